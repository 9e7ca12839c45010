"""Pipeline counters and the timed training-loop wrapper (hasten.echo.counters)."""

import time

from hasten.echo import EchoCounters, timed_loader


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


def test_counters_on_known_batches_and_times():
    c = EchoCounters(loader_wait_s=1.0, step_time_s=3.0)
    c.record_batch([1, 2, 2, 3])
    c.record_batch([4, 4, 4, 4])
    assert c.examples_in_batches == 8 and c.duplicates_in_batches == 4
    assert c.duplicate_rate == 0.5 and c.idle_fraction == 0.25
    assert c.as_dict()["duplicate_rate"] == 0.5 and c.as_dict()["idle_fraction"] == 0.25
    assert EchoCounters().duplicate_rate == 0.0 and EchoCounters().idle_fraction == 0.0
