"""``hasten profile --verify`` as a measurement: interleaved samples of the baseline and each fix, the
ratio's 95% interval with n, and a ranking that moves only on a difference the interval can tell.

The scripts' effects are set by construction (sleeps), and the real ones are 5x or more, so that no
assertion rests on a small timing difference."""

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from hasten.profile.launcher import ProfileConfig, profile, run_instrumented
from hasten.profile.report import format_report
from hasten.profile.input_fixes import worker_cap
from hasten.profile.ranking import rerank
from hasten.profile.records import Recommendation
from hasten.profile.verdict import analyse
from test_profile_report import _analysis as report_analysis
from hasten.profile.verify import BLOCK_STEPS, PAIRS, RERUNS, judge, ratio_interval, verify
from hasten.timing import interleaved
from profile_helpers import verify_only, verify_rounds

SCRIPTS = Path(__file__).parent / "profile_scripts"
# A verification runs the command up to 7 times here, each a few seconds; on a machine loaded 10-fold
# (a load of 18 on 2 cores), each took a minute and more to start.
SLOW = pytest.mark.timeout(2400)


def _analysis(recommendations, rejected=()):
    """A real Analysis (from constructed steps) carrying the fixes to verify."""
    a = report_analysis()
    a.recommendations, a.rejected = list(recommendations), list(rejected)
    a.steps, a.cost = 8, {"profile_run_s": 1.0}
    return a


def _config(script, *args):
    return ProfileConfig((sys.executable, str(SCRIPTS / script), *args), warmup=2, steps=8, capture=True,
                         timeout_s=600)  # a loaded machine (a load of 18 on 2 cores) took a minute to start one


def _null_fix(apply):
    return {"fix": f"no change ({apply})", "why": "predicted x1.00: not worth it", "basis": "", "how": "",
            "predicted_speedup": 1.0, "apply": apply, "step_rate_factor": 1.0, "changes_math": False}


# ---------------------------------------------------------------- a fix with no effect

NULL_ROUNDS = 2  # the no-effect verification's rounds (below)


@pytest.fixture(scope="module")
def null():
    # A clock that only the script's sleeps advance: an unchanged step takes exactly as long in every run and
    # block, so these fixes' effect is exactly none. workers=0 (re-runs) where no DataLoader is built, and
    # comm=bf16 (switched between steps) without DDP, change nothing.
    # Rounds: NULL_ROUNDS, not RERUNS (whose runs are `reruns`' below): every sample is the same, so a
    # round more adds nothing but its two runs.
    a = _analysis([], [_null_fix("workers=0"), _null_fix("comm=bf16")])
    with pytest.MonkeyPatch.context() as mp:
        verify_rounds(mp, NULL_ROUNDS)
        verify(_config("autocast_sleep.py", "--virtual-clock"), a, log=lambda m: None,
               run_instrumented=run_instrumented)
    return a


@SLOW
@pytest.mark.slow  # the first to use `null`: 5 runs of the command
@pytest.mark.parametrize("apply", ["workers=0", "comm=bf16"])
def test_a_fix_with_no_effect_is_no_measurable_difference_and_not_promoted(null, apply):
    (rec,) = [r for r in null.rejected if r["apply"] == apply]
    v = rec["verification"]
    assert v["interval"][0] <= 1 <= v["interval"][1] and not v["decides"]
    assert v["finding"].startswith("no measurable difference")
    assert not null.recommendations  # not promoted


@SLOW
def test_the_report_prints_each_verification_with_its_interval_n_and_cost(null):
    text = format_report(null)
    assert f"n = {NULL_ROUNDS} re-runs of each, interleaved" in text
    assert f"n = {PAIRS} pairs of {BLOCK_STEPS}-step blocks in one run, interleaved" in text
    assert text.count("95% interval x") == 2 and text.count("no measurable difference") == 2
    runs = 2 * NULL_ROUNDS + 1  # the baseline's and the fix's re-runs, and one run switching comm=bf16
    assert f"({runs} runs)" in text and null.cost["verify_runs"] == runs and null.cost["verify_runs_s"] > 0


# ---------------------------------------------------------------- a real effect

