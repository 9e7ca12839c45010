"""benchmarks/imagenet_pipeline.py --smoke: it runs end to end and writes the fields it promises."""

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
