import json
import statistics
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cli_helpers import exit_status
from hasten.cli import main
from hasten.data import load_dataset
from hasten.recipes.speedrun import build_recipe, flops_per_run


def _image_folder(root: Path, per_class=12, classes=("a", "b", "c")) -> Path:
    rng = np.random.default_rng(0)
    for split, n in (("train", per_class), ("test", 4)):
        for k, name in enumerate(classes):
            d = root / split / name
            d.mkdir(parents=True)
            for i in range(n):
                img = rng.integers(0, 60, (32, 32, 3), dtype=np.uint8)
                img[..., k] += 150  # class = dominant colour
                Image.fromarray(img).save(d / f"{i}.png")
    return root


def test_cli_writes_run_directory_and_json(tmp_path, capsys):
    data = _image_folder(tmp_path / "data")
    out = tmp_path / "summary.json"
    rc = main(["speedrun", "--data", str(data), "--preset", "tiny", "--runs", "2", "--epochs", "1",
               "--batch-size", "12", "--device", "cpu", "--json", str(out)])
    assert rc == 0
    summary = json.loads(out.read_text())
    for key in ("runs", "mean_accuracy", "std_accuracy", "mean_time_s", "device", "preset", "flops_per_run"):
        assert key in summary
    assert len(summary["runs"]) == 2 and set(summary["runs"][0]) >= {"accuracy", "tta_accuracy", "time_s"}
    assert summary["preset"] == "tiny"
    # The numbers are the recipe's own: FLOPs of this recipe on this data, the mean
    # and spread of the runs' times, and the rate they give.
    recipe = build_recipe("tiny", epochs=1, batch_size=12)
    assert summary["flops_per_run"] == flops_per_run(recipe, load_dataset(data)) > 0
    times = [r["time_s"] for r in summary["runs"]]
    assert summary["mean_time_s"] == pytest.approx(statistics.fmean(times))
    assert summary["std_time_s"] == pytest.approx(statistics.stdev(times))
    assert summary["achieved_tflops"] == pytest.approx(summary["flops_per_run"] / summary["mean_time_s"] / 1e12)
    assert summary["mean_accuracy"] == pytest.approx(statistics.fmean(r["tta_accuracy"] for r in summary["runs"]))
    rundir = Path(summary["rundir"])
    for name in ("config.json", "environment.json", "metrics.jsonl", "results.json", "accuracy_vs_time.png"):
        assert (rundir / name).exists(), name
    lines = (rundir / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["run"] == 0
    printed = capsys.readouterr().out
    assert "preset: tiny" in printed and "val_acc" in printed


def test_cli_rejects_bad_input_with_one_line(tmp_path, capsys):
    assert exit_status(["speedrun", "--runs", "0", "--data", str(tmp_path)]) == 2
    assert "--runs" in capsys.readouterr().err
    assert exit_status(["speedrun", "--data", str(tmp_path / "missing"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "missing" in err and "Traceback" not in err
    data = _image_folder(tmp_path / "small")
    assert main(["speedrun", "--data", str(data), "--preset", "tiny", "--device", "cpu"]) == 2
    assert "--batch-size" in capsys.readouterr().err
    assert exit_status(["speedrun", "--data", str(data), "--epochs", "-1", "--device", "cpu"]) == 2
    assert "--epochs" in capsys.readouterr().err


def test_a_url_is_one_line_saying_what_speedrun_reads_and_what_streams_a_url(capsys):
    assert exit_status(["speedrun", "--data", "http://127.0.0.1:8000/shards/", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not exist" not in err
    assert "reads a local image folder, archive or CIFAR-10 binary" in err
    assert "hasten train --loader stream --data URL" in err


def test_cli_ablation_prints_the_ladder(tmp_path, capsys):
    data = _image_folder(tmp_path / "data", per_class=32)
    out = tmp_path / "ladder.json"
    assert main(["speedrun", "--data", str(data), "--preset", "tiny", "--ablate", "--epochs", "1",
                 "--batch-size", "32", "--no-warmup", "--target", "0.5", "--device", "cpu",
                 "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert len(summary["rungs"]) == 14 and summary["target"] == 0.5
    assert (Path(summary["rundir"]) / "ablation.png").exists()
    printed = capsys.readouterr().out
    assert "epochs_to_target" in printed and "+ TTA: flip + translate" in printed


def test_a_stopped_speedrun_says_how_to_resume_and_resumes(tmp_path, capsys, monkeypatch):
    from hasten.recipes.speedrun import JobCheckpoint

    data = _image_folder(tmp_path / "data")
    argv = ["speedrun", "--data", str(data), "--preset", "tiny", "--runs", "2", "--epochs", "3", "--batch-size", "12",
            "--device", "cpu", "--no-warmup"]
    save_run = JobCheckpoint.save_run

    def ctrl_c_after_run_1_epoch_2(checkpoint, index, state):
        save_run(checkpoint, index, state)
        if (index, state["epoch"]) == (1, 2):
            raise KeyboardInterrupt

    monkeypatch.setattr(JobCheckpoint, "save_run", ctrl_c_after_run_1_epoch_2)
    # Nothing to resume yet: said, then a fresh job, which Ctrl-C stops.
    assert main([*argv, "--resume", "auto"]) == 130
    out, err = capsys.readouterr()
    run_path = Path(out.split("run directory: ")[1].split()[0])
    first_threads = int(out.split("threads: ")[1].split()[0])
    assert err.splitlines() == [
        f"hasten speedrun: no stopped speedrun of these settings under {tmp_path / 'runs'}; starting fresh",
        f"hasten speedrun: stopped by SIGINT; run directory {run_path} (1 of 2 runs finished, run 1 to epoch 2 of 3); "
        "resume with: hasten speedrun <same options> --resume auto"]
    monkeypatch.setattr(JobCheckpoint, "save_run", save_run)
    assert main([*argv, "--resume", "auto", "--json", str(tmp_path / "s.json")]) == 0
    out, err = capsys.readouterr()
    assert err == f"hasten speedrun: resuming {run_path}: 1 of 2 runs finished, run 1 to epoch 2 of 3\n"
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["rundir"] == str(run_path) and [r["resumed"] for r in summary["runs"]] == [False, True]
    parts = summary["runs"][1]["time_parts_s"]
    assert f"run 1 was stopped and resumed: its time is {parts[0]:.2f} + {parts[1]:.2f} = " in out
    # with the threads of the run it resumes, whatever the load now (bit for bit the same sums)
    assert f"threads: {first_threads}, as the run it resumes" in out
    # The table holds every epoch of both runs, the finished ones printed again from the checkpoint.
    assert [line.split()[:2] for line in out.splitlines() if line[:3].strip().isdigit()] == [
        [str(r), f"{e}/3"] for r in (0, 1) for e in (1, 2, 3)]


def test_threads_are_chosen_said_and_undone(tmp_path, capsys, monkeypatch):
    import torch

    from hasten import cores

    data = _image_folder(tmp_path / "data")
    argv = ["speedrun", "--data", str(data), "--preset", "tiny", "--epochs", "1", "--batch-size", "12",
            "--device", "cpu", "--no-warmup"]
    before = torch.get_num_threads()
    seen = []
    real_set = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (seen.append(n), real_set(n)))
    # Other processes keep 1.6 of 2 cores busy: one thread.
    monkeypatch.setattr(cores, "core_share", lambda: cores.CoreShare(2, 1.6, 1))
    assert main([*argv, "--json", str(tmp_path / "a.json")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith("; fp32")  # a CPU trains in float32
    assert "threads: 1 of 2 cores: other processes keep 1.6 of them busy" in out
    assert json.loads((tmp_path / "a.json").read_text())["precision"] == "fp32"
    assert seen[0] == 1 and torch.get_num_threads() == before  # the caller's count is back
    seen.clear()
    assert main([*argv, "--threads", "2"]) == 0
    assert "threads: 2 (--threads)" in capsys.readouterr().out
    assert seen[0] == 2 and torch.get_num_threads() == before
