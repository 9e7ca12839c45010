"""benchmarks/remote_link_probe.py --smoke: every client reads every byte of the shards over the
emulated link, each burst setting is the one tc reports, and the output holds what the diagnosis
needs (fractions of the link, CPU per GB of client and server, tc counters, the BDP)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hasten.harness.netns import probe

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "remote_link_probe.py"
PREFIX = "hlt"  # not the probe's own: a test must never tear down a running benchmark


@pytest.mark.slow
def test_smoke_run_reads_every_byte_with_every_client_under_both_bursts(tmp_path):
    reason = probe(PREFIX)
    if reason is not None:
        pytest.skip(f"no network namespaces: {reason}")
    out = tmp_path / "probe.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--netns-prefix", PREFIX, "--out", str(out)],
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "HASTEN_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    index = next((tmp_path / "cache").glob("imagenet-like/*/shards-1mib/index.json"))
    shards = json.loads(index.read_text())["splits"]["train"]["shards"]
    total = sum(s["bytes"] for s in shards)
    setup = r["setup"]
    assert setup["data_bytes"] == total and setup["shards"] == len(shards) > 1
    assert setup["bdp_bytes"] == pytest.approx(1e9 / 8 * 0.020)  # 1 Gbit/s x 20 ms
    assert setup["reader_bytes_in_flight"] == setup["requests_in_flight"] * max(s["bytes"] for s in shards)
    configs = {f"{c}, burst {b}" for c in ("curl", "obstore", "hasten", "hasten-loader") for b in ("tc default", "4 ms")}
    assert {run["config"] for run in r["runs"]} == configs == set(r["summary"]) and len(r["runs"]) == 8
    for run in r["runs"]:
        assert run["complete"] and run["data_bytes"] == total, run["config"]  # every byte, once
        assert run["link_bytes"] >= total, run["config"]  # and it crossed the shaped link
        assert run["client_cpu_s"] >= 0 and run["server_cpu_s"] >= 0 and run["wall_s"] > 0, run["config"]
        assert set(run["tc"]) == {"upload", "download"}
        assert all(v >= 0 for side in run["tc"].values() for v in side.values()), run["config"]
        if run["client"].startswith("hasten"):
            assert run["examples"] == 96, run["config"]  # every image's record (decoded, for the loader)
    # The shaping is what the labels say: 4 ms of 1 Gbit/s is 500000 bytes; tc's default is not.
    assert "burst 500000b" in r["tc_classes"]["4 ms"] and "cburst 500000b" in r["tc_classes"]["4 ms"]
    assert "burst 500000b" not in r["tc_classes"]["tc default"]
    by_config = {run["config"]: run for run in r["runs"]}
    for config, row in r["summary"].items():  # one run each: the summary is that run's figures
        run = by_config[config]
        assert row["link_fraction"]["mean"] == pytest.approx(run["link_bytes"] * 8 / run["wall_s"] / 1e9)
        assert row["server_cpu_s_per_gb"]["mean"] == pytest.approx(run["server_cpu_s"] / (total / 1e9))
        assert row["server_cores"]["mean"] == pytest.approx(run["server_cpu_s"] / run["wall_s"])
        assert row["client_cores"]["mean"] == pytest.approx(run["client_cpu_s"] / run["wall_s"])
        assert row["dropped"]["mean"] == run["tc"]["upload"]["dropped"] + run["tc"]["download"]["dropped"]
    assert set(r["tc_qdiscs_at_end"]) == {"upload", "download"} and "conditions" in r
