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