@pytest.fixture(scope="module")
def reruns():
    # 8 items x 25 ms of storage latency against a 20 ms step: the resident loader takes the 200 ms out (~x10;
    # sleeps long beside what a loaded machine adds to a step: 30-100 ms at a load of 18 on 2 cores, nice 19).
    # The whole command, profiled and verified: its fix the profile's own (the other fixes' re-runs, workers
    # and echo, are test_profile_launcher's), one run more than verifying a given fix would take.
    config = _config("input_bound.py", "--item-sleep", "0.025", "--batch", "8", "--step-sleep", "0.02")
    with pytest.MonkeyPatch.context() as mp:
        verify_only(mp, "resident")
        return profile(replace(config, probe_steps=4, verify=True), log=lambda m: None)


def _resident(a):
    return next(r for r in a.recommendations if r.apply == "resident")


@SLOW
@pytest.mark.slow  # the first to use `reruns`: 7 runs of the command
def test_a_real_effect_is_measured_with_an_interval_clear_of_1(reruns):
    res = _resident(reruns)
    v = res.verification
    assert v is not None, reruns.notes
    assert v["decides"] and v["interval"][0] > 1 and v["interval"][0] <= v["speedup"] <= v["interval"][1], (v, reruns.notes)
    assert v["n"] == RERUNS and res.verified_speedup == v["speedup"]


@SLOW
def test_verify_measures_the_device_resident_loader(reruns):
    # issue 32, item 5: the profile recommends it, and its re-runs gather the training loader's batches from
    # the warm-up's, kept in memory (tests/test_profile_resident.py): by construction x10, far above any
    # overhead of the gather
    res = _resident(reruns)
    assert res.fix == "device-resident loader" and res.verified_speedup > 2, reruns.notes


@SLOW
def test_each_round_runs_the_baseline_and_the_fix_once_in_its_recorded_shuffle(reruns):
    v = _resident(reruns).verification
    names = {None: "the baseline", 0: "device-resident loader"}
    assert v["order"] == [names[i] for _, i in interleaved([None, 0], RERUNS, seed=v["seed"])]
    for r in range(RERUNS):
        assert sorted(v["order"][2 * r:2 * r + 2]) == sorted(names.values())


@pytest.fixture(scope="module")
def switched():
    # The forward sleeps 100 ms, 10 ms under autocast: ~x10 by construction (still x1.8 with the 100 ms a
    # step that a load of 18 on 2 cores added); predicted x1.01, so rejected
    a = _analysis([], [{**_null_fix("autocast"), "fix": "bf16 autocast", "predicted_speedup": 1.01}])
    verify(_config("autocast_sleep.py", "--plain-sleep", "0.1", "--autocast-sleep", "0.01"), a, log=lambda m: None,
           run_instrumented=run_instrumented)
    return a


@SLOW
def test_a_fix_switched_between_steps_is_measured_in_blocks_of_one_run_and_promoted(switched):
    assert switched.recommendations, switched.rejected
    (ac,) = switched.recommendations
    v = ac.verification
    assert ac.promoted and v["decides"] and v["interval"][0] > 1 and v["n"] == PAIRS
    order = v["order"]
    assert order == [("fix" if on else "baseline") for _, on in interleaved((False, True), PAIRS, seed=v["seed"])]
    assert all(sorted(order[2 * p:2 * p + 2]) == ["baseline", "fix"] for p in range(PAIRS))
    assert switched.cost["verify_runs"] == 1  # one run, no baseline runs


# ---------------------------------------------------------------- the rules, on given numbers

def test_the_interval_comes_from_the_paired_ratios_and_is_at_least_2_percent_wide():
    r = ratio_interval([10.0, 10.0, 10.0], [5.0, 5.0, 5.0])  # no spread: the floor
    assert r["ratio"] == pytest.approx(2.0) and r["n"] == 3
    assert r["interval"] == pytest.approx((2.0 / 1.02, 2.0 * 1.02))
    wide = ratio_interval([10.0, 12.0, 9.0], [5.0, 5.0, 5.0])
    assert wide["interval"][0] < 1.8 and wide["interval"][1] > 2.4
    assert ratio_interval([10.0], [5.0])["interval"] is None


