"""The real-scripts benchmark in pieces (issue 43): the busy condition takes longer than a session, so
every write must be a whole results file (conditions, each piece, complete or not), a piece must leave
whole cases, a resumed run must skip the finished runs and rerun the one that was stopped, and nothing
it started may outlive it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hasten.environment

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
if str(BENCHMARKS) not in sys.path:  # the scripts import each other, as when run from benchmarks/
    sys.path.insert(0, str(BENCHMARKS))

import profile_real_scripts as bench  # noqa: E402
import _real_script_pieces as pieces  # noqa: E402
import real_script_cases as cases  # noqa: E402
from _common import load_results  # noqa: E402

# cases that run from the test environment (no torchvision, timm, lightning or gymnasium needed)
PLAIN = [c for c in cases.CASES if c.needs is None][:3]


def _row(case, repeat, verdict="compute-bound"):
    return {"case": case.name, "repeat": repeat, "busy": 2,
            "truth": {"asrun_s": 0.2, "datafree_s": 0.2, "asrun_steps": [0.2] * 8, "datafree_steps": [0.2] * 8,
                      "loaders_replayed": 1, "wall_s": 1.0},
            "profile": {"exit": 0, "verdict": verdict, "top_fix": None, "wall_s": 1.0}}


@pytest.fixture
def bench_on(monkeypatch, tmp_path):
    """The benchmark on the plain cases with a stand-in for each run (``calls`` records them; a run
    listed in ``stop_at`` is stopped as by a SIGTERM), its conditions' matmul probes short."""
    real = hasten.environment.matmul_gflops
    monkeypatch.setattr(hasten.environment, "matmul_gflops",
                        lambda device="cpu", n=1024, seconds=1.0: real(device, n=256, seconds=0.05))
    monkeypatch.setattr(bench, "CASES", PLAIN)
    calls, stop_at = [], set()

    def run_case(case, rep, *args):
        calls.append((case.name, rep))
        if (case.name, rep) in stop_at:
            raise SystemExit(143)
        return _row(case, rep)

    monkeypatch.setattr(bench, "run_case", run_case)
    return tmp_path / "busy.json", calls, stop_at


def test_a_stopped_piece_leaves_a_whole_results_file_and_the_next_piece_reruns_only_the_rest(bench_on):
    out, calls, stop_at = bench_on
    argv = ["--busy", "2", "--repeats", "3", "--out", str(out)]
    order = [(c.name, rep) for rep, c in pieces.plan(PLAIN, 3, 0, [])]
    stop_at.add(order[4])                       # the 5th run (the second case's second repeat) is stopped
    with pytest.raises(SystemExit):
        bench.main(argv)
    data = json.loads(out.read_text())
    cond = data["conditions"]                   # what tests/test_benchmarks_conditions.py asks of every result
    assert cond["matmul_gflops_before"] > 0 and cond["matmul_gflops_after"] > 0 and cond["wall_s"] >= 0
    assert len(cond["load_average_after"]) == 3 and cond["environment"]["torch"]
    assert data["complete"] is False and data["runs_done"].startswith("4 of 9 runs")
    assert len(data["pieces"]) == 1 and data["pieces"][0]["runs_after"] == 4
    assert [(r["case"], r["repeat"]) for r in load_results(out)["runs"]] == order[:4]   # not the stopped one
    assert data["summary"]["cases_short_of_repeats"] == {order[3][0]: "1 of 3 runs"}
    assert data["summary"]["same_verdict_every_repeat"] == "1/1"   # the whole case only

    calls.clear()
    stop_at.clear()
    assert bench.main(argv) == 0
    assert calls == order[4:]                   # the stopped run again, then the rest; no finished run twice
    data = json.loads(out.read_text())
    assert data["complete"] is True and data["runs_done"].startswith("9 of 9 runs")
    assert [p["runs_before"] for p in data["pieces"]] == [0, 4]
    assert all(p["conditions"]["matmul_gflops_after"] > 0 for p in data["pieces"])
    assert data["summary"]["cases_short_of_repeats"] == {} and data["summary"]["same_verdict_every_repeat"] == "3/3"


def test_the_plan_runs_case_by_case_a_begun_case_first():
    plan = pieces.plan(PLAIN, 3, 0, [])
    names = [c.name for _, c in plan]
    assert sorted(names) == sorted(c.name for c in PLAIN for _ in range(3))
    assert all(names[i] == names[i // 3 * 3] for i in range(len(names)))     # each case's repeats together
    assert [rep for rep, _ in plan] == [0, 1, 2] * 3
    last = plan[-1][1]
    resumed = pieces.plan(PLAIN, 3, 0, [_row(last, 0), _row(last, 2)])
    assert [(rep, c.name) for rep, c in resumed[:1]] == [(1, last.name)] and len(resumed) == 7


def test_a_case_short_of_its_repeats_is_said_to_be_and_not_counted_as_agreeing():
    a, b = PLAIN[0], PLAIN[1]
    s = bench.judge([_row(a, r) for r in range(3)] + [_row(b, 0), _row(b, 1)], repeats=3)
    assert s["cases_short_of_repeats"] == {b.name: "2 of 3 runs"} and s["same_verdict_every_repeat"] == "1/1"
    assert "short of their repeats" in bench.goals_text(s)


def test_time_limits_stretch_with_the_busy_processes(monkeypatch):
    seen = {}
    monkeypatch.setattr(bench, "truth_run", lambda *a, limit, **k: seen.setdefault("truth", limit) and {})
    monkeypatch.setattr(bench, "profile_run", lambda *a: seen.setdefault("profile", a[-1]) and {})
    monkeypatch.setattr(bench, "Busy", lambda k: _Nothing())
    monkeypatch.setattr(bench, "prepared", lambda case: _Nothing(("c", "s", "w", "o")))
    case = next(c for c in PLAIN if not c.busy)
    bench.run_case(case, 1, "none", busy=2)
    assert seen == {"truth": 400 * 3, "profile": 3}


class _Nothing:
    def __init__(self, value=None):
        self.value = value

    def __enter__(self):
        return self.value

    def __exit__(self, *exc):
        return False


def test_a_run_past_its_limit_is_ended_with_its_children(tmp_path):
    pid_file = tmp_path / "child"
    code, _, _ = pieces.run_group(["sh", "-c", f"sleep 60 & echo $! > {pid_file}; wait"], timeout=1)
    assert code == 124
    _gone(int(pid_file.read_text()))


def test_busy_processes_end_themselves_when_the_benchmark_is_killed(tmp_path):
    # a parent that starts the spinners and dies at once without cleaning up, as under SIGKILL
    pid_file = tmp_path / "spinner"
    code = ("import sys, os; sys.path.insert(0, sys.argv[1]); import profile_real_scripts as b; "
            "busy = b.Busy(1).__enter__(); open(sys.argv[2], 'w').write(str(busy.procs[0].pid)); os._exit(0)")
    subprocess.run([sys.executable, "-c", code, str(BENCHMARKS), str(pid_file)], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=300,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join((str(ROOT), os.environ.get("PYTHONPATH", "")))})
    _gone(int(pid_file.read_text()))


def _gone(pid: int, within: float = 30) -> None:
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        if Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z":
            return                              # ended, waiting for init to reap it
        time.sleep(0.1)
    os.kill(pid, 9)
    raise AssertionError(f"process {pid} still runs")
