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

Case by case (``_real_script_pieces.py``, ``plan``: the cases in a seeded shuffled order, every repeat
of a case, each with its own truth, before the next), so a benchmark stopped part way leaves whole
cases. Each finished (case, repeat) is written at once and skipped on a rerun; a run stopped part way
(SIGTERM, Ctrl-C, SIGKILL) is not recorded and runs again, so the benchmark resumes where it stopped
(``--fresh`` starts over) and runs in pieces over several sessions. Every write is a whole results file:
the conditions so far, each piece's start, end, commit and conditions (``pieces``), ``complete`` and
``runs_done`` (of the selected cases' repeats), the summary of the runs so far (a case with fewer runs
than ``--repeats`` is listed as such, not judged for the same verdict every repeat), a line per run, in
``benchmarks/results/profile_real_scripts.json``; every run in full (the truth's step times, the
profile's per-step record as columns) in ``profile_real_scripts.runs.jsonl.gz`` beside it.

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

**Two conditions** (issue 43): quiet, and ``--busy 2``: two processes spinning on the CPU beside each
case for the whole of its truth and its profile (the truth is measured in the same conditions as the
verdict it judges), written to ``profile_real_scripts-busy2.json``; the time limits of the truth, the
profile and the fix truth are (1 + K) x the quiet ones (``stretch``; each run:
``_real_script_runs.py``). A case may add its own (``Case.busy``: one worker beside a busy core). The
image-training cases (torchvision, timm, Lightning) need the environment of ``_real_script_env.py``; run
from anywhere else they are skipped and said to be.

(``nice -n 19`` in front on a machine others are timing on; ``hasten profile`` runs the command
with ``python`` from ``PATH``, so run it from the environment hasten is installed in.)
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import time
from pathlib import Path

from hasten.cores import usable_cores
from hasten.profile.verdict import classify

from _common import RESULTS, MeasuredConditions, load_results, write_results
from real_script_cases import CASES, Case
from _real_script_env import skip_reason
from _real_script_judge import _pct, _share_interval, goals_text, judge, table, truth
from _real_script_pieces import brief, checkpoint, hasten_commit, now, plan, stop
from _real_script_runs import Busy, fix_truth_run, prepared, profile_run, stretch, truth_run

OUT = RESULTS / "profile_real_scripts.json"


def truth_says_input(t: dict) -> bool:
    """Whether one run's truth could be input-bound (its share's interval reaches the input line): the runs
    ``--verify input-bound`` verifies. Deciding from the run's own truth, measured just before in the same
    conditions, spends the re-runs where the goal judges them and leaves compute-bound runs as a user
    without ``--verify`` runs them (the overhead goal)."""
    if not t.get("asrun_steps") or not t.get("datafree_steps"):
        return False
    lo, hi = _share_interval(t["asrun_steps"], t["datafree_steps"], n=400)
    return classify(hi, 0.0)[0] != "compute-bound"


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
    row["fix_truth"].update(later=True, hasten=hasten_commit())


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
    piece = {"started": now(), "hasten": hasten_commit(), "fix_truth_only": True}
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
    result.setdefault("pieces", []).append({**piece, "ended": now(), "conditions": cond.as_dict()})
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
    piece = {"started": now(), "hasten": hasten_commit(), "runs_before": len(result["runs"])}
    result.setdefault("pieces", []).append(piece)
    result["cases"] = _cases_block()
    result["skipped"] = {c.name: skip_reason(c) for c in CASES if skip_reason(c)}
    t_start, n_done, past = time.perf_counter(), 0, _load(OUT)["runs"]
    print(f"{len(todo)} runs to go ({len(result['runs'])} already in {out.name}, {args.busy} busy processes beside, "
          f"time limits x{stretch(args.busy)}); about {estimate(todo, past, args.busy) / 60:.0f} min", flush=True)
    # a SIGTERM unwinds as an exception: the busy processes and the run under way are ended, and the
    # run is not recorded (only a finished run is), so a resumed benchmark runs it again
    signal.signal(signal.SIGTERM, stop)
    with MeasuredConditions("cpu") as cond:
        checkpoint(out, result, piece, cond, selected, args.repeats)
        for i, (rep, case) in enumerate(todo):
            row = run_case(case, rep, args.verify, args.busy, args.verify_repeats, args.fix_truth_limit)
            if "skipped" in row:
                print(f"{case.name}: skipped, {row['skipped']}", flush=True)
                continue
            row["hasten"] = piece["hasten"]
            row["finished"] = now()
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


def _cases_block() -> list[dict]:
    return [{"case": c.name, "repo": c.source.name, "commit": c.source.commit, "licence": c.source.licence,
             "script": c.script, "args": list(c.args), "variant": c.variant, "cwd": c.cwd,
             "pythonpath": c.pythonpath, "taskset": c.taskset, "data": c.data, "data_fn": c.data_fn,
             "stubs": list(c.stubs), "env": dict(c.env), "needs": c.needs, "busy": c.busy, "skipped": skip_reason(c)}
            for c in CASES]


if __name__ == "__main__":
    sys.exit(main())
