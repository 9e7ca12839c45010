"""benchmarks/remote_shards.py --smoke over hasten's own readers (the peers are a benchmark-only
extra): it runs end to end in network namespaces and what it writes holds together."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hasten.harness.netns import probe

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "remote_shards.py"
PREFIX = "hrt"  # not the benchmark's own: a test must never tear down a running benchmark


@pytest.mark.slow
def test_smoke_run_reads_every_image_over_the_link_once_then_from_the_cache(tmp_path):
    reason = probe(PREFIX)
    if reason is not None:
        pytest.skip(f"no network namespaces: {reason}")
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--readers", "hasten,hasten-s3",
                           "--netns-prefix", PREFIX, "--out", str(out)], capture_output=True, text=True,
                          timeout=900, env={**os.environ, "HASTEN_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert set(r["runs"]) == {"hasten local", "hasten @ 0.1 Gbit/s", "hasten-s3 @ 0.1 Gbit/s",
                              "hasten @ 1 Gbit/s", "hasten-s3 @ 1 Gbit/s"}
    shards = json.loads((tmp_path / "cache").glob("imagenet-like/*/shards/index.json").__next__().read_text())
    data_bytes = sum(s["bytes"] for s in shards["splits"]["train"]["shards"])
    for config, (run,) in r["runs"].items():
        assert [e["images"] for e in run] == [96, 96], config
        assert all(e["peak_pss_bytes"] and e["cpu_s"] > 0 and e["store_cpu_s"] >= 0 for e in run), config
        if config.endswith("local"):
            assert all(e["link_bytes"] < 100_000 for e in run), config  # nothing crossed the link
            continue
        first, second = run
        assert first["link_bytes"] >= data_bytes, config  # every shard crossed the link once ...
        assert second["link_bytes"] < 0.01 * data_bytes, config  # ... and epoch 2 came from the cache
        # The link's rate bounds what crossed it (the shaping works, the bytes are counted right).
        rate = float(config.split()[2])
        assert first["link_bytes"] * 8 / first["wall_s"] <= 1.05 * rate * 1e9, config
    assert "request RTT +20 ms by a userspace relay" in r["link"]
