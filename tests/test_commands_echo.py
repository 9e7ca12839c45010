"""``hasten echo`` end to end on a tiny image folder: real training to a target, one-line errors."""

import json

import pytest

from hasten.cli import main


def test_cli_single_run_writes_json(colours, tmp_path, capsys, one_thread):
    out = tmp_path / "echo.json"
    rc = main(["echo", "--data", str(colours), "--echo", "2", "--variant", "batch", "--upstream-delay", "0.0002",
               "--target", "0.9", "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["baseline"] and len(data["results"]) == 2
    for entry in data["results"]:
        for key in ("variant", "echo_factor", "upstream_ratio", "fresh_examples_to_target", "steps_to_target",
                    "wall_time_to_target_s", "final_accuracy", "idle_fraction"):
            assert key in entry
    assert {e["echo_factor"] for e in data["results"]} == {1.0, 2.0}
    assert data["results"][0]["upstream_ratio"] >= 1 and data["results"][0]["storage_ratio"] > 0
    assert data["results"][1]["upstream_ratio"] == data["results"][0]["upstream_ratio"]
    out = capsys.readouterr().out
    assert "speedup" in out and "step time" in out


@pytest.mark.parametrize("argv,match", [
    (["--echo", "0.5"], ">= 1"), (["--echo", "fast"], "'auto' or a number"),
    (["--variant", "sideways"], "example-before, example-after, batch"), (["--target", "1.5"], "target"),
    (["--upstream-ratio", "-1"], "upstream ratio must be >= 0"), (["--repeats", "0"], "repeats must be >= 1"),
])
def test_cli_bad_options_one_line_exit_2(colours, argv, match, capsys):
    assert main(["echo", "--data", str(colours), *argv]) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err
