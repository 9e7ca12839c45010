"""Training checkpoints: atomic writes, safe loads, clear errors.

A checkpoint is one dict of tensors and plain Python values, so it loads with
``torch.load(path, weights_only=True)`` (no pickled code runs on load). It is
written to a temporary file in the same directory, flushed to disk and renamed
over the old one: a crash mid-write leaves the previous good checkpoint in place.

Changes the training math: no.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import torch

from hasten.errors import HastenError

__all__ = ["CheckpointError", "save_checkpoint", "load_checkpoint", "rng_state", "set_rng_state"]


class CheckpointError(HastenError, RuntimeError):
    """A checkpoint file that is missing, truncated, corrupt or not ours."""


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> Path:
    """Write ``state`` to ``path`` atomically (temp file, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


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
