"""Where a ``hasten train`` run starts: its run directory, derived from the
configuration alone (``default_run_path``: every rank and every torchrun restart finds
the same one), and the checkpoint it resumes from (``plan_resume``, ``load_resume``:
refused when written with other training math), and how a run takes it up (``restore``,
``same_step_on_every_rank``).

Used by ``hasten.recipes.train`` and ``hasten train``. Changes the training math: no.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from hasten.checkpoint import CHECKPOINT_NAME, CheckpointError, load_checkpoint, newest_checkpoint, set_rng_state
from hasten.errors import ConfigError
from hasten.recipes.train_config import MATH_FIELDS, TrainConfig
from hasten.rundir import stable_run_path


def run_identity(cfg: TrainConfig) -> dict:
    """What makes two runs the same run: the fields of the training math and the data
    (resolved to an absolute path when it is one). Its digest names the run directory."""
    data = cfg.data or os.environ.get("HASTEN_DATA") or "cifar10-download"
    if Path(data).exists():
        data = str(Path(data).resolve())
    return {"data": data, **{k: getattr(cfg, k) for k in MATH_FIELDS}}


def default_run_path(cfg: TrainConfig, root: str | os.PathLike | None = None) -> Path:
    """``<root>/train-<digest of run_identity(cfg)>``: the directory every rank and every
    restart of this run derives alone (``root``: ``$HASTEN_RUNS``, else ``runs``)."""
    return stable_run_path("train", run_identity(cfg), root)


RESUME_AUTO = "auto"


@dataclass(frozen=True)
class ResumePlan:
    """Where a run starts: the checkpoint state to resume (None: fresh), the file it
    came from, and a line to tell the user (None: nothing to say). ``finished``: the
    report (``results.json``) of a run that already ended: nothing to train or evaluate."""
    state: dict | None
    source: Path | None
    note: str | None
    finished: dict | None = None


def plan_resume(cfg: TrainConfig, run_path: str | os.PathLike, resume: str | None = None, *,
                restarted: bool = False) -> ResumePlan:
    """Decide where a run in ``run_path`` starts.

    - ``resume="auto"``, or ``restarted`` (a worker torchrun restarted): the newest
      complete checkpoint in ``run_path``; with none, a given ``resume`` path, else a
      fresh start (said in the note).
    - ``resume=PATH``: that checkpoint (file, or run directory holding one).
    - ``resume=None``: fresh; refused when ``run_path`` already holds a checkpoint,
      so that a second run never overwrites the first one's.
    With ``resume`` None or "auto", a run that finished (its ``results.json`` is of its
    newest checkpoint's step) is not run again: ``finished`` holds its report.
    Every checkpoint must have been written with the same training configuration."""
    run_path = Path(run_path)
    newest = newest_checkpoint(run_path)
    if resume in (None, RESUME_AUTO) and newest is not None:
        report = _finished_report(run_path, newest.step)
        if report is not None:
            return ResumePlan(None, newest.path, f"{run_path} holds this run, finished at step {newest.step}: "
                              "nothing to train (a new run: --run-dir DIR)", finished=report)
    if resume == RESUME_AUTO or restarted:
        if newest is not None:
            return ResumePlan(load_resume(newest.path, cfg), newest.path,
                              f"resuming from {newest.path} (step {newest.step})")
        if resume in (None, RESUME_AUTO):
            return ResumePlan(None, None, f"no checkpoint in {run_path} yet; starting fresh")
    if resume is not None:
        path = Path(resume)
        path = path / CHECKPOINT_NAME if path.is_dir() else path
        if newest is not None and path.resolve().parent != run_path.resolve():
            raise ConfigError(f"{run_path} already holds a checkpoint of this configuration (step "
                              f"{newest.step}); resume it with --resume auto, or pass --run-dir DIR to "
                              f"continue {path} elsewhere")
        return ResumePlan(load_resume(path, cfg), path, None)
    if newest is not None:
        raise ConfigError(f"{run_path} already holds a checkpoint of this run (step {newest.step}); "
                          "continue it with --resume auto, or start a new run with --run-dir DIR")
    return ResumePlan(None, None, None)


def _finished_report(run_path: Path, step: int) -> dict | None:
    """The report a run in ``run_path`` wrote when it ended at ``step``, if it did."""
    import json

    try:
        report = json.loads((run_path / "results.json").read_text())
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) and report.get("steps") == step else None


def load_resume(resume: str | os.PathLike, cfg: TrainConfig) -> dict:
    """Load a checkpoint to resume ``cfg`` from; a clear error if it is damaged or
    was written with a different training configuration."""
    path = Path(resume)
    if path.is_dir():
        path = path / CHECKPOINT_NAME
    state = load_checkpoint(path)
    if "config" not in state or "model" not in state:
        raise CheckpointError(f"{path} is not a hasten train checkpoint (no config/model entries)")
    saved = state["config"]
    diff = [f"--{k.replace('_', '-')}: checkpoint {saved.get(k)!r}, now {getattr(cfg, k)!r}"
            for k in MATH_FIELDS if saved.get(k) != getattr(cfg, k)]
    if diff:
        raise ConfigError(f"cannot resume {path} with a different training configuration: "
                          + "; ".join(diff))
    return state


def restore(state: dict | None, model, optimizer, scheduler, position, rank: int, world: int) -> tuple[int, bool]:
    """Load a checkpoint's ``state`` (None: a fresh run) into the run's model, optimizer,
    schedule, random state and, when it was saved with as many ranks, the loader's
    ``position``; returns (the step to continue from, whether the loader resumed at its
    own position: else the run skips the steps done of the epoch)."""
    if state is None:
        return 0, False
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    saved = state.get("data")
    if position is not None and saved is not None and saved["world_size"] == world:
        position.load_state_dict(saved["ranks"][rank])
        return state["step"], True
    return state["step"], False


def same_step_on_every_rank(step: int, device) -> None:
    """Every rank must start at the same step, or the first collective pairs different steps."""
    steps = torch.tensor([step, -step], device=device)
    torch.distributed.all_reduce(steps, op=torch.distributed.ReduceOp.MAX)
    if int(steps[0]) != -int(steps[1]):
        raise ConfigError(f"the ranks resume from different steps ({-int(steps[1])} to {int(steps[0])}): "
                          "every rank must see the same run directory (shared storage across nodes)")
