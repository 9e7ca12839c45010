"""Argument types for the ``hasten`` command line: each option's value checked where it is read.

Every command's options use these as ``argparse`` ``type=`` functions, so a value
that cannot work (0 workers per step, a negative momentum, NaN, an unknown
device, a path that is not there) stops the command at once with exit status 2
and one line naming the flag, before any data is read or any process starts:

    hasten echo: error: argument --workers: must be an integer >= 0, got '-1'

The checks here are about one value; checks across flags (warm-up shorter than
the run, a batch the world size divides) live with each command and raise
``hasten.errors.ConfigError`` naming the flags.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Callable

__all__ = ["int_range", "float_range", "positive_int", "nonneg_int", "seed", "positive_float", "nonneg_float",
           "finite_float", "probability", "fraction", "device", "existing_path", "output_file", "output_dir",
           "new_or_empty_dir", "nonempty", "echo_factor", "INT_MAX", "MAX_WORKERS", "MAX_THREADS"]

# Larger than any count a run could use (steps, images, batch): beyond it a value is a typo.
INT_MAX = 2**31 - 1
# Processes or threads a command starts: far more than any machine has cores.
MAX_WORKERS = 512
MAX_THREADS = 1024


def _named(fn: Callable, name: str) -> Callable:
    fn.__name__ = fn.__qualname__ = name  # argparse names the type in some of its messages
    return fn


def int_range(lo: int, hi: int = INT_MAX, what: str | None = None) -> Callable[[str], int]:
    """An integer in ``[lo, hi]``."""
    bounds = what or (f"an integer >= {lo}" if hi == INT_MAX else f"an integer in {lo}..{hi}")

    def parse(text: str) -> int:
        try:
            value = int(str(text).strip(), 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {text!r}")
        return value

    return _named(parse, f"int_range({lo}, {hi})")


def float_range(lo: float = -math.inf, hi: float = math.inf, *, lo_open: bool = False, hi_open: bool = False,
                what: str | None = None) -> Callable[[str], float]:
    """A finite number between ``lo`` and ``hi`` (each end open or closed)."""
    if what is None:
        parts = []
        if lo > -math.inf:
            parts.append(f"{'>' if lo_open else '>='} {lo:g}")
        if hi < math.inf:
            parts.append(f"{'<' if hi_open else '<='} {hi:g}")
        what = "a finite number" + (f" {' and '.join(parts)}" if parts else "")

    def parse(text: str) -> float:
        try:
            value = float(str(text).strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        ok = (math.isfinite(value) and (value > lo if lo_open else value >= lo)
              and (value < hi if hi_open else value <= hi))
        if not ok:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    return _named(parse, "float_range")


positive_int = _named(int_range(1), "positive_int")
nonneg_int = _named(int_range(0), "nonneg_int")
# torch.manual_seed and numpy's seeding both take it.
seed = _named(int_range(0, 2**32 - 1), "seed")
positive_float = _named(float_range(0, lo_open=True), "positive_float")
nonneg_float = _named(float_range(0), "nonneg_float")
finite_float = _named(float_range(), "finite_float")
probability = _named(float_range(0, 1), "probability")          # [0, 1]
fraction = _named(float_range(0, 1, hi_open=True), "fraction")  # [0, 1)

DEVICES = "auto, cpu, cuda or cuda:N"


def device(text: str) -> str:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (a CUDA device torch can see)."""
    value = str(text).strip().lower()
    if value in ("auto", "cpu"):
        return value
    kind, _, index = value.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; use {DEVICES}")
    import torch

    if not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text!r} was asked for, but torch sees no CUDA device; use auto or cpu")
    if index and int(index) >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"{text!r}: torch sees {torch.cuda.device_count()} CUDA device(s)")
    return value


device = _named(device, "device")


def nonempty(text: str) -> str:
    if not str(text).strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def existing_path(text: str) -> str:
    """A file or directory that exists (``~`` expanded)."""
    nonempty(text)
    path = Path(text).expanduser()
    if not path.exists():
        # --data defaults to $HASTEN_DATA: say where a value nobody typed came from.
        origin = " (the value of $HASTEN_DATA)" if text == os.environ.get("HASTEN_DATA") else ""
        raise argparse.ArgumentTypeError(f"{text!r}{origin} does not exist")
    return str(path)


def output_file(text: str) -> str:
    """A file to write: not empty, not an existing directory, under no existing file."""
    nonempty(text)
    path = Path(text).expanduser()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; name a file")
    _check_parents(text, path.parent)
    return str(path)


def output_dir(text: str) -> str:
    """A directory to write into (made if missing): not empty, not an existing file."""
    nonempty(text)
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file; name a directory")
    _check_parents(text, path.parent)
    return str(path)


def new_or_empty_dir(text: str) -> str:
    """A directory that does not exist yet, or exists and is empty."""
    output_dir(text)
    path = Path(text).expanduser()
    if path.is_dir() and any(path.iterdir()):
        raise argparse.ArgumentTypeError(f"{text!r} is not empty; name a new or empty directory")
    return str(path)


def _check_parents(text: str, parent: Path) -> None:
    for p in (parent, *parent.parents):
        if p.exists():
            if not p.is_dir():
                raise argparse.ArgumentTypeError(f"{text!r}: {str(p)!r} is a file, not a directory")
            if not os.access(p, os.W_OK | os.X_OK):
                raise argparse.ArgumentTypeError(f"{text!r}: cannot write in {str(p)!r}")
            return


_at_least_one = float_range(1)


def echo_factor(text: str) -> float | str:
    """``auto`` or a finite number >= 1 (data echoing's factor)."""
    if str(text).strip().lower() == "auto":
        return "auto"
    try:
        return _at_least_one(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be 'auto' or a finite number >= 1, got {text!r}") from None
