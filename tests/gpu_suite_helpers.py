"""Shared by the GPU suite's test files (benchmarks/gpu_suite.py and benchmarks/gpu/): the
benchmarks folder on sys.path, the plan, a CPU context of the smoke sizes, a clock that moves
only when told, and a speedrun job whose runs take the time they are told."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

plan = importlib.import_module("gpu.plan")
common = importlib.import_module("_common")
SECTIONS = plan.SECTIONS


def make_context(tmp_path, sizes=None, **kw):
    from gpu.context import Context

    return Context(device=torch.device("cpu"), sizes=sizes or plan.SMOKE, out=tmp_path, data_path=None, smoke=True,
                   say=lambda line: None, **kw)


class FakeClock:
    """A clock that moves only when told: budgets tested without waiting."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class FakeJob:
    """A speedrun job whose runs take ``seconds`` on ``clock`` (or raise from run ``fail_at`` on)."""

    def __init__(self, name, clock=None, seconds=1.0, fail_at=None, compiles=False, log=None):
        self.name, self.clock, self.seconds, self.fail_at, self.compiles = name, clock, seconds, fail_at, compiles
        self.log = log if log is not None else []

    def _spend(self):
        if self.clock is not None:
            self.clock.t += self.seconds

    def warm(self):
        self.log.append((self.name, "warm"))
        self._spend()
        return {"seed": 10_000, "tta_accuracy": 0.5, "time_s": self.seconds, "wall_s": self.seconds}

    def run(self, i):
        if self.fail_at is not None and i >= self.fail_at:
            raise RuntimeError(f"{self.name} broke")
        self.log.append((self.name, i))
        self._spend()
        return {"seed": i, "tta_accuracy": 0.9 + i / 100, "time_s": self.seconds}


def jobs_record(jobs):
    return {"jobs": {j.name: {"status": "waiting", "runs": []} for j in jobs}, "order": [], "cut_short": False}
