"""The emulated cluster: namespaces are made, links are shaped, everything is torn down."""

import subprocess
import time

import pytest
import torch
import torch.distributed as dist

from hasten.distributed import ring_allreduce
from hasten.harness.launch import spawn
from hasten.harness.netns import EmulatedCluster, probe

PREFIX = "hsx"  # not the benchmark's prefix: a test must never tear down a running benchmark


@pytest.fixture(scope="module")
def namespaces():
    # Probed here, not at import: every xdist worker imports this file (--dist loadfile runs its
    # tests in one), and probes made side by side with one prefix removed each other's bridge, so
    # both tests skipped ("RTNETLINK answers: File exists") in a CI run.
    reason = probe(PREFIX)
    if reason is not None:
        pytest.skip(f"no network namespaces: {reason}")


def _namespaces():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]


def _worker(rank, world, nbytes):
    x = torch.full((4,), float(rank + 1))
    ring_allreduce(x)
    buf = torch.empty(nbytes // 4)
    dist.barrier()
    start = time.perf_counter()
    if rank == 0:
        dist.send(buf, 1)
        dist.recv(buf[:1], 1)
    elif rank == 1:
        dist.recv(buf, 0)
        dist.send(buf[:1], 0)
    return x.tolist(), time.perf_counter() - start


@pytest.mark.multiproc
def test_emulated_cluster_shapes_links_and_tears_down(namespaces):
    rate_gbit, nbytes = 0.1, 1 << 20
    with EmulatedCluster(3, rate_gbit, prefix=PREFIX) as cluster:
        assert len(_namespaces()) == 3
        assert [p.master_addr for p in cluster.placement] == ["10.213.0.1"] * 3
        results = spawn(_worker, 3, (nbytes,), timeout_s=30, placement=cluster.placement)
    assert _namespaces() == []
    assert all(x == [6.0] * 4 for x, _ in results)
    wire_s = nbytes * 8 / (rate_gbit * 1e9)  # 84 ms at 0.1 Gbit/s
    # Loopback moves 1 MiB in about a millisecond: taking most of the wire time shows the shaping.
    assert results[0][1] > 0.7 * wire_s


def test_teardown_after_error_and_leftover_cleanup(namespaces):
    with pytest.raises(RuntimeError):
        with EmulatedCluster(2, 1.0, prefix=PREFIX):
            raise RuntimeError("boom")
    assert _namespaces() == []
    subprocess.run(["ip", "netns", "add", f"{PREFIX}7"], check=True)  # a killed run's leftover
    with EmulatedCluster(1, 1.0, prefix=PREFIX):
        assert _namespaces() == [f"{PREFIX}0"]
    assert _namespaces() == []


def test_bad_cluster_options():
    with pytest.raises(ValueError, match="go together"):
        EmulatedCluster(4, 1.0, inter_rate_gbit=0.25)
    with pytest.raises(ValueError, match="must divide"):
        EmulatedCluster(6, 1.0, inter_rate_gbit=0.25, local_size=4)
    with pytest.raises(ValueError, match="burst_s"):
        EmulatedCluster(2, 1.0, burst_s=0)


def test_links_burst_4_ms_of_their_rate_after_a_rate_change_too(namespaces):
    # tc's own default burst is rate/HZ + MTU with HZ = 10^9 (hrtimers): 1375 bytes at 1 Gbit/s,
    # under one frame, so a late dequeue on a busy CPU lost link time (netns.py's docstring).
    def bursts(cluster):
        out = subprocess.run(["tc", "-d", "class", "show", "dev", f"{PREFIX}1h"], capture_output=True, text=True,
                             check=True).stdout
        return [(line.split(" burst ")[1].split("/")[0], line.split(" cburst ")[1].split("/")[0])
                for line in out.splitlines() if "1:10 " in line or "1:20 " in line]

    with EmulatedCluster(2, 1.0, prefix=PREFIX) as cluster:
        assert bursts(cluster) == [("500000b", "500000b")] * 2  # 4 ms of 125 MB/s
        cluster.set_rate(0.25)
        assert bursts(cluster) == [("125000b", "125000b")] * 2
    with EmulatedCluster(2, 1.0, prefix=PREFIX, burst_s=None) as cluster:
        assert all(int(b[:-1]) < 2000 for b, _ in bursts(cluster))  # tc's default, kept for comparison


def test_set_rate_changes_every_link_in_place(namespaces):
    def rates(cluster):
        shown = []
        for rank in range(cluster.world_size):
            ns, host, inner = f"{PREFIX}{rank}", f"{PREFIX}{rank}h", f"{PREFIX}{rank}n"
            for cmd in (["ip", "netns", "exec", ns, "tc", "class", "show", "dev", inner],
                        ["tc", "class", "show", "dev", host]):
                out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                shown += [line.split(" rate ")[1].split()[0] for line in out.splitlines()
                          if "1:10 " in line or "1:20 " in line]
        return shown

    with EmulatedCluster(2, 1.0, prefix=PREFIX) as cluster:
        assert rates(cluster) == ["1Gbit"] * 8
        cluster.set_rate(0.25)
        assert rates(cluster) == ["250Mbit"] * 8 and cluster.rate_gbit == 0.25
        with pytest.raises(ValueError, match="positive"):
            cluster.set_rate(0)
