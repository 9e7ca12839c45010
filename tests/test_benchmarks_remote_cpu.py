"""benchmarks/remote_cpu.py --smoke: it reads every object through every route, the cache
file it writes is the object, and the bound it prints is the arithmetic of its own columns."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "remote_cpu.py"


def test_smoke_run_accounts_every_route_and_the_bound_adds_up(tmp_path):
    pytest.importorskip("obstore")
    pytest.importorskip("RangeHTTPServer")
    out = tmp_path / "remote_cpu.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--decode-cpu-s-per-gb", "10",
                           "--link-gbit", "1", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert set(r["results"]) == {"receive, get_range", "receive, streamed", "cache write, get_range + pwrite",
                                 "cache write, write_to", "sha256, second pass", "worker reads"}
    for name, route in r["results"].items():
        assert len(route["reader_s"]["values"]) == r["repeats"], name
        assert all(v >= 0 for v in route["reader_s"]["values"] + route["store_s"]["values"]), name
    b, remote = r["bound"], r["results"]["cache write, write_to"]
    total = 10 + remote["reader_s"]["mean"] + remote["store_s"]["mean"]
    assert b["total_cpu_s_per_gb"] == pytest.approx(total)
    assert b["of_link"] == pytest.approx(2 / total / (1 / 8))
