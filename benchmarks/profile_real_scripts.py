"""Is ``hasten profile`` right on real training scripts from public repositories, run unchanged? (issue 32, item 8)

The scripts (``real_script_cases.py``: repository, commit, licence, command line, the data
made for each) are fetched at pinned commits into a cache outside this repository
(``real_script_fetch.py``) and run unchanged on synthetic data. Per case and repeat, in this order:

1. **the truth**, without hasten: the script under ``_real_script_truth.py``, which times its
   optimizer steps (a global step hook; at ``backward()`` where it builds no optimizer) in
   alternating blocks, as run and with its data made free (each DataLoader hands out copies of
   its first batch, or the script's batch function returns its first result), and stops it. It
   also shows that the script works here without hasten. The true data share is
   1 - T(free) / T(as run), pooled over the repeats; the expected verdict is what that share
   gives under the profile's own thresholds (``hasten.profile.verdict.classify``). A script
   whose data path cannot be made free this way has no truth ("not measured").
2. **``hasten profile --json``** on the same command line, in the same conditions (a case
   pinned to a core runs both under ``taskset``): its exit status, verdict, data share and
   interval, step time, what it dropped, its #1 fix.
3. **the fix truth**, where ``--verify`` verified the #1 fix with an interval: the script under the
   same harness with that fix applied by the benchmark itself (``_real_script_fix.py``, from the
   fix's ``apply``) in shuffled pairs of blocks against as run, its ratio with a 95% interval
   (``_real_script_fix_truth.py``), at most ``--fix-truth-limit`` seconds. ``--fix-truth-only``
   measures it for the runs already recorded that the goal judges and that have none.

Case by case (``plan``: the cases in a seeded shuffled order, every repeat of a case, each with its
own truth, before the next), so a benchmark stopped part way leaves whole cases. Each finished
(case, repeat) is written at once and skipped on a rerun; a run stopped part way (SIGTERM, Ctrl-C,
SIGKILL) is not recorded and runs again, so the benchmark resumes where it stopped (``--fresh``
starts over) and runs in pieces over several sessions. Every write is a whole results file: the
conditions so far, each piece's start, end, commit and conditions (``pieces``), ``complete`` and
``runs_done`` (of the selected cases' repeats), the summary of the runs so far (a case with fewer
runs than ``--repeats`` is listed as such, not judged for the same verdict every repeat), a line per
run, in ``benchmarks/results/profile_real_scripts.json``; every run in full (the truth's step times,
the profile's per-step record as columns) in ``profile_real_scripts.runs.jsonl.gz`` beside it.

Goals (issue 43, per condition; ``summary.goals`` holds each figure and whether it is met): the
right verdict on >= 95% of runs; the same verdict 3 of 3 on >= 90% of cases; 0 scripts broken (a
script that runs without hasten must not fail under it); no #1 prediction above its bound (the
profile's own, and for a data fix the truth's data-free speedup, the upper end of its interval);
the #1 fix verified with an interval on >= 80% of the truly input-bound runs (``--verify``),
within 15% of the truth (here: of that fix's own truth, step 3; a run without one counts as "no fix
truth"; the distance to the truth's data-free speedup, the most a data fix can give, is kept beside it);
profiling overhead < 5% per step on the compute-bound cases without ``--verify``.

    python benchmarks/profile_real_scripts.py [--repeats 3] [--busy K] [--verify input-bound|all|none] [--only NAME] [--fresh] [--summarize]
    python benchmarks/profile_real_scripts.py --fix-truth-only [--only NAME] [--fix-truth-limit 600] [--busy K]

A piece is stopped with SIGTERM or Ctrl-C (a SIGKILL leaves no process of its own behind either) and
goes on with the same command; the results file says ``"complete": false`` and ``runs_done`` until then.

**Two conditions** (issue 43): quiet, and ``--busy 2``: two processes spinning on the CPU beside
each case for the whole of its truth and its profile (the truth is measured in the same
conditions as the verdict it judges), written to ``profile_real_scripts-busy2.json``; the time
limits of the truth, the profile and the fix truth are (1 + K) x the quiet ones (``stretch``). A case may
add its own (``Case.busy``: one worker beside a busy core). The image-training cases (torchvision,
timm, Lightning) need the environment of ``_real_script_env.py``; run from anywhere else they are
skipped and said to be.

(``nice -n 19`` in front on a machine others are timing on; ``hasten profile`` runs the command
with ``python`` from ``PATH``, so run it from the environment hasten is installed in.)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

from hasten.cores import usable_cores
from hasten.profile.verdict import classify

from _common import RESULTS, MeasuredConditions, hardware_label, load_results, write_results
from real_script_cases import CASES, DATA, STUBS, Case
from _real_script_env import PACKAGES as ENV_PACKAGES
from real_script_fetch import checkout
import _real_script_fix_truth as fix_truth
from _real_script_fix import supported as fix_supported
from _real_script_judge import _pct, _share_interval, goals_text, judge, table, truth

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = RESULTS / "profile_real_scripts.json"
PY = sys.executable


def _fill(args, checkout_dir: Path, scratch: Path) -> list[str]:
    return [a.format(checkout=checkout_dir, scratch=scratch) for a in args]


def _portable(text: str, checkout_dir: Path, scratch: Path) -> str:
    return (text.replace(str(checkout_dir), "<checkout>").replace(str(scratch), "<scratch>")
            .replace(str(ROOT), "<hasten>").replace(sys.prefix, "<python>"))


def _env(case: Case, checkout_dir: Path, scratch: Path) -> dict:
    # `hasten profile -- python SCRIPT` finds python on PATH: this interpreter's first (the environment of
    # _real_script_env.py when the benchmark runs from it)
    env = {**os.environ, "PATH": os.pathsep.join((str(Path(PY).parent), os.environ.get("PATH", ""))), **dict(case.env)}
    extra = [str(checkout_dir)] if case.pythonpath else []
    if case.stubs:  # stand-ins for an online service the script logs to (real_script_cases.STUBS)
        extra.append(str(scratch / "stubs"))
    if extra:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (*extra, env.get("PYTHONPATH")) if p)
    return env


def _pin(case: Case) -> list[str]:
    return ["taskset", "-c", case.taskset] if case.taskset else []


def _tail(text: str, n: int = 6) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def _run(cmd: list[str], timeout: float, **kw) -> tuple[int, str, str]:
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


def stretch(busy: int) -> int:
    """How much longer the time limits are beside ``busy`` spinning processes: 1 + busy. A limit only
    catches a hang; beside 2 spinners on 2 cores a step took up to 3 x its quiet time (a DataLoader's
    workers queue behind the spinners too), and minGPT chargpt's truth ran past a quiet 400 s."""
    return 1 + busy


