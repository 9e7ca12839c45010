"""Zero-code mode: run a user's unmodified command with the profiler injected, then verify fixes.

Every Python process the command starts (the script, each torchrun worker) attaches
at start-up, through hasten's ``.pth`` in site-packages or, in a Python without hasten
installed, a temporary ``sitecustomize.py`` first on ``PYTHONPATH``
(:mod:`hasten.profile.attach`); it reports in, and once it has imported torch it runs
:mod:`hasten.profile.inject`, measures, probes, writes ``rank<N>.json`` into a
temporary directory and exits at the same step as its peers. A Python that does not
report in within seconds is looked at (:mod:`hasten.profile.attach_check`): when it
cannot attach (``-S``, a cleared environment, a Python without hasten under ``-I``/``-E``
or a ``PYTHONPATH`` of the command's own, ...) and no attached process has imported
torch, the command is stopped with one line naming the cause and what to do.

This module merges the ranks' reports into one
:class:`~hasten.profile.verdict.Analysis` and, with ``verify``, re-runs the command
once per fix that can be applied from outside (``HASTEN_PROFILE_APPLY``), and the
baseline once more, to measure the speedup each fix was predicted to give.

While the command runs, its output passes through (and a tail is kept), and the
ranks' status files are read every half second: when no optimizer step comes for
``stall_s`` seconds, the launcher says what it looked for and what it saw (batches
per loader, model forwards, backward calls, where the main thread spends its
time). A command that fails, ends before the profile is complete, never calls
``optimizer.step()`` or outlasts the timeout raises :class:`ProfileFailed` with
one clear message (each failing rank's error line included) and the exit code to
return.

Changes the training math: no (the verification runs apply fixes that may; they
are separate, short runs).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import hasten
from hasten.cores import cpu_available
from hasten.errors import HastenError
from hasten.profile.attach_check import AttachCheck
from hasten.profile.inject.settings import NEEDS_REPLAY, PROBES, parse_probes
from hasten.profile.verdict import Analysis, Recommendation, analyse, rerank

SITECUSTOMIZE = '''\
# Written by `hasten profile`: attach to this process (a no-op where hasten's .pth already has),
# then run the sitecustomize this one shadows.
import os
import sys

if os.environ.get("HASTEN_PROFILE_DIR"):
    try:
        import hasten.profile.attach
        hasten.profile.attach.attach("sitecustomize")
    except Exception as exc:  # never break the user's command
        sys.stderr.write(f"hasten profile: could not attach to process {os.getpid()}: {exc}\\n")

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


# The exit code when hasten itself failed (EX_SOFTWARE), never the command's own.
HASTEN_FAILED = 70


class ProfileFailed(HastenError, RuntimeError):
    """The profiled command did not get far enough; ``exit_code`` is what to return."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


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


@dataclass(frozen=True)
class RunOutcome:
    returncode: int
    ranks: list
    timed_out: bool
    output: str  # the tail of the command's output
    wall_s: float
    statuses: list = field(default_factory=list)  # each instrumented process's last status
    attached: list = field(default_factory=list)  # each attached process's report-in
    not_attached: str = ""  # no Python seen, or the silent ones (AttachCheck.summary)
    hasten_error: str = ""  # hasten's own failure in a process of the command ("rank N: ...")


def _environment(out_dir: Path, site_dir: Path, config: ProfileConfig, apply: str, probes: bool) -> dict:
    env = dict(os.environ)
    # The package's parent goes last: the child finds hasten even from another working directory.
    package_root = str(Path(hasten.__file__).resolve().parent.parent)
    paths = [str(site_dir)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p] + [package_root]
    env.update(PYTHONPATH=os.pathsep.join(paths), HASTEN_PROFILE_DIR=str(out_dir),
               HASTEN_PROFILE_WARMUP=str(config.warmup), HASTEN_PROFILE_STEPS=str(config.steps),
               HASTEN_PROFILE_SECONDS=str(config.seconds),
               HASTEN_PROFILE_PROBE_STEPS=str(config.probe_steps),
               HASTEN_PROFILE_PROBES=",".join(p for p in PROBES if p not in config.probes_off) if probes else "",
               HASTEN_PROFILE_APPLY=apply, HASTEN_PROFILE_DECIDE_S=str(config.decide_s))
    return env


def _missing_script(command: tuple[str, ...]) -> str | None:
    """`python missing.py`: the script's path, when the command names one that does not exist."""
    if len(command) >= 2 and Path(command[0]).name.startswith("python") and command[1].endswith(".py"):
        if not Path(command[1]).exists():
            return command[1]
    return None


