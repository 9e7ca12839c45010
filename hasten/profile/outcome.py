"""What one run of the profiled command gave: its ranks' reports, or why there are none.

While the command runs, each instrumented process writes a status file every second (steps,
forwards, backward calls, batches per loader, where its main thread is, an uncaught exception's
line); :func:`describe_statuses` turns them into the launcher's stall and failure messages.
When it has ended, :func:`check_outcome` hands back the ranks' complete reports, or raises
:class:`ProfileFailed` with one clear message and the exit code to return: the command failed
(each failing rank's error line), ended before the window and probes were done, never called
``optimizer.step()``, outlasted ``--timeout``, or hasten failed in its own code.

Changes the training math: no.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hasten.errors import HastenError

if TYPE_CHECKING:
    from hasten.profile.config import ProfileConfig
    from hasten.profile.verdict import Analysis

# The exit code when hasten itself failed (EX_SOFTWARE), never the command's own.
HASTEN_FAILED = 70


class ProfileFailed(HastenError, RuntimeError):
    """The profiled command did not get far enough; ``exit_code`` is what to return."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code

    def one_line(self) -> str:
        """The message as one line, for a note (a failed verification's): its lines joined, what was seen
        included, the command's output tail left out. The first line alone ended in "Seen:" with what was
        seen cut off."""
        text = str(self).split(OUTPUT_TAIL)[0]
        return " ".join(line.strip() for line in text.splitlines() if line.strip())


OUTPUT_TAIL = "\n--- last lines of the command's output ---\n"  # where a message's copy of the output begins



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



def read_json_files(out_dir: Path, pattern: str) -> list[dict]:
    """The JSON files in ``out_dir`` matching ``pattern``, in name order; a file being written or gone
    meanwhile is left out (the ranks write theirs while the launcher reads)."""
    out = []
    for p in sorted(out_dir.glob(pattern)):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            pass
    return out


def read_statuses(out_dir: Path) -> list[dict]:
    return read_json_files(out_dir, "status-*.json")


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


def hasten_errors(statuses: list[dict]) -> str:
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



def check_outcome(outcome: RunOutcome, config: ProfileConfig) -> list[dict]:
    """The ranks' complete reports, or ProfileFailed saying why there are none."""
    code = outcome.returncode
    lines = [ln for ln in outcome.output.splitlines() if ln.strip()]
    tail = ""
    if lines and config.capture:
        tail = OUTPUT_TAIL + "\n".join(lines[-15:])
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

