"""Progress where there is no terminal: plain lines every HASTEN_PROGRESS_INTERVAL seconds, flushed;
the tqdm bar on a terminal; nothing with HASTEN_PROGRESS=0 (what CI sets)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from hasten.progress import LineProgress, progress, progress_mode


@pytest.mark.parametrize("value, mode", [("0", "off"), ("", "off"), ("1", "bar"), ("lines", "lines"),
                                         (None, "lines")])  # unset: stderr here is not a terminal
def test_mode_follows_hasten_progress(value, mode, monkeypatch):
    if value is None:
        monkeypatch.delenv("HASTEN_PROGRESS", raising=False)
    else:
        monkeypatch.setenv("HASTEN_PROGRESS", value)
    assert progress_mode() == mode
    bar = progress(total=3, desc="x")
    assert isinstance(bar, LineProgress) == (mode == "lines")
    bar.close()


def test_lines_say_step_total_rate_and_time_left(monkeypatch, capsys):
    monkeypatch.setenv("HASTEN_PROGRESS", "lines")
    monkeypatch.setenv("HASTEN_PROGRESS_INTERVAL", "0")
    for _ in progress(range(4), desc="train", unit="step"):
        pass
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 5, lines  # one per step, then the last one
    assert re.fullmatch(r"train: 2/4 steps \(50%\), [\d.]+ steps/s, 0:00:00 elapsed, about 0:00:00 left", lines[1])
    assert lines[-1].startswith("train: 4/4 steps (100%)") and lines[-1].endswith(", done")


def test_nothing_for_work_shorter_than_the_interval(monkeypatch, capsys):
    monkeypatch.setenv("HASTEN_PROGRESS", "lines")
    monkeypatch.delenv("HASTEN_PROGRESS_INTERVAL", raising=False)
    with progress(total=100, desc="quick") as bar:
        bar.update(100)
    assert capsys.readouterr().err == ""


def test_metrics_lines_are_on_disk_as_they_are_logged(tmp_path):
    from hasten.rundir import RunDir

    with RunDir("x", root=tmp_path) as rd:
        rd.log(step=1, loss=2.5)
        assert json.loads((rd.path / "metrics.jsonl").read_text()) == {"step": 1, "loss": 2.5}


def test_train_in_a_log_file_says_what_it_does(colours, tmp_path):
    """stderr not a terminal (a pipe): the start line at once, then progress lines."""
    env = {k: v for k, v in os.environ.items() if k != "HASTEN_PROGRESS"}
    env.update(HASTEN_PROGRESS_INTERVAL="0", HASTEN_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1",
               HASTEN_RUNS=str(tmp_path / "runs"))
    proc = subprocess.run([sys.executable, "-m", "hasten", "train", "--data", str(colours), "--model", "resnet10",
                           "--width", "4", "--batch-size", "32", "--epochs", "4", "--device", "cpu"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("train: 24 steps to go"))
    assert "(6 per epoch at global batch 32, device loader, 1 process(es)); progress every 0 s" in lines[start]
    steps = [line for line in lines[start + 1:] if re.match(r"train: \d+/24 steps \(\d+%\), ", line)]
    assert steps and steps[-1].startswith("train: 24/24 steps (100%)"), lines
    assert "\r" not in proc.stderr and "Traceback" not in proc.stderr


def test_every_progress_bar_of_the_package_names_what_it_counts():
    """A bar without a unit reads "1.6 s per item"; each caller says steps, runs, files..."""
    import ast
    from pathlib import Path

    import hasten

    unnamed = []
    for path in Path(hasten.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "progress"
                    and not any(k.arg == "unit" for k in node.keywords)):
                unnamed.append(f"{path.name}:{node.lineno}")
    assert not unnamed, f"progress() without unit=: {unnamed}"
