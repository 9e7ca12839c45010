""""Prepare the data once" only where it fits, marked where it changes the math, and below a fix --verify can
measure when that one's prediction is within its uncertainty (issue 32, item 5).

pytorch/examples' regression draws fresh random features in get_batch() (a set made once is other data);
ng-video-lecture's bigram slices a tensor it made once already (advice to do what it does). The fixed set of
batches is predicted as what it does (issue 43): small enough to be reused in a run of known length, each step
paying a kept batch's measured hand-out, the set's making paid once."""

import sys
import textwrap
from pathlib import Path

import pytest
import torch

from hasten.profile.inject.batch_fn import kind_of
from hasten.profile.inject.batch_shape import IN_MEMORY_ROWS, function_shape
from hasten.profile.launcher import ProfileConfig, profile
from hasten.profile.prepare_once import MIN_POOL, POOL, REUSE, pool_size
from hasten.profile.ranking import rerank
from hasten.profile.records import Recommendation
from hasten.profile.resident_fix import MEMORY_SHARE
from hasten.profile.verdict import analyse

SCRIPTS = Path(__file__).parent / "profile_scripts"


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


def _rank(shape, handout_s=0.0005, **run):
    """nanoGPT's tiny context's 70 ms step (20 ms making the batch, 18 of it CPU) with the batch function's
    ``shape``, a kept batch's hand-out as measured, and what the run's report says of its end (``run``)."""
    from test_profile_advice import _tiny_context_rank
    rank = _tiny_context_rank(prepared=False, per_row=False)
    rank["batch_fn"] = shape
    rank["loader_probe"] = {} if handout_s is None else {"handout_s": handout_s}
    return {**rank, **run}


DRAWS = {"name": "get_batch", "draws_values": True, "in_memory": []}


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
    from hasten.profile.inject.batch_fn import pooled
    a = analyse([_rank(DRAWS)], cpus={"available": 2.0})
    fixed = next(r for r in a.recommendations if r.fix.startswith("make a fixed set"))
    kind, n = kind_of(fixed.apply)
    assert kind == "pool" and f"range({n})" in fixed.how
    calls = []

    def get_batch(split):
        calls.append(split)
        return torch.full((2,), float(len(calls)))

    fn = pooled(get_batch, 3)
    assert fn("train")[0].item() == 1 and len(calls) == 3  # the whole set made at the first call, before its steps
    out = [fn("train")[0].item() for _ in range(6)]
    assert out == [2, 3, 1, 2, 3, 1] and len(calls) == 3  # then handed out in turn
    assert fn("val")[0].item() == 4  # other arguments, a set of their own
    first = fn("train")
    first += 100  # the loop changes its batch in place: the kept one stays
    assert fn("train")[0].item() == 3


def _fixed_set(a):
    """The fixed-set fix: ("recommended", its Recommendation) or ("rejected", its entry)."""
    for r in a.recommendations:
        if r.fix.startswith("make a fixed set"):
            return "recommended", r
    return "rejected", next(r for r in a.rejected if r["fix"].startswith("make a fixed set"))


def test_in_a_run_of_known_length_the_fixed_set_is_reused_and_its_making_is_paid_in_the_run():
    # pytorch/examples' regression ended on its own after 529 steps: a set of 1024 was never used twice, and its
    # verification measured only the set's making (predicted x1.26, the data-free bound; verified x0.91: issue 43)
    a = analyse([_rank(DRAWS, handout_s=0.002, ended_early=True, steps_seen=300)], cpus={"available": 2.0})
    where, fix = _fixed_set(a)
    n = kind_of(fix.apply)[1]
    assert where == "recommended" and MIN_POOL <= n <= 300 // 4
    assert f"{n} distinct batches" in fix.fix and "300 steps" in fix.fix and f"range({n})" in fix.how
    assert fix.changes_math and f"{n} distinct batches" in fix.math_note
    step, free, making = 0.070, 0.050, 0.020  # the rank's step, with its data made free, and making its batch
    fill = n * making / 300  # making the set, shared over the run
    assert fix.predicted_speedup == pytest.approx(step / (free + 0.002 + fill), rel=1e-3)
    # --verify times the steps after the set is made (in a warm-up step): the making's share of the run is the
    # factor that its measured step rate is multiplied by
    assert fix.step_rate_factor == pytest.approx((free + 0.002) / (free + 0.002 + fill), rel=1e-3)
    assert "a kept batch takes 2.00 ms a step (measured" in fix.basis


