"""``hasten echo`` end to end on a tiny image folder: real training to a target, one-line errors."""

import json

import pytest

from cli_helpers import exit_status
from hasten.cli import main


def test_cli_single_run_writes_json(colours, tmp_path, capsys, one_thread):
    out = tmp_path / "echo.json"
    # 3 ms per image read, 192 ms per batch of 64: several times a step on 16x16 images, and still
    # twice a step that other jobs make three times slower (at 1 ms it read 1.9 under a load of 6).
    rc = main(["echo", "--data", str(colours), "--echo", "2", "--variant", "batch", "--upstream-delay", "0.003",
               "--target", "0.9", "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["baseline"] and len(data["results"]) == 2
    for entry in data["results"]:
        for key in ("variant", "echo_factor", "upstream_ratio", "fresh_examples_to_target", "steps_to_target",
                    "wall_time_to_target_s", "final_accuracy", "idle_fraction"):
            assert key in entry
    assert {e["echo_factor"] for e in data["results"]} == {1.0, 2.0}
    base = next(e for e in data["results"] if e["echo_factor"] == 1.0)
    echoed = next(e for e in data["results"] if e["echo_factor"] == 2.0)
    # R measured by the loop must show the storage delay: at least most of the delay's own share
    # (storage_ratio: delay per batch over step time), well above 1. Storage that does not sleep,
    # or a ratio taken the wrong way round, fails this.
    assert base["storage_ratio"] > 2
    assert base["upstream_ratio"] > 0.7 * base["storage_ratio"] and base["idle_fraction"] > 0.5
    assert base["upstream_ratio"] == pytest.approx(1 / (1 - base["idle_fraction"]))
    assert echoed["upstream_ratio"] == base["upstream_ratio"]
    # Echoing hides part of the wait: fewer seconds waited for input. (Not a smaller idle share: on a
    # loaded machine the echoed run's shorter steps can leave its share higher, 0.94 against 0.88.)
    def waited(e):
        return e["idle_fraction"] * e["wall_time_s"]
    assert waited(echoed) < 0.8 * waited(base)
    out = capsys.readouterr().out
    assert "speedup" in out and "step time" in out


@pytest.mark.parametrize("argv,match", [
    (["--echo", "0.5"], ">= 1"), (["--echo", "fast"], "'auto' or a finite number"),
    (["--variant", "sideways"], "'example-before', 'example-after', 'batch'"), (["--target", "1.5"], "--target"),
    (["--upstream-ratio", "-1"], "--upstream-ratio: must be a finite number >= 0"),
    (["--repeats", "0"], "--repeats: must be an integer >= 1"),
])
def test_cli_bad_options_one_line_exit_2(colours, argv, match, capsys):
    assert exit_status(["echo", "--data", str(colours), *argv]) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_sweep_options_build_the_sweep_config(colours):
    import argparse

    from hasten.commands.echo import add_arguments, config_from
    from hasten.recipes.echo.config import SweepConfig

    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg = config_from(p.parse_args(["--data", str(colours), "--sweep", "--e-max", "6"]), "cpu")
    assert isinstance(cfg, SweepConfig) and cfg.seeds == 3 and cfg.e_max == 6.0
    assert config_from(p.parse_args(["--data", str(colours), "--sweep", "--repeats", "5"]), "cpu").seeds == 5


def test_sweep_command_journals_under_runs_and_says_it_resumes(colours, tmp_path, monkeypatch, capsys):
    """hasten echo --sweep hands the sweep a journal named for its settings, under the runs
    root, and says so; run again, it says how many finished runs it will take from it."""
    from hasten.recipes.echo import sweep

    monkeypatch.setenv("HASTEN_RUNS", str(tmp_path / "runs"))
    seen = []

    def fake_run(cfg, *, log=None, journal=None):
        seen.append(journal.path)
        journal.run("a finished run", lambda: {"end_accuracy": 0.5})
        return {"summary": [], "results": []}

    monkeypatch.setattr(sweep, "run", fake_run)
    monkeypatch.setattr("hasten.recipes.echo.report.write_plots", lambda summary, directory: [])
    argv = ["echo", "--data", str(colours), "--sweep", "--device", "cpu"]
    assert main(argv) == 0
    assert "rerun the command to resume" in capsys.readouterr().out
    assert main(argv) == 0
    assert "resuming, 1 finished runs" in capsys.readouterr().out
    assert seen[0] == seen[1] and seen[0].is_file() and (tmp_path / "runs") in seen[0].parents
    assert main([*argv, "--e-max", "4"]) == 0  # other settings: another journal
    assert seen[2] != seen[0]
