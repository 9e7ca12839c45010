"""``hasten allreduce``: table, JSON fields, plot, and clear errors on bad input."""

import json

import pytest

from cli_helpers import exit_status
from hasten.cli import main
from hasten.commands.allreduce import parse_size


@pytest.mark.multiproc
def test_allreduce_command_writes_table_json_and_plot(tmp_path, capsys):
    out_json, out_png = tmp_path / "ar.json", tmp_path / "ar.png"
    rc = main(["allreduce", "--world", "3", "--sizes", "4K,64K", "--iters", "2", "--warmup", "0",
               "--json", str(out_json), "--plot", str(out_png)])
    assert rc == 0
    report = json.loads(out_json.read_text())
    assert report["world_size"] == 3 and report["backend"] == "gloo"
    assert report["network"]["kind"] == "loopback" and report["grid"] == [1, 3]
    rows = report["results"]
    assert {(r["algo"], r["bytes"]) for r in rows} == {
        (a, b) for a in ("ring", "torus", "naive", "native") for b in (4096, 65536)}
    for r in rows:
        assert r["n"] == 2 and r["time_s"] > 0 and r["predicted_time_s"] > 0
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 2 * 2 / 3)
    assert report["calibration"]["link"]["beta_s_per_byte"] > 0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    assert "busbw GB/s" in table and "ring" in table and "64K" in table


@pytest.mark.parametrize("argv, message", [
    (["--sizes", "12Q"], "cannot read '12Q'"),
    (["--sizes", "6"], "multiples of 4"),
    (["--grid", "3x3", "--world", "4"], "grid 3x3 holds 9 ranks but the group has 4"),
    (["--inter-gbit", "0.25"], "go together"),
    (["--world", "0"], "argument --world: must be an integer in 1..1024"),
    (["--world", "6", "--local-size", "4", "--inter-gbit", "1", "--network", "emulated"],
     "local-size must divide"),
])
def test_bad_input_is_one_line_error(argv, message, capsys):
    assert exit_status(["allreduce", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_parse_size():
    assert [parse_size(s) for s in ("4", "1K", "64KB", "1M", "256M")] == [4, 1024, 65536, 1 << 20, 256 << 20]


@pytest.mark.multiproc
def test_emulated_network_falls_back_to_loopback_without_root(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    out_json = tmp_path / "ar.json"
    assert main(["allreduce", "--world", "2", "--network", "emulated", "--sizes", "4K",
                 "--iters", "1", "--algo", "ring", "--json", str(out_json)]) == 0
    assert "network namespaces unavailable (network namespaces need root)" in capsys.readouterr().out
    network = json.loads(out_json.read_text())["network"]
    assert network == {"kind": "loopback", "fallback_reason": "network namespaces need root"}
