"""SlowStorage and slow_iter: per-item latency and a bandwidth limit."""

import time

import pytest

from hasten.stream.slow_storage import SlowStorage, slow_iter


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

