"""Every prediction bounded by what was measured, and the biggest fix of every kind shown (issue 43).

timm's train.py with one loader worker (-j 1) beside another job printed "data made free: step
0.0 ms" and ranked the device-resident loader first at x231,837,393: the data wait and the
workers' CPU (none of it on an idle core, at the rate a thread gets a core) added up to more than
the step. A run whose compute fix would pay more than every input fix had it hidden because its
verdict was input-bound."""

import math

import pytest

from hasten.profile.bounds import gain_bound
from hasten.profile.ranking import admit
from hasten.profile.records import COMMUNICATION, COMPUTE, INPUT, Recommendation
from hasten.profile.verdict import analyse
from test_profile_verdict import _rank


def _one_slow_worker_beside_a_busy_core(own_work=0.060, n=24):
    """timm's case in numbers: a 300 ms step that waits 200 ms for its one worker, whose 250 ms of CPU a
    batch found no idle core (another job holds the other one: /proc/stat saw none idle); two torch
    threads on the one core left; the loop's thread sat 40 ms of its 100 ms of work in the run queue."""
    rank = _rank(wait=0.200, work=0.100, alone=0.100, workers=1, n=n)
    for r in rank["records"]["measure"]:
        r.update(cpu_s=0.100, data_cpu_s=0.001, compute_s=0.100, span_s=0.300, own_s=own_work)
    rank["worker_cpu"] = {"cpu_s": 0.250 * n, "batches": n, "in_flight": 2}
    rank["cpu_window"] = {"cores": 2, "wall_s": n * 0.300, "busy_s": 2 * n * 0.300, "free": 1.0}
    rank["threads"] = {"intra_op": 2}
    return rank


def test_the_wait_and_the_workers_cpu_together_never_make_the_step_free():
    a = analyse([_one_slow_worker_beside_a_busy_core()], cpus={"available": 1.0, "affinity": 2})
    step, wait, delay = a.step_time_s, a.data_wait_fraction * a.step_time_s, a.cpu["data_cpu_delay_s"]
    assert wait + delay > step  # the model, unbounded, would leave nothing of the step
    # the step's own work stays: its 100 ms less the 40 ms its thread waited for a core
    assert a.data_free_step_s == pytest.approx(0.060)
    for rec in a.recommendations + [r for r in a.rejected if r.get("predicted_speedup")]:
        predicted = rec.predicted_speedup if isinstance(rec, Recommendation) else rec["predicted_speedup"]
        assert predicted <= step / 0.060 + 1e-9
    low, point, high = a.data_gain
    assert point == pytest.approx(step / 0.060) and low <= point <= high <= step / 0.060 + 1e-9
    # the floor moves with what was measured: a thread that never waited for a core keeps all its work
    b = analyse([_one_slow_worker_beside_a_busy_core(own_work=0.100)], cpus={"available": 1.0, "affinity": 2})
    assert b.data_free_step_s == pytest.approx(0.100)


def test_without_a_run_queue_reading_the_replayed_step_is_the_floor():
    rank = _one_slow_worker_beside_a_busy_core()
    for r in rank["records"]["measure"]:
        del r["own_s"]
    a = analyse([rank], cpus={"available": 1.0, "affinity": 2})
    assert a.data_free_step_s == pytest.approx(0.100)  # the replayed step: the data made free, measured


def _analysis(**kw):
    a = analyse([_rank(wait=0.010, work=0.090)], cpus={"available": 2.0})
    a.recommendations, a.rejected = [], []
    for k, v in kw.items():
        setattr(a, k, v)
    return a


def _rec(kind, x, name=None):
    return Recommendation(fix=name or f"{kind} x{x}", how="...", predicted_speedup=x, basis="", changes_math=False,
                          apply="a", kind=kind)


def test_every_prediction_is_held_to_the_amdahl_bound_of_its_part():
    a = _analysis(verdict="balanced", comm_s=0.020, own_step_s=0.100, compute_fraction=0.5)
    recs = [_rec(INPUT, 50.0), _rec(COMPUTE, 50.0), _rec(COMMUNICATION, 50.0)]
    admit(a, recs)
    got = {r.kind: r.predicted_speedup for r in a.recommendations}
    assert got[INPUT] == pytest.approx(0.100 / (0.100 - 0.010))
    assert got[COMPUTE] == pytest.approx(2.0) and got[COMMUNICATION] == pytest.approx(0.100 / 0.080)
    assert all(r.bound == pytest.approx(gain_bound(a, r.kind)) for r in a.recommendations)
    with pytest.raises(ValueError, match="Invalid fix kind"):
        gain_bound(a, "memory")
    assert math.isinf(gain_bound(_analysis(compute_fraction=1.0), COMPUTE))


@pytest.mark.parametrize("verdict, named", [("input-bound", INPUT), ("compute-bound", COMPUTE),
                                            ("communication-bound", COMMUNICATION)])
def test_the_best_fix_of_every_kind_shows_when_it_beats_the_verdicts_best(verdict, named):
    a = _analysis(verdict=verdict, data_free_step_s=0.050, comm_s=0.050, own_step_s=0.100, compute_fraction=0.9)
    others = [k for k in (INPUT, COMPUTE, COMMUNICATION) if k != named]
    bigger, smaller = others
    recs = [_rec(named, 1.3), _rec(named, 1.2), _rec(bigger, 1.6, "big"), _rec(bigger, 1.5, "second of its kind"),
            _rec(smaller, 1.25, "small")]
    admit(a, recs)
    shown = [r.fix for r in a.recommendations]
    assert shown[0] == "big"  # the biggest fix leads, whatever the verdict
    assert "second of its kind" not in shown and "small" not in shown  # only the top of another kind, if bigger
    assert [r.kind for r in a.recommendations].count(named) == 2


def test_a_compute_fix_bigger_than_every_input_fix_is_shown_in_an_input_bound_run():
    # 15% of the step waits for data; bf16 autocast halves the replayed step
    a = analyse([_rank(wait=0.015, work=0.085, autocast=0.040, n=12)], cpus={"available": 2.0})
    assert a.verdict == "input-bound"
    assert a.recommendations and a.recommendations[0].fix == "bf16 autocast"
    assert a.recommendations[0].predicted_speedup > max(
        [r.predicted_speedup for r in a.recommendations if r.kind == INPUT] or [0])
