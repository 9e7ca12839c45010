"""A command that ends on its own before hasten's window is done (issue 32, item 1: do no harm).

pytorch/examples' regression/main.py stops when its loss is low enough, after a few hundred
sub-millisecond steps: its run was fine, so hasten reports from the steps it measured and
exits 0. The step counts here are fixed by the scripts' own arguments: whether the command
ends inside the window does not depend on timing."""

import json
import sys
from pathlib import Path

import pytest

from hasten.cli import main
from hasten.profile.launcher import ProfileConfig, ProfileFailed, profile
from profile_helpers import measured_steps

SCRIPTS = Path(__file__).parent / "profile_scripts"


def _short(steps: int, **kw) -> ProfileConfig:
    kw = {"warmup": 3, "steps": 1000, "probe_steps": 4, "capture": True, "timeout_s": 120, **kw}
    return ProfileConfig((sys.executable, str(SCRIPTS / "short_run.py"), "--steps", str(steps),
                          "--batch-sleep", "0.01"), **kw)


def test_a_command_that_ends_inside_the_window_is_reported_from_the_steps_measured():
    analysis = profile(_short(60), log=lambda m: None)
    assert analysis.ended_early
    # 60 steps counted at backward(), 3 of them warm-up: the rest are the report's (the last may be open)
    assert 55 <= analysis.steps <= 57 and analysis.steps_from == "backward"
    note = analysis.notes[0]
    assert note.startswith("the command ended on its own (exit 0) after 60 steps")
    assert "--warmup 0 measures 3 more" in note and "probes did not run" in note
    # 10 ms of get_batch() sleep against a 4-to-1 linear layer: input-bound by construction
    assert analysis.verdict == "input-bound"


def test_the_cli_exits_0_with_the_report_of_a_command_that_ended_on_its_own(tmp_path, capsys):
    out = tmp_path / "p.json"
    code = main(["profile", "--warmup", "0", "--steps", "1000", "--quiet", "--json", str(out), "--",
                 sys.executable, str(SCRIPTS / "short_run.py"), "--steps", "40", "--batch-sleep", "0.01"])
    printed = capsys.readouterr().out
    assert code == 0 and printed.startswith("hasten profile: ")
    assert "note: the command ended on its own (exit 0) after 40 steps" in printed
    assert "more iterations or epochs" in printed and "--warmup 0 measures" not in printed
    assert json.loads(out.read_text())["ended_early"] is True


def test_a_command_that_ends_in_its_warm_up_still_says_to_lower_it():
    with pytest.raises(ProfileFailed) as exc:
        profile(_short(5, warmup=10), log=lambda m: None)
    assert exc.value.exit_code == 2 and "lower --warmup/--steps" in str(exc.value)


def test_a_command_that_fails_inside_the_window_is_not_reported_as_ended_on_its_own(tmp_path):
    # the same short run, then a failure: its exit code, not a report
    script = tmp_path / "fails.py"
    script.write_text(f"import runpy, sys\nsys.argv = ['short_run.py', '--steps', '20']\n"
                      f"runpy.run_path({str(SCRIPTS / 'short_run.py')!r}, run_name='__main__')\nsys.exit(4)\n")
    with pytest.raises(ProfileFailed) as exc:
        profile(ProfileConfig((sys.executable, str(script)), warmup=3, steps=1000, capture=True), log=lambda m: None)
    assert exc.value.exit_code == 4 and "failed with exit code 4 after 20 steps" in str(exc.value)


def test_a_window_of_millisecond_steps_goes_on_to_a_second():
    # 12 steps of a 1 ms sleep are 12 ms: one time slice of another job would be most of it. The window
    # doubles until it has lasted a second (the script runs far longer than that).
    cmd = (sys.executable, str(SCRIPTS / "short_run.py"), "--steps", "100000", "--batch-sleep", "0.001")
    a = profile(ProfileConfig(cmd, warmup=3, steps=12, probe_steps=3, capture=True, timeout_s=120),
                log=lambda m: None)
    assert not a.ended_early and a.extended >= 1 and measured_steps(a) >= 24  # (a stall left out is measured)
    assert sum(r["span_s"] for r in a.per_step) > 0.5
