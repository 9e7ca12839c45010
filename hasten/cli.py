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
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hasten",
        description="Make neural-network training as fast as the hardware allows.",
    )
    parser.add_argument("--version", action="version", version=f"hasten {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=f"hasten.commands.{name}")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    # Two passes: find the command first, then let its module add its own options.
    known, _ = parser.parse_known_args(argv)
    if known.command is None:
        parser.print_help()
        return 0
    module = importlib.import_module(known._module)
    sub_action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    module.add_arguments(sub_action.choices[known.command])
    args = parser.parse_args(argv)
    try:
        return int(module.run(args) or 0)
    except HastenError as exc:
        print(f"hasten {known.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"hasten {known.command}: interrupted", file=sys.stderr)
        return 130
