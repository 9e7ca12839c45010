"""The ``hasten`` command line: one sub-command per technique.

Each sub-command lives in ``hasten.commands.<name>`` and exposes
``add_arguments(parser)`` and ``run(args) -> int``. Modules are imported only when
their command runs, so ``hasten --help`` stays fast and one command's optional
dependencies never break another.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import os
import signal
import sys
import threading
from typing import NoReturn

from hasten import __version__
from hasten.errors import HastenError, Terminated

# name -> one-line help. The module hasten.commands.<name> implements it.
COMMANDS = {
    "speedrun": "CIFAR-10 speedrun: the single-GPU bag of tricks (Page; airbench)",
    "echo": "data echoing (Choi et al. 2019) through the streaming input pipeline",
    "allreduce": "benchmark ring / 2-D torus / naive / native all-reduce",
    "train": "large-batch data-parallel training (LARS, group BN, bf16) under torchrun",
    "profile": "why a training command is slower than the hardware: verdict, predicted and verified fixes",
    "data": "prepare data: pack an image folder or archive into tar shards for streaming (pack), or write a "
            "data set as JPEG files, which makes CIFAR-10-JPEG (jpeg)",
}


def _shows_default(action: argparse.Action) -> bool:
    # Identity, not equality: a default of 0 is worth showing, False (a switch) is not.
    return not any(action.default is v for v in (None, False, True, argparse.SUPPRESS)) and action.nargs != 0


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with each option's default, except where there is none to show
    (None, a switch's False) or the help text already says it."""

    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and action.option_strings and _shows_default(action):
            action = copy.copy(action)
            action.help = "default: %(default)s"
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or "default" in text.lower() or not _shows_default(action):
            return text
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr and exit status 2:

        hasten echo: error: argument --workers: must be an integer >= 0, got '-1'

    (argparse prints the whole usage first; ``--help`` still shows it). Sub-command
    parsers are of this class too, and show their options' defaults."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        message = " ".join(str(message).split())
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    parser = Parser(
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
    name = f"hasten {command}" if command in COMMANDS else "hasten"
    # From here on (importing torch takes seconds), SIGTERM and SIGINT stop with one line.
    with _signals_raise():
        try:
            module = None
            if command in COMMANDS:
                module = importlib.import_module(f"hasten.commands.{command}")
                module.add_arguments(sub.choices[command])
            args, unknown = parser.parse_known_args(argv)
            if unknown:
                # argparse leaves them to the top parser, whose error would name just `hasten`.
                _chosen_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
            if module is None:
                parser.print_help()
                return 0
            return int(module.run(args) or 0)
        except HastenError as exc:
            print(f"{name}: error: {one_line(exc)}", file=sys.stderr, flush=True)
            return 2
        except KeyboardInterrupt:
            print(f"{name}: interrupted (SIGINT)", file=sys.stderr, flush=True)
            return 128 + signal.SIGINT
        except Terminated as exc:
            print(f"{name}: stopped by {exc}", file=sys.stderr, flush=True)
            return 128 + exc.signum


def _chosen_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost (sub-)command parser ``args`` went through: ``hasten data pack``'s for
    ``hasten data pack ...``, so that its errors name that command."""
    while True:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        name = getattr(args, sub.dest, None) if sub is not None else None
        if name not in (sub.choices if sub is not None else {}):
            return parser
        parser = sub.choices[name]


def one_line(exc: BaseException) -> str:
    """An exception's message as one line (a command's error is one line on stderr)."""
    return " ".join(str(exc).split()) or type(exc).__name__


@contextlib.contextmanager
def _signals_raise():
    """While a command runs, SIGTERM (``timeout``, Slurm, ``docker stop``) raises
    ``Terminated`` in the main thread, as SIGINT raises KeyboardInterrupt, so the
    command unwinds (removing what it made) and says in one line that it stopped;
    a second SIGTERM or SIGINT while it does ends the process at once, quietly,
    with the same exit status 128 + signal."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stopping = []
    stopped = []  # a stop signal came (never emptied, unlike ``stopping``)

    def handler(signum, frame):
        if stopping:
            os._exit(128 + signum)
        stopping.append(signum)
        stopped.append(signum)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(signum)

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    # Only signals left at their defaults: an embedding program's own handlers stay.
    installed = [sig for sig, h in previous.items()
                 if h in (signal.SIG_DFL, signal.default_int_handler)]
    previous_hook = sys.unraisablehook

    def unraisable(info):
        # The handler runs wherever the main thread is, and there Python may ignore the
        # exception it raises: a finalizer, or an at-fork hook such as logging's that runs
        # each time decode workers start. The stop would be lost and the command run on.
        # Send the signal again from another thread, so that it is raised at the next line
        # of ordinary code (os.kill from this thread would run the handler here again at
        # once), a little later so that this hook has returned (where it lands in such a
        # place again, this hook sends it again).
        if stopping and isinstance(info.exc_value, (KeyboardInterrupt, Terminated)):
            signum = stopping.pop()
            resend = threading.Timer(0.05, os.kill, args=(os.getpid(), signum))
            resend.daemon = True
            resend.start()
        else:
            previous_hook(info)

    previous_excepthook = sys.excepthook

    def excepthook(kind, value, tb):
        # The signal reaches the whole process group, so decode workers die with the command.
        # multiprocessing's resource sharer, handing one of them a shared buffer's descriptor
        # at that moment, reports the broken connection through sys.excepthook from its own
        # thread: a traceback under the one line of the stop (CI saw it after a SIGTERM).
        if stopped and issubclass(kind, (ConnectionError, EOFError)):
            return
        previous_excepthook(kind, value, tb)

    for sig in installed:
        signal.signal(sig, handler)
    if installed:
        sys.unraisablehook = unraisable
        sys.excepthook = excepthook
    try:
        yield
    finally:
        for sig in installed:
            signal.signal(sig, previous[sig])
        if installed:
            sys.unraisablehook = previous_hook
            sys.excepthook = previous_excepthook
