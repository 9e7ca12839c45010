"""An emulated cluster on one machine: one Linux network namespace per rank, shaped links.

Loopback has no topology (every "link" is a memory copy), so algorithm
comparisons there mostly measure the CPU. Here each rank gets its own network
namespace with a veth pair into a shared bridge, and both directions of each
rank's link are rate-limited with tc (htb), like a NIC port on a switch:
the rank's uploads on its own side, its downloads on the bridge side. With two
levels, ranks are grouped into "nodes" of ``local_size``; traffic to a rank of
the same node gets the fast rate, traffic to other nodes the slow one (each rank
has its own slow link, as with one NIC per GPU).

Addresses are 10.213.<node>.<local rank + 1>/16 on the namespaces' own veths:
no address is given to the root namespace, so traffic cannot leave the
namespaces. Everything is torn down on exit (context manager and atexit), and
leftovers from a killed earlier run are removed before setting up.

Burst: each htb class may send ``burst_s`` of its rate at once (``BURST_S``, 4 ms: one
kernel tick at HZ=250, the usual rule for a token bucket's burst, rate/HZ). htb's tokens
never exceed the burst, so a dequeue that comes later than burst/rate after the last one
(a late timer or softirq on a busy CPU) loses that link time for good. tc's default burst
is rate/HZ + MTU with HZ read from /proc/net/psched, which is 10^9 on a kernel with
high-resolution timers: 1375 bytes at 1 Gbit/s, 11 microseconds of the rate, so a shaped
link under CPU load fell short of its rate (``benchmarks/remote_link_probe.py`` compares
the two; ``burst_s=None`` is tc's default). The burst lets at most ``burst_s`` of the
rate through faster than the rate: 0.4% of a one-second reading.

Latency: the kernel here has no sch_netem, so only the rate is shaped; a link's
latency is whatever the veth/bridge path costs (tens of microseconds).

Needs root and iproute2 (``ip``, ``tc``); ``probe()`` says whether it can work.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import time

from hasten.harness.launch import RankPlacement
from hasten.errors import HastenError

PREFIX = "hst"  # every namespace, veth and bridge made here starts with this
SUBNET = "10.213"
_QUANTUM = "60000"
_LEAF_PACKETS = "100"  # htb's per-class quantum; its default is too big at Gbit rates and warns
BURST_S = 0.004  # seconds of the rate an htb class may send at once (module docstring)


class NetnsUnavailable(HastenError, RuntimeError):
    """Network namespaces, veth or tc cannot be used here (not root, no iproute2, ...)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(list(args), capture_output=True, text=True)
    if check and res.returncode != 0:
        raise NetnsUnavailable(f"`{' '.join(args)}` failed: {res.stderr.strip() or res.stdout.strip()}")
    return res


def _links(prefix: str) -> list[str]:
    out = _ip("ip", "-o", "link", "show", check=False).stdout
    names = (line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line)
    return [n for n in names if n.startswith(prefix)]


