"""``hasten profile``: why a training command is slower than the hardware, the fix, and proof.

    hasten profile [--steps N | --seconds S] [--warmup N] [--json PATH] [--verify] -- python train.py --lr 0.1
    hasten profile -- torchrun --nproc-per-node 2 train.py
    hasten profile --no-probe autocast,loader -- python train.py

Runs the unmodified command with hasten's profiler injected into each of its
Python processes (``hasten.profile.inject``), measures ``--steps`` optimizer steps
(or about ``--seconds`` of them) after ``--warmup``, runs the counterfactual probes,
stops it (a script that never ends is fine), and prints a verdict,
the time breakdown and ranked fixes with predicted speedups; ``--verify``
measures each fix that can be applied without editing the command against the
baseline, with a 95% interval (:mod:`hasten.profile.verify`).
Writes results.json and timeline.png to a run directory.
"""

from __future__ import annotations

import argparse
import sys

from hasten import cli_types as t
from hasten.errors import ConfigError
from hasten.profile.inject.settings import PROBES, parse_probes
from hasten.profile.launcher import ProfileConfig, ProfileFailed, profile
from hasten.profile.report import format_report, plot_timeline, results_json
from hasten.rundir import RunDir, write_json


def probe_names(text: str) -> tuple[str, ...]:
    """``--no-probe``: probe names, comma-separated, each one of :data:`PROBES`."""
    try:
        names = parse_probes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not names:
        raise argparse.ArgumentTypeError(f"give one or more of {', '.join(PROBES)}, got {text!r}")
    return tuple(p for p in PROBES if p in names)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=t.int_range(3), default=20, help="optimizer steps to measure after the warm-up (default 20)")
    p.add_argument("--seconds", type=t.nonneg_float, default=0.0, metavar="S",
                   help="measure about S seconds of steps instead of --steps (from the warm-up's step time)")
    p.add_argument("--warmup", type=t.nonneg_int, default=5, help="optimizer steps to discard first (default 5)")
    p.add_argument("--probe-steps", type=t.int_range(2), default=8, help="steps per counterfactual probe (default 8)")
    p.add_argument("--verify", action="store_true", help="measure each applicable fix against the baseline (3 interleaved re-runs of each, or "
                        "blocks of steps switched in one run): speedups with 95%% intervals and their cost")
    p.add_argument("--json", type=t.output_file, default=None, metavar="PATH", help="also write the results JSON here")
    p.add_argument("--timeout", type=t.positive_float, default=300.0, metavar="SECONDS",
                   help="stop a run of the command after this long (default 300)")
    p.add_argument("--quiet", action="store_true",
                   help="hide the command's own output (its tail and each failing rank's error are shown on failure)")
    p.add_argument("--stall", type=t.positive_float, default=30.0, metavar="SECONDS",
                   help="say what is seen when no optimizer step comes for this long (default 30)")
    p.add_argument("--decide-within", type=t.nonneg_float, default=30.0, metavar="SECONDS",
                   help="measure on, up to this long, while the data share's interval straddles a verdict "
                        "threshold (default 30; 0: exactly --steps)")
    p.add_argument("--no-probe", type=probe_names, action="append", default=[], metavar="NAMES",
                   help=f"turn probes off, comma-separated (repeatable): {', '.join(PROBES)}; "
                        "autocast and comm are replays and go with replay")
    p.add_argument("command_line", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                   help="the training command to profile, after --")


def run(args: argparse.Namespace) -> int:
    command = list(args.command_line)
    if command[:1] == ["--"]:
        command = command[1:]
    try:
        config = ProfileConfig(tuple(command), warmup=args.warmup, steps=args.steps, probe_steps=args.probe_steps,
                               verify=args.verify, timeout_s=args.timeout, capture=args.quiet,
                               seconds=args.seconds, stall_s=args.stall, decide_s=args.decide_within,
                               skip_probes=tuple(p for names in args.no_probe for p in names))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    try:
        analysis = profile(config)
    except ProfileFailed as exc:
        print(f"hasten profile: {exc}", file=sys.stderr)
        return exc.exit_code
    with RunDir("profile") as rd:
        rd.write_config({**vars(args), "command_line": command})
        results = results_json(analysis, command, rd.environment)
        rd.write_results(results)
        png = plot_timeline(analysis, rd.path / "timeline.png")
    print(format_report(analysis))
    print(f"  results: {rd.path / 'results.json'}, timeline: {png}")
    if args.json:
        write_json(args.json, results)
    return 0
