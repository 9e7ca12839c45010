""""Prepare the data once" only where it fits, marked where it changes the math, and below a fix --verify can
measure when that one's prediction is within its uncertainty (issue 32, item 5).

pytorch/examples' regression draws fresh random features in get_batch() (a set made once is other data);
ng-video-lecture's bigram slices a tensor it made once already (advice to do what it does)."""

import textwrap

import pytest
import torch

from hasten.profile.inject.batch_shape import IN_MEMORY_ROWS, function_shape
from hasten.profile.ranking import rerank
from hasten.profile.records import Recommendation
from hasten.profile.verdict import analyse


def _function(tmp_path, source: str, **globals_):
    """A function defined in a file (its source is read back as the profile reads a script's)."""
    path = tmp_path / f"script_{abs(hash(source))}.py"  # one file per source: the profile caches what it parsed
    path.write_text(textwrap.dedent(source))
    scope = {"__name__": "script", "torch": torch, **globals_}
    exec(compile(path.read_text(), str(path), "exec"), scope)
    return scope["get_batch"]


REGRESSION = """
def get_batch(batch_size=32):
    random = torch.randn(batch_size)
    x = make_features(random)
    y = f(x)
    return x, y
"""
BIGRAM = """
def get_batch(split):
    data = train_data if split == 'train' else val_data
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([data[i:i+block_size] for i in ix])
    y = torch.stack([data[i+1:i+block_size+1] for i in ix])
    return x, y
"""


def test_a_batch_function_that_draws_its_values_is_told_apart_from_one_that_indexes_data_in_memory(tmp_path):
    reg = function_shape(_function(tmp_path, REGRESSION))
    assert reg["draws_values"] and not reg["in_memory"]
    big = torch.zeros(IN_MEMORY_ROWS, dtype=torch.long)
    bigram = function_shape(_function(tmp_path, BIGRAM, train_data=big, val_data=big[:100], block_size=8,
                                      batch_size=4))
    assert not bigram["draws_values"] and bigram["in_memory"] == ["train_data"]  # randint draws indices
    small = function_shape(_function(tmp_path, BIGRAM, train_data=big[:100], val_data=big[:10], block_size=8,
                                     batch_size=4))
    assert small["in_memory"] == []


def _rank(shape, interval_low=None):
    from test_profile_advice import _tiny_context_rank
    rank = _tiny_context_rank(prepared=False, per_row=False)
    rank["batch_fn"] = shape
    return rank


def test_data_drawn_fresh_each_call_is_offered_a_fixed_set_that_says_it_changes_the_math():
    a = analyse([_rank({"name": "get_batch", "draws_values": True, "in_memory": []})], cpus={"available": 2.0})
    fixed = next(r for r in a.recommendations if r.fix.startswith("make a fixed set"))
    assert fixed.changes_math and "draws random values" in fixed.basis
    assert not any(r.fix.startswith("prepare the data once") for r in a.recommendations)
    compile(fixed.how, "<fixed set>", "exec")


def test_data_already_in_memory_is_not_told_to_be_prepared():
    a = analyse([_rank({"name": "get_batch", "draws_values": False, "in_memory": ["train_data"]})],
                cpus={"available": 2.0})
    assert not any("once" in r.fix for r in a.recommendations + [type("R", (), x) for x in a.rejected])
    b = analyse([_rank({"name": "get_batch", "draws_values": False, "in_memory": []})], cpus={"available": 2.0})
    prep = next(r for r in b.recommendations if r.fix.startswith("prepare the data once"))
    assert not prep.changes_math and prep.low is not None and prep.low <= prep.predicted_speedup


def _analysis_with(recs):
    a = analyse([_rank({})], cpus={"available": 2.0})
    a.recommendations, a.rejected = recs, []
    return a


@pytest.mark.parametrize("workers_pred, first", [(1.30, "make batches"), (1.10, "prepare")])
def test_a_fix_verify_can_apply_goes_first_when_its_prediction_reaches_the_unverifiable_ones_low_end(
        workers_pred, first):
    prepare = Recommendation(fix="prepare the data once", how="", predicted_speedup=1.45, basis="",
                             changes_math=False, low=1.25)
    workers = Recommendation(fix="make batches in a DataLoader with 2 workers", how="",
                             predicted_speedup=workers_pred, basis="", changes_math=False, apply="batch_fn=workers:2")
    a = _analysis_with([prepare, workers])
    rerank(a)
    assert a.recommendations[0].fix.startswith(first)
    if first == "make batches":
        assert "within its uncertainty, and --verify can measure this one" in a.recommendations[0].basis


def test_the_fixed_set_is_verifiable_and_hands_out_its_batches_in_turn():
    from hasten.profile.inject.batch_fn import kind_of, pooled
    a = analyse([_rank({"name": "get_batch", "draws_values": True, "in_memory": []})], cpus={"available": 2.0})
    fixed = next(r for r in a.recommendations if r.fix.startswith("make a fixed set"))
    kind, n = kind_of(fixed.apply)
    assert kind == "pool" and f"range({n})" in fixed.how
    calls = []

    def get_batch(split):
        calls.append(split)
        return torch.full((2,), float(len(calls)))

    fn = pooled(get_batch, 3)
    out = [fn("train")[0].item() for _ in range(7)]
    assert out == [1, 2, 3, 1, 2, 3, 1] and len(calls) == 3  # made once, then in turn
    assert fn("val")[0].item() == 4  # other arguments, a set of their own
    first = fn("train")
    first += 100  # the loop changes its batch in place: the kept one stays
    assert fn("train")[0].item() == 3
