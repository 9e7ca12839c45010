"""AutoEcho against an upstream whose items arrive a shard at a time (hasten.echo.auto,
hasten.echo.factor_rule): the bursty arrival seen on the real source (issue 44).

On the real link at a nominal R of 1 (docs/results/echo-link.md) the loop waited 6-9% of
the time at e = 1: whole shards arrive at once, then a gap. Windows of four steps then read
R above 1.25 and the rule of one window (the median of three) echoed, mean e 1.31-1.94, and
at R = 2 it settled at 2.15-2.48. The model here: shards of 32 items (half a batch, as 128
images are of a batch of 256), each shard's gap drawn from a gamma distribution with a
coefficient of variation of 1 around the mean rate, at most 8 shards read ahead (a loader's
read-ahead and shuffle buffer), then the echo stage, ``auto_shuffle_buffer``, batches of 64
and a loop that reports each step; every second modelled, the gaps from a seeded generator.
At R = 1 it waits 7% of the time at e = 1, as the real source did.
"""

import random
from collections import deque

import pytest

from hasten.echo import AutoEcho, auto_shuffle_buffer, echo_examples, shuffle_buffer
from hasten.echo.auto import HEADROOM

BATCH, SHARD, LEAD_SHARDS, STEP_S, STEPS = 64, 32, 8, 0.008, 1000


class ShardArrivals:
    """Fresh items on a modelled clock, a shard at a time: shard k is ready ``gap_k`` after
    shard k - 1 (or after a read-ahead slot frees: the consumer took the first item of shard
    k - ``LEAD_SHARDS``); its items are all there at once. Gaps: gamma, mean ``SHARD x
    per_item_s``, coefficient of variation ``cv``."""

    def __init__(self, per_item_s: float, cv: float, seed: int):
        self.mean_gap = SHARD * per_item_s
        self.shape = 1 / cv**2
        self.rng = random.Random(seed)
        self.now = 0.0
        self.waited = 0.0
        self._ready = 0.0
        self._taken = deque(maxlen=LEAD_SHARDS)  # when the consumer took each recent shard's first item

    def items(self):
        j = 0
        while True:
            if j % SHARD == 0:
                slot = self._taken[0] if len(self._taken) == LEAD_SHARDS else 0.0
                self._ready = max(self._ready, slot) + self.rng.gammavariate(self.shape, self.mean_gap / self.shape)
                wait = max(0.0, self._ready - self.now)
                self.now += wait
                self.waited += wait
                self._taken.append(self.now)
            yield j
            j += 1


def bursty_pipeline(ratio: float, seed: int, cv: float = 1.0, factor=None, value: float | None = None,
                    steps: int = STEPS):
    """``steps`` steps behind ``ShardArrivals`` at ``ratio`` step times per batch, with
    AutoEcho (or a fixed ``factor``); the factor in force at each step, the share of time
    waiting, and how many steps ``value_due()`` asked to measure the repeat value. With
    ``value``: each measurement reports gradient dots of a repeat worth ``value``, noisy as
    a small batch's are (each dot with a standard deviation of 0.3 |grad L|^2: blocks of
    four spread as the real source's, 0.5-0.9)."""
    arrivals = ShardArrivals(ratio * STEP_S / BATCH, cv, seed)
    noise = random.Random(seed + 100)
    auto = AutoEcho(interval=4 * BATCH) if factor is None else None
    stage = echo_examples(arrivals.items(), auto or factor, clock=lambda: arrivals.now)
    items = shuffle_buffer(stage, auto_shuffle_buffer(auto, BATCH) if auto else 0, seed=seed)
    if auto:
        auto.expect_step_reports()
    factors, measured = [], 0
    for _ in range(steps):
        t0 = arrivals.now
        for _ in range(BATCH):
            next(items)
        if auto and auto.value_due():
            measured += 1
            if value is not None:
                auto.report_repeat_gradients(value + noise.gauss(0, 0.3), 1 + noise.gauss(0, 0.3))
        arrivals.now += STEP_S
        if auto:
            auto.record_step(arrivals.now - t0 - STEP_S, STEP_S, BATCH)
        factors.append(auto.factor if auto else factor)
    return auto, factors, arrivals.waited / arrivals.now, measured


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bursts_at_r_1_leave_e_at_exactly_one_and_measure_nothing(seed):
    # Echoing cannot pay at R = 1: the waits are bursts around a mean the upstream keeps up
    # with, yet e = 1 waits as it did on the real source (6-9% of the time there). The rule
    # of one window echoed here (mean e 1.05-1.13).
    assert 0.05 <= bursty_pipeline(1.0, seed, factor=1.0)[2] <= 0.10
    auto, factors, _, measured = bursty_pipeline(1.0, seed)
    assert auto.windows > 100
    assert set(factors) == {1.0}, (sum(factors) / len(factors), auto.history[:12])
    assert measured == 0 and auto.probes == 0


