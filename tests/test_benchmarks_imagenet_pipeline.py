"""benchmarks/imagenet_pipeline.py --smoke: it runs end to end and writes the fields it promises; its
helpers pack a folder of one's own once (_imagenet_pipeline_data.py) and break the CPU down by stage
(_imagenet_pipeline_stages.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "imagenet_pipeline.py"


@pytest.mark.slow
def test_smoke_run_writes_every_promised_field(tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--cache-dir", str(tmp_path / "cache"),
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(out.read_text())
    assert r["data"]["train_images"] == 96 and r["data"]["classes"] == 4
    for name in ("hasten fused 224", "torch DataLoader 224", "decode only, pillow"):
        assert r["images_per_s_per_core"][name] > 0
    assert set(r["speedup_per_core"]) == {"224", "128"} and r["speedup_per_core"]["224"]["mean"] > 0
    assert [m["epoch"] for m in r["rss_mb"]] == [1, 2] and all(m["images"] == 96 for m in r["rss_mb"])
    assert r["cache_epoch2_speedup"] > 0 and r["cache"]["slow_reads"] == r["cache"]["shards"]
    stages = r["stages"]["224"]["ms_per_image"]
    assert stages["loading process: scan the shard's tar headers"] > 0
    assert any(k.startswith("worker: decode") for k in stages) and any("pread" in k for k in stages)
    assert r["stages"]["224"]["total_ms_per_image"] >= sum(stages.values()) - 1e-3
    assert "load_average_before" in r["conditions"]
    assert "speedup per core over the Pillow DataLoader at 224" in proc.stdout


if str(SCRIPT.parent) not in sys.path:  # the benchmark's helper modules, imported as the script imports them
    sys.path.insert(0, str(SCRIPT.parent))


def test_a_folder_of_ones_own_is_packed_once_and_again_when_it_changes(photo_folder, tmp_path):
    import shutil

    from _imagenet_pipeline_data import packed_folder

    from hasten.stream.shard_store import open_shards

    folder = shutil.copytree(photo_folder, tmp_path / "photos")
    got, shards = packed_folder(tmp_path / "cache", folder, seed=0)
    assert got == folder and open_shards(shards, "train").total == 54
    index = (shards / "index.json").stat().st_mtime_ns
    assert packed_folder(tmp_path / "cache", folder, seed=0)[1] == shards  # packed once ...
    assert (shards / "index.json").stat().st_mtime_ns == index
    (folder / "train" / "ant" / "ant00.jpg").unlink()
    changed = packed_folder(tmp_path / "cache", folder, seed=0)[1]
    assert changed != shards and open_shards(changed, "train").total == 53  # ... and again when it changes
    with pytest.raises(SystemExit, match="train/<class>/"):
        packed_folder(tmp_path / "cache", tmp_path / "cache", seed=0)


def test_the_stage_breakdown_reports_the_decode_floor(photo_folder, tmp_path):
    """The floor's decodes (the last row of each box the loader draws, at 1/8) run for every
    image of the breakdown: a box whose last row is outside the scaled image would raise."""
    from hasten.decode import turbojpeg

    if not turbojpeg.available():
        pytest.skip("no libturbojpeg 3")
    from _imagenet_pipeline_data import packed_folder
    from _imagenet_pipeline_stages import stage_breakdown

    from hasten.stream.shard_store import open_shards

    shards = open_shards(packed_folder(tmp_path / "cache", photo_folder, seed=0)[1], "train")
    stages = stage_breakdown(shards, 64, images=54)
    assert stages["images"] == 54 and stages["decode_floor_ms_per_image"] > 0