def test_in_a_run_cut_by_the_window_the_fixed_set_is_predicted_at_its_steady_state_and_says_so():
    a = analyse([_rank(DRAWS, handout_s=0.002)], cpus={"available": 2.0})
    where, fix = _fixed_set(a)
    assert where == "recommended" and fix.step_rate_factor == 1.0
    assert fix.predicted_speedup == pytest.approx(0.070 / (0.050 + 0.002), rel=1e-3)  # not the data-free x1.40
    assert "the steady state once the set is made" in fix.basis


@pytest.mark.parametrize("handout_s", [0.020, 0.030])
def test_a_batch_no_dearer_to_make_than_to_copy_is_not_recommended_a_fixed_set(handout_s):
    a = analyse([_rank(DRAWS, handout_s=handout_s)], cpus={"available": 2.0})
    where, fix = _fixed_set(a)
    assert where == "rejected" and fix["predicted_speedup"] <= 1.0
    assert (f"handing out a kept batch takes {handout_s * 1e3:.1f} ms a step (measured), at least the 20.0 ms of "
            "making it") in fix["why"]


def test_a_fixed_set_whose_hand_out_was_not_measured_is_not_predicted():
    a = analyse([_rank(DRAWS, handout_s=None)], cpus={"available": 2.0})
    where, fix = _fixed_set(a)
    assert where == "rejected" and fix["predicted_speedup"] is None
    assert fix["why"].startswith("not predicted: what handing out a kept batch costs")


def test_the_fixed_set_is_reused_in_a_run_of_known_length_and_fits_in_memory():
    memory = 8 * 2**30
    assert pool_size(None, None, memory) == POOL
    for calls in (40, 300, 529, 10_000):
        n = pool_size(calls, None, memory)
        assert MIN_POOL <= n <= POOL and (n * REUSE <= calls or n == MIN_POOL)
    assert pool_size(None, 2**30, memory) * 2**30 <= MEMORY_SHARE * memory


def test_the_hand_out_probe_times_handing_out_a_copy_of_the_batch_functions_result():
    from types import SimpleNamespace

    from hasten.profile.inject import probes
    st = SimpleNamespace(batch_fn_result=(torch.zeros(32, 4), torch.zeros(32, 1)), loader_probe={}, device="cpu")
    probes.handout(st)
    assert st.loader_probe["handout_s"] > 0 and st.loader_probe["batch_fn_bytes"] == 32 * 5 * 4
    none = SimpleNamespace(batch_fn_result=None, loader_probe={}, device="cpu")
    probes.handout(none)
    assert none.loader_probe == {}  # no batch function timed: no fixed set to predict


def test_a_regression_like_run_names_a_set_it_reuses_and_its_measured_hand_out():
    # pytorch/examples' regression, smaller: random features drawn in get_batch(), 300 steps, then it exits
    cmd = (sys.executable, str(SCRIPTS / "short_run.py"), "--steps", "300",
           "--batch-sleep", "0", "--draws-per-row", "500")
    a = profile(ProfileConfig(cmd, warmup=3, steps=1000, capture=True, timeout_s=300), log=lambda m: None)
    assert a.ended_early
    _, fix = _fixed_set(a)
    fix = fix if isinstance(fix, dict) else vars(fix)
    n = kind_of(fix["apply"])[1]
    assert MIN_POOL <= n <= 300 // REUSE and f"{n} distinct batches" in fix["fix"]
    handout_ms = float(fix["basis"].split("handing out a kept batch takes ")[1].split(" ms")[0])
    assert handout_ms > 0
