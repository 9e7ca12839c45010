"""Echo stages, and the shuffle buffer's size after them (hasten.echo.stages)."""

from itertools import groupby

import pytest
import torch

from hasten.echo import (AutoEcho, EchoCounters, auto_shuffle_buffer, default_shuffle_buffer, echo_batches, echo_copies,
                         echo_examples, shuffle_buffer)


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


def test_batch_echo_repeats_whole_dataloader_batches():
    data = torch.utils.data.TensorDataset(torch.arange(40).float(), torch.arange(40))
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    counters = EchoCounters()
    out = list(echo_batches(loader, 2, counters=counters))
    assert len(out) == 10 and counters.fresh_batches == 5
    for a, b in zip(out[::2], out[1::2]):
        assert torch.equal(a[1], b[1])
    assert sorted(torch.cat([b[1] for b in out[::2]]).tolist()) == list(range(40))


def test_grouped_batch_echo_repeats_whole_optimizer_steps_with_their_micro_batches_distinct():
    # Gradient accumulation over 2 micro-batches: group=2 echoes the step's pair, b0 b1 b0 b1,
    # so each step (2 consecutive batches) holds two different batches and is repeated whole.
    data = torch.utils.data.TensorDataset(torch.arange(56).float(), torch.arange(56))
    loader = torch.utils.data.DataLoader(data, batch_size=8)  # 7 batches: the last run is short
    counters = EchoCounters()
    out = [y[0].item() // 8 for _, y in echo_batches(loader, 2, group=2, counters=counters)]
    assert out == [0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5, 6, 6]
    steps = [out[i:i + 2] for i in range(0, 12, 2)]
    assert all(a != b for a, b in steps)
    assert steps[0::2] == steps[1::2]  # every step's data is seen again in the next step
    assert counters.fresh_batches == 7
    # group=1 is the batch echo of before: under accumulation a step's micro-batches are copies
    assert [y[0].item() // 8 for _, y in echo_batches(loader, 2)][:4] == [0, 0, 1, 1]
    # non-integral e draws copies per run: each run is repeated whole, 2 or 3 times
    out = list(echo_batches(range(40), 2.5, group=4, seed=3))
    chunks = [out[i:i + 4] for i in range(0, len(out), 4)]
    assert all(c == list(range(c[0], c[0] + 4)) and c[0] % 4 == 0 for c in chunks)
    copies = [sum(c[0] == 4 * k for c in chunks) for k in range(10)]
    assert set(copies) == {2, 3} and [c[0] for c in chunks] == sorted(c[0] for c in chunks)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="group must be an integer >= 1"):
            echo_batches(range(4), 2, group=bad)


def test_grouped_echo_with_autoecho_repeats_whole_runs_at_its_factor():
    # A run of 3 batches echoed twice at AutoEcho's e = 2: the run, then the run again.
    auto = AutoEcho()
    auto.factor = 2.0
    assert list(echo_batches(range(6), auto, group=3)) == [0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5]


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


def _hand_buffer(e, batch, rate):
    # (e - 1) * B / (4 * rate), rounded up: the docstring's formula written out again.
    k = (e - 1) * batch / (4 * rate)
    return int(k) + (k != int(k))


@pytest.mark.parametrize("e,batch", [(2.0, 32), (4.0, 64), (6.0, 64), (8.0, 16)])
def test_default_buffer_keeps_measured_duplicates_near_one_percent(e, batch):
    from hasten.echo import default_shuffle_buffer, expected_duplicate_rate

    size = default_shuffle_buffer(e, batch)
    assert size == _hand_buffer(e, batch, 0.01)
    fresh = 60 * size // int(e)  # many buffer lengths: the start and the final flush weigh little
    items = list(shuffle_buffer(echo_examples(range(fresh), e), size, seed=3))
    measured = within_batch_duplicate_rate(items, batch)
    assert 0.005 < measured < 0.015, measured
    assert expected_duplicate_rate(size, e, batch) == pytest.approx(measured, rel=0.3)
    # A buffer a quarter the size: four times the duplicates, as the formula says.
    small = list(shuffle_buffer(echo_examples(range(fresh), e), size // 4, seed=3))
    assert within_batch_duplicate_rate(small, batch) == pytest.approx(4 * measured, rel=0.3)


def test_default_buffer_is_zero_without_echo_and_validates():
    from hasten.echo import default_shuffle_buffer

    assert default_shuffle_buffer(1.0, 64) == 0
    assert default_shuffle_buffer(5.0, 64) == 6400  # the probe: 8,192 gave 0.8% duplicates
    for bad in [(0.5, 64), (2.0, 0), (2.0, 1.5)]:
        with pytest.raises(ValueError):
            default_shuffle_buffer(*bad)


def test_small_buffer_warns_and_default_does_not():
    import warnings

    from hasten.echo import default_shuffle_buffer, warn_if_small_buffer

    with pytest.warns(UserWarning, match=r"about 2\d% of each batch.*use about 6400"):
        assert warn_if_small_buffer(256, 5.0, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not warn_if_small_buffer(default_shuffle_buffer(5.0, 64), 5.0, 64)
        assert not warn_if_small_buffer(0, 1.0, 64)  # nothing to spread without echoing


# --- Reference values written independently of the implementation ---------------------------

_M64 = (1 << 64) - 1


def _splitmix64_ref(x):
    """SplitMix64's output for state x (Steele, Lea, Flood 2014; Vigna's reference C code)."""
    z = (x + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _copies_ref(e, seed, epoch, index):
    """floor(e) + [u < e - floor(e)], u the documented counter hash of (seed, epoch, index)."""
    whole = int(e // 1)
    frac = e - whole
    u = _splitmix64_ref(_splitmix64_ref(_splitmix64_ref(seed) ^ epoch) ^ index) / 2.0**64
    return whole + (1 if u < frac else 0)


def test_reference_splitmix64_matches_the_published_test_vectors():
    # The first three outputs of SplitMix64 seeded with 0, as printed by the reference C code:
    # they check the test's reference hash (and so every test below that uses it).
    gamma = 0x9E3779B97F4A7C15
    assert [_splitmix64_ref(k * gamma & _M64) for k in range(3)] == [
        0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def test_copy_counts_are_the_documented_hash_of_seed_epoch_and_index():
    for e in (1.3, 2.5, 3.75):
        for seed, epoch in [(0, 0), (7, 0), (0, 3), (123456789, 2**40 + 5)]:
            got = [echo_copies(e, seed=seed, epoch=epoch, index=i) for i in range(64)]
            assert got == [_copies_ref(e, seed, epoch, i) for i in range(64)], (e, seed, epoch)


def test_the_extra_copy_is_drawn_with_u_strictly_below_the_fraction():
    # With u uniform on [0, 1), "one more if u < frac" has probability frac exactly; u == frac
    # must not add a copy. Pick an index and a factor whose fraction equals that index's u.
    for i in range(64):
        u = _splitmix64_ref(_splitmix64_ref(_splitmix64_ref(0) ^ 0) ^ i) / 2.0**64
        e = 1.0 + u
        if e - 1.0 == u and u > 0.5:
            break
    else:
        pytest.fail("no index with an exactly representable 1 + u")
    assert echo_copies(e, seed=0, epoch=0, index=i) == 1
    # and a hair above u the copy is added
    assert echo_copies(e + 2**-52, seed=0, epoch=0, index=i) == 2


def _counts(stream):
    return runs(stream)  # consecutive copies of distinct items


@pytest.mark.parametrize("e", [2.5, 1.5])
def test_stage_copy_counts_follow_the_hash_of_each_fresh_items_index(e):
    n = 200
    expect = [_copies_ref(e, 0, 0, i) for i in range(n)]
    # The defaults are seed 0, epoch 0 (documented in the signatures).
    assert _counts(echo_examples(range(n), e)) == expect
    assert _counts(echo_examples(range(n), e, seed=9, epoch=4)) == [_copies_ref(e, 9, 4, i) for i in range(n)]
    batches = [torch.full((2,), i) for i in range(n)]
    out = list(echo_batches(batches, e))
    assert _counts([int(b[0]) for b in out]) == expect
    out = list(echo_batches(batches, e, seed=9, epoch=4))
    assert _counts([int(b[0]) for b in out]) == [_copies_ref(e, 9, 4, i) for i in range(n)]


def test_factor_one_is_valid_and_passes_the_stream_through():
    from hasten.echo.stages import check_factor

    assert check_factor(1) == 1 and check_factor(1.0) == 1.0
    c = EchoCounters()
    assert list(echo_examples(range(10), 1, counters=c)) == list(range(10))
    assert (c.fresh_examples, c.items_emitted, c.fresh_batches) == (10, 10, 0)
    c = EchoCounters()
    assert list(echo_batches(range(10), 1, counters=c)) == list(range(10))
    assert (c.fresh_batches, c.fresh_examples, c.items_emitted) == (10, 0, 0)


def test_check_variant_accepts_the_three_variants_and_names_them_when_rejecting():
    from hasten.echo.stages import check_variant

    for v in ("example-before", "example-after", "batch"):
        assert check_variant(v) == v
    with pytest.raises(ValueError, match="'examples'; accepted: example-before, example-after, batch$"):
        check_variant("examples")


class _FakeClock:
    """A host clock that moves only when the test says so."""

    def __init__(self):
        self.t = 1000.0

    def perf_counter(self):
        return self.t


class _RecordingAuto:
    """An AutoEcho that records each window the stage reports and then switches to ``next``."""

    @staticmethod
    def make(interval, factor, then):
        from hasten.echo import AutoEcho

        class Recording(AutoEcho):
            def observe(self, fresh, emitted, wait_s, downstream_s):
                self.windows_seen.append((fresh, emitted, wait_s, downstream_s))
                self.factor = then
                return then

        auto = Recording(e_max=8, interval=interval)
        auto.windows_seen = []
        auto.factor = factor
        return auto


def test_stage_reports_each_windows_fresh_emitted_wait_and_downstream_time_to_autoecho(monkeypatch):
    import hasten.echo.stages as stages

    clock = _FakeClock()
    monkeypatch.setattr(stages, "time", clock)
    upstream_s = [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0]  # powers of two: exact sums

    def upstream():
        for i, u in enumerate(upstream_s):
            clock.t += u  # the upstream takes u to produce item i
            yield i

    auto = _RecordingAuto.make(interval=3, factor=2.0, then=3.0)
    c = EchoCounters()
    out = []
    for item in echo_examples(upstream(), auto, counters=c):
        out.append(item)
        clock.t += 0.125 * len(out)  # the k-th emitted item takes k/8 downstream
    # e = 2 for the first window's three items; the new e = 3 from the next fresh item on.
    assert out == [0, 0, 1, 1, 2, 2, 3, 3, 3, 4, 4, 4, 5, 5, 5, 6, 6, 6]
    down = [0.125 * k for k in range(1, 19)]
    # Window 1: items 0-2 (emitted 1-6); window 2: items 3-5 (emitted 7-15); item 6 starts a third.
    assert auto.windows_seen == [
        (3, 6, pytest.approx(3.5), pytest.approx(sum(down[0:6]))),
        (3, 9, pytest.approx(28.0), pytest.approx(sum(down[6:15]))),
    ]
    assert c.upstream_wait_s == pytest.approx(sum(upstream_s))
    assert c.downstream_s == pytest.approx(sum(down))
    assert (c.fresh_examples, c.items_emitted) == (7, 18)


def test_stage_reports_windows_of_exactly_interval_fresh_batches(monkeypatch):
    import hasten.echo.stages as stages

    clock = _FakeClock()
    monkeypatch.setattr(stages, "time", clock)

    def upstream():
        for i in range(4):
            clock.t += 1.0
            yield i

    auto = _RecordingAuto.make(interval=2, factor=3.0, then=3.0)
    c = EchoCounters()
    for _ in echo_batches(upstream(), auto, counters=c):
        clock.t += 0.25
    assert auto.windows_seen == [(2, 6, 2.0, 1.5), (2, 6, 2.0, 1.5)]
    assert (c.fresh_batches, c.upstream_wait_s, c.downstream_s) == (4, 4.0, 3.0)


def test_default_shuffle_buffer_validates_with_clear_messages():
    from hasten.echo import default_shuffle_buffer

    assert default_shuffle_buffer(5.0, 1) == 100  # ceil(4 * 1 / 0.04): a batch of one is valid
    assert default_shuffle_buffer(3.0, 64, duplicate_rate=0.5) == 64  # ceil(2 * 64 / 2)
    with pytest.raises(ValueError, match="echo factor must be a number >= 1; got 0.5"):
        default_shuffle_buffer(0.5, 64)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1; got 0"):
        default_shuffle_buffer(2.0, 0)
    for rate in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match=r"duplicate_rate must be in \(0, 1\); got"):
            default_shuffle_buffer(2.0, 64, duplicate_rate=rate)


def test_expected_duplicate_rate_matches_the_hand_computed_formula():
    import math

    from hasten.echo.stages import expected_duplicate_rate

    assert expected_duplicate_rate(64, 1.0, 32) == 0.0  # no copies, no duplicates
    assert expected_duplicate_rate(0, 1.0, 32) == 0.0
    # size 0 or 1: copies stay adjacent; a pair shares a batch unless split by a boundary, p = 1 - 1/B.
    assert expected_duplicate_rate(0, 2.0, 4) == pytest.approx(1 * 0.75 / 2)
    assert expected_duplicate_rate(1, 2.0, 4) == pytest.approx(1 * 0.75 / 2)
    # size 2: p = 1 - (K/B)(1 - exp(-B/K)) with K = 2, B = 4.
    assert expected_duplicate_rate(2, 2.0, 4) == pytest.approx((1 - 0.5 * (1 - math.exp(-2))) / 2)
    # At most (e - 1)/e of the items can be repeats: e = 8, adjacent copies, B = 64.
    assert expected_duplicate_rate(0, 8.0, 64) == pytest.approx(7 / 8)


def test_small_buffer_warning_threshold_and_where_it_points():
    import math
    import warnings

    from hasten.echo import warn_if_small_buffer
    from hasten.echo.stages import expected_duplicate_rate

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # e = 2 with adjacent copies: half the batch are repeats; must warn even at e = 2.
        with pytest.raises(UserWarning):
            warn_if_small_buffer(0, 2.0, 64)
        # Exactly 4x the default share (4%) does not warn: only more than that does.
        e = 1 + 0.08 * 13 / 12  # (e - 1) * (1 - 1/13) / 2 = 0.04
        assert expected_duplicate_rate(0, e, 13) == 0.04
        assert not warn_if_small_buffer(0, e, 13)
        # K = 355, B = 64, e = 2: (1 - (K/B)(1 - exp(-B/K))) / 2 = 4.25%, between 4% and 5%: warns.
        rate = (1 - (355 / 64) * (1 - math.exp(-64 / 355))) / 2
        assert 0.04 < rate < 0.05
        with pytest.raises(UserWarning):
            warn_if_small_buffer(355, 2.0, 64)

    def location(**kw):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warn_if_small_buffer(256, 5.0, 64, **kw)
        assert len(caught) == 1
        return caught[0].filename, caught[0].lineno

    # stacklevel counts from the caller of warn_if_small_buffer, as warnings.warn's does from its
    # own: the default is 2 (the caller's caller), and each level moves the warning one frame out.
    # (Relative checks only: a test harness may add frames between the caller and the function.)
    assert location() == location(stacklevel=2)
    def f1(k):
        return location(stacklevel=k)

    def f2(k):
        return f1(k)

    def f3(k):
        return f2(k)

    # Levels 4, 5, 6 land on three different frames of this chain (whatever a harness adds).
    assert len({f3(4), f3(5), f3(6)}) == 3


def test_the_echo_stage_reads_its_clock_per_fresh_item_not_per_copy(monkeypatch):
    # Per-copy clock reads were a measurable share of a short step at e = 1; two per fresh
    # item (plus one at the start) are enough for the wait and the downstream time.
    import hasten.echo.stages as stages

    reads = []
    real = stages.time.perf_counter

    class Clock:
        @staticmethod
        def perf_counter():
            reads.append(1)
            return real()

    monkeypatch.setattr(stages, "time", Clock)
    c = EchoCounters()
    out = list(echo_examples(range(10), 3, counters=c))
    assert len(out) == 30 and c.items_emitted == 30 and c.fresh_examples == 10
    assert len(reads) <= 2 * 10 + 1, len(reads)


def test_auto_shuffle_buffer_grows_with_the_factor_and_never_shrinks():
    auto = AutoEcho(e_max=8)
    size = auto_shuffle_buffer(auto, 64)
    assert size() == 0
    auto.factor = 3.0
    assert size() == default_shuffle_buffer(3.0, 64)
    # A shrinking buffer hands its surplus to the loop, which then does not wait, and AutoEcho
    # lowers e again: e fell to 1 at R = 3.75 (test_echo_auto.py's modelled pipeline).
    auto.factor = 1.0
    assert size() == default_shuffle_buffer(3.0, 64)
    auto.factor = 4.0
    assert size() == default_shuffle_buffer(4.0, 64)
    with pytest.raises(ValueError, match="batch_size"):
        auto_shuffle_buffer(auto, 0)
