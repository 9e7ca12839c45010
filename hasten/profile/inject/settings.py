"""What ``hasten profile`` asks of each process it instruments: the ``HASTEN_PROFILE_*`` environment.

The launcher (:mod:`hasten.profile.launcher`) writes these variables; every Python of the
command reads them once, when it is instrumented. Standard library only: the launcher
imports this module to validate ``--no-probe`` before anything runs.

Changes the training math: no.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV_DIR = "HASTEN_PROFILE_DIR"

# The counterfactual probes, each of which ``--no-probe`` can turn off:
PROBES = {
    "replay": "the step alone, on the first batch replayed (R's denominator)",
    "autocast": "the replayed step under bf16 autocast",
    "comm": "DDP: the replayed step without gradient averaging and with bf16-compressed averaging",
    "loader": "the training loader alone, a batch's hand-off through a worker, and a kept batch's hand-out",
}
# autocast and comm are replays, compared with the plain replayed step: they need it.
NEEDS_REPLAY = ("autocast", "comm")


def parse_probes(text: str) -> frozenset[str]:
    """A comma-separated list of probe names (``"autocast,loader"``), checked against :data:`PROBES`."""
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    unknown = sorted(names - PROBES.keys())
    if unknown:
        raise ValueError(f"unknown probe {', '.join(map(repr, unknown))}; the probes are {', '.join(PROBES)}")
    return names


@dataclass(frozen=True)
class Settings:
    dir: str  # where this process writes its report and status files
    rank: int
    world_size: int
    warmup: int  # steps discarded
    steps: int  # steps measured (``seconds`` > 0: a first guess, replaced after the warm-up)
    seconds: float  # > 0: measure about this long instead
    probe_steps: int  # replayed steps of each kind
    probes: frozenset[str]  # the probes to run
    apply: str  # the fix a verification run applies ("" for none)
    decide_s: float = 0.0  # > 0: measure on (up to this long) while the data share is too uncertain to decide
    switch: str = ""  # "<steps>:<pattern>": ``apply`` only in the blocks of steps marked 1 (fixes.switch_fix)

    @classmethod
    def from_environment(cls, env=os.environ) -> Settings:
        probes = parse_probes(env.get("HASTEN_PROFILE_PROBES", ",".join(PROBES)))
        if "replay" not in probes:
            probes -= set(NEEDS_REPLAY)
        return cls(dir=env[ENV_DIR], rank=int(env.get("RANK", "0")), world_size=int(env.get("WORLD_SIZE", "1")),
                   warmup=int(env.get("HASTEN_PROFILE_WARMUP", "5")), steps=int(env.get("HASTEN_PROFILE_STEPS", "20")),
                   seconds=float(env.get("HASTEN_PROFILE_SECONDS", "0") or 0),
                   probe_steps=int(env.get("HASTEN_PROFILE_PROBE_STEPS", "8")), probes=probes,
                   apply=env.get("HASTEN_PROFILE_APPLY", ""),
                   decide_s=float(env.get("HASTEN_PROFILE_DECIDE_S", "0") or 0),
                   switch=env.get("HASTEN_PROFILE_SWITCH", ""))
