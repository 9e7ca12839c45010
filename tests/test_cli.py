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


# Every command, and every action of `hasten data` (its required words given).
UNKNOWN_OPTION_CASES = [["speedrun"], ["echo"], ["allreduce"], ["train"], ["profile"], ["data"],
                        ["data", "pack", "{src}", "{out}"], ["data", "jpeg", "{out}"]]


def test_the_unknown_option_cases_cover_every_command():
    assert {words[0] for words in UNKNOWN_OPTION_CASES} == set(COMMANDS)


@pytest.mark.parametrize("words", UNKNOWN_OPTION_CASES, ids=lambda words: " ".join(w for w in words if "{" not in w))
def test_an_unknown_option_is_named_with_its_command(words, tmp_path, capsys):
    """argparse leaves unknown options to the top parser, which would say `hasten: error:`."""
    command = " ".join(w for w in words if "{" not in w)
    argv = [w.format(src=tmp_path, out=tmp_path / "out") for w in words]
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--nosuchflag"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == f"hasten {command}: error: unrecognized arguments: --nosuchflag\n"


def test_a_command_with_actions_describes_each_of_them(capsys):
    """`hasten data --help` once described only `pack`."""
    import argparse
    import importlib

    from hasten.cli import build_parser

    parser, sub = build_parser()
    checked = 0
    for name in COMMANDS:
        command = sub.choices[name]
        importlib.import_module(f"hasten.commands.{name}").add_arguments(command)
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                missing = [a for a in action.choices if f"({a})" not in command.description]
                assert not missing, f"hasten {name} --help does not describe {missing}: {command.description!r}"
                checked += 1
    assert checked >= 1
    with pytest.raises(SystemExit):
        main(["data", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "tar shards for streaming (pack)" in out and "JPEG files, which makes CIFAR-10-JPEG (jpeg)" in out
