import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import hasten
from hasten.environment import source_revision
from hasten.rundir import RunDir, stable_run_path, write_json


def test_run_directory_records_version_commit_and_command(tmp_path, monkeypatch):
    argv = ["hasten", "speedrun", "--data", "../shared/data/cifar10-jpeg.tar.xz", "--note", "a b"]
    monkeypatch.setattr(sys, "argv", argv)
    with RunDir("speedrun", root=tmp_path, device="cpu") as rd:
        rd.write_config({"lr": 0.1})
    env = json.loads((rd.path / "environment.json").read_text())
    assert env == rd.environment
    assert env["hasten"] == hasten.__version__
    assert env["command"] == " ".join(shlex.quote(a) for a in argv)
    assert shlex.split(env["command"]) == argv
    assert (env["git_commit"], env["git_dirty"]) == source_revision()
    assert json.loads((rd.path / "config.json").read_text()) == {"lr": 0.1}


def test_commit_in_a_checkout_is_git_head(tmp_path):
    repo = Path(hasten.__file__).resolve().parent.parent
    try:
        subprocess.run(["git", "-C", str(repo), "ls-files", "--error-unmatch", "hasten/__init__.py"],
                       capture_output=True, check=True)
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("hasten is not imported from a git checkout, or git is missing")
    with RunDir("train", root=tmp_path) as rd:
        pass
    assert json.loads((rd.path / "environment.json").read_text())["git_commit"] == head


def test_layout_metrics_and_results(tmp_path, monkeypatch):
    monkeypatch.setenv("HASTEN_RUNS", str(tmp_path / "elsewhere"))
    rd = RunDir("echo")
    assert rd.path.parent == tmp_path / "elsewhere" and rd.path.name.startswith("echo-")
    rd.log(step=1, loss=0.5)
    rd.log(step=2, loss=math.nan)
    rd.write_results({"accuracy": 0.9, "path": Path("x")})
    rd.close()
    lines = [json.loads(line) for line in (rd.path / "metrics.jsonl").read_text().splitlines()]
    assert lines == [{"step": 1, "loss": 0.5}, {"step": 2, "loss": None}]
    assert json.loads((rd.path / "results.json").read_text()) == {"accuracy": 0.9, "path": "x"}
    assert sorted(p.name for p in rd.path.iterdir()) == ["environment.json", "metrics.jsonl", "results.json"]


def test_runs_started_in_the_same_second_get_their_own_directory(tmp_path):
    paths = []
    for _ in range(3):
        with RunDir("train", root=tmp_path) as rd:
            paths.append(rd.path)
    assert len(set(paths)) == 3


def test_write_json_is_atomic_and_leaves_no_temp_file(tmp_path):
    write_json(tmp_path / "a" / "r.json", {"x": (1, 2), "inf": math.inf})
    assert json.loads((tmp_path / "a" / "r.json").read_text()) == {"x": [1, 2], "inf": None}
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["r.json"]


# --- stable run directories: the same settings find the same directory -------------

def test_stable_run_path_depends_only_on_the_settings(tmp_path, monkeypatch):
    a = {"model": "resnet18", "seed": 0, "lr": 0.1}
    same = stable_run_path("train", dict(reversed(list(a.items()))), root=tmp_path)  # key order is irrelevant
    assert stable_run_path("train", a, root=tmp_path) == same
    assert same.parent == tmp_path and same.name.startswith("train-") and len(same.name) == len("train-") + 10
    assert stable_run_path("train", {**a, "seed": 1}, root=tmp_path) != same
    assert stable_run_path("train", {**a, "lr": 0.1000001}, root=tmp_path) != same
    monkeypatch.setenv("HASTEN_RUNS", str(tmp_path / "elsewhere"))
    assert stable_run_path("train", a).parent == tmp_path / "elsewhere"


