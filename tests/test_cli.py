import pytest

from hasten import __version__
from hasten.cli import COMMANDS, main


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and __version__ in capsys.readouterr().out


@pytest.mark.parametrize("command, option", [("speedrun", "--runs"), ("echo", "--echo"),
                                             ("allreduce", "--algo"), ("train", "--optimizer")])
def test_command_help_lists_its_own_options(command, option, capsys):
    assert command in COMMANDS
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0 and option in capsys.readouterr().out


def test_no_command_prints_help(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)


def test_unknown_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bogus"])
    assert exc.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_command_is_found_past_option_values_and_before_double_dash(monkeypatch):
    import hasten.commands.profile as profile_command

    seen = {}
    monkeypatch.setattr(profile_command, "run", lambda args: seen.update(vars(args)) or 0)
    assert main(["profile", "--steps", "5", "--", "python", "train.py", "echo", "--lr", "0.1"]) == 0
    assert seen["steps"] == 5
    assert seen["command_line"][-5:] == ["python", "train.py", "echo", "--lr", "0.1"]