def cleanup_leftovers(prefix: str = PREFIX) -> list[str]:
    """Delete namespaces, veths and bridges named ``prefix*`` (e.g. left by a killed run).

    Returns their names. Waits (up to 10 s) until the kernel has really removed the
    links: a veth outlives its namespace briefly, and re-creating it too soon fails.
    """
    if shutil.which("ip") is None:
        return []
    removed = []
    for line in _ip("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(prefix):
            _ip("ip", "netns", "del", name, check=False)
            removed.append(name)
    deadline = time.monotonic() + 10
    while (links := _links(prefix)) and time.monotonic() < deadline:
        for name in links:
            _ip("ip", "link", "del", name, check=False)
            removed.append(name)
        time.sleep(0.1)
    return sorted(set(removed))


def probe(prefix: str = PREFIX) -> str | None:
    """None if namespaces, veth, a bridge and htb can be made here; else the reason why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (apt-get install iproute2)"
    try:
        with EmulatedCluster(1, rate_gbit=1.0, prefix=prefix):
            pass
    except NetnsUnavailable as exc:
        return str(exc)
    return None


def _gbit(rate: float) -> str:
    return f"{int(rate * 1000)}mbit"


def _burst(rate: float, burst_s: float | None) -> list[str]:
    """tc's burst and cburst arguments for an htb class of ``rate`` Gbit/s (none: tc's default)."""
    if burst_s is None:
        return []
    size = str(max(int(rate * 1e9 / 8 * burst_s), 3000))  # bytes; at least two full frames
    return ["burst", size, "cburst", size]


class EmulatedCluster:
    """``with EmulatedCluster(8, rate_gbit=1.0) as cl: spawn(fn, 8, placement=cl.placement)``.

    rate_gbit: each rank's link, both directions. inter_rate_gbit with local_size:
    the rate to ranks of other nodes (nodes = consecutive groups of local_size ranks).
    burst_s: seconds of the rate a link may send at once (module docstring); None: tc's default.
    """

    def __init__(self, world_size: int, rate_gbit: float = 1.0, *,
                 inter_rate_gbit: float | None = None, local_size: int | None = None,
                 prefix: str = PREFIX, burst_s: float | None = BURST_S):
        if world_size < 1 or world_size > 250:
            raise ValueError(f"world_size must be in 1..250, got {world_size}")
        if rate_gbit <= 0 or (inter_rate_gbit is not None and inter_rate_gbit <= 0):
            raise ValueError(f"link rates must be positive, got {rate_gbit}, {inter_rate_gbit}")
        if burst_s is not None and not 0 < burst_s < 1:
            raise ValueError(f"burst_s must be in (0, 1) seconds or None (tc's default), got {burst_s}")
        if (inter_rate_gbit is None) != (local_size is None):
            raise ValueError("inter_rate_gbit and local_size go together (two-level network)")
        if local_size is not None and (local_size < 1 or world_size % local_size):
            raise ValueError(f"local_size must divide world_size {world_size}, got {local_size}")
        self.world_size, self.rate_gbit = world_size, rate_gbit
        self.inter_rate_gbit, self.local_size = inter_rate_gbit, local_size or world_size
        self.prefix, self.burst_s = prefix, burst_s
        self.bridge = f"{prefix}br"
        self.placement: list[RankPlacement] = []
        self._up = False

    def address(self, rank: int) -> str:
        return f"{SUBNET}.{rank // self.local_size}.{rank % self.local_size + 1}"

    def _shape(self, ns: list[str], dev: str, rank: int, match: str) -> None:
        """htb on ``dev``: own-node traffic (matched on ``match`` = src|dst) fast, the rest slow."""
        tc = [*ns, "tc"]
        _ip(*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "20")
        slow = self.inter_rate_gbit if self.inter_rate_gbit is not None else self.rate_gbit
        for cls, rate in (("1:10", self.rate_gbit), ("1:20", slow)):
            _ip(*tc, "class", "add", "dev", dev, "parent", "1:", "classid", cls, "htb",
                "rate", _gbit(rate), "ceil", _gbit(rate), *_burst(rate, self.burst_s), "quantum", _QUANTUM)
            # A short queue: htb's default leaf queues 1000 packets (12 ms at 1 Gbit/s), which
            # delays the ACKs of the opposite direction and halves two-way throughput.
            _ip(*tc, "qdisc", "add", "dev", dev, "parent", cls, "pfifo", "limit", _LEAF_PACKETS)
        # Pure TCP ACKs (IP length < 64) skip the data queue, as on a switch port with
        # separate directions; otherwise ACK clocking halves throughput when a pair
        # sends both ways at once (two ranks of a ring exchanging).
        _ip(*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:5", "htb",
            "rate", "100mbit", "ceil", "10gbit", "prio", "0", "quantum", _QUANTUM)
        _ip(*tc, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1",
            "u32", "match", "ip", "protocol", "6", "0xff", "match", "u16", "0x0000", "0xffc0",
            "at", "2", "flowid", "1:5")
        node = rank // self.local_size
        _ip(*tc, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "2",
            "u32", "match", "ip", match, f"{SUBNET}.{node}.0/24", "flowid", "1:10")

    def __enter__(self) -> "EmulatedCluster":
        cleanup_leftovers(self.prefix)
        atexit.register(self.close)
        try:
            _ip("ip", "link", "add", self.bridge, "type", "bridge")
            _ip("ip", "link", "set", self.bridge, "up")
            for rank in range(self.world_size):
                ns, host, inner = f"{self.prefix}{rank}", f"{self.prefix}{rank}h", f"{self.prefix}{rank}n"
                in_ns = ["ip", "netns", "exec", ns]
                _ip("ip", "netns", "add", ns)
                _ip("ip", "link", "add", host, "type", "veth", "peer", "name", inner)
                _ip("ip", "link", "set", inner, "netns", ns)
                _ip("ip", "link", "set", host, "master", self.bridge)
                _ip("ip", "link", "set", host, "up")
                _ip(*in_ns, "ip", "addr", "add", f"{self.address(rank)}/16", "dev", inner)
                _ip(*in_ns, "ip", "link", "set", inner, "up")
                _ip(*in_ns, "ip", "link", "set", "lo", "up")
                self._shape(in_ns, inner, rank, "dst")   # the rank's uploads
                self._shape([], host, rank, "src")       # the rank's downloads
                self.placement.append(RankPlacement(ns, inner, self.address(0)))
            self._up = True
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        cleanup_leftovers(self.prefix)
        self.placement = []
        self._up = False

    def __exit__(self, *exc) -> None:
        self.close()
        atexit.unregister(self.close)

    def set_rate(self, rate_gbit: float) -> None:
        """Every link's rate changed in place (both directions, both classes): one cluster,
        and the servers running in it, serve a sweep of rates."""
        if rate_gbit <= 0:
            raise ValueError(f"link rates must be positive, got {rate_gbit}")
        for rank in range(self.world_size):
            ns, host, inner = f"{self.prefix}{rank}", f"{self.prefix}{rank}h", f"{self.prefix}{rank}n"
            for cmd, dev in ((["ip", "netns", "exec", ns, "tc"], inner), (["tc"], host)):
                for cls in ("1:10", "1:20"):
                    _ip(*cmd, "class", "change", "dev", dev, "parent", "1:", "classid", cls, "htb",
                        "rate", _gbit(rate_gbit), "ceil", _gbit(rate_gbit), *_burst(rate_gbit, self.burst_s),
                        "quantum", _QUANTUM)
        self.rate_gbit = rate_gbit
        self.inter_rate_gbit = None if self.inter_rate_gbit is None else rate_gbit

    def describe(self) -> str:
        text = f"emulated: {self.world_size} network namespaces, {self.rate_gbit:g} Gbit/s links"
        if self.inter_rate_gbit is not None:
            text += (f" inside nodes of {self.local_size}, {self.inter_rate_gbit:g} Gbit/s "
                     "between nodes")
        burst = "tc's default burst" if self.burst_s is None else f"burst {self.burst_s * 1e3:g} ms of the rate"
        return text + f" (tc htb, {burst}; no added latency)"
