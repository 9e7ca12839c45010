"""AutoEcho: the echo factor that follows the measured upstream/downstream ratio (hasten.echo.auto)."""

import queue
import threading
import time
from collections import Counter

import pytest

from hasten.echo import AutoEcho, echo_examples


def prefetched(items, upstream_s, depth=4):
    """A concurrent upstream taking ``upstream_s`` per item (a thread and a bounded queue)."""
    q = queue.Queue(maxsize=depth)
    done = object()

    def produce():
        for item in items:
            time.sleep(upstream_s)
            q.put(item)
        q.put(done)

    threading.Thread(target=produce, daemon=True).start()
    while (item := q.get()) is not done:
        yield item


def run_auto(upstream_s, downstream_s, n, e_max=8.0):
    auto = AutoEcho(e_max=e_max, interval=10)
    factors = []
    for _ in echo_examples(prefetched(range(n), upstream_s), auto):
        time.sleep(downstream_s)
        factors.append(auto.factor)
    return auto, factors


def test_autoecho_settles_near_known_ratio():
    auto, factors = run_auto(upstream_s=0.008, downstream_s=0.002, n=250)  # R = 4
    late = factors[len(factors) // 2 :]
    mean_late = sum(late) / len(late)
    assert 3.0 < mean_late < 4.6, (mean_late, auto.history[-5:])


def test_autoecho_switches_off_when_not_input_bound():
    auto, factors = run_auto(upstream_s=0.0005, downstream_s=0.002, n=150)  # R = 0.25
    assert max(factors) == 1.0


def test_autoecho_respects_e_max_and_validates():
    auto = AutoEcho(e_max=2.0)
    for _ in range(5):
        auto.observe(fresh=10, emitted=10, wait_s=1.0, downstream_s=0.1)  # R = 11
    assert auto.factor == 2.0
    with pytest.raises(ValueError, match="e_max"):
        AutoEcho(e_max=0.5)
    with pytest.raises(ValueError, match="interval"):
        AutoEcho(interval=0)


def test_autoecho_follows_a_change_in_ratio():
    auto = AutoEcho(e_max=10, smoothing=1.0)
    auto.observe(fresh=10, emitted=10, wait_s=9.0, downstream_s=0.1)  # start-up window: ignored
    assert auto.factor == 1.0
    auto.observe(fresh=10, emitted=10, wait_s=0.5, downstream_s=0.1)  # R = 6
    assert auto.factor == pytest.approx(6.0)
    for _ in range(10):
        auto.observe(fresh=10, emitted=60, wait_s=0.0, downstream_s=0.6)  # no waiting now: probe down
    assert auto.factor < 3.0
    auto.observe(fresh=10, emitted=20, wait_s=0.0, downstream_s=0.2)
    auto.observe(fresh=10, emitted=20, wait_s=0.2, downstream_s=0.2)  # R = 2 * (1 + 1) = 4
    assert auto.factor == pytest.approx(4.0)
    assert Counter(f for f, _ in auto.history)[1.0] == 1  # the first measured window only


def _agree_worker(rank, world, port, out):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    auto = AutoEcho(e_max=10, smoothing=1.0)
    auto.observe(fresh=10, emitted=10, wait_s=1.0, downstream_s=0.1)  # start-up window
    # Rank 0 measures R = 3, rank 1 R = 5: both must settle on the mean, 4.
    wait = 0.2 if rank == 0 else 0.4
    auto.observe(fresh=10, emitted=10, wait_s=wait, downstream_s=0.1)
    out.put((rank, auto.factor))
    dist.destroy_process_group()


@pytest.mark.multiproc
def test_autoecho_ranks_agree_on_one_factor():
    import socket

    import torch.multiprocessing as tmp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = tmp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_agree_worker, args=(r, 2, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    assert results[0] == results[1] == pytest.approx(4.0)
