"""Zero-code mode: run a user's unmodified command with the profiler injected, then verify fixes.

The command runs with a temporary ``sitecustomize.py`` first on ``PYTHONPATH``;
every Python process it starts (the script, each torchrun worker) then imports
:mod:`hasten.profile.inject`, measures, probes, writes ``rank<N>.json`` into a
temporary directory and exits at the same step as its peers. This module merges
the ranks' reports into one :class:`~hasten.profile.verdict.Analysis` and, with
``verify``, re-runs the command once per fix that can be applied from outside
(``HASTEN_PROFILE_APPLY``), and the baseline once more, to measure the speedup
each fix was predicted to give.

A command that fails, ends before the warm-up is over, never iterates a
DataLoader or outlasts the timeout raises :class:`ProfileFailed` with one clear
message and the exit code to return.

Changes the training math: no (the verification runs apply fixes that may; they
are separate, short runs).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import hasten
from hasten.errors import HastenError
from hasten.profile.verdict import Analysis, Recommendation, analyse

SITECUSTOMIZE = '''\
# Written by `hasten profile`: instrument this process, then run the sitecustomize this one shadows.
import os
import sys

if os.environ.get("HASTEN_PROFILE_DIR"):
    try:
        import hasten.profile.inject
        hasten.profile.inject.install()
    except Exception as exc:  # never break the user's command
        sys.stderr.write(f"hasten profile: could not instrument process {os.getpid()}: {exc}\\n")

_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_self = sys.modules.pop("sitecustomize")
try:
    import sitecustomize  # noqa: F401
except ImportError:
    pass
finally:
    sys.modules["sitecustomize"] = _self  # the import that is running this file looks itself up
'''


class ProfileFailed(HastenError, RuntimeError):
    """The profiled command did not get far enough; ``exit_code`` is what to return."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class ProfileConfig:
    command: tuple[str, ...]
    warmup: int = 5  # steps discarded before measuring
    steps: int = 20  # steps measured
    probe_steps: int = 8  # steps per counterfactual probe
    verify: bool = False  # re-run with each fix applied
    timeout_s: float = 300.0  # per run of the command
    capture: bool = False  # keep the command's own output off the terminal

    def __post_init__(self):
        if not self.command:
            raise ValueError("give the command to profile after `--`, e.g. hasten profile -- python train.py")
        if self.warmup < 0 or self.steps < 3 or self.probe_steps < 2:
            raise ValueError(f"need --warmup >= 0, --steps >= 3 and probe steps >= 2; got "
                             f"{self.warmup}, {self.steps}, {self.probe_steps}")
        if not self.timeout_s > 0:
            raise ValueError(f"--timeout must be > 0; got {self.timeout_s}")


@dataclass(frozen=True)
class RunOutcome:
    returncode: int
    ranks: list
    timed_out: bool
    output: str  # the command's output when captured, else ""
    wall_s: float


def _environment(out_dir: Path, site_dir: Path, config: ProfileConfig, apply: str, probes: bool) -> dict:
    env = dict(os.environ)
    # The package's parent goes last: the child finds hasten even from another working directory.
    package_root = str(Path(hasten.__file__).resolve().parent.parent)
    paths = [str(site_dir)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p] + [package_root]
    env.update(PYTHONPATH=os.pathsep.join(paths), HASTEN_PROFILE_DIR=str(out_dir),
               HASTEN_PROFILE_WARMUP=str(config.warmup), HASTEN_PROFILE_STEPS=str(config.steps),
               HASTEN_PROFILE_PROBE_STEPS=str(config.probe_steps), HASTEN_PROFILE_PROBES="1" if probes else "0",
               HASTEN_PROFILE_APPLY=apply)
    return env


