"""Time outside the compute hooks that is the model, a loss, autograd's backward or an optimizer's step
is compute, never "neither data, compute nor communication" (issue 43: "lines named for time that is
compute")."""

import pytest

from hasten.profile.attribution import MIN_NAMED, compute_samples
from hasten.profile.report import format_report
from hasten.profile.verdict import analyse
from test_profile_verdict import _rank


@pytest.mark.parametrize("code", ["loss = F.cross_entropy(model(x), y)", "optimizer.step()", "loss.backward()",
                                  "logits = self.model(x)", "torch.autograd.backward(losses)", "opt.step()"])
def test_a_line_that_calls_the_model_a_loss_backward_or_a_step_is_compute(code):
    assert compute_samples({"samples": 7, "code": code}) == 7


@pytest.mark.parametrize("code", ["time.sleep(args.pause)", "scheduler.step()", "print(loss.item())",
                                  "torch.save(model.state_dict(), path)", "ema.update(model_path)", ""])
def test_other_lines_stay_the_rest(code):
    assert compute_samples({"samples": 7, "code": code}) == 0


def test_the_samplers_word_wins_over_the_code():
    # the sampler saw 3 of the line's 7 samples with a module's forward, backward or a step on the stack
    assert compute_samples({"samples": 7, "code": "time.sleep(1)", "compute_samples": 3}) == 3
    assert compute_samples({"samples": 7, "code": "optimizer.step()", "compute_samples": 0}) == 0


def _rest_rank(lines):
    """A DataLoader loop of 100 ms steps: 60 ms compute as the hooks saw it, 40 ms neither, sampled on ``lines``."""
    rank = _rank(wait=0.0, work=0.100)
    for r in rank["records"]["measure"]:
        r.update(compute_s=0.060)
    rank["outside"] = {"counts": {"other": sum(x["samples"] for x in lines)}, "batch_found": True,
                       "lines": {"other": lines}}
    return rank


def test_the_verdict_counts_the_models_lines_as_compute_and_names_only_the_rest():
    lines = [{"at": "train.py:50", "code": "loss = F.cross_entropy(model(x), y)", "function": "train", "samples": 30},
             {"at": "train.py:52", "code": "optimizer.step()", "function": "train", "samples": 10},
             {"at": "train.py:60", "code": "time.sleep(args.pause)", "function": "train", "samples": 40}]
    a = analyse([_rest_rank(lines)], cpus={"available": 2.0})
    assert a.other_fraction == pytest.approx(0.40 * 40 / 80)  # half the rest's samples were compute
    assert a.compute_fraction == pytest.approx(1 - a.other_fraction)
    assert [w["at"] for w in a.other_where] == ["train.py:60"]
    assert a.other_where[0]["share"] == pytest.approx(a.other_fraction)
    report = format_report(a)
    assert "optimizer.step()" not in report and "cross_entropy" not in report
    assert "train.py:60 `time.sleep(args.pause)` (neither data, compute nor communication)" in report


def test_the_samplers_compute_lines_count_as_compute():
    # the sampler files samples whose stack was in torch's forward, autograd or an optimizer under "compute",
    # a part of counts["other"] (hasten.profile.inject.sampler): a helper's loss line, whatever its code says
    compute = [{"at": "losses.py:12", "code": "return criterion(out, y)", "function": "loss_of", "samples": 40}]
    rest = [{"at": "train.py:60", "code": "time.sleep(args.pause)", "function": "train", "samples": 40}]
    rank = _rest_rank(rest)
    rank["outside"]["counts"]["other"] += 40
    rank["outside"]["counts"]["compute"] = 40
    rank["outside"]["lines"]["compute"] = compute
    a = analyse([rank], cpus={"available": 2.0})
    assert a.other_fraction == pytest.approx(0.40 * 40 / 80)
    assert [w["at"] for w in a.other_where] == ["train.py:60"]


def test_the_rest_is_named_from_enough_samples_only():
    # a run of a second of 0.2 ms steps: one sample of the rest, in hasten's own hooks, named 47% of the step
    def where(n):
        rank = _rest_rank([{"at": "train.py:60", "code": "time.sleep(args.pause)", "function": "train",
                            "samples": n}])
        return analyse([rank], cpus={"available": 2.0}).other_where
    assert where(1) == [] and where(MIN_NAMED - 1) == []
    assert [w["at"] for w in where(MIN_NAMED)] == ["train.py:60"]
