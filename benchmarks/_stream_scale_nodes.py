"""The nodes of benchmarks/stream_scale.py: the store's server and two torchrun launches of 2
ranks, each in a network namespace of its own (``hasten.harness.netns``) or all on loopback; the
scheduling share they are kept at, the kill of a node, and one attempt from launch to end."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

HTTP_PORT = 8000
SCRIPT = Path(__file__).with_name("stream_scale.py")  # what torchrun runs, with --worker


class Nodes:
    """The store's server and the two nodes' torchrun launches, in namespaces or on loopback."""

    def __init__(self, args, packed: Path, logs: Path):
        self.args, self.logs = args, logs
        self.cluster = None
        if args.loopback:
            from hasten.harness.launch import free_port

            self.store_addr = self.master = "127.0.0.1"
            port = free_port()
            self.ns = [None, None, None]
            self.ifname = ["lo", "lo"]
        else:
            from hasten.harness.netns import EmulatedCluster

            self.cluster = EmulatedCluster(3, rate_gbit=args.rate_gbit, prefix=args.netns_prefix).__enter__()
            self.store_addr, self.master = self.cluster.address(0), self.cluster.address(1)
            port = HTTP_PORT
            self.ns = [p.netns for p in self.cluster.placement]
            self.ifname = [p.ifname for p in self.cluster.placement[1:]]
        self.server = subprocess.Popen(self.in_ns(0, sys.executable, "-m", "RangeHTTPServer", str(port),
                                                  "-b", self.store_addr),
                                       cwd=packed.parent, stdout=open(logs / "server.log", "w"),
                                       stderr=subprocess.STDOUT, start_new_session=True)
        keep_low([self.server.pid])
        self.url = f"http://{self.store_addr}:{port}/{packed.name}/"
        deadline = time.monotonic() + 60
        while subprocess.run(self.in_ns(1, sys.executable, "-c", "import socket, sys; socket.create_connection("
                                        f"({self.store_addr!r}, {port}), timeout=1)"),
                             capture_output=True).returncode:
            if time.monotonic() > deadline or self.server.poll() is not None:
                raise SystemExit(f"the store did not start: {(logs / 'server.log').read_text()[-2000:]}")
            time.sleep(0.2)

    def in_ns(self, k: int, *argv: str) -> list[str]:
        return list(argv) if self.ns[k] is None else ["ip", "netns", "exec", self.ns[k], *argv]

    def rx_bytes(self, k: int) -> int | None:
        """Bytes received by node k's namespace (None on loopback, where the nodes share one)."""
        if self.ns[k] is None:
            return None
        text = subprocess.run(self.in_ns(k, "cat", "/proc/net/dev"), capture_output=True, text=True).stdout
        return sum(int(line.split(":")[1].split()[0]) for line in text.splitlines()[2:]
                   if ":" in line and line.split(":")[0].strip() != "lo")

    def launch(self, node: int, attempt: int, work: Path, cache_bytes: int) -> subprocess.Popen:
        a = self.args
        port = a.master_port
        cmd = self.in_ns(node + 1, sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank",
                         str(node), "--nproc-per-node", "2", "--master-addr", self.master, "--master-port", str(port),
                         "--max-restarts", "0", str(SCRIPT), "--worker", "--url", self.url, "--work", str(work),
                         "--attempt", str(attempt), "--cache-bytes", str(cache_bytes), "--epochs", str(a.epochs),
                         "--batch", str(a.batch), "--seed", str(a.seed), "--workers", str(a.workers),
                         "--checkpoint-every", str(a.checkpoint_every), "--timeout", str(a.timeout))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": self.ifname[node],
               "PYTHONPATH": os.pathsep.join(p for p in (str(Path(__file__).resolve().parent.parent),
                                                         os.environ.get("PYTHONPATH")) if p)}
        log = open(self.logs / f"a{attempt}-node{node}.log", "w")
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def close(self) -> None:
        if self.server.poll() is None:
            os.killpg(self.server.pid, signal.SIGKILL)
            self.server.wait()
        if self.cluster is not None:
            self.cluster.__exit__(None, None, None)