def run_instrumented(config: ProfileConfig, apply: str = "", probes: bool = True) -> RunOutcome:
    """Run the command once with the profiler injected; collect every rank's report."""
    work = Path(tempfile.mkdtemp(prefix="hasten-profile-"))
    try:
        site_dir, out_dir = work / "site", work / "ranks"
        site_dir.mkdir()
        out_dir.mkdir()
        (site_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
        stream = subprocess.PIPE if config.capture else None
        t0 = time.perf_counter()
        try:
            # A session of its own: on a timeout the whole tree (torchrun and its workers) is killed.
            proc = subprocess.Popen(list(config.command), env=_environment(out_dir, site_dir, config, apply, probes),
                                    stdout=stream, stderr=subprocess.STDOUT if stream else None,
                                    start_new_session=True)
        except OSError as exc:
            raise ProfileFailed(f"cannot start {config.command[0]!r}: {exc.strerror}", 127) from None
        timed_out = False
        try:
            out, _ = proc.communicate(timeout=config.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        wall = time.perf_counter() - t0
        ranks = [json.loads(p.read_text()) for p in sorted(out_dir.glob("rank*.json"))]
        text = out.decode(errors="replace") if out else ""
        return RunOutcome(proc.returncode, ranks, timed_out, text, wall)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def check_outcome(outcome: RunOutcome, config: ProfileConfig) -> list[dict]:
    """The ranks' complete reports, or ProfileFailed saying why there are none."""
    code = outcome.returncode
    tail = ""
    if outcome.output:
        tail = "\n--- last lines of the command's output ---\n" + "\n".join(outcome.output.splitlines()[-15:])
    seen = max((d["batches_seen"] for d in outcome.ranks), default=0)
    need = f"{config.warmup} warm-up + {config.steps} measured steps"
    if outcome.timed_out:
        raise ProfileFailed(f"the command did not reach {need} within --timeout {config.timeout_s:g} s "
                            f"({seen} batches seen); it was stopped{tail}", 124)
    complete = [d for d in outcome.ranks if d["complete"]]
    world = max((d["world_size"] for d in outcome.ranks), default=1)
    if complete and len(complete) == world:
        return complete
    exit_code = code if code else 2
    if not outcome.ranks:
        raise ProfileFailed(f"the command exited with code {code} without iterating a torch DataLoader: "
                            f"hasten profile times the steps of the first DataLoader a command iterates{tail}",
                            exit_code)
    if code:
        raise ProfileFailed(f"the command failed with exit code {code} after {seen} batches{tail}", exit_code)
    raise ProfileFailed(f"the command ended after {seen} batches, before {need} and the probes "
                        f"(about {4 * config.probe_steps} more) were done: lower --warmup/--steps{tail}", exit_code)


def _measured_step_s(ranks: list[dict]) -> float:
    """The slowest rank's mean wall-clock step."""
    return max(sum(r["wait_s"] + r["work_s"] for r in d["records"]["measure"]) / len(d["records"]["measure"])
               for d in ranks)


def _memory_bytes(device: str) -> float:
    if device == "cuda":
        import torch
        return torch.cuda.get_device_properties(0).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 * 2**30


def profile(config: ProfileConfig, log=None) -> Analysis:
    """Measure, probe, analyse and (with ``config.verify``) verify: the whole command."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    log(f"hasten profile: running `{' '.join(config.command)}` ({config.warmup} warm-up + {config.steps} "
        f"measured steps, then probes)")
    ranks = check_outcome(run_instrumented(config), config)
    analysis = analyse(ranks, memory_bytes=_memory_bytes(ranks[0]["device"]))
    if config.verify:
        verify(config, analysis, log)
    return analysis


def verify(config: ProfileConfig, analysis: Analysis, log) -> None:
    """Re-run the command once per fix that can be applied from outside; measure its speedup.

    Rejected fixes that can be applied are verified too: "no gain" is a claim as well.
    The baseline is run again after the fixes and averaged with the first one, so that
    a machine whose load drifts between the runs (other jobs) biases no fix."""
    todo = [(r, r.fix, r.apply, r.step_rate_factor) for r in analysis.recommendations if r.apply] + \
           [(r, r["fix"], r["apply"], r["step_rate_factor"]) for r in analysis.rejected if r.get("apply")]
    if not todo:
        return
    fixed_steps = []
    for rec, fix, apply, factor in todo:
        log(f"hasten profile: verifying {fix} (re-run with {apply})")
        try:
            fixed_steps.append(_measured_step_s(check_outcome(run_instrumented(config, apply=apply, probes=False),
                                                              config)))
        except ProfileFailed as exc:
            analysis.notes.append(f"verification of {fix} failed: {str(exc).splitlines()[0]}")
            fixed_steps.append(None)
    log("hasten profile: re-running the baseline")
    base = analysis.step_time_s
    try:
        base = (base + _measured_step_s(check_outcome(run_instrumented(config, probes=False), config))) / 2
    except ProfileFailed as exc:
        analysis.notes.append(f"baseline re-run failed: {str(exc).splitlines()[0]}")
    for (rec, fix, apply, factor), step_s in zip(todo, fixed_steps):
        if step_s is None:
            continue
        # Wall clock: the loop's own time would hide what extra workers cost the loop's
        # thread (they compete with it for the cores), and that cost is part of the fix.
        verified = {"verified_step_s": step_s, "verified_speedup": base / step_s * factor}
        if isinstance(rec, Recommendation):
            for k, v in verified.items():
                setattr(rec, k, v)
        else:
            rec.update(verified)
