"""Echo stages and the shuffle buffer (hasten.echo.stages)."""

from itertools import groupby

import pytest
import torch

from hasten.echo import EchoCounters, echo_batches, echo_copies, echo_examples, shuffle_buffer


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