def _read_statuses(out_dir: Path) -> list[dict]:
    out = []
    for p in sorted(out_dir.glob("status-*.json")):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            pass
    return out


def describe_statuses(statuses: list[dict]) -> str:
    """What the instrumented processes saw: loaders, forwards, backward calls, where time went."""
    active = [s for s in statuses if s.get("forwards") or s.get("loaders") or s.get("steps") or s.get("backwards")]
    if not active:
        where = _where_text(statuses)
        return "no model forward, backward or DataLoader batch was seen" + (f"; {where}" if where else "")
    parts = []
    for s in sorted(active, key=lambda s: s.get("rank", 0))[:4]:
        loaders = ", ".join(f"{d['name']}: {d['batches']} batches" + ("" if d.get("training") else " (not training)")
                            for d in s.get("loaders", [])) or "no DataLoader"
        steps = (f"{s.get('steps', 0)} steps counted at backward() (no torch.optim optimizer built)"
                 if s.get("pace") == "backward" else f"{s.get('steps', 0)} optimizer steps")
        if not s.get("steps") and s.get("backwards") and s.get("optimizers_built"):
            steps += f" ({s['optimizers_built']} optimizer(s) built, never stepped)"
        desc = (f"rank {s.get('rank', 0)}: {steps}, {s.get('train_forwards', 0)} "
                f"training forwards of {s.get('forwards', 0)}, {s.get('backwards', 0)} backward calls; {loaders}")
        where = _where_text([s])
        parts.append(desc + (f"; {where}" if where else ""))
    return "\n  ".join(parts)


def _where_text(statuses: list[dict]) -> str:
    for s in statuses:
        if s.get("where"):
            return "the main thread was in " + ", ".join(f"{w['at']} ({w['share']:.0%})" for w in s["where"])
    return ""


def _hasten_errors(statuses: list[dict]) -> str:
    return "; ".join(f"{'rank ' + str(s.get('rank', 0)) if s.get('ranked') else 'process ' + str(s.get('pid'))}: "
                     f"{s['hasten_error']}" for s in statuses if s.get("hasten_error"))


def _error_lines(statuses: list[dict]) -> list[str]:
    ranked = [s for s in statuses if s.get("ranked")]
    pool = ranked if any(s.get("error") for s in ranked) else statuses
    lines = []
    for s in sorted(pool, key=lambda s: (s.get("rank", 0), s.get("pid", 0))):
        if s.get("error"):
            who = f"rank {s.get('rank', 0)}" if s.get("ranked") else f"process {s.get('pid')}"
            lines.append(f"{who}: {s['error']}")
    return lines


class _Tee(threading.Thread):
    """Pass the command's output through (unless quiet) and keep its tail."""

    def __init__(self, stream, quiet: bool) -> None:
        super().__init__(daemon=True)
        self.stream, self.quiet, self.tail = stream, quiet, bytearray()

    def run(self) -> None:
        fd = self.stream.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            if not self.quiet:
                try:
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.flush()
                except (AttributeError, ValueError, OSError):
                    sys.stdout.write(chunk.decode(errors="replace"))
            self.tail += chunk
            if len(self.tail) > 65536:
                del self.tail[:-32768]