def test_a_fix_that_only_removes_work_measured_slower_is_an_anomaly_not_its_effect():
    slower = {"ratio": 0.75, "interval": (0.7, 0.8), "n": 3}
    v = judge("echo=2", slower, 1.0)
    assert not v["decides"] and v["finding"].startswith("a measurement anomaly")
    v = judge("workers=3", slower, 1.0)  # workers can slow the step (they take its cores)
    assert v["decides"] and v["finding"].startswith("slower")


def test_rerank_moves_a_fix_only_on_a_verification_that_decides():
    keep = Recommendation("A", "", 2.0, "", False, apply="a", verified_speedup=0.95,
                          verification={"decides": False})
    drop = Recommendation("B", "", 2.0, "", False, apply="b", verified_speedup=0.5,
                          verification={"decides": True})
    a = _analysis([keep, drop])
    rerank(a)
    assert [r.fix for r in a.recommendations] == ["A"] and [r["fix"] for r in a.rejected] == ["B"]


@pytest.mark.parametrize("cpu, most", [({"affinity": 2, "probe": 0.9}, 2), ({"affinity": 8, "quota": 1.5}, 2), ({"affinity": 8, "quota": 0.5}, 1),
                                       ({"affinity": 4, "window_cores": 3}, 3)])
def test_the_worker_cap_is_whole_cores_capped_by_quota_and_window(cpu, most):
    # the quota rounds up, as hasten.cores counts cores everywhere (joblib's rule: 1.5 CPUs keep 2 busy)
    assert worker_cap(cpu) == most


def _workers_recommended(cores):
    rank = {"rank": 0, "world_size": 1, "device": "cpu", "num_workers": 0, "batch_size": 16, "dataset_len": 64,
            "batch_bytes": 1024, "cpu_count": cores, "warmup": 2,
            "records": {"measure": [{"wait_s": 0.090, "work_s": 0.010, "cpu_s": 0.0005}] * 6,
                        "step_alone": [{"wait_s": 0.0, "work_s": 0.010, "cpu_s": 0.0005}] * 6},
            "loader_probe": {"batch_s": 0.090, "main_cpu_s": 0.0, "worker_cpu_s": None, "handoff_s": 1e-5},
            "ddp": False, "grad_bytes": 0, "allreduce_times": []}
    a = analyse([rank], cpus={"affinity": cores, "quota": None, "probe": float(cores), "available": float(cores)})
    return [int(r.apply.split("=")[1]) for r in a.recommendations if r.apply and r.apply.startswith("workers=")]


def test_never_more_dataloader_workers_than_the_cores_the_run_can_use():
    # 90 ms of waiting on a sleeping loader against a 10 ms step: with 8 cores, more than 2 workers pay
    (many,) = _workers_recommended(8)
    assert many > 2
    assert _workers_recommended(2) == [2]  # PyTorch warns above the cores: "might get DataLoader running slow"


def test_a_failed_verification_says_what_was_seen_never_a_bare_seen():
    # a re-run that timed out: its failure says "Seen:" and, on the next lines, what the processes saw;
    # the note kept only the first line, ending in "Seen:" (issue 43)
    from hasten.profile.outcome import RunOutcome
    status = {"rank": 0, "steps": 3, "forwards": 9, "train_forwards": 9, "backwards": 3, "loaders": [],
              "where": [{"at": "train.py:get_batch", "share": 0.9}]}

    def timed_out(config, apply="", probes=True, log=None, switch=""):
        return RunOutcome(-9, [], True, "epoch 1\nloss 0.5\n", 1.0, [status])

    a = _analysis([Recommendation(fix="a fix", how="", predicted_speedup=1.5, basis="", changes_math=False,
                                  apply="workers=2")])
    verify(_config("autocast_sleep.py"), a, log=lambda m: None, run_instrumented=timed_out)
    (note,) = [n for n in a.notes if n.startswith("verification of a fix failed")]
    assert not note.rstrip().endswith("Seen:")
    assert "Seen: rank 0: 3 optimizer steps" in note and "the main thread was in train.py:get_batch (90%)" in note
    assert "loss 0.5" not in note  # the command's output stays out of a one-line note
