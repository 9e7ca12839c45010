"""benchmarks/restart_markers.py --smoke: it runs, checks that the crops of the marked files are
the plain files' (it asserts so itself), and writes its rows, bytes and conditions."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hasten.decode import restart, turbojpeg

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.skipif(not (restart.available() and turbojpeg.available()),
                    reason="no libjpeg of ABI 62 (Pillow's) or no libturbojpeg 3")
def test_smoke_run_writes_every_configuration_with_its_conditions(tmp_path, photo_folder):
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, str(BENCH / "restart_markers.py"), "--smoke", "--folder", str(photo_folder),
                           "--sizes", "64", "--out", str(out)], capture_output=True, text=True, cwd=BENCH, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["images"] == 24 and data["refused"] == 0
    got = {(r["size"], r["stage"], r["files"]) for r in data["rows"]}
    assert got == {(64, stage, files) for stage, files in [
        ("region decode", "as given"), ("region decode", "restart markers"), ("region decode", "intervals prebuilt"),
        ("fused crop", "as given"), ("fused crop", "restart markers")]}
    assert all(r["mean"] > 0 for r in data["rows"])
    assert data["bytes"]["restart_markers"] > data["bytes"]["optimised_no_markers"]  # the markers cost bytes
    assert "load_average_before" in data["conditions"]