def run_instrumented(config: ProfileConfig, apply: str = "", probes: bool = True, log=None) -> RunOutcome:
    """Run the command once with the profiler injected; collect every rank's report."""
    log = log or (lambda msg: None)
    missing = _missing_script(config.command)
    if missing:
        raise ProfileFailed(f"the script {missing!r} does not exist (nothing was run)", 2)
    work = Path(tempfile.mkdtemp(prefix="hasten-profile-"))
    try:
        site_dir, out_dir = work / "site", work / "ranks"
        site_dir.mkdir()
        out_dir.mkdir()
        (site_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
        t0 = time.perf_counter()
        try:
            # A session of its own: on a timeout the whole tree (torchrun and its workers) is killed.
            proc = subprocess.Popen(list(config.command), env=_environment(out_dir, site_dir, config, apply, probes),
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            raise ProfileFailed(f"cannot start {config.command[0]!r}: {exc.strerror}", 127) from None
        tee = _Tee(proc.stdout, config.capture)
        tee.start()
        check = AttachCheck(proc.pid, out_dir, site_dir)
        timed_out, cannot_attach, hasten_error = False, None, ""
        last_steps, last_change, next_warn, told_pace = 0, t0, config.stall_s, False
        try:
            while proc.poll() is None:
                time.sleep(0.5)
                now = time.perf_counter()
                if now - t0 > config.timeout_s:
                    timed_out = True
                    os.killpg(proc.pid, signal.SIGKILL)
                    break
                statuses = _read_statuses(out_dir)
                blocked = check.poll()
                # A status file means an attached process has imported torch: a silent Python beside
                # it (a helper of another environment) is named but stops nothing.
                if blocked and not statuses:
                    cannot_attach = blocked[0]
                    os.killpg(proc.pid, signal.SIGKILL)
                    break
                for line in blocked:
                    log(f"hasten profile: {line} (profiling the processes that did attach)")
                hasten_error = _hasten_errors(statuses)
                if hasten_error:  # profiling is off there: the command would run on unmeasured, or hang a peer
                    os.killpg(proc.pid, signal.SIGKILL)
                    break
                steps = max((s.get("steps", 0) for s in statuses), default=0)
                by_backward = [s for s in statuses if s.get("pace") == "backward"]
                if by_backward and not told_pace:
                    told_pace = True
                    who = (" (" + ", ".join(f"rank {s.get('rank', 0)}" for s in by_backward) + ")"
                           if len(statuses) > 1 else "")
                    log(f"hasten profile: no torch.optim optimizer was built{who}: a step is counted at each "
                        "backward() call (a loop that updates its weights by hand)")
                if steps != last_steps:
                    last_steps, last_change, next_warn = steps, now, config.stall_s
                elif now - last_change >= next_warn:
                    what = ("no optimizer.step() call" if steps == 0 else
                            f"no optimizer.step() call after {steps} steps")
                    unseen = check.summary()
                    log(f"hasten profile: {what} in {now - last_change:.0f} s (looked for torch.optim optimizer "
                        f"steps; a step's data ends where the model's first training forward begins). Seen so far:"
                        f"\n  {describe_statuses(statuses)}" + (f"\n  {unseen}" if unseen else ""))
                    next_warn *= 2
            proc.wait()
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        tee.join(timeout=5)
        if cannot_attach:
            raise ProfileFailed(cannot_attach, 2)
        wall = time.perf_counter() - t0
        ranks = []
        for p in sorted(out_dir.glob("rank*.json")):
            try:
                ranks.append(json.loads(p.read_text()))
            except (OSError, ValueError):
                pass
        text = tee.tail.decode(errors="replace")
        statuses = _read_statuses(out_dir)
        return RunOutcome(proc.returncode, ranks, timed_out, text, wall, statuses, check.attached(),
                          check.summary(), hasten_error or _hasten_errors(statuses))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def check_outcome(outcome: RunOutcome, config: ProfileConfig) -> list[dict]:
    """The ranks' complete reports, or ProfileFailed saying why there are none."""
    code = outcome.returncode
    lines = [ln for ln in outcome.output.splitlines() if ln.strip()]
    tail = ""
    if lines and config.capture:
        tail = "\n--- last lines of the command's output ---\n" + "\n".join(lines[-15:])
    errors = _error_lines(outcome.statuses)
    err = "".join(f"\n  {e}" for e in errors)
    seen = max([d.get("steps_seen", 0) for d in outcome.ranks] +
               [s.get("steps", 0) for s in outcome.statuses], default=0)
    by_backward = any(s.get("pace") == "backward" for s in outcome.statuses)
    unit = "steps (counted at backward(): no torch.optim optimizer was built)" if by_backward else "optimizer steps"
    need = (f"{config.warmup} warm-up + {config.steps if not config.seconds else f'{config.seconds:g} s of'} "
            f"measured {'' if by_backward else 'optimizer '}steps")
    complete = [d for d in outcome.ranks if d["complete"]]
    world = max((d["world_size"] for d in outcome.ranks), default=1)
    if outcome.hasten_error and not (complete and len(complete) == world):
        raise ProfileFailed(f"hasten profile failed in its own code, not in the command ({outcome.hasten_error}); "
                            f"the command was stopped. This is a bug in hasten: please report it{tail}",
                            HASTEN_FAILED)
    if outcome.timed_out:
        unseen = f"\n  {outcome.not_attached}" if outcome.not_attached else ""
        raise ProfileFailed(f"the command did not reach {need} and the probes within --timeout {config.timeout_s:g} "
                            f"s ({seen} {unit} seen); it was stopped. Seen:\n  "
                            f"{describe_statuses(outcome.statuses)}{unseen}{tail}", 124)
    failed_probes = [(d["rank"], x) for d in complete for x in d.get("dropped", []) if x.get("ended_run")]
    # the loop raised in a step a probe made it run: the command failed under the profile (issue 43)
    failed_probes = [p for p in failed_probes if p[1].get("raised")] or failed_probes
    if complete and len(complete) == world and not any(x.get("raised") for _, x in failed_probes):
        return complete
    short = _ended_on_its_own(outcome)
    if short:
        return short
    if failed_probes:  # one rank's probe ended its process, and the command with it
        rank, x = failed_probes[0]
        raise ProfileFailed(f"hasten's {x['probe']} probe failed on rank {rank} after the measured steps "
                            f"({x['why']}), and the command ended with it: rerun with --no-probe {x['probe']}"
                            f"{err}{tail}", HASTEN_FAILED)
    exit_code = code if code else 2
    if code and seen == 0:
        last = "" if errors or not lines else f"; its last line: {lines[-1].strip()}"
        raise ProfileFailed(f"the command failed with exit code {code} before any optimizer step{last}{err}{tail}",
                            exit_code)
    if code:
        raise ProfileFailed(f"the command failed with exit code {code} after {seen} {unit}{err}{tail}",
                            exit_code)
    if seen == 0:
        raise ProfileFailed(f"the command exited without calling optimizer.step() or backward(): hasten profile "
                            f"counts the steps of torch.optim optimizers (or, with none built, backward() calls). "
                            f"Seen:\n  {describe_statuses(outcome.statuses)}{tail}",
                            exit_code)
    raise ProfileFailed(f"the command ended after {seen} {unit}, before {need} and the probes "
                        f"(about {4 * config.probe_steps} more) were done: lower --warmup/--steps{tail}", exit_code)


# The fewest measured steps a report is made from (the least --steps accepts).
MIN_MEASURED = 3


def _ended_on_its_own(outcome: RunOutcome) -> list[dict] | None:
    """Every rank's steps measured so far, when the command ended by itself (exit 0) inside the
    measured window with at least :data:`MIN_MEASURED` of them: a short script's run was fine, and
    its steps are what there is to report (each rank marked ``ended_early``). None otherwise."""
    if outcome.returncode != 0 or outcome.timed_out or outcome.hasten_error or not outcome.ranks:
        return None
    world = max(d["world_size"] for d in outcome.ranks)
    ranks = [d for d in outcome.ranks if d.get("phase") == "measure" and len(d["records"]["measure"]) >= MIN_MEASURED]
    if len(ranks) != len(outcome.ranks) or len({d["rank"] for d in ranks}) != world:
        return None
    return [{**d, "ended_early": True} for d in ranks]


def ended_early_note(ranks: list[dict], analysis: Analysis) -> str:
    """What a report from a command that ended inside the measured window rests on, and how to get more."""
    d = ranks[0]
    lo, hi = analysis.data_interval
    why = ("while hasten measured on (its window doubles until the data share is decided and it has lasted a "
           "second)" if d.get("extended") else
           f"before the {d['warmup']} warm-up + {d['steps']} measured steps asked for were done")
    decided = ("too short to decide at the usual confidence" if analysis.near is not None
               else "enough to decide the verdict")
    more = "a longer run of the command itself (more iterations or epochs) gives more steps"
    if d["warmup"]:
        more = f"--warmup 0 measures {d['warmup']} more of its steps; {more}"
    return (f"the command ended on its own (exit 0) after {d['steps_seen']} steps, {why}: this report is from the "
            f"{len(d['records']['measure'])} steps measured, {decided} (data {analysis.data_share:.0%} of the step, "
            f"95% interval {lo:.0%}-{hi:.0%}); hasten's probes did not run (no step alone, R or autocast "
            f"estimate); {more}")


def _measured_step_s(ranks: list[dict]) -> float:
    """The slowest rank's mean wall-clock step (excluded steps left out)."""
    def mean_step(d):
        recs = [r for r in d["records"]["measure"] if not r.get("excluded")] or d["records"]["measure"]
        return sum(r["wait_s"] + r["work_s"] for r in recs) / len(recs)
    return max(mean_step(d) for d in ranks)


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
    window = f"{config.seconds:g} s" if config.seconds else f"{config.steps} optimizer steps"
    log(f"hasten profile: running `{' '.join(config.command)}` ({config.warmup} warm-up + {window} measured, "
        f"then probes; stopped after that)")
    cpus = cpu_available()
    outcome = run_instrumented(config, log=log)
    ranks = check_outcome(outcome, config)
    analysis = analyse(ranks, memory_bytes=_memory_bytes(ranks[0]["device"]), cpus=cpus)
    analysis.cost = {"profile_run_s": outcome.wall_s}
    analysis.probes_off = list(config.probes_off)
    if outcome.returncode:
        analysis.notes.append(f"the command exited with code {outcome.returncode} during hasten's probes, after "
                              "the measured steps (see the dropped probe)")
    if any(d.get("ended_early") for d in ranks):
        analysis.ended_early = True
        analysis.notes.insert(0, ended_early_note(ranks, analysis))
    analysis.notes += same_in_every_worker(ranks)
    if config.verify:
        verify(config, analysis, log)
    return analysis


def same_in_every_worker(ranks: list[dict], where: str = "", fix: str | None = None) -> list[str]:
    """One line per DataLoader whose workers handed out the same first batch: an
    IterableDataset that ignores ``torch.utils.data.get_worker_info()`` (each worker then
    yields every item). Measured by fingerprinting each worker's first batch
    (:func:`hasten.profile.inject.loader._check_workers`)."""
    notes = []
    for ld in ranks[0].get("loaders", []):
        dup = ld.get("worker_duplicates")
        if dup and dup["distinct"] < dup["workers"]:
            same = "the same" if dup["distinct"] == 1 else f"only {dup['distinct']} different"
            cost = f"; the speedup of '{fix}' counts repeated batches" if fix else ""
            notes.append(f"{where}{ld['name']}: its {dup['workers']} workers' first batches are {same}: an "
                         "IterableDataset that ignores torch.utils.data.get_worker_info() yields every item in "
                         f"every worker (split the items by worker id){cost}")
    return notes


def verify(config: ProfileConfig, analysis: Analysis, log) -> None:
    """Re-run the command once per fix that can be applied from outside; measure its speedup; re-rank.

    Rejected fixes that can be applied are verified too: "no gain" is a claim as well.
    The baseline is run again after the fixes and averaged with the first one, so that
    a machine whose load drifts between the runs (other jobs) biases no fix."""
    todo = [(r, r.fix, r.apply, r.step_rate_factor) for r in analysis.recommendations if r.apply] + \
           [(r, r["fix"], r["apply"], r["step_rate_factor"]) for r in analysis.rejected if r.get("apply")]
    if not todo:
        return
    # The verification runs need only the measured window, not the probes; with --seconds, the same steps.
    vconfig = ProfileConfig(config.command, warmup=config.warmup, steps=max(3, analysis.steps), probe_steps=2,
                            timeout_s=config.timeout_s, capture=config.capture, stall_s=config.stall_s, decide_s=0)
    fixed_steps, walls = [], []
    for rec, fix, apply, factor in todo:
        log(f"hasten profile: verifying {fix} (re-run with {apply})")
        try:
            out = run_instrumented(vconfig, apply=apply, probes=False, log=log)
            walls.append(out.wall_s)
            fixed = check_outcome(out, vconfig)
            cannot = next((d["apply_error"] for d in fixed if d.get("apply_error")), None)
            if cannot:  # the run went on unchanged: its steps are not the fix's
                raise ProfileFailed(f"it could not be applied: {cannot}", 2)
            fixed_steps.append(_measured_step_s(fixed))
            repeated = same_in_every_worker(fixed, f"in the re-run with {apply}, ", fix)
            if repeated:  # each worker trains on every item: the fix, as applied, repeats the data
                analysis.notes += repeated
                if isinstance(rec, Recommendation):
                    rec.changes_math = True
                else:
                    rec["changes_math"] = True
        except ProfileFailed as exc:
            analysis.notes.append(f"verification of {fix} failed: {str(exc).splitlines()[0]}")
            fixed_steps.append(None)
    log("hasten profile: re-running the baseline")
    base = analysis.step_time_s
    try:
        out = run_instrumented(vconfig, probes=False, log=log)
        walls.append(out.wall_s)
        base = (base + _measured_step_s(check_outcome(out, vconfig))) / 2
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
    n_fixes = len(todo)
    analysis.cost.update(verify_runs_s=sum(walls), fixes_verified=n_fixes,
                         per_verified_fix_s=(analysis.cost["profile_run_s"] + sum(walls)) / n_fixes)
    rerank(analysis)
