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
:class:`~hasten.profile.verdict.Analysis` and, with ``verify``, has
:mod:`hasten.profile.verify` measure each fix that can be applied from outside
(``HASTEN_PROFILE_APPLY``) against the baseline, with its 95% interval.

While the command runs, its output passes through (and a tail is kept), and the
ranks' status files are read every half second: when no optimizer step comes for
``stall_s`` seconds, the launcher says what it looked for and what it saw (batches
per loader, model forwards, backward calls, where the main thread spends its
time). A command that fails, ends before the profile is complete, never calls
``optimizer.step()`` or outlasts the timeout raises :class:`ProfileFailed` with
one clear message and the exit code to return (:mod:`hasten.profile.outcome`).
Once the command's own process has ended, what it left running in its session
(the command is started in a session of its own) is ended too.

Changes the training math: no (the verification runs apply fixes that may; they
are separate, short runs).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import hasten
from hasten.cores import cpu_available
from hasten.profile.attach_check import AttachCheck
from hasten.profile.config import ProfileConfig
from hasten.profile.inject.settings import PROBES
from hasten.profile.outcome import (ProfileFailed, RunOutcome, check_outcome, describe_statuses, ended_early_note,
                                    hasten_errors, read_json_files, read_statuses, same_in_every_worker)
from hasten.profile.verdict import Analysis, analyse

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



def _environment(out_dir: Path, site_dir: Path, config: ProfileConfig, apply: str, probes: bool,
                 switch: str = "") -> dict:
    env = dict(os.environ)
    # The package's parent goes last: the child finds hasten even from another working directory.
    package_root = str(Path(hasten.__file__).resolve().parent.parent)
    paths = [str(site_dir)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p] + [package_root]
    env.update(PYTHONPATH=os.pathsep.join(paths), HASTEN_PROFILE_DIR=str(out_dir),
               HASTEN_PROFILE_WARMUP=str(config.warmup), HASTEN_PROFILE_STEPS=str(config.steps),
               HASTEN_PROFILE_SECONDS=str(config.seconds),
               HASTEN_PROFILE_PROBE_STEPS=str(config.probe_steps),
               HASTEN_PROFILE_PROBES=",".join(p for p in PROBES if p not in config.probes_off) if probes else "",
               HASTEN_PROFILE_APPLY=apply, HASTEN_PROFILE_SWITCH=switch, HASTEN_PROFILE_DECIDE_S=str(config.decide_s))
    return env


def _missing_script(command: tuple[str, ...]) -> str | None:
    """`python missing.py`: the script's path, when the command names one that does not exist."""
    if len(command) >= 2 and Path(command[0]).name.startswith("python") and command[1].endswith(".py"):
        if not Path(command[1]).exists():
            return command[1]
    return None



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


def run_instrumented(config: ProfileConfig, apply: str = "", probes: bool = True, log=None,
                     switch: str = "") -> RunOutcome:
    """Run the command once with the profiler injected; collect every rank's report. ``apply``: the
    fix a verification run applies; ``switch`` (``"<steps>:<pattern>"``): applied only in the blocks
    of steps the pattern marks 1 (:mod:`hasten.profile.verify`)."""
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
            proc = subprocess.Popen(list(config.command), env=_environment(out_dir, site_dir, config, apply, probes, switch),
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            raise ProfileFailed(f"cannot start {config.command[0]!r}: {exc.strerror}", 127) from None
        try:
            tee = _Tee(proc.stdout, config.capture)
            tee.start()
            check = AttachCheck(proc.pid, out_dir, site_dir)
            timed_out, cannot_attach, hasten_error = False, None, ""
            last_steps, last_change, next_warn, told_pace = 0, t0, config.stall_s, False
            while proc.poll() is None:
                try:  # a look every half second; the command's end is seen at once, not up to 0.5 s late
                    proc.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    pass
                now = time.perf_counter()
                if now - t0 > config.timeout_s:
                    timed_out = True
                    os.killpg(proc.pid, signal.SIGKILL)
                    break
                statuses = read_statuses(out_dir)
                blocked = check.poll()
                # A status file means an attached process has imported torch: a silent Python beside
                # it (a helper of another environment) is named but stops nothing.
                if blocked and not statuses:
                    cannot_attach = blocked[0]
                    os.killpg(proc.pid, signal.SIGKILL)
                    break
                for line in blocked:
                    log(f"hasten profile: {line} (profiling the processes that did attach)")
                hasten_error = hasten_errors(statuses)
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
        except BaseException:
            # Ctrl-C, SIGTERM (hasten.cli raises Terminated for it) or hasten's own error: the command runs
            # in a session of its own, which no signal to hasten reaches, and left alone it ran on as an
            # orphan (a --verify re-run, issue 43). Its whole session goes with hasten.
            stop_session(proc)
            raise
        stop_session(proc)  # what it left in its session (stop_session's docstring)
        tee.join(timeout=5)
        if cannot_attach:
            raise ProfileFailed(cannot_attach, 2)
        wall = time.perf_counter() - t0
        ranks = read_json_files(out_dir, "rank*.json")
        text = tee.tail.decode(errors="replace")
        statuses = read_statuses(out_dir)
        return RunOutcome(proc.returncode, ranks, timed_out, text, wall, statuses, check.attached(),
                          check.summary(), hasten_error or hasten_errors(statuses))
    finally:
        shutil.rmtree(work, ignore_errors=True)



def stop_session(proc: subprocess.Popen) -> None:
    """Kill the command's session (its process group: torchrun's workers and DataLoader workers in it) and
    reap it. SIGKILL, not the signal hasten got: a second Ctrl-C while the command ran its own handlers
    would end hasten first (hasten.cli), and the command would be left running again. Also after the
    command ended by itself: DataLoader workers of a process that left with ``os._exit`` (as every
    profiled rank does) see their parent gone only at their next check, up to 5 s later (torch's
    MP_STATUS_CHECK_INTERVAL), and meanwhile hold the output pipe open (so the run's wall time and the
    tee waited for them) and their cores busy (beside the next re-run)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # already gone
        pass
    proc.wait()


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
        from hasten.profile.verify import verify
        verify(config, analysis, log, run_instrumented)
    return analysis