@pytest.mark.parametrize("ratio", [2.0, 4.0])
def test_bursts_at_a_sustained_r_leave_e_about_r_not_above(ratio):
    # The same bursts around a sustained R = 2 or 4: over three seeds e averages within 10% of
    # R, and each seed's second half within 15% (the rule of one window: 2.24 and 4.46 on
    # average, 2.35 and 5.01 in a second half).
    means, lates = [], []
    for seed in range(3):
        auto, factors, _, _ = bursty_pipeline(ratio, seed)
        means.append(sum(factors) / len(factors))
        late = factors[len(factors) // 2:]
        lates.append(sum(late) / len(late))
    assert 0.9 * ratio <= sum(means) / len(means) <= 1.1 * ratio, means
    assert all(0.85 * ratio <= m <= 1.15 * ratio for m in lates), lates


@pytest.mark.parametrize("ratio", [2.0, 4.0])
def test_repeats_measured_to_be_worth_much_lift_e_above_r_within_the_headroom(ratio):
    # Repeats worth 0.85 of a fresh example (0.63-0.86 on the real source): a copy above R
    # costs a step little and absorbs the bursts, so e runs above R^ by up to HEADROOM once
    # the value is measured. The rule without headroom sat at R (mean e 1.72 at R = 2 on the
    # real source, against an idle share of 0.17 where e = 4 had 0.09).
    means, lates = [], []
    for seed in range(3):
        auto, factors, _, _ = bursty_pipeline(ratio, seed, value=0.85)
        assert auto.measured_value is not None and auto.measured_value > 0.7
        means.append(sum(factors) / len(factors))
        late = factors[len(factors) // 2:]
        lates.append(sum(late) / len(late))
    assert 1.1 * ratio <= sum(means) / len(means) <= (1 + HEADROOM) * 1.1 * ratio, means
    assert all(1.1 * ratio <= m <= (1 + HEADROOM) * 1.15 * ratio for m in lates), lates


@pytest.mark.parametrize("ratio", [2.0, 4.0])
def test_repeats_measured_to_be_worth_little_keep_e_at_r(ratio):
    # Repeats worth 0.45 (mostly memorised): a copy above R is not worth its step; no headroom.
    means = []
    for seed in range(3):
        auto, factors, _, _ = bursty_pipeline(ratio, seed, value=0.45)
        assert auto.measured_value is not None and auto.measured_value < 0.65
        means.append(sum(factors) / len(factors))
    assert 0.9 * ratio <= sum(means) / len(means) <= 1.1 * ratio, means


def test_the_repeat_value_is_measured_within_a_short_run_and_rarely_after():
    # A 700-step run at R = 4 (the real source's runs took 600-750 steps to the target): the
    # value counts within the first 200 steps, and the runs measure 22 times each on average
    # at most (19-21 here; measuring every 16 steps while e > 1 and backing off only on
    # blocks within 0.05 of the median took 24-27, each of a whole batch's items).
    counts = []
    for seed in range(3):
        auto, _, _, _ = bursty_pipeline(4.0, seed, value=0.85, steps=200)
        assert auto.measured_value is not None
        auto, _, _, measured = bursty_pipeline(4.0, seed, value=0.85, steps=700)
        counts.append(measured)
    assert all(c >= 3 * 4 for c in counts) and sum(counts) <= 22 * len(counts), counts
