"""`hasten profile` end to end through the CLI."""

import json
import sys
from pathlib import Path

from hasten.cli import main

SCRIPTS = Path(__file__).parent / "profile_scripts"


def test_profile_command_prints_the_report_and_writes_json(tmp_path, capsys):
    out = tmp_path / "p.json"
    code = main(["profile", "--warmup", "2", "--steps", "8", "--probe-steps", "4", "--quiet", "--json", str(out),
                 "--", sys.executable, str(SCRIPTS / "input_bound.py"), "--item-sleep", "0.002"])
    assert code == 0
    printed = capsys.readouterr().out
    assert printed.startswith("hasten profile: INPUT-BOUND")
    d = json.loads(out.read_text())
    assert d["verdict"] == "input-bound" and d["ranks"] == 1 and d["device"] == "cpu"
    assert d["recommendations"] and d["command"][-2:] == ["--item-sleep", "0.002"]
    run_dirs = list((tmp_path / "runs").glob("profile-*"))
    assert len(run_dirs) == 1 and (run_dirs[0] / "timeline.png").exists()


def test_profile_command_returns_the_commands_exit_code(capsys):
    code = main(["profile", "--quiet", "--", sys.executable, str(SCRIPTS / "input_bound.py"), "--exit-after", "2"])
    assert code == 3
    err = capsys.readouterr().err
    assert "failed with exit code 3" in err and "Traceback" not in err


def test_profile_without_a_command_is_a_usage_error(capsys):
    assert main(["profile", "--steps", "5"]) == 2
    assert "after `--`" in capsys.readouterr().err
