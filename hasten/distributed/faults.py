"""A lost peer rank, said in one line: recognise a failed collective and stop cleanly.

When one rank of a torch.distributed job dies (killed, out of memory, machine
gone) or hangs, every other rank fails inside a collective: gloo raises a
``RuntimeError`` such as ``[.../pair.cc:537] Read error ...: Connection reset by
peer ... GLHF!`` within a second, or ``Timed out waiting 300000ms for recv`` once
the process group's timeout passes for a hung peer; NCCL raises
``DistBackendError``; hasten's own all-reduce hooks raise ``CollectiveError``. And
torchrun's elastic agent, once it sees one worker die, sends SIGTERM to the others,
which by default kills them wherever they are, without a word.

This module turns both into an exception with one readable line:

    with stop_on_sigterm() as guard:
        try:
            train_loop()
        except BaseException as exc:
            guard.stopping = True             # from here on SIGTERM cannot interrupt the report
            lost = peer_failure(exc)          # None: an ordinary bug, let it propagate
            if lost is None:
                raise
            raise PeerLostError(f"lost contact with a peer rank at step {step} ({lost})") from None

Usable in any plain PyTorch loop. Changes the training math: no.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
from typing import Iterator

import torch.distributed as dist

from hasten.distributed.p2p import CollectiveError
from hasten.errors import HastenError, Terminated

__all__ = ["PeerLostError", "SigtermGuard", "Terminated", "peer_failure", "stop_on_sigterm", "stop_signal",
           "terminated"]


class PeerLostError(HastenError, RuntimeError):
    """Training stopped because a peer rank died, hung past the timeout, or the job was torn down
    (SIGTERM) or interrupted (SIGINT). ``exit_code``: what the process should exit with
    (1, or 128 + the signal's number)."""

    def __init__(self, message: str = "", exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


# Messages of collective failures caused by a peer, as gloo, NCCL and the store word them.
_PEER_PATTERNS = re.compile(
    r"connection (reset|closed|refused)|broken pipe|timed out|timeout|by peer|pair closure|"
    r"gloo|nccl|processgroup", re.IGNORECASE)
# gloo prefixes its messages with the C++ source location, e.g. "[/__w/.../pair.cc:537] ".
_SOURCE_PREFIX = re.compile(r"^\[[^\]]*\.(cc|cpp|h|hpp):\d+\]\s*")
# ... and ends them with advice that is not about this run.
_ADVICE = re.compile(r"\s*(This is typically caused|Check the logs of the remote).*$", re.DOTALL)


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _backend() -> str:
    try:
        return dist.get_backend() if dist.is_initialized() else "torch.distributed"
    except (RuntimeError, ValueError):
        return "torch.distributed"


def _summary(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = _ADVICE.sub("", _SOURCE_PREFIX.sub("", text)).strip().rstrip(".")
    # "Read error [127.0.0.1]:55021: Connection reset by peer" -> "Connection reset by peer"
    m = re.search(r"Connection (reset|closed|refused)( by peer)?|Broken pipe", text, re.IGNORECASE)
    if m:
        text = m.group(0)
    if len(text) > 160:
        text = text[:157] + "..."
    return text


def peer_failure(exc: BaseException) -> str | None:
    """A short description of the peer failure behind ``exc``, or None when ``exc``
    (and what caused it) is not a failed collective.

    ``exc`` counts when it, its cause or its context is a ``torch.distributed.DistError``
    (NCCL, store and network errors), hasten's ``CollectiveError``, or a
    ``RuntimeError`` whose message is a transport's (gloo raises plain RuntimeError).
    Returned like ``"gloo: Connection reset by peer"``."""
    for e in _chain(exc):
        if isinstance(e, CollectiveError):
            return f"hasten all-reduce: {_summary(e)}"
        if isinstance(e, dist.DistError) or (type(e) is RuntimeError and _PEER_PATTERNS.search(str(e))):
            return f"{_backend()}: {_summary(e)}"
    return None


def terminated(exc: BaseException) -> Terminated | None:
    """The :class:`Terminated` in ``exc``'s chain, if any."""
    return next((e for e in _chain(exc) if isinstance(e, Terminated)), None)


def stop_signal(exc: BaseException) -> signal.Signals | None:
    """The signal that stopped the process, when ``exc`` (or its cause or context)
    is SIGTERM's :class:`Terminated` or SIGINT's ``KeyboardInterrupt``."""
    for e in _chain(exc):
        if isinstance(e, Terminated):
            return signal.Signals(e.signum)
        if isinstance(e, KeyboardInterrupt):
            return signal.SIGINT
    return None


class SigtermGuard:
    """What :func:`stop_on_sigterm` yields: set ``stopping = True`` once the process is
    already on its way out (reporting a lost peer, say), and a later SIGTERM is
    ignored so that the report is not cut short. A plain attribute store, because
    the interpreter runs a pending signal handler only at calls and loop edges: no
    handler can run between ``except`` and the store."""

    def __init__(self) -> None:
        self.stopping = False


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[SigtermGuard]:
    """Within the block, the first SIGTERM raises :class:`Terminated` in the main
    thread, instead of killing the process silently; later ones are ignored, as is
    any after the yielded guard's ``stopping`` was set, and so is SIGTERM after the
    block when it ended that way (the process is expected to report and exit).
    Outside the main thread it does nothing (signal handlers can only be installed
    there)."""
    guard = SigtermGuard()
    if threading.current_thread() is not threading.main_thread():
        yield guard
        return

    def handler(signum, frame):
        if guard.stopping:
            return
        guard.stopping = True
        raise Terminated(signum)

    previous_hook = sys.unraisablehook

    def unraisable(info):
        # Raised where Python ignores exceptions (an at-fork hook, a finalizer): the stop
        # would be lost and later SIGTERMs ignored. Clear the mark and send it again from a
        # timer thread, to be raised in ordinary code (as hasten.cli does for its handlers).
        if isinstance(info.exc_value, Terminated) and guard.stopping:
            guard.stopping = False
            resend = threading.Timer(0.05, os.kill, args=(os.getpid(), signal.SIGTERM))
            resend.daemon = True
            resend.start()
        else:
            previous_hook(info)

    previous = signal.signal(signal.SIGTERM, handler)
    sys.unraisablehook = unraisable
    try:
        yield guard
    finally:
        sys.unraisablehook = previous_hook
        # On the way out after a failure, SIGTERM stays ignored: torchrun sends it to
        # every survivor the moment one worker dies, and the default action would
        # kill this process before it said why it stopped. torchrun follows up with
        # SIGKILL if the process does not exit.
        signal.signal(signal.SIGTERM, signal.SIG_IGN if guard.stopping else previous)
