"""The ``hasten`` command line: one sub-command per technique.

Each sub-command lives in ``hasten.commands.<name>`` and exposes
``add_arguments(parser)`` and ``run(args) -> int``. Modules are imported only when
their command runs, so ``hasten --help`` stays fast and one command's optional
dependencies never break another.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from hasten import __version__
from hasten.errors import HastenError

# name -> one-line help. The module hasten.commands.<name> implements it.
COMMANDS = {
    "speedrun": "CIFAR-10 speedrun: the single-GPU bag of tricks (Page; airbench)",
    "echo": "data echoing (Choi et al. 2019) through the streaming input pipeline",
    "allreduce": "benchmark ring / 2-D torus / naive / native all-reduce",
    "train": "large-batch data-parallel training (LARS, group BN, bf16) under torchrun",
    "profile": "why a training command is slower than the hardware: verdict, predicted and verified fixes",
    "data": "prepare data for streaming: pack an image folder or archive into tar shards",
}


def build_parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    parser = argparse.ArgumentParser(
        prog="hasten",
        description="Make neural-network training as fast as the hardware allows.",
    )
    parser.add_argument("--version", action="version", version=f"hasten {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        sub.add_parser(name, help=help_text, description=help_text)
    return parser, sub


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser, sub = build_parser()
    # The command is the first known command word (else the first word that is not an
    # option, for argparse to reject), before any `--`: in `hasten profile --steps 5 --
    # python train.py` neither "5" nor "python" is it. Its module adds its own options
    # before parsing, so `hasten speedrun --help` lists them.
    words = argv[:argv.index("--")] if "--" in argv else argv
    command = next((a for a in words if a in COMMANDS), next((a for a in words if not a.startswith("-")), None))
    module = None
    if command in COMMANDS:
        module = importlib.import_module(f"hasten.commands.{command}")
        module.add_arguments(sub.choices[command])
    args = parser.parse_args(argv)
    if module is None:
        parser.print_help()
        return 0
    try:
        return int(module.run(args) or 0)
    except HastenError as exc:
        print(f"hasten {command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"hasten {command}: interrupted", file=sys.stderr)
        return 130