def test_stable_run_path_is_the_same_in_another_process(tmp_path):
    """Restarted workers are fresh interpreters: no per-process salt (as str hash() has) may enter."""
    config = {"model": "resnet18", "data": "/data/x", "epochs": 2.5}
    code = ("import sys, json; from hasten.rundir import stable_run_path; "
            "print(stable_run_path('train', json.loads(sys.argv[1]), root=sys.argv[2]))")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(config), str(tmp_path)],
                         capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "123"})
    assert out.stdout.strip() == str(stable_run_path("train", config, root=tmp_path))


def test_run_dir_at_a_given_path_is_reused_and_appends(tmp_path):
    with RunDir("train", path=tmp_path / "run") as rd:
        rd.log(step=1, loss=1.0)
    with RunDir("train", path=tmp_path / "run") as rd:
        rd.log(step=2, loss=0.5)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2]


def test_drop_metrics_after_keeps_each_step_once_after_a_resume(tmp_path):
    with RunDir("train", path=tmp_path / "run") as rd:
        for step in (3, 6, 9, 12):
            rd.log(step=step, loss=float(step))
        rd.log(note="no step")
    (tmp_path / "run" / "metrics.jsonl").open("a").write('{"step": 15, "lo')  # cut short by SIGKILL
    with RunDir("train", path=tmp_path / "run") as rd:
        rd.drop_metrics_after(6)  # resumed from the checkpoint at step 6
        rd.log(step=9, loss=-9.0)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert lines == [{"step": 3, "loss": 3.0}, {"step": 6, "loss": 6.0}, {"note": "no step"},
                     {"step": 9, "loss": -9.0}]


def test_run_journal_replays_finished_runs_and_only_under_the_same_config(tmp_path):
    from hasten.rundir import RunJournal

    path, calls = tmp_path / "runs.jsonl", []

    def work(x):
        calls.append(x)
        return {"x": x, "curve": [(1, 0.5)], "inf": float("inf")}

    first = RunJournal(path, {"lr": 0.1})
    a = first.run("a", lambda: work(1))
    assert a == {"x": 1, "curve": [[1, 0.5]], "inf": None}  # as a replay will see it: JSON
    a["x"] = 99  # a caller annotating its copy changes nothing stored
    assert first.run("a", lambda: work(2))["x"] == 1 and calls == [1] and first.resumed == 1
    first.run("b", lambda: work(3))
    again = RunJournal(path, {"lr": 0.1})
    assert len(again) == 2 and "a" in again and again.run("b", lambda: work(4))["x"] == 3 and calls == [1, 3]
    other = RunJournal(path, {"lr": 0.2})  # other settings: nothing reused, nothing lost
    assert len(other) == 0 and other.other_config == 2
    other.run("a", lambda: work(5))
    assert calls == [1, 3, 5] and len(RunJournal(path, {"lr": 0.1})) == 2
    assert RunJournal(None, {}).run("a", lambda: work(6))["x"] == 6 and calls[-1] == 6
    tagged = RunJournal(tmp_path / "tagged.jsonl", {}, meta={"git_commit": "abc"})
    tagged.run("a", lambda: work(7))
    later = RunJournal(tmp_path / "tagged.jsonl", {}, meta={"git_commit": "def"})
    assert later.replayed_meta == [{"git_commit": "abc"}]  # who made the runs it will replay


def test_run_journal_skips_a_line_cut_off_mid_write_and_starts_the_next_on_its_own_line(tmp_path):
    from hasten.rundir import RunJournal

    path = tmp_path / "runs.jsonl"
    j = RunJournal(path, {})
    j.run("a", lambda: {"v": 1})
    with open(path, "a") as f:
        f.write('{"config": "')  # the process died inside a write
    cut = RunJournal(path, {})
    assert len(cut) == 1 and cut.torn == 1
    cut.run("b", lambda: {"v": 2})
    after = RunJournal(path, {})
    assert after.torn == 1 and after.run("b", lambda: {"v": 3}) == {"v": 2} and "a" in after
