"""SlowStorage and slow_iter: per-item latency and a bandwidth limit."""

import time

import pytest

from hasten.stream.slow_storage import SlowStorage, concurrent_reads, slow_iter


def test_slow_storage_imposes_latency_and_bandwidth():
    t0 = time.perf_counter()
    out = list(slow_iter([b"x" * 1000] * 5, latency_s=0.01, bandwidth_bytes_per_s=100_000))
    elapsed = time.perf_counter() - t0
    assert len(out) == 5 and elapsed >= 5 * (0.01 + 0.01)
    store = SlowStorage([b"ab", b"cd"], latency_s=0.0)
    assert store[1] == b"cd" and len(store) == 2 and store.reads == 1
    with pytest.raises(ValueError, match="latency_s"):
        SlowStorage([], latency_s=-1)
    with pytest.raises(ValueError, match="bandwidth"):
        slow_iter([], bandwidth_bytes_per_s=0)



def _timed_read(storage, key, out):
    t0 = time.perf_counter()
    storage[key]
    out.append(time.perf_counter() - t0)


def test_paused_stretches_a_read_in_flight_and_holds_back_new_ones():
    import threading

    store = SlowStorage([b"a", b"b"], latency_s=0.15)
    first, second = [], []
    t = threading.Thread(target=_timed_read, args=(store, 0, first))
    t.start()
    time.sleep(0.03)
    with store.paused():
        late = threading.Thread(target=_timed_read, args=(store, 1, second))
        late.start()
        time.sleep(0.25)
        assert first == [] and second == []  # nothing completes while paused
    t.join()
    late.join()
    # The in-flight read still needed 0.12 s of storage time after the 0.25 s pause;
    # a paused() that did nothing would have returned it after 0.15 s in all.
    assert first[0] >= 0.15 + 0.25 - 0.02, first
    # The read requested during the pause started its latency when the pause ended.
    assert second[0] >= 0.22 + 0.15 - 0.02, second


def test_storage_clock_stands_still_while_paused():
    store = SlowStorage([b"a"])
    c0 = store.clock()
    with store.paused():
        time.sleep(0.1)
    assert store.clock() - c0 < 0.05


def test_concurrent_requests_hide_latency_but_share_the_link():
    records = [b"x" * 1000] * 16
    store = SlowStorage(records, latency_s=0.05)
    t0 = time.perf_counter()
    out = list(concurrent_reads(store, range(16), in_flight=8))
    parallel = time.perf_counter() - t0
    assert out == records and store.reads == 16
    assert 0.1 <= parallel < 0.3, parallel  # 2 waves of 8 requests, not 16 x 0.05 s
    # A 40 kB/s link: 16 kB take 0.4 s however many requests are in flight.
    linked = SlowStorage([(i, b"x" * 1000) for i in range(16)], latency_s=0.05, link_bytes_per_s=40_000)
    t0 = time.perf_counter()
    out = list(concurrent_reads(linked, range(16), in_flight=8, prefetch=4))
    elapsed = time.perf_counter() - t0
    assert [i for i, _ in out] == list(range(16))  # in order
    assert 0.05 + 0.4 - 0.02 <= elapsed < 0.7, elapsed


def test_one_request_at_a_time_pays_every_latency():
    store = SlowStorage(list(range(6)), latency_s=0.03)
    t0 = time.perf_counter()
    assert list(concurrent_reads(store, range(6), in_flight=1)) == list(range(6))
    assert time.perf_counter() - t0 >= 6 * 0.03


def test_size_of_sets_the_bytes_on_the_wire_and_bad_arguments_raise():
    store = SlowStorage([7], link_bytes_per_s=1000, size_of=lambda r: 100)
    t0 = time.perf_counter()
    assert store[0] == 7
    assert time.perf_counter() - t0 >= 0.1 - 0.005
    with pytest.raises(ValueError, match="link_bytes_per_s"):
        SlowStorage([], link_bytes_per_s=0)
    with pytest.raises(ValueError, match="in_flight"):
        concurrent_reads(store, [0], in_flight=0)
    with pytest.raises(ValueError, match="prefetch"):
        concurrent_reads(store, [0], prefetch=-1)