def truth_run(case: Case, checkout_dir: Path, scratch: Path, cwd: Path, fix: dict | None = None,
              limit: float = 400) -> dict:
    """The script under ``_real_script_truth.py``: as run against data free, or with ``fix``
    (``REAL_TRUTH_FIX``, ``REAL_TRUTH_ORDER``, ``REAL_TRUTH_PAIRS``: the fix truth) against its fix."""
    out = scratch / ("fix_truth.json" if fix else "truth.json")
    env = {**_env(case, checkout_dir, scratch), "REAL_TRUTH_OUT": str(out), "REAL_TRUTH_WARMUP": str(case.truth_warmup),
           "REAL_TRUTH_BLOCK": str(case.truth_block), "REAL_TRUTH_PAIRS": str(case.truth_pairs),
           "REAL_TRUTH_DATA_FN": case.data_fn or "", **(fix or {})}
    cmd = [*_pin(case), PY, str(HERE / "_real_script_truth.py"), str(checkout_dir / case.script),
           *_fill(case.args, checkout_dir, scratch)]
    t0 = time.perf_counter()
    code, _, err = _run(cmd, limit, cwd=cwd, env=env)
    if code == 124 and not err:
        err = f"timed out after {limit:.0f} s"
    row = json.loads(out.read_text()) if out.exists() else {}
    row.update(exit=code, wall_s=time.perf_counter() - t0)
    if code != 0 or row.get("asrun_s") is None:
        row["error"] = _portable(_tail(err), checkout_dir, scratch)
    return row


