"""Every option of every command, given a value users get wrong, stops the command at the
boundary: exit status 2, one line on stderr naming the option, no traceback, no work done.

The test walks the parsers ``hasten.cli`` builds, so an option added without a check (or
without an entry in SPEC below) fails here. The heavy entry points (a run directory,
the all-reduce launch, packing, profiling, loading data) are replaced by a tripwire: a
value that gets past validation reaches it and the case fails.
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest
import torch

from hasten.cli import COMMANDS, build_parser, main

MISSING = "/nonexistent/hasten-test/missing"

# What users get wrong, by the kind of value an option takes.
KINDS = {
    "positive_int": ["0", "-1", "1.5", "abc", "", "99999999999999999999"],
    "nonneg_int": ["-1", "1.5", "abc", "", "99999999999999999999"],
    "seed": ["-1", "1.5", "abc", "", "99999999999999999999"],
    "positive_float": ["0", "-1", "nan", "inf", "-inf", "abc", ""],
    "nonneg_float": ["-1", "nan", "inf", "abc", ""],
    "fraction": ["-0.1", "1", "1.5", "nan", "inf", "abc", ""],            # [0, 1)
    "accuracy": ["0", "-0.5", "1.5", "nan", "inf", "abc", ""],             # (0, 1]
    "device": ["tpu", "gpu", "cuda:x", "", *([] if torch.cuda.is_available() else ["cuda", "cuda:0"])],
    "choice": ["bogus", ""],
    "path": [MISSING, ""],
    "output_file": ["", "{dir}"],
    "output_dir": ["", "{file}"],
    "new_or_empty_dir": ["", "{file}", "{full}"],
}
WORKERS = KINDS["nonneg_int"] + ["100000"]
THREADS = KINDS["positive_int"] + ["100000"]

# (command path, option) -> (kind or list of bad values, extra bad values). Switches are not listed.
SPEC = {
    ("speedrun", "--data"): ("path", []),
    ("speedrun", "--runs"): ("positive_int", []),
    ("speedrun", "--device"): ("device", []),
    ("speedrun", "--preset"): ("choice", []),
    ("speedrun", "--seed"): ("seed", []),
    ("speedrun", "--epochs"): ("positive_float", []),
    ("speedrun", "--batch-size"): ("positive_int", []),
    ("speedrun", "--threads"): ("positive_int", []),
    ("speedrun", "--train-subset"): ("nonneg_int", []),
    ("speedrun", "--target"): ("accuracy", []),
    ("speedrun", "--resume"): ("path", []),
    ("speedrun", "--json"): ("output_file", []),
    ("echo", "--data"): ("path", []),
    ("echo", "--echo"): (["0", "0.5", "-2", "nan", "inf", "fast", ""], []),
    ("echo", "--variant"): ("choice", []),
    ("echo", "--upstream-delay"): ("nonneg_float", []),
    ("echo", "--upstream-ratio"): ("nonneg_float", []),
    ("echo", "--target"): ("accuracy", ["1"]),
    ("echo", "--e-max"): (["0", "0.5", "-1", "nan", "inf", "abc", ""], []),
    ("echo", "--repeats"): ("positive_int", []),
    ("echo", "--device"): ("device", []),
    ("echo", "--threads"): (THREADS, []),
    ("echo", "--workers"): (WORKERS, []),
    ("echo", "--json"): ("output_file", []),
    ("echo", "--plots"): ("output_dir", []),
    ("allreduce", "--algo"): ("choice", []),
    ("allreduce", "--world"): ("positive_int", ["100000"]),
    ("allreduce", "--sizes"): (["12Q", "6", "0", "-4", "", ",", "1000000G"], []),
    ("allreduce", "--iters"): ("positive_int", []),
    ("allreduce", "--warmup"): ("nonneg_int", []),
    ("allreduce", "--grid"): (["3", "0x2", "ax2", "1x2x3", "", "3x3"], []),
    ("allreduce", "--network"): ("choice", []),
    ("allreduce", "--link-gbit"): ("positive_float", []),
    ("allreduce", "--inter-gbit"): ("positive_float", []),
    ("allreduce", "--local-size"): ("positive_int", []),
    ("allreduce", "--timeout"): ("positive_float", []),
    ("allreduce", "--json"): ("output_file", []),
    ("allreduce", "--plot"): ("output_file", []),
    # URL mistakes too (tests/test_stream_store_url.py: what each says).
    ("train", "--data"): ("path", ["ftp://host/shards/", "s3:///prefix/", "gs://", "https://user:pw@host/shards/",
                                   "s3://bucket/prefix/?versionId=1", "file:///tmp/shards/"]),
    ("train", "--model"): ("choice", []),
    ("train", "--width"): ("positive_int", []),
    ("train", "--image-size"): ("positive_int", []),
    ("train", "--train-subset"): ("nonneg_int", []),
    ("train", "--loader"): ("choice", []),
    ("train", "--workers"): (WORKERS, []),
    ("train", "--batch-size"): ("positive_int", []),
    ("train", "--epochs"): ("positive_float", []),
    ("train", "--optimizer"): ("choice", []),
    ("train", "--lr"): ("positive_float", []),
    ("train", "--lr-scaling"): ("choice", []),
    ("train", "--base-batch"): ("positive_int", []),
    ("train", "--momentum"): ("fraction", []),
    ("train", "--weight-decay"): ("nonneg_float", []),
    ("train", "--trust-coefficient"): ("positive_float", []),
    ("train", "--warmup-epochs"): ("nonneg_float", ["10"]),  # not less than the default --epochs 10
    ("train", "--decay-power"): ("nonneg_float", []),
    ("train", "--label-smoothing"): ("fraction", []),
    ("train", "--bn-group"): ("positive_int", []),
    ("train", "--ghost-batch"): ("nonneg_int", ["5"]),  # does not divide the batch of 512
    ("train", "--hook"): ("choice", []),
    ("train", "--compress"): ("choice", []),
    ("train", "--retries"): (["-1", "1001", "1.5", "abc", ""], []),
    ("train", "--checkpoint-every"): ("nonneg_int", []),
    ("train", "--resume"): ("path", []),
    ("train", "--run-dir"): ("output_dir", []),
    ("train", "--collective-timeout"): ("positive_float", []),
    ("train", "--seed"): ("seed", []),
    ("train", "--device"): ("device", []),
    ("train", "--json"): ("output_file", []),
    ("profile", "--steps"): ("positive_int", ["2"]),
    ("profile", "--seconds"): ("nonneg_float", []),
    ("profile", "--warmup"): ("nonneg_int", []),
    ("profile", "--probe-steps"): ("positive_int", ["1"]),
    ("profile", "--json"): ("output_file", []),
    ("profile", "--timeout"): ("positive_float", []),
    ("profile", "--stall"): ("positive_float", []),
    ("profile", "--decide-within"): ("nonneg_float", []),
    ("profile", "--no-probe"): (["autocats", "", ",", "replay,bogus"], []),
    ("data pack", "src"): ("path", []),
    ("data pack", "outdir"): ("new_or_empty_dir", []),
    ("data pack", "--shard-size-mb"): ("positive_float", []),
    ("data pack", "--seed"): ("seed", []),
    ("data pack", "--max-side"): (["0", "-1", "31", "1.5", "abc", "", "99999999999999999999"], []),
    ("data pack", "--quality"): (["0", "101", "-5", "1.5", "abc", ""], []),
    ("data jpeg", "--quality"): (["0", "101", "-1", "abc", "", "nan"], []),
}
# Options whose values are checked elsewhere, with the reason.
NOT_HERE = {
    ("profile", "command_line"): "the profiled command: its own tests (tests/test_commands_profile.py)",
    ("data jpeg", "paths"): "[SRC] OUT: see test_data_jpeg_paths below",
}
# The flag's name as the error line says it (positionals by their dest).
SWITCH_ACTIONS = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._HelpAction,
                  argparse._VersionAction, argparse._SubParsersAction)


def _parsers():
    """{command path: parser} for every command and sub-command, built as ``hasten`` builds them."""
    parser, sub = build_parser()
    found = {}

    def walk(p, path):
        found[path] = p
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, f"{path} {name}")

    for name in COMMANDS:
        importlib.import_module(f"hasten.commands.{name}").add_arguments(sub.choices[name])
        walk(sub.choices[name], name)
    return found


def _options(p):
    for action in p._actions:
        if isinstance(action, SWITCH_ACTIONS):
            continue
        yield action.option_strings[-1] if action.option_strings else action.dest


class Reached(BaseException):
    """Validation let the value through: the command started its work."""


@pytest.fixture
def tripwire(monkeypatch):
    """The heavy entry points of every command raise ``Reached``."""
    def trip(*args, **kwargs):
        raise Reached

    import hasten.commands.profile
    import hasten.data
    import hasten.recipes.allreduce
    import hasten.rundir
    import hasten.stream.pack

    monkeypatch.setattr(hasten.rundir.RunDir, "__init__", trip)
    monkeypatch.setattr(hasten.recipes.allreduce, "run", trip)
    monkeypatch.setattr(hasten.stream.pack, "pack", trip)
    monkeypatch.setattr(hasten.commands.profile, "profile", trip, raising=False)
    monkeypatch.setattr(hasten.data, "load_dataset", trip)
    monkeypatch.delenv("HASTEN_DATA", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    threads = torch.get_num_threads()  # hasten echo sets them before its run directory
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def places(tmp_path):
    """Paths the base command lines and the bad values name."""
    (tmp_path / "data").mkdir()
    (tmp_path / "a-dir").mkdir()
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    return {"data": str(tmp_path / "data"), "dir": str(tmp_path / "a-dir"), "file": str(tmp_path / "a-file"),
            "full": str(tmp_path / "full"), "out": str(tmp_path / "new-out")}


def _argv(path: str, option: str | None, value: str | None, places: dict) -> list[str]:
    """A valid command line of ``path`` with ``option`` set to ``value``."""
    opt = [] if option is None else [option, value]
    words = path.split()
    if path in ("speedrun", "echo", "train"):
        base = {"--data": places["data"], "--device": "cpu"}
        base.pop(option, None)
        return [*words, *(w for pair in base.items() for w in pair), *opt]
    if path == "allreduce":
        return [*words, "--world", "2", "--sizes", "4K", *opt]
    if path == "profile":
        return [*words, *opt, "--", "python", "train.py"]
    if path == "data pack":
        src = value if option == "src" else places["data"]
        out = value if option == "outdir" else places["out"]
        return [*words, *([] if option in ("src", "outdir") else opt), src, out]
    if path == "data jpeg":
        return [*words, *opt, places["out"]]
    raise AssertionError(path)


def _run(argv, capsys) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    except Reached:
        raise AssertionError(f"accepted, the command started its work: hasten {' '.join(argv)}") from None
    return code, capsys.readouterr().err


def test_every_option_is_covered():
    listed = set(SPEC) | set(NOT_HERE)
    found = {(path, opt) for path, p in _parsers().items() for opt in _options(p)}
    assert not found - listed, f"options without bad values in tests/test_cli_flags.py SPEC: {sorted(found - listed)}"
    assert not listed - found, f"SPEC lists options no command has: {sorted(listed - found)}"


@pytest.mark.parametrize("path", ["speedrun", "echo", "allreduce", "train", "profile", "data pack", "data jpeg"])
def test_the_base_command_lines_are_valid(path, tripwire, places, capsys):
    """So that in every case below the bad value, and nothing else, is what stops the command."""
    with pytest.raises(Reached):
        main(_argv(path, None, None, places))


@pytest.mark.parametrize("path, option", sorted(SPEC), ids=[" ".join(k) for k in sorted(SPEC)])
def test_bad_values_stop_at_the_boundary_in_one_line(path, option, tripwire, places, capsys):
    kind, extra = SPEC[(path, option)]
    values = (KINDS[kind] if isinstance(kind, str) else kind) + extra
    for value in values:
        value = value.format(**places)
        argv = _argv(path, option, value, places)
        code, err = _run(argv, capsys)
        lines = err.splitlines()
        shown = f"hasten {' '.join(argv)}"
        assert code == 2, f"{shown}: exit {code}, stderr {err!r}"
        assert len(lines) == 1, f"{shown}: {len(lines)} lines on stderr:\n{err}"
        assert lines[0].startswith("hasten ") and option in lines[0], f"{shown}: {lines[0]!r} does not name {option}"
        assert "Traceback" not in err


@pytest.mark.parametrize("argv, says", [
    # Checks across flags name the flags, and the path comes first.
    (["train", "--warmup-epochs", "5", "--epochs", "2"], "--warmup-epochs 5 must be >= 0 and less than --epochs 2"),
    (["train", "--data", MISSING, "--warmup-epochs", "5", "--epochs", "2"], "argument --data: "),
    (["train", "--batch-size", "16", "--ghost-batch", "5"], "--ghost-batch 5 must divide the per-replica batch 16"),
    (["speedrun", "--ablate", "--batch-size", "100"], "--batch-size 100 must be a multiple of 32"),
    (["allreduce", "--inter-gbit", "1"], "--inter-gbit and --local-size go together"),
    (["allreduce", "--world", "4", "--grid", "3x3"], "--grid: grid 3x3 holds 9 ranks but the group has 4"),
    (["allreduce", "--world", "6", "--local-size", "4", "--inter-gbit", "1", "--network", "emulated"],
     "--local-size must divide --world 6"),
    (["allreduce", "--world", "1000", "--sizes", "64G"], "GiB of memory"),
    (["echo", "--upstream-delay", "0.1", "--upstream-ratio", "2"], "--upstream-ratio: not allowed with"),
    (["data", "jpeg", "", "out"], "SRC and OUT must not be empty"),
    (["data", "jpeg", MISSING, "out"], f"SRC '{MISSING}' does not exist"),
])
def test_cross_flag_errors_name_the_flags(argv, says, tripwire, places, capsys, monkeypatch):
    if argv[0] in ("train", "speedrun", "echo") and "--data" not in argv:
        argv = [argv[0], "--data", places["data"], *argv[1:]]
    code, err = _run(argv, capsys)
    assert code == 2 and len(err.splitlines()) == 1 and says in err, err


def test_data_jpeg_paths(tripwire, places, capsys):
    code, err = _run(["data", "jpeg", "a", "b", "c"], capsys)
    assert code == 2 and "takes [SRC] OUT, got 3 paths" in err and len(err.splitlines()) == 1


def test_a_missing_hasten_data_is_named_before_any_work(tripwire, monkeypatch, capsys):
    monkeypatch.setenv("HASTEN_DATA", MISSING)
    for command in ("speedrun", "echo", "train"):
        code, err = _run([command], capsys)
        assert code == 2 and err.strip() == (f"hasten {command}: error: argument --data: '{MISSING}' (the value of "
                                             "$HASTEN_DATA) does not exist")


def test_short_runs_scale_the_default_warm_up_down(tripwire, places, monkeypatch):
    """--epochs 1 with the default --warmup-epochs: 0.2 epochs of warm-up, not an error."""
    import hasten.recipes.train as recipe

    seen = []

    def plan_resume(cfg, *args, **kwargs):
        seen.append(cfg)
        raise Reached

    monkeypatch.setattr(recipe, "plan_resume", plan_resume)
    for epochs, warmup in (("1", 0.2), ("5", 1.0), ("10", 2.0), ("90", 2.0)):
        with pytest.raises(Reached):
            main(["train", "--data", places["data"], "--epochs", epochs])
        assert seen[-1].warmup_epochs == pytest.approx(warmup)


def test_help_shows_defaults(capsys):
    for argv, shown in ((["train", "--help"], "default: 0.9"), (["echo", "--help"], "(default: 8.0)"),
                        (["speedrun", "--help"], "(default: 1)"), (["data", "pack", "--help"], "(default: 64.0)")):
        with pytest.raises(SystemExit):
            main(argv)
        assert shown in capsys.readouterr().out, argv


def test_help_names_every_store_scheme_and_the_retries_default(capsys):
    """Issue 46: `echo --help` once wrote `http(s)://`, which names neither scheme as a user types it."""
    import re

    from hasten.stream.store_url import SCHEMES

    for command in ("train", "echo"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
        for kind in sorted(set(SCHEMES.values())):
            named = [s for s, k in SCHEMES.items() if k == kind and f"{s}://" in text]
            assert named, f"hasten {command} --help names no scheme of {kind}"
        assert "http://" in text and "https://" in text, command
        if command == "train":
            assert re.search(r"--retries RETRIES .*\(default 8\)", text), text


def test_from_the_shell(tmp_path):
    """The real entry point, end to end: no traceback, one line, exit 2 (in-process above, for speed)."""
    proc = subprocess.run([sys.executable, "-m", "hasten", "echo", "--device", "tpu"], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr == ("hasten echo: error: argument --device: unknown device 'tpu'; "
                                                    "use auto, cpu, cuda or cuda:N\n"), proc.stderr
