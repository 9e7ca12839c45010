"""Echo stages, shuffle buffer, counters and AutoEcho (hasten.echo)."""

import queue
import threading
import time
from collections import Counter
from itertools import groupby

import pytest
import torch

from hasten.echo import (
    AutoEcho,
    EchoCounters,
    echo_batches,
    echo_copies,
    echo_examples,
    shuffle_buffer,
    timed_loader,
)


def runs(seq):
    return [len(list(g)) for _, g in groupby(seq)]


def test_integral_factor_repeats_each_item_exactly():
    out = list(echo_examples(range(100), 3))
    assert out == [i for i in range(100) for _ in range(3)]


def test_fractional_factor_counts_are_floor_or_ceil_with_mean_close_to_e():
    counters = EchoCounters()
    out = list(echo_examples(range(5000), 2.4, seed=7, counters=counters))
    counts = runs(out)
    assert len(counts) == 5000 and set(counts) == {2, 3}
    assert abs(sum(counts) / 5000 - 2.4) < 0.03
    assert counters.fresh_examples == 5000 and counters.items_emitted == len(out)


def test_draws_identical_across_ranks_and_differ_between_epochs():
    # Two ranks read different data, but must take the same number of steps.
    rank0 = runs(list(echo_examples(range(0, 2000, 2), 1.5, seed=3, epoch=4)))
    rank1 = runs(list(echo_examples(range(1, 2000, 2), 1.5, seed=3, epoch=4)))
    assert rank0 == rank1
    other_epoch = runs(list(echo_examples(range(0, 2000, 2), 1.5, seed=3, epoch=5)))
    assert other_epoch != rank0
    assert echo_copies(1.5, seed=3, epoch=4, index=10) == rank0[10]


@pytest.mark.parametrize("bad", [0.5, 0, -2, float("nan"), float("inf"), "2", True])
def test_invalid_factor_names_accepted_values(bad):
    with pytest.raises(ValueError, match=r">= 1"):
        echo_examples(range(3), bad)
    with pytest.raises(ValueError, match=r">= 1"):
        echo_batches(range(3), bad)


@pytest.mark.parametrize("bad", [-1, 2.5, "8"])
def test_invalid_buffer_size(bad):
    with pytest.raises(ValueError, match="integer >= 0"):
        shuffle_buffer(range(3), bad)


def test_batch_echo_repeats_whole_dataloader_batches():
    data = torch.utils.data.TensorDataset(torch.arange(40).float(), torch.arange(40))
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    counters = EchoCounters()
    out = list(echo_batches(loader, 2, counters=counters))
    assert len(out) == 10 and counters.fresh_batches == 5
    for a, b in zip(out[::2], out[1::2]):
        assert torch.equal(a[1], b[1])
    assert sorted(torch.cat([b[1] for b in out[::2]]).tolist()) == list(range(40))


def test_shuffle_buffer_is_a_permutation():
    out = list(shuffle_buffer(range(1000), 100, seed=1))
    assert sorted(out) == list(range(1000)) and out != list(range(1000))
    assert list(shuffle_buffer(range(10), 0)) == list(range(10))


def within_batch_duplicate_rate(items, batch_size):
    c = EchoCounters()
    for i in range(0, len(items) - batch_size + 1, batch_size):
        c.record_batch(items[i : i + batch_size])
    return c.duplicate_rate


def test_shuffle_buffer_lowers_within_batch_duplicates():
    echoed = list(echo_examples(range(2000), 4))
    unshuffled = within_batch_duplicate_rate(echoed, 32)
    shuffled = within_batch_duplicate_rate(list(shuffle_buffer(echoed, 2000, seed=0)), 32)
    assert unshuffled == pytest.approx(0.75)
    assert shuffled < 0.1


def test_timed_loader_measures_idle_fraction():
    def slow_source():
        for i in range(5):
            time.sleep(0.02)
            yield i

    c = EchoCounters()
    for _ in timed_loader(slow_source(), c):
        time.sleep(0.005)
    assert c.batches_emitted == 5
    assert 0.6 < c.idle_fraction < 0.9  # 20 ms waiting vs 5 ms working per step


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