def fix_truth_run(case: Case, checkout_dir: Path, scratch: Path, cwd: Path, row: dict, limit: float) -> dict:
    """The fix truth of a run's verified #1 fix (``_real_script_fix_truth.py``): the script as run
    against the same with the fix, in shuffled pairs of blocks of one process, at most ``limit`` s."""
    top = row["profile"].get("top_fix") or {}
    apply = fix_truth.apply_of(top)
    if not fix_supported(apply):
        return {"measured": False, "apply": apply, "fix": top.get("fix"),
                "why": f"the benchmark does not apply {apply!r}" if apply else "no apply string for this fix"}
    pairs = max(case.truth_pairs, fix_truth.PAIRS)
    seed = zlib.crc32(f"{case.name}/{row['repeat']}".encode())
    t = truth_run(case, checkout_dir, scratch, cwd, limit=limit, fix={
        "REAL_TRUTH_FIX": apply, "REAL_TRUTH_PAIRS": str(pairs), "REAL_TRUTH_ORDER": fix_truth.order(pairs, seed),
        "REAL_TRUTH_BLOCK": str(fix_truth.block_steps(case.truth_block, row["truth"].get("asrun_s")))})
    t.update(fix_truth.ratio(t) if t.get("fix_steps") else {"ratio": None, "interval": None, "n": 0},
             apply=apply, fix=top.get("fix"), seed=seed, measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    t["measured"] = t["ratio"] is not None and t["interval"] is not None and not t.get("fix_error")
    if not t["measured"]:
        t["why"] = t.get("fix_error") or t.get("error") or f"{t['n']} pair(s) of blocks measured, too few for an interval"
    return t


def _verified_interval(rec: dict) -> list[float] | None:
    """The 95% interval of a fix's verified speedup, as the profile's JSON gives it (``verification``:
    hasten.profile.verify)."""
    if (rec.get("verification") or {}).get("interval"):
        return list(rec["verification"]["interval"])
    if rec.get("verified_interval"):
        return list(rec["verified_interval"])
    if rec.get("verified_low") is not None and rec.get("verified_high") is not None:
        return [rec["verified_low"], rec["verified_high"]]
    return None


def profile_run(case: Case, checkout_dir: Path, scratch: Path, cwd: Path, verify: bool, slower: int = 1) -> dict:
    """``hasten profile --json`` on the case; its own ``--timeout`` and the benchmark's limit ``slower``
    times the quiet ones (``stretch``)."""
    js = scratch / "profile.json"
    cmd = [*_pin(case), PY, "-m", "hasten", "profile", *case.profile_args, *(["--verify"] if verify else []),
           "--json", str(js), "--quiet",
           "--timeout", str(300 * slower), "--", "python", str(checkout_dir / case.script),
           *_fill(case.args, checkout_dir, scratch)]
    # --verify re-runs the command about 3 times per fix (each under hasten's own --timeout): a slow
    # script's verification takes many minutes, which is its cost, not a hang
    limit = (2400 if verify else 500) * slower
    t0 = time.perf_counter()
    code, out, err = _run(cmd, limit, cwd=cwd, env=_env(case, checkout_dir, scratch))
    if code == 124 and not out and not err:
        err = f"timed out after {limit} s (the benchmark's limit, not hasten's)"
    row = {"exit": code, "wall_s": time.perf_counter() - t0}
    if js.exists():
        a = json.loads(js.read_text())
        top = (a.get("recommendations") or [None])[0]
        row.update({k: a.get(k) for k in ("verdict", "severity", "step_time_s", "data_share", "data_interval",
                                          "input_kind", "data_wait_fraction", "compute_fraction",
                                          "other_fraction", "data_free_step_s", "steps", "steps_from",
                                          "num_workers", "dropped", "probes_off", "ended_early", "extended",
                                          "near")})
        row["cpu_available"] = (a.get("cpu") or {}).get("available")
        row["top_fix"] = top and {"fix": top.get("fix"), "kind": top.get("kind"), "apply": top.get("apply"),
                                  "predicted": top.get("predicted_speedup"),
                                  "verified": top.get("verified_speedup"), "bound": top.get("bound"),
                                  "verified_interval": _verified_interval(top)}
        row["other_where"] = (a.get("other_where") or [])[:2]
        row["per_step"] = _columns(a.get("per_step"))
        row["notes"] = a.get("notes")
        row["cpu"] = a.get("cpu")
    row["report"] = _portable(_tail(out, 30), checkout_dir, scratch)
    if code != 0:
        row["error"] = _portable(_tail(err + "\n" + out, 8), checkout_dir, scratch)
    return row


def _columns(records: list[dict] | None) -> dict | None:
    """Per-step records as one list per field: the field names once, not once per step."""
    if not records:
        return None
    return {k: [r.get(k) for r in records] for k in records[0]}


def brief(row: dict) -> dict:
    """One run in a line of the summary: what the results pages quote, without the per-step times."""
    t, p = row["truth"], row["profile"]
    return {"case": row["case"], "repeat": row["repeat"], "hasten": row.get("hasten"), "finished": row.get("finished"),
            "truth_asrun_s": t.get("asrun_s"), "truth_datafree_s": t.get("datafree_s"), "truth_exit": t.get("exit"),
            "exit": p["exit"], "verdict": p.get("verdict"), "data_share": p.get("data_share"),
            "data_interval": p.get("data_interval"), "step_time_s": p.get("step_time_s"), "top_fix": p.get("top_fix"),
            "fix_truth": row.get("fix_truth") and {k: row["fix_truth"].get(k) for k in ("apply", "ratio", "interval",
                                                                                         "n", "why")}}


class Busy:
    """``k`` processes spinning on the CPU (a pure-Python loop each, as a busy neighbour's would) for as long
    as the block runs, beside the truth and the profile alike; ended by their own ids, and each ends itself
    within a fraction of a second once the benchmark is gone (a SIGKILL runs no ``__exit__``)."""

    # the benchmark's pid is passed in: one read by the spinner could already be init's, had the benchmark died first
    SPIN = ("import os, sys\nwhile os.getppid() == int(sys.argv[1]):\n"
            "    for _ in range(100000):\n        pass\n")

    def __init__(self, k: int):
        self.k, self.procs = k, []

    def __enter__(self):
        self.procs = [subprocess.Popen([PY, "-c", self.SPIN, str(os.getpid())]) for _ in range(self.k)]
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
            p.wait()


def skip_reason(case: Case) -> str | None:
    if case.needs and importlib.util.find_spec(case.needs) is None:
        how = ("run the benchmark from the environment of benchmarks/_real_script_env.py"
               if case.needs in ENV_PACKAGES else f"pip install {case.needs}")
        return f"needs {case.needs} ({how})"
    return None


def truth_says_input(t: dict) -> bool:
    """Whether one run's truth could be input-bound (its share's interval reaches the input line): the runs
    ``--verify input-bound`` verifies. Deciding from the run's own truth, measured just before in the same
    conditions, spends the re-runs where the goal judges them and leaves compute-bound runs as a user
    without ``--verify`` runs them (the overhead goal)."""
    if not t.get("asrun_steps") or not t.get("datafree_steps"):
        return False
    lo, hi = _share_interval(t["asrun_steps"], t["datafree_steps"], n=400)
    return classify(hi, 0.0)[0] != "compute-bound"


@contextlib.contextmanager
def prepared(case: Case):
    """``(checkout, scratch, cwd, origin)`` for one run of the case: its data made in a fresh scratch
    folder, removed after."""
    src = case.source
    checkout_dir, origin = checkout(src.name, src.commit)
    scratch = Path(tempfile.mkdtemp(prefix="hasten-real-"))
    try:
        if case.data:
            DATA[case.data](checkout_dir, scratch)
        for name in case.stubs:
            (scratch / "stubs").mkdir(exist_ok=True)
            (scratch / "stubs" / f"{name}.py").write_text(STUBS[name])
        yield checkout_dir, scratch, checkout_dir if case.cwd == "checkout" else scratch, origin
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def wants_fix_truth(row: dict) -> bool:
    """Whether a run's #1 fix was verified with an interval (the runs the fix truth measures)."""
    top = row["profile"].get("top_fix") or {}
    return bool(row.get("verify")) and top.get("verified") is not None and bool(top.get("verified_interval"))


def run_case(case: Case, repeat: int, verify: str, busy: int = 0, verify_repeats: int = 1,
             fix_limit: float = 600) -> dict:
    why = skip_reason(case)
    if why:
        return {"case": case.name, "repeat": repeat, "skipped": why}
    with prepared(case) as (checkout_dir, scratch, cwd, origin):
        row = {"case": case.name, "repeat": repeat, "fetched_from": origin, "busy": busy + case.busy}
        slower = stretch(busy + case.busy)
        with Busy(busy + case.busy):
            row["truth"] = truth_run(case, checkout_dir, scratch, cwd, limit=400 * slower)
            verified = repeat < verify_repeats and (
                verify == "all" or (verify == "input-bound" and truth_says_input(row["truth"])))
            row["verify"] = verified
            row["profile"] = profile_run(case, checkout_dir, scratch, cwd, verified, slower)
            if wants_fix_truth(row):
                row["fix_truth"] = fix_truth_run(case, checkout_dir, scratch, cwd, row, fix_limit * slower)
        return row


def add_fix_truth(case: Case, row: dict, fix_limit: float) -> None:
    """The fix truth of a run measured before the benchmark had one (``--fix-truth-only``), beside as
    many busy processes as the run had; marked as measured later than its profile."""
    with prepared(case) as (checkout_dir, scratch, cwd, _):
        with Busy(row.get("busy", 0)):
            limit = fix_limit * stretch(row.get("busy", 0))
            row["fix_truth"] = fix_truth_run(case, checkout_dir, scratch, cwd, row, limit)
    # not right after the run's profile (the machine's load may differ), and perhaps with another hasten
    row["fix_truth"].update(later=True, hasten=_hasten_commit())


def estimate(todo: list[tuple[int, Case]], past: list[dict], busy: int = 0) -> float:
    """Seconds the runs to go should take: each case's mean wall time in the quiet results where it has
    some, else its ``est_s``; 0 for a case that will be skipped. Beside busy processes, stretched by
    (cores + busy) / cores: a step is fixed work, and the spinners take their share of the cores."""
    walls: dict[str, list[float]] = {}
    for r in past:
        if "skipped" not in r:
            walls.setdefault(r["case"], []).append(r["truth"].get("wall_s", 0) + r["profile"].get("wall_s", 0)
                                                   + (r.get("fix_truth") or {}).get("wall_s", 0))
    return sum(0.0 if skip_reason(c) else statistics.mean(walls[c.name]) if c.name in walls else c.est_s
               for _, c in todo) * (usable_cores() + busy) / usable_cores()


def _load(out: Path) -> dict:
    return load_results(out) or {"runs": []}


def _hasten_commit() -> str:
    p = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "hasten"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    return p.stdout.strip() + ("+uncommitted hasten/ changes" if dirty else "")


def fix_truth_only(result: dict, out: Path, only: str | None, limit: float) -> int:
    """``--fix-truth-only``: the fix truth of each run the goal judges that has none measured yet."""
    cases = {c.name: c for c in CASES}
    todo = []
    for case in CASES:
        runs = [r for r in result["runs"] if r["case"] == case.name and "skipped" not in r]
        t = truth(case, runs) if runs else {}
        if (only is None or only in case.name) and t.get("verdict") == "input-bound" and t.get("decided"):
            todo += [r for r in runs if wants_fix_truth(r) and not (r.get("fix_truth") or {}).get("measured")
                     and not skip_reason(case)]
    # its steps: (pairs x block) as the truth's, 6 pairs or more where the truth had 5, and a few more in the warm-up
    about = sum(min(limit, 1.3 * r["truth"].get("wall_s", 0)) for r in todo)
    print(f"fix truth of {len(todo)} run(s) in {out.name}, at most {limit:.0f} s each; about {about / 60:.0f} min "
          "quiet (1.3 x each run's truth), and the making of each case's data", flush=True)
    piece = {"started": _now(), "hasten": _hasten_commit(), "fix_truth_only": True}
    with MeasuredConditions("cpu") as cond:
        for i, r in enumerate(todo, 1):
            add_fix_truth(cases[r["case"]], r, limit)
            result["summary"] = judge(result["runs"], result.get("repeats"))
            result["runs_brief"] = [brief(x) for x in result["runs"]]
            write_results(out, result)
            ft = r["fix_truth"]
            shown = (f"x{ft['ratio']:.2f} (x{ft['interval'][0]:.2f}-x{ft['interval'][1]:.2f}, n = {ft['n']})"
                     if ft.get("measured") else f"not measured: {str(ft.get('why'))[-200:]}")
            print(f"[{i}/{len(todo)}] {r['case']} (repeat {r['repeat']}): {ft.get('apply')}: {shown}; "
                  f"verified x{r['profile']['top_fix']['verified']:.2f}; {ft.get('wall_s', 0):.0f} s", flush=True)
    result.setdefault("pieces", []).append({**piece, "ended": _now(), "conditions": cond.as_dict()})
    result["summary"] = judge(result["runs"], result.get("repeats"))
    write_results(out, result)
    print(goals_text(result["summary"]))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs per case (the goal: the same verdict 3 of 3)")
    ap.add_argument("--verify", choices=("input-bound", "all", "none"), default="input-bound",
                    help="profile with --verify (re-runs with each fix applied): on the runs whose own truth may "
                         "be input-bound (the default: the goal judges those), on all, or on none")
    ap.add_argument("--verify-repeats", type=int, default=1, metavar="N",
                    help="verify in the first N repeats of a case only (default 1: a verification re-runs the "
                         "script about 3 times per fix, 10-20 min for a slow image script on 2 cores)")
    ap.add_argument("--seed", type=int, default=0, help="seeds the order of the cases in each repeat")
    ap.add_argument("--only", default=None, help="run the cases whose name contains this")
    ap.add_argument("--fresh", action="store_true", help="forget the runs already in the results file")
    ap.add_argument("--busy", type=int, default=0, metavar="K",
                    help="K processes spinning beside every case, its truth and its profile alike (the busy "
                         "condition; its results go to profile_real_scripts-busyK.json unless --out)")
    ap.add_argument("--out", type=Path, default=None,
                    help="the summary file, its runs beside it as NAME.runs.jsonl.gz (a check of one case "
                         "elsewhere leaves the benchmark's own alone)")
    ap.add_argument("--summarize", action="store_true",
                    help="judge the runs already in the results file again and write the summary, running nothing")
    ap.add_argument("--fix-truth-only", action="store_true",
                    help="run nothing but the fix truth of the runs already in the results file that the goal judges "
                         "(truly input-bound, #1 fix verified) and have none measured yet, each written as it finishes")
    ap.add_argument("--fix-truth-limit", type=float, default=600, metavar="S",
                    help="the most seconds one fix truth may take (default 600); past it, that run has none")
    args = ap.parse_args(argv)
    if args.busy < 0:
        ap.error("--busy takes a number of processes, 0 or more")
    if args.fix_truth_limit <= 0:
        ap.error("--fix-truth-limit takes a number of seconds above 0")
    if args.fix_truth_only and (args.fresh or args.summarize):
        ap.error("--fix-truth-only measures the runs already in the results file: not with --fresh or --summarize")
    out = (args.out or (OUT.with_name(f"{OUT.stem}-busy{args.busy}.json") if args.busy else OUT)).resolve()
    result = {"runs": []} if args.fresh else _load(out)
    if result["runs"] and result.get("busy", args.busy) != args.busy:
        ap.error(f"{out.name} holds runs beside {result['busy']} busy processes, not {args.busy}: "
                 "another --out, or --fresh")
    result["busy"] = args.busy
    if args.summarize:
        result["summary"] = judge(result["runs"], result.get("repeats"))
        result["runs_brief"] = [brief(r) for r in result["runs"]]
        write_results(out, result)
        print(table(result["summary"]))
        print(goals_text(result["summary"]))
        return 0
    if args.fix_truth_only:
        return fix_truth_only(result, out, args.only, args.fix_truth_limit)
    selected = [c for c in CASES if args.only is None or args.only in c.name]
    todo = plan(selected, args.repeats, args.seed, result["runs"])
    piece = {"started": _now(), "hasten": _hasten_commit(), "runs_before": len(result["runs"])}
    result.setdefault("pieces", []).append(piece)
    result["cases"] = _cases_block()
    result["skipped"] = {c.name: skip_reason(c) for c in CASES if skip_reason(c)}
    t_start, n_done, past = time.perf_counter(), 0, _load(OUT)["runs"]
    print(f"{len(todo)} runs to go ({len(result['runs'])} already in {out.name}, {args.busy} busy processes beside, "
          f"time limits x{stretch(args.busy)}); about {estimate(todo, past, args.busy) / 60:.0f} min", flush=True)
    # a SIGTERM unwinds as an exception: the busy processes and the run under way are ended, and the
    # run is not recorded (only a finished run is), so a resumed benchmark runs it again
    signal.signal(signal.SIGTERM, _stop)
    with MeasuredConditions("cpu") as cond:
        checkpoint(out, result, piece, cond, selected, args.repeats)
        for i, (rep, case) in enumerate(todo):
            row = run_case(case, rep, args.verify, args.busy, args.verify_repeats, args.fix_truth_limit)
            if "skipped" in row:
                print(f"{case.name}: skipped, {row['skipped']}", flush=True)
                continue
            row["hasten"] = piece["hasten"]
            row["finished"] = _now()
            result["runs"].append(row)
            checkpoint(out, result, piece, cond, selected, args.repeats)
            n_done += 1
            elapsed = time.perf_counter() - t_start
            # the estimate of the runs to go, scaled by how the runs so far kept to theirs
            pace = elapsed / max(1e-9, estimate(todo[:i + 1], past, args.busy))
            left = estimate(todo[i + 1:], past, args.busy) * pace
            p, t = row["profile"], row["truth"]
            print(f"[{n_done}/{len(todo)}] {case.name} (repeat {rep}): as run "
                  f"{(t.get('asrun_s') or 0) * 1e3:.0f} ms, data free "
                  f"{(t.get('datafree_s') or 0) * 1e3:.0f} ms{' ' + t['error'][-150:] if t.get('error') else ''}; "
                  f"hasten exit {p['exit']}, "
                  f"{p.get('verdict') or p.get('error', '')[:200]} (data {_pct(p.get('data_share'))}); "
                  f"{elapsed / 60:.1f} min in, about {left / 60:.1f} min left; {result['runs_done']}", flush=True)
    checkpoint(out, result, piece, cond, selected, args.repeats)
    s = result["summary"]
    print(table(s))
    print(f"beside {args.busy} busy processes:\n{goals_text(s)}")
    print(f"right verdicts {s['verdicts_right']} ({s['verdicts_right_decided_truths']} against decided truths), "
          f"crashes {s['crashes']}, same verdict every repeat "
          f"{s['same_verdict_every_repeat']}, overhead on compute-bound cases (median) "
          f"{_pct(s['overhead_compute_bound_median'])}")
    if not result["complete"]:
        print(f"not complete: {result['runs_done']}; run the same command again to go on", flush=True)
    return 0


def _stop(signum, frame):
    raise SystemExit(128 + signum)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


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
    piece.update(ended=_now(), runs_after=len(result["runs"]), conditions=result["conditions"])
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


def _cases_block() -> list[dict]:
    return [{"case": c.name, "repo": c.source.name, "commit": c.source.commit, "licence": c.source.licence,
             "script": c.script, "args": list(c.args), "variant": c.variant, "cwd": c.cwd,
             "pythonpath": c.pythonpath, "taskset": c.taskset, "data": c.data, "data_fn": c.data_fn,
             "stubs": list(c.stubs), "env": dict(c.env), "needs": c.needs, "busy": c.busy, "skipped": skip_reason(c)}
            for c in CASES]

if __name__ == "__main__":
    sys.exit(main())
