"""What one ``hasten profile`` run is asked to do (``ProfileConfig``): the command, the steps to
warm up and measure, the probes, the time limits. Validated here, at the boundary; read by the
launcher, the outcome checks and the verification.

Changes the training math: no (settings of a measurement).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hasten.profile.inject.settings import NEEDS_REPLAY, PROBES, parse_probes


@dataclass(frozen=True)
class ProfileConfig:
    command: tuple[str, ...]
    warmup: int = 5  # optimizer steps discarded before measuring
    steps: int = 20  # optimizer steps measured
    probe_steps: int = 8  # steps per counterfactual probe
    verify: bool = False  # re-run with each fix applied
    timeout_s: float = 300.0  # per run of the command
    capture: bool = False  # keep the command's own output off the terminal
    seconds: float = 0.0  # > 0: measure for about this long instead of `steps` steps
    stall_s: float = 30.0  # say what is seen when no optimizer step comes for this long
    skip_probes: tuple[str, ...] = ()  # probes turned off (hasten.profile.inject.settings.PROBES)
    decide_s: float = 30.0  # measure on, up to this long, while the data share is too uncertain to decide; 0: off

    def __post_init__(self):
        if not self.command:
            raise ValueError("give the command to profile after `--`, e.g. hasten profile -- python train.py")
        if self.warmup < 0 or self.steps < 3 or self.probe_steps < 2:
            raise ValueError(f"need --warmup >= 0, --steps >= 3 and probe steps >= 2; got "
                             f"{self.warmup}, {self.steps}, {self.probe_steps}")
        if not self.timeout_s > 0:
            raise ValueError(f"--timeout must be > 0; got {self.timeout_s}")
        if not (self.seconds >= 0 and math.isfinite(self.seconds)):
            raise ValueError(f"--seconds must be >= 0; got {self.seconds}")
        if not self.stall_s > 0:
            raise ValueError(f"stall_s must be > 0; got {self.stall_s}")
        if not (self.decide_s >= 0 and math.isfinite(self.decide_s)):
            raise ValueError(f"--decide-within must be >= 0; got {self.decide_s}")
        parse_probes(",".join(self.skip_probes))  # a misspelt probe name is an error, not a silent no-op

    @property
    def probes_off(self) -> tuple[str, ...]:
        """The probes that will not run: those skipped, and those compared with a skipped replay."""
        off = set(self.skip_probes) | (set(NEEDS_REPLAY) if "replay" in self.skip_probes else set())
        return tuple(p for p in PROBES if p in off)
