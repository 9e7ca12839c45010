"""The real-scripts benchmark (``profile_real_scripts.py``) in resumable pieces (issue 43): the busy
condition takes longer than a session, so the benchmark runs in pieces over several.

``plan`` orders the runs to go case by case (every repeat of a case before the next, so a stopped
piece leaves whole cases; the runs already recorded left out); ``checkpoint`` writes a whole
results file after every run (the conditions so far, each piece, ``complete`` and ``runs_done``,
the summary so far, a ``brief`` line per run); ``run_group`` runs a command in a process group of
its own that is killed with it, and ``stop`` turns SIGTERM into an exception, so a stopped piece
leaves no process behind and its unfinished run unrecorded (run again on resuming).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from pathlib import Path

from _common import MeasuredConditions, hardware_label, write_results
from _real_script_env import skip_reason
from _real_script_judge import judge
from real_script_cases import Case

ROOT = Path(__file__).resolve().parent.parent


def run_group(cmd: list[str], timeout: float, **kw) -> tuple[int, str, str]:
    """``cmd`` in a process group of its own: on its limit, or when the benchmark is stopped (SIGTERM,
    Ctrl-C), the whole group is killed (``hasten profile``'s script and its DataLoader workers with it),
    so no run outlives the one it belongs to. (124, "", "") past the limit."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err
    except BaseException as e:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        if isinstance(e, subprocess.TimeoutExpired):
            return 124, "", ""
        raise


def stop(signum, frame):
    raise SystemExit(128 + signum)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def hasten_commit() -> str:
    p = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "hasten"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    return p.stdout.strip() + ("+uncommitted hasten/ changes" if dirty else "")


def plan(cases: list[Case], repeats: int, seed: int, runs: list[dict]) -> list[tuple[int, Case]]:
    """``(repeat, case)`` to run, case by case: every repeat of a case (each with its own truth) before
    the next case, so a benchmark stopped part way leaves whole cases. The cases in an order shuffled by
    ``seed`` (a case's place in the session's drift of load is not its name's), a case already begun (a
    piece stopped inside it) first; the runs already recorded left out."""
    done = {(r["case"], r["repeat"]) for r in runs}
    order = cases[:]
    random.Random(seed).shuffle(order)
    begun = {name for name, _ in done}
    order.sort(key=lambda c: c.name not in begun)  # stable: the shuffled order otherwise
    return [(rep, c) for c in order for rep in range(repeats) if (c.name, rep) not in done]


def _conditions_now(cond: MeasuredConditions) -> dict:
    """The conditions from the piece's start until now: the load and the matmul rate measured again
    (about a second), as at the end of a measurement, so each write carries a whole conditions block."""
    cond.__exit__(None, None, None)
    return cond.as_dict()


def checkpoint(out: Path, result: dict, piece: dict, cond: MeasuredConditions, cases: list[Case],
               repeats: int) -> None:
    """Write ``result`` as a valid results file after every run, not only at the end: the conditions so far
    (this piece's, under "conditions"; every piece's, with its start, end, commit and runs, under "pieces"),
    whether it is complete (the runs done of all the selected cases' repeats) and the summary of the runs so far."""
    result["conditions"] = _conditions_now(cond)
    result["hardware"] = hardware_label(result["conditions"]["environment"])
    piece.update(ended=now(), runs_after=len(result["runs"]), conditions=result["conditions"])
    wanted = {(c.name, rep) for c in cases if not skip_reason(c) for rep in range(repeats)}
    done = wanted & {(r["case"], r["repeat"]) for r in result["runs"]}
    result["repeats"] = repeats
    result["complete"] = len(done) == len(wanted)
    skipped = sum(1 for c in cases if skip_reason(c))
    result["runs_done"] = (f"{len(done)} of {len(wanted)} runs ({len(cases) - skipped} cases x {repeats} repeats"
                           + (f"; {skipped} case(s) skipped here)" if skipped else ")"))
    result["summary"] = judge(result["runs"], repeats)
    result["runs_brief"] = [brief(r) for r in result["runs"]]
    # a SIGTERM waits for the files to be written (each is renamed into place, but a stop between the
    # write and the rename would leave a temporary file behind)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        write_results(out, result)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def brief(row: dict) -> dict:
    """One run in a line of the summary: what the results pages quote, without the per-step times."""
    t, p = row["truth"], row["profile"]
    return {"case": row["case"], "repeat": row["repeat"], "hasten": row.get("hasten"), "finished": row.get("finished"),
            "truth_asrun_s": t.get("asrun_s"), "truth_datafree_s": t.get("datafree_s"), "truth_exit": t.get("exit"),
            "exit": p["exit"], "verdict": p.get("verdict"), "data_share": p.get("data_share"),
            "data_interval": p.get("data_interval"), "step_time_s": p.get("step_time_s"), "top_fix": p.get("top_fix"),
            "fix_truth": row.get("fix_truth") and {k: row["fix_truth"].get(k) for k in ("apply", "ratio", "interval",
                                                                                         "n", "why")}}
