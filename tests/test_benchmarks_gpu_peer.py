"""benchmarks/gpu/peer.py and peer_run.py: the airbench peer served one run at a time between
hasten's (against a stand-in with airbench 0.1.8's layout), a peer that dies, the capture of its
final row, its sdist checked against PyPI's hash, and the data's round trip to its format."""

from __future__ import annotations

import io
import json
import tarfile
import types
from pathlib import Path

import pytest
import torch

from gpu_suite_helpers import FakeJob, jobs_record, make_context


def test_the_peer_is_served_one_run_at_a_time_and_interleaved(tmp_path):
    """peer_run.py against a stand-in with airbench 0.1.8's layout (train94 -> utils.train ->
    utils.print_training_details) in its own process: one run per request, between hasten's."""
    from gpu.peer import PeerProcess
    from gpu.speedrun_sections import PeerJob, comparison, run_jobs

    work = _fake_airbench(tmp_path)
    lines = []
    process = PeerProcess(work, tmp_path / "src", lines.append)
    try:
        assert process.info["hyp"] == {"opt": {"train_epochs": 9.9}}
        ctx = make_context(tmp_path / "out")
        ctx.begin("speedrun")
        log = []
        hasten = FakeJob("tiny", log=log)
        peer = PeerJob(ctx, process)
        rec = jobs_record([hasten, peer])
        run_jobs(ctx, [hasten, peer], 3, rec)
        ctx.close()
    finally:
        process.close()
    assert process.proc.returncode == 0
    peer_runs = rec["jobs"]["peer"]["runs"]
    assert rec["jobs"]["peer"]["warmup_run"]["tta_accuracy"] == 0.5  # run 0: the warm-up
    assert [r["tta_accuracy"] for r in peer_runs] == [0.51, 0.52, 0.53]
    assert [r["time_s"] for r in peer_runs] == [2.0, 3.0, 4.0] and all(r["wall_s"] > 0 for r in peer_runs)
    assert [name for _, name in rec["order"]].count("peer") == 3 and any("row" in line for line in lines)
    saved = json.loads((tmp_path / "out" / "speedrun.json").read_text())
    assert saved["jobs"]["peer"]["runs"] == peer_runs  # kept with the suite's results, not in scratch space
    delta = comparison(rec["jobs"]["tiny"]["runs"], peer_runs)["accuracy_delta_pt"]  # paired by round
    assert delta["n"] == 3 and delta["mean"] == pytest.approx(100 * (0.91 - 0.52))


def test_a_peer_that_dies_raises_instead_of_hanging(tmp_path):
    from gpu.peer import PeerProcess

    work = _fake_airbench(tmp_path, crash=True)
    process = PeerProcess(work, tmp_path / "src", lambda line: None)
    with pytest.raises(RuntimeError, match="exited with status 3"):
        process.run(1, timeout_s=60)
    process.close()


def test_peer_capture_reads_airbench_final_row_and_keeps_printing():
    from gpu.peer_run import capture_final_rows

    printed = []
    utils = types.SimpleNamespace(print_training_details=lambda v, is_final_entry: printed.append(is_final_entry))
    final = capture_final_rows(utils)
    utils.print_training_details({"tta_val_acc": None, "total_time_seconds": 1.0}, is_final_entry=False)
    assert final == {}
    utils.print_training_details({"tta_val_acc": 0.9312, "total_time_seconds": 3.5, "epoch": "eval"},
                                 is_final_entry=True)
    assert final == {"tta_accuracy": 0.9312, "time_s": 3.5} and printed == [False, True]


def test_peer_sdist_is_checked_against_pypis_hash(tmp_path):
    from gpu.peer import SDIST_NAME, locate_airbench

    from hasten.errors import ConfigError

    fake = tmp_path / SDIST_NAME
    with tarfile.open(fake, "w:gz") as tf:
        body = b"def train94(): pass\n"
        info = tarfile.TarInfo("airbench-0.1.8/airbench/lib_airbench94.py")
        info.size = len(body)
        tf.addfile(info, io.BytesIO(body))
    with pytest.raises(ConfigError, match="not PyPI's"):
        locate_airbench(fake)
    missing = locate_airbench(tmp_path / "absent.tar.gz")
    assert missing["found"] is (missing["kind"] == "installed" and missing.get("version") == "0.1.8")


def test_peer_data_round_trip_detects_a_wrong_layout(tmp_path):
    from gpu.peer import check_converted, convert_for_airbench

    from hasten.data import ImageDataset, Split

    g = torch.Generator().manual_seed(0)
    split = Split(torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8, generator=g), torch.arange(6) % 3)
    data = ImageDataset("toy", ["a", "b", "c"], split, split, source="toy")
    conv = convert_for_airbench(data, tmp_path / "cifar10")
    assert conv["shapes"]["train"] == [6, 32, 32, 3]
    saved = torch.load(tmp_path / "cifar10" / "train.pt")
    assert saved["images"].dtype == torch.uint8 and saved["labels"].dtype == torch.int64
    assert torch.equal(saved["images"][2, 5, 7], split.images[2, :, 5, 7])  # pixel (y=5, x=7), NHWC
    assert check_converted(tmp_path / "cifar10", data)
    # Height and width swapped (a wrong layout) is caught by the check.
    torch.save({"images": split.images.transpose(1, 3).contiguous(), "labels": split.labels, "classes": data.classes},
               tmp_path / "cifar10" / "train.pt")
    assert not check_converted(tmp_path / "cifar10", data)


FAKE_UTILS = '''
def print_training_details(variables, is_final_entry):
    print("row", variables.get("tta_val_acc"), variables.get("total_time_seconds"))

def train(run):
    import os
    assert os.path.isdir("cifar10"), "CifarLoader('cifar10') reads from the working directory"
    if CRASH and run:
        os._exit(3)
    tta_val_acc = 0.5 + run / 100
    total_time_seconds = 1.0 + run
    print_training_details(locals(), is_final_entry=False)
    print_training_details(locals(), is_final_entry=True)  # a module-global call, as airbench 0.1.8 makes
'''


def _fake_airbench(tmp_path: Path, crash: bool = False) -> Path:
    package = tmp_path / "src" / "airbench"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from .lib_airbench94 import train94\n")
    (package / "utils.py").write_text(f"CRASH = {crash}\n" + FAKE_UTILS)
    (package / "lib_airbench94.py").write_text(
        "from . import utils\nhyp = {'opt': {'train_epochs': 9.9}}\n"
        "def train94(run=0, verbose=True):\n    return utils.train(run)\n")
    work = tmp_path / "work"
    (work / "cifar10").mkdir(parents=True)
    return work
