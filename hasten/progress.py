"""Progress for long work: a tqdm bar on a terminal, a plain line now and then elsewhere.

On a terminal (stderr is a TTY) the bar redraws in place. In a log file, under
nohup, in CI or a Slurm job, carriage-return redraws would fill the log with
noise and a silent command looks hung, so instead one plain line goes to stderr
(flushed) every ``HASTEN_PROGRESS_INTERVAL`` seconds (default 30), with
step/total, rate and time left, plus a last line when the work ends, if it took
long enough to print any:

    train: 120/2000 steps (6%), 3.1 steps/s, 0:00:39 elapsed, about 0:10:06 left

``HASTEN_PROGRESS=0`` turns both off, ``=1`` forces the bar, ``=lines`` forces the lines.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Iterable, Iterator, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")

DEFAULT_INTERVAL_S = 30.0


def progress_mode() -> str:
    """``"bar"``, ``"lines"`` or ``"off"`` (see the module docstring)."""
    forced = os.environ.get("HASTEN_PROGRESS")
    if forced is not None:
        value = forced.strip().lower()
        if value in ("0", "", "false", "no", "off"):
            return "off"
        if value in ("lines", "line", "plain", "log"):
            return "lines"
        return "bar"
    try:
        return "bar" if sys.stderr.isatty() else "lines"
    except (AttributeError, ValueError):  # no stderr, or a closed one
        return "off"


def progress_enabled() -> bool:
    """Whether progress is shown at all (as a bar or as lines)."""
    return progress_mode() != "off"


def progress_interval() -> float:
    """Seconds between plain progress lines: ``$HASTEN_PROGRESS_INTERVAL``, else 30."""
    try:
        value = float(os.environ.get("HASTEN_PROGRESS_INTERVAL", DEFAULT_INTERVAL_S))
    except ValueError:
        return DEFAULT_INTERVAL_S
    return value if value >= 0 else DEFAULT_INTERVAL_S


def progress(iterable: Iterable[T] | None = None, **kwargs):
    """``tqdm(iterable, **kwargs)`` on a terminal, :class:`LineProgress` elsewhere,
    silent with ``disable=True`` or ``HASTEN_PROGRESS=0``."""
    mode = progress_mode()
    disable = kwargs.pop("disable", None)
    if disable is None:
        disable = mode == "off"
    if disable or mode == "bar":
        kwargs.setdefault("dynamic_ncols", True)
        kwargs.setdefault("leave", False)
        return tqdm(iterable, disable=bool(disable), **kwargs)
    return LineProgress(iterable, **kwargs)


def format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class LineProgress:
    """What ``tqdm`` offers the callers here (iterate, ``update``, ``close``, a context
    manager, ``set_description``, ``set_postfix``), written as one plain line to
    stderr every ``interval`` seconds. Keyword arguments of tqdm's that do not
    apply (``leave``, ``dynamic_ncols``, ...) are accepted and ignored."""

    def __init__(self, iterable: Iterable | None = None, *, desc: str | None = None, total: float | None = None,
                 initial: float = 0, unit: str = "it", interval: float | None = None, file=None, **_ignored):
        self.iterable = iterable
        if total is None and iterable is not None:
            try:
                total = len(iterable)  # type: ignore[arg-type]
            except (TypeError, AttributeError):
                total = None
        self.desc, self.total, self.unit = desc or "", total, unit
        self.n = self.initial = initial
        self.interval = progress_interval() if interval is None else interval
        self.file = file
        self.postfix = ""
        self.start = self._last = time.monotonic()
        self.printed = 0
        self.closed = False

    # -- tqdm's interface -------------------------------------------------------------
    def __iter__(self) -> Iterator:
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __len__(self) -> int:
        return int(self.total or 0)

    def __enter__(self) -> "LineProgress":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None:
            self.closed = True  # stopped by an error: the error says so, not a last progress line
        self.close()

    def update(self, n: float = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            self._print(now)

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc or ""

    def set_postfix(self, ordered_dict=None, refresh: bool = True, **kwargs) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        """A last line, if the work took long enough to print any before."""
        if self.closed:
            return
        self.closed = True
        if self.printed:
            self._print(time.monotonic(), done=True)

    # -- the line ---------------------------------------------------------------------
    def line(self, now: float | None = None, done: bool = False) -> str:
        now = time.monotonic() if now is None else now
        elapsed = now - self.start
        done_here = self.n - self.initial
        rate = done_here / elapsed if elapsed > 0 else 0.0
        # tqdm's default unit "it" says nothing: leave it out. Counts are plural.
        one = "" if self.unit == "it" else self.unit.removesuffix("s")
        many = f" {one}s" if one else ""
        if self.total:
            head = f"{_num(self.n)}/{_num(self.total)}{many} ({100 * self.n / self.total:.0f}%)"
        else:
            head = f"{_num(self.n)}{many}"
        if rate >= 1 or rate == 0:
            speed = f"{rate:.1f}{many}/s"
        else:
            speed = f"{1 / rate:.1f} s per {one or 'item'}"
        parts = [head, speed, f"{format_duration(elapsed)} elapsed"]
        if done:
            if not self.total or self.n >= self.total:
                parts.append("done")
        elif self.total and rate > 0 and self.n < self.total:
            parts.append(f"about {format_duration((self.total - self.n) / rate)} left")
        if self.postfix:
            parts.append(self.postfix)
        return f"{self.desc}: " * bool(self.desc) + ", ".join(parts)

    def _print(self, now: float, done: bool = False) -> None:
        self.printed += 1
        print(self.line(now, done), file=self.file or sys.stderr, flush=True)


def _num(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"


def status(message: str) -> None:
    """One line about work that has no step count (reading an archive, filling a
    cache), unless progress is off: printed to stderr, flushed, at once."""
    if progress_enabled():
        print(message, file=sys.stderr, flush=True)
