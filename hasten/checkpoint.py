"""Training checkpoints: atomic writes, safe loads, clear errors.

A checkpoint is one dict of tensors and plain Python values, so it loads with
``torch.load(path, weights_only=True)`` (no pickled code runs on load). It is
written to a temporary file in the same directory, flushed to disk and renamed
over the old one: a crash mid-write leaves the previous good checkpoint in place.
With ``keep_previous`` the one it replaces is kept as ``<name>-previous.pt``, and
:func:`newest_checkpoint` picks the newest of the two that loads, so even a file
damaged after it was written (a copy cut short, a disk error) costs one interval.

Changes the training math: no.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hasten.errors import HastenError

__all__ = ["CheckpointError", "CheckpointInfo", "save_checkpoint", "load_checkpoint", "newest_checkpoint",
           "rng_state", "set_rng_state"]

CHECKPOINT_NAME = "checkpoint.pt"


class CheckpointError(HastenError, RuntimeError):
    """A checkpoint file that is missing, truncated, corrupt or not ours."""


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete checkpoint file and the training step it was written at."""
    path: Path
    step: int


def previous_path(path: str | os.PathLike) -> Path:
    """Where :func:`save_checkpoint` keeps the checkpoint ``path`` replaced."""
    path = Path(path)
    return path.with_name(f"{path.stem}-previous{path.suffix}")


def _fsync_dir(directory: Path) -> None:
    # The rename is durable only once the directory entry is on disk too.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any], *, keep_previous: bool = False) -> Path:
    """Write ``state`` to ``path`` atomically (temp file, fsync, rename). With
    ``keep_previous`` an existing ``path`` is first renamed to ``<stem>-previous<suffix>``.
    A reader (or a process killed at any instant) sees either the old complete file
    or the new complete file, never a partial one under either name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        if keep_previous and path.exists():
            os.replace(path, previous_path(path))
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def newest_checkpoint(directory: str | os.PathLike, name: str = CHECKPOINT_NAME) -> CheckpointInfo | None:
    """The newest complete checkpoint among ``directory/name`` and the previous one
    :func:`save_checkpoint` kept, or None when neither exists or loads.

    "Complete" means it loads (``torch.load`` checks the zip directory at the end of
    the file, so a truncated or half-copied file fails) and holds an integer
    ``step``. Temporary files of an interrupted write are never considered. Files
    are memory-mapped, so looking costs little even for a large model."""
    directory = Path(directory)
    found = []
    for path in (directory / name, previous_path(directory / name)):
        if not path.is_file():
            continue
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception:  # damaged: torch raises several types; skip it, the other may be good
            continue
        if isinstance(state, dict) and isinstance(state.get("step"), int):
            found.append(CheckpointInfo(path, state["step"]))
    return max(found, key=lambda c: c.step, default=None)


def load_checkpoint(path: str | os.PathLike, map_location="cpu") -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` with weights_only=True."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises several types for damaged zip archives
        raise CheckpointError(
            f"checkpoint {path} is corrupt or truncated and cannot be loaded "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
            "delete it or resume from another run"
        ) from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} holds a {type(state).__name__}, not a dict")
    return state


def rng_state() -> dict[str, Any]:
    """Python and torch (CPU and CUDA) random states, in weights_only-safe types."""
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
