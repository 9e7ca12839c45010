"""What ``hasten train`` says when it stops early: a lost peer rank (killed, or hung past
the collective timeout), torchrun's SIGTERM, or a store of remote shards that failed.
One line each, naming the step, the newest checkpoint and how to resume
(``hasten.distributed.faults`` tells what was lost).

Used by ``hasten.recipes.train``. Changes the training math: no.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from hasten.checkpoint import newest_checkpoint
from hasten.distributed.faults import peer_failure, stop_signal
from hasten.errors import StoreError, StoreUnavailable
from hasten.recipes.train_config import TrainConfig

@dataclass
class Where:
    """How far training got: read by the fault report after the loop is gone."""
    step: int


def lost_peer_message(exc: BaseException, world: int, step: int, cfg: TrainConfig, run_path) -> str | None:
    """The one line for a lost peer or a SIGTERM, or None for any other exception."""
    what = peer_failure(exc) if world > 1 else None
    sig = stop_signal(exc)
    if what is not None:
        head = f"lost contact with a peer rank at step {step} ({what})"
    elif sig is not None:
        head = (f"stopped by {sig.name} at step {step} (torchrun sends it when another rank fails)"
                if world > 1 and sig == signal.SIGTERM else f"stopped by {sig.name} at step {step}")
    else:
        return None
    where = checkpoint_note(cfg, run_path)
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    max_restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    if restarts < max_restarts:
        how = f"torchrun restarts the workers (restart {restarts + 1} of {max_restarts}), which resume from it"
    else:
        how = "rerun with --resume auto"
    return f"{head}; {where}; {how}"


def store_stop_note(failure: StoreError, cfg: TrainConfig, run_path, step: int) -> str:
    """What a rerun can do after a store stopped the run at ``step``: resume advice only when
    the store did not answer (``StoreUnavailable``: waiting may cure it) and a checkpoint
    exists; no run directory named that a stop before the first step leaves behind."""
    newest = newest_checkpoint(run_path) if run_path is not None else None
    waited = isinstance(failure, StoreUnavailable)
    if newest is not None:
        when = "when the store answers again" if waited else "once that is fixed"
        return (f"stopped at step {step}; newest checkpoint: {newest.path} (step {newest.step}); "
                f"rerun with --resume auto {when}")
    if step == 0:
        s3_endpoint = str(cfg.data).startswith(("s3://", "s3a://")) and os.environ.get("AWS_ENDPOINT_URL")
        where = "AWS_ENDPOINT_URL" if s3_endpoint else "the URL's host and port"
        return (f"stopped before the first step; rerun when the store answers (if it never does, check {where})"
                if waited else "nothing was trained")
    every = f"every {cfg.checkpoint_every} steps" if cfg.checkpoint_every else "only at the end"
    return (f"stopped at step {step}, before the first checkpoint (saved {every}; --checkpoint-every N); "
            f"a rerun starts over{' when the store answers again' if waited else ''}")


def checkpoint_note(cfg: TrainConfig, run_path) -> str:
    """Where a stopped run can resume from: its newest checkpoint, or why there is none."""
    newest = newest_checkpoint(run_path) if run_path is not None else None
    if newest is not None:
        return f"newest checkpoint: {newest.path} (step {newest.step})"
    if run_path is None:
        return "no checkpoint (no run directory)"
    every = f"every {cfg.checkpoint_every} steps" if cfg.checkpoint_every else "only at the end"
    return f"no checkpoint in {run_path} yet (saved {every}; --checkpoint-every N)"
