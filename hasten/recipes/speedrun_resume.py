"""A stopped speedrun job resumed: its checkpoint (``JobCheckpoint``: the runs
finished and the run in progress at its last epoch end), what it must share with
the job that resumes it (``run_identity``), and where a job starts (``plan_resume``:
fresh, ``--resume auto`` or a path). ``hasten.recipes.speedrun_train.train_run`` continues
a run from its state with the same steps on the same batches.

Changes the training math: no (a resumed run ends with the same weights, bit for bit
on the CPU, as one never stopped).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from hasten.checkpoint import (CHECKPOINT_NAME, CheckpointError, load_checkpoint, newest_checkpoint, previous_path,
                               save_checkpoint)
from hasten.data import ImageDataset
from hasten.errors import ConfigError
from hasten.recipes.speedrun_recipe import LADDER, RunResult, SpeedrunConfig
from hasten.rundir import config_digest, runs_root

# ----------------------------------------------------------------------------
# Checkpoints: a stopped job resumed
# ----------------------------------------------------------------------------

CHECKPOINT_FORMAT = "hasten speedrun 1"
RESUME_AUTO = "auto"


def run_identity(config: SpeedrunConfig, dataset: ImageDataset | None = None) -> dict:
    """What a stopped job must share with a new one to be resumed by it: what its
    results depend on (recipe, runs, seed, data, device type, ladder and target), not
    how it is watched (warm-up, output files)."""
    if dataset is not None:
        data = f"{dataset.name} ({dataset.source})"
    else:
        data = config.data or "cifar10-download"
        if Path(data).expanduser().exists():
            data = str(Path(data).expanduser().resolve())
    return {"preset": config.preset, "recipe": dataclasses.asdict(config.recipe), "runs": config.runs,
            "seed": config.seed, "data": data, "train_subset": config.train_subset,
            "device": torch.device(config.device).type, "ablate": config.ablate,
            "target": config.target if config.ablate else None}


class JobCheckpoint:
    """A job's ``checkpoint.pt`` in its run directory (``hasten.checkpoint.save_checkpoint``:
    atomic, the one before kept as ``checkpoint-previous.pt``): the results of the runs
    finished and, at its last epoch end, the state of the run in progress. Its ``step``
    counts the job's training steps. ``directory=None`` keeps the bookkeeping, writes nothing."""

    def __init__(self, directory: str | os.PathLike | None, identity: dict, state: dict | None = None):
        self.path = Path(directory) / CHECKPOINT_NAME if directory is not None else None
        self.identity = identity
        self.done: list[RunResult] = [RunResult(**r) for r in state["done"]] if state is not None else []
        self.done_steps: int = state["done_steps"] if state is not None else 0
        self.current: dict | None = state["current"] if state is not None else None

    def resume_state(self, index: int) -> dict | None:
        """The saved state of run ``index`` when the job stopped inside it, else None."""
        current = self.current
        return current["run"] if current is not None and current["index"] == index else None

    def save_run(self, index: int, state: dict) -> None:
        """At an epoch end of run ``index`` (``train_run``'s ``on_checkpoint``)."""
        self.current = None  # the state holds the live tensors: saved, not kept
        self._save(self.done_steps + state["step"], {"index": index, "run": state})

    def finish(self, result: RunResult, steps: int) -> None:
        """A run ended: its result joins the finished ones."""
        self.done.append(result)
        self.done_steps += steps
        self.current = None
        self._save(self.done_steps, None)

    def remove(self) -> None:
        """The job is complete: nothing left to resume."""
        if self.path is not None:
            for path in (self.path, previous_path(self.path)):
                path.unlink(missing_ok=True)

    def _save(self, step: int, current: dict | None) -> None:
        if self.path is not None:
            save_checkpoint(self.path, {"format": CHECKPOINT_FORMAT, "step": step, "identity": self.identity,
                                        "digest": config_digest(self.identity),
                                        "done": [dataclasses.asdict(r) for r in self.done],
                                        "done_steps": self.done_steps, "current": current,
                                        # a resumed run uses the same threads: float sums split over
                                        # another count round in another order, and it would not end
                                        # bit for bit as the run never stopped
                                        "torch_threads": torch.get_num_threads()}, keep_previous=True)


def describe_checkpoint(state: dict, config: SpeedrunConfig) -> str:
    """How far a checkpointed job got, in words: "1 of 3 runs finished, run 1 to epoch 4 of 7"."""
    jobs = config.runs * (len(LADDER) if config.ablate else 1)
    text = f"{len(state['done'])} of {jobs} {'ladder runs' if config.ablate else 'runs'} finished"
    current = state["current"]
    if current is not None:
        text += f", run {current['index']} to epoch {current['run']['epoch']} of {math.ceil(config.recipe.epochs)}"
    return text


@dataclass(frozen=True)
class ResumePlan:
    """Where a job starts: the run directory to continue (None: a new one), the
    checkpoint state (None: fresh) and a line for the user (None: nothing to say)."""
    run_path: Path | None
    state: dict | None
    note: str | None


def plan_resume(config: SpeedrunConfig, resume: str | os.PathLike | None, root: str | os.PathLike | None = None,
                dataset: ImageDataset | None = None) -> ResumePlan:
    """Decide where a job starts.

    - ``resume=None``: fresh, in a new run directory.
    - ``resume="auto"``: the stopped job of the same settings (``run_identity``) whose
      checkpoint is newest, among the ``speedrun-*`` run directories under ``root``
      (default ``$HASTEN_RUNS``, else ``runs``); with none, fresh, said in the note.
    - ``resume=PATH``: that run directory or checkpoint file; a ``ConfigError`` naming
      the settings that differ when it was written with other ones.

    ``dataset``: the in-memory data set ``run`` will be given, if any (part of the settings)."""
    if resume is None:
        return ResumePlan(None, None, None)
    identity = run_identity(config, dataset)
    digest = config_digest(identity)
    if str(resume) == RESUME_AUTO:
        root = Path(root) if root is not None else runs_root()
        found, others = [], 0
        for directory in sorted(root.glob("speedrun-*")):
            newest = newest_checkpoint(directory)
            if newest is None:
                continue
            state = load_checkpoint(newest.path)
            if state.get("digest") == digest:
                found.append((newest.path.stat().st_mtime, directory, state))
            else:
                others += 1
        if not found:
            other = f" ({others} stopped job(s) of other settings there)" if others else ""
            return ResumePlan(None, None, f"no stopped speedrun of these settings under {root}{other}; starting fresh")
        _, directory, state = max(found, key=lambda f: f[0])
        return ResumePlan(directory, state, f"resuming {directory}: {describe_checkpoint(state, config)}")
    path = Path(resume).expanduser()
    newest = newest_checkpoint(path) if path.is_dir() else None
    if path.is_dir() and newest is None:
        raise ConfigError(f"{path} holds no complete speedrun checkpoint (finished jobs keep none)")
    state = load_checkpoint(newest.path if newest is not None else path)
    if state.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not a hasten speedrun checkpoint")
    if state["digest"] != digest:
        now, saved = identity, state["identity"]
        diff = [f"{k}: checkpoint {saved.get(k)!r}, now {now[k]!r}" for k in now
                if config_digest({k: saved.get(k)}) != config_digest({k: now[k]})]
        raise ConfigError(f"cannot resume {path} with different settings: " + "; ".join(diff))
    directory = path if path.is_dir() else path.parent
    return ResumePlan(directory, state, f"resuming {directory}: {describe_checkpoint(state, config)}")