def autogroup_nice(pid: int | str = "self") -> int | None:
    try:
        return int(Path(f"/proc/{pid}/autogroup").read_text().split("nice")[1])
    except (OSError, IndexError, ValueError):
        return None  # not Linux, or no autogroup scheduling


def keep_low(pids: list[int]) -> None:
    """The scheduling share of this process given to ``pids``: the server and torchrun start
    sessions of their own, and each session is an autogroup with nice 0 whatever its processes'
    nice, so a benchmark started at low priority (``setsid nice -n 19``, autogroup nice 19)
    would otherwise run its ranks at normal priority."""
    mine = autogroup_nice()
    if not mine:
        return
    for pid in pids:
        if autogroup_nice(pid) not in (None, mine):
            try:
                Path(f"/proc/{pid}/autogroup").write_text(str(mine))
            except OSError:
                pass  # ended meanwhile


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL to a launch and everything it started: torchrun starts its ranks in sessions of
    their own, so killing its process group alone would leave them running."""
    from hasten.cpu_time import descendants

    for pid in [proc.pid, *descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def run_attempt(nodes: Nodes, attempt: int, work: Path, args, cache_bytes: int, kill: bool, started: float,
                total_batches: int, done_batches: int) -> dict:
    """Both nodes launched once; node B killed mid-epoch when ``kill``; waits for both to end."""
    args.master_port = random.randint(20000, 60000)
    rx = [nodes.rx_bytes(k) for k in (1, 2)]
    procs = [nodes.launch(n, attempt, work, cache_bytes) for n in (0, 1)]
    record = {"attempt": attempt, "killed": None}
    t0, said = time.monotonic(), time.monotonic()
    progress = work / "progress.json"
    from hasten.cpu_time import descendants

    lowered = 0.0
    while any(p.poll() is None for p in procs):
        time.sleep(0.05)
        if time.monotonic() - lowered > 2:  # (the ranks start within seconds; once in 2 s is enough)
            lowered = time.monotonic()
            keep_low([q for p in procs for q in (p.pid, *descendants(p.pid))])
        try:
            where = json.loads(progress.read_text())
        except (OSError, ValueError):
            continue
        batch = where["epoch"] * where["per_rank"] // args.batch + where["position"] // args.batch
        if time.monotonic() - said > args.progress_s:
            said = time.monotonic()
            rate = (batch - done_batches) / max(time.monotonic() - started, 1e-9)
            left = (total_batches - batch) / rate / 60 if rate > 0 else float("nan")
            print(f"attempt {attempt}: epoch {where['epoch'] + 1}/{args.epochs}, batch {batch}/{total_batches} of "
                  f"rank 0, {rate * args.batch * 4:.0f} images/s (indicative), about {left:.0f} min left",
                  file=sys.stderr, flush=True)
        if kill and record["killed"] is None and where["epoch"] == args.kill_epoch - 1 \
                and where["position"] >= args.kill_at * where["per_rank"]:
            checkpoint = json.loads((work / "checkpoint.json").read_text())
            if checkpoint["epoch"] == where["epoch"] and min(checkpoint["positions"]) > 0:
                kill_tree(procs[1])
                record["killed"] = {"node": 1, "epoch": where["epoch"], "rank0_position": where["position"],
                                    "newest_checkpoint": checkpoint, "s_into_attempt": time.monotonic() - t0}
                print(f"attempt {attempt}: node B killed in epoch {where['epoch'] + 1} at rank 0's example "
                      f"{where['position']}/{where['per_rank']}", file=sys.stderr, flush=True)
        if record["killed"] is not None and procs[0].poll() is None \
                and time.monotonic() - t0 - record["killed"]["s_into_attempt"] > args.timeout + 60:
            kill_tree(procs[0])  # its ranks should have stopped at their next collective
            record["node_a_killed_too"] = True
    for p in procs:
        p.wait()
    record["exit_codes"] = [p.returncode for p in procs]
    record["s"] = time.monotonic() - t0
    if record["killed"] is not None:
        record["s_kill_to_node_a_stop"] = record["s"] - record["killed"]["s_into_attempt"]
    after = [nodes.rx_bytes(k) for k in (1, 2)]
    record["node_rx_bytes"] = [None if b is None else a - b for a, b in zip(after, rx)]
    return record