# -- one storage shared by forked reader processes (decode workers) ---------------------------
def _read_all(storage, keys):
    return [storage[k] for k in keys]


def test_forked_workers_read_through_one_shared_storage(monkeypatch):
    """Decode workers are forked processes: before the storage's state was shared, each
    worker read through its own copy (the parent counted no reads: a storage ratio of 0),
    and concurrent readers each got the full rate."""
    import types
    from functools import partial

    import hasten.stream.slow_storage as slow_storage
    from hasten.data.workers import ordered_map

    # The clock of a machine up for 19 hours (CI's was up 18): the summed delays must not lose precision
    # to it (they were differences of clock readings, 2.7e-10 s short over 40 reads in CI).
    # (At 70,000 s a clock reading's unit is 1.46e-11 s, and 2 ms rounds down in it.)
    started = time.monotonic()
    monkeypatch.setattr(slow_storage, "time", types.SimpleNamespace(
        monotonic=lambda: 70_000.0 + (time.monotonic() - started), sleep=time.sleep))

    chunks = [list(range(i, i + 5)) for i in range(0, 40, 5)]
    store = SlowStorage(list(range(40)), latency_s=0.002)
    out = [x for chunk in ordered_map(partial(_read_all, store), chunks, workers=4, prefetch=4) for x in chunk]
    assert out == list(range(40))
    assert store.reads == 40  # counted in the parent, though read in the workers
    assert store.delay_s >= 40 * 0.002 * (1 - 1e-9)  # a sum of 40 float delays: rounding
    # A throughput (item_s): one record per 10 ms for all readers together, so 40 records
    # read by 4 workers at once take 0.4 s, not 0.1 s.
    rate = SlowStorage(list(range(40)), item_s=0.01)
    t0 = time.perf_counter()
    assert [x for c in ordered_map(partial(_read_all, rate), chunks, workers=4, prefetch=4) for x in c] == out
    elapsed = time.perf_counter() - t0
    assert rate.reads == 40 and rate.link_busy_s == pytest.approx(40 * 0.01)
    assert elapsed >= 40 * 0.01 - 0.02, elapsed


def _timed_child_reads(storage, n, out, reading):
    t0 = time.monotonic()
    reading.set()
    for i in range(n):
        storage[i]
    out.put(time.monotonic() - t0)


def test_a_pause_in_the_parent_stops_reads_in_forked_workers():
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    store = SlowStorage(list(range(10)), latency_s=0.05)
    out, reading = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=_timed_child_reads, args=(store, 10, out, reading))
    child.start()
    assert reading.wait(timeout=30)  # however slowly a loaded machine starts the child
    time.sleep(0.05)
    with store.paused():
        time.sleep(0.4)
    child.join(timeout=30)
    took = out.get(timeout=1)
    # 10 x 50 ms of storage time plus the 0.4 s pause, which starts about 50 ms into the
    # child's 0.5 s of reads: a pause that only stopped the parent's copy would let the child
    # finish in about 0.5 s.
    assert took >= 0.5 + 0.4 - 0.03, took
    assert store.reads == 10


def test_item_s_is_a_throughput_that_concurrent_requests_cannot_beat():
    store = SlowStorage(list(range(20)), item_s=0.01)
    t0 = time.perf_counter()
    assert list(concurrent_reads(store, range(20), in_flight=8, prefetch=4)) == list(range(20))
    assert time.perf_counter() - t0 >= 20 * 0.01 - 0.02
    with pytest.raises(ValueError, match="item_s"):
        SlowStorage([], item_s=-1)


def test_items_of_makes_item_s_a_time_per_item_of_each_record():
    # A store of shards of 3, 1 and 2 examples: item_s is the time per example, so the link is
    # busy 6 x item_s, whatever the number of requests; without items_of it would be 3 x item_s.
    examples = [3, 1, 2]
    storage = SlowStorage([b"a", b"b", b"c"], item_s=0.01, items_of=examples.__getitem__)
    t0 = time.monotonic()
    assert [storage[i] for i in range(3)] == [b"a", b"b", b"c"]
    assert storage.reads == 3 and storage.items == 6
    assert storage.link_busy_s == pytest.approx(0.06)
    assert time.monotonic() - t0 >= 0.06  # the reads waited that long, one after the other
