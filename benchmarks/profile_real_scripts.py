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

Repeats are interleaved (every case once per repeat, in a shuffled order). Each finished
(case, repeat) is written at once and skipped on a rerun, so the benchmark resumes where it
stopped (``--fresh`` starts over): the summary (conditions, the cases, each case's truth and
verdicts, the goals, a line per run) in ``benchmarks/results/profile_real_scripts.json``, every
run in full (the truth's step times, the profile's per-step record as columns) in
``profile_real_scripts.runs.jsonl.gz`` beside it.

Goals (issue 32): the right verdict on >= 90% of runs; 0 crashes (a script that runs without
hasten must not fail under it); the same verdict on every repeat of >= 90% of cases (3 of 3
with ``--repeats 3``); profiling overhead < 5% per step on the compute-bound cases.

    python benchmarks/profile_real_scripts.py [--repeats 3] [--verify] [--only NAME] [--fresh]

(``nice -n 19`` in front on a machine others are timing on; ``hasten profile`` runs the command
with ``python`` from ``PATH``, so run it from the environment hasten is installed in.)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hasten.profile.verdict import classify
from hasten.timing import interleaved

from _common import RESULTS, MeasuredConditions, hardware_label, load_results, write_results
from real_script_cases import CASES, DATA, STUBS, Case
from real_script_fetch import checkout

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
    env = dict(os.environ)
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


def truth_run(case: Case, checkout_dir: Path, scratch: Path, cwd: Path) -> dict:
    out = scratch / "truth.json"
    env = {**_env(case, checkout_dir, scratch), "REAL_TRUTH_OUT": str(out), "REAL_TRUTH_WARMUP": str(case.truth_warmup),
           "REAL_TRUTH_BLOCK": str(case.truth_block), "REAL_TRUTH_PAIRS": str(case.truth_pairs),
           "REAL_TRUTH_DATA_FN": case.data_fn or ""}
    cmd = [*_pin(case), PY, str(HERE / "_real_script_truth.py"), str(checkout_dir / case.script),
           *_fill(case.args, checkout_dir, scratch)]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=400)
        code, err = p.returncode, p.stderr
    except subprocess.TimeoutExpired:
        code, err = 124, "timed out after 400 s"
    row = json.loads(out.read_text()) if out.exists() else {}
    row.update(exit=code, wall_s=time.perf_counter() - t0)
    if code != 0 or row.get("asrun_s") is None:
        row["error"] = _portable(_tail(err), checkout_dir, scratch)
    return row


def profile_run(case: Case, checkout_dir: Path, scratch: Path, cwd: Path, verify: bool) -> dict:
    js = scratch / "profile.json"
    cmd = [*_pin(case), PY, "-m", "hasten", "profile", *case.profile_args, *(["--verify"] if verify else []),
           "--json", str(js), "--quiet",
           "--timeout", "300", "--", "python", str(checkout_dir / case.script),
           *_fill(case.args, checkout_dir, scratch)]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=cwd, env=_env(case, checkout_dir, scratch), capture_output=True, text=True,
                           timeout=500)
        code, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        code, out, err = 124, "", "timed out after 500 s"
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
        row["top_fix"] = top and {"fix": top.get("fix"), "predicted": top.get("predicted_speedup"),
                                  "verified": top.get("verified_speedup")}
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
            "data_interval": p.get("data_interval"), "step_time_s": p.get("step_time_s"), "top_fix": p.get("top_fix")}


def run_case(case: Case, repeat: int, verify: bool) -> dict:
    if case.needs and importlib.util.find_spec(case.needs) is None:
        return {"case": case.name, "repeat": repeat, "skipped": f"needs {case.needs} (pip install {case.needs})"}
    src = case.source
    checkout_dir, origin = checkout(src.name, src.commit)
    scratch = Path(tempfile.mkdtemp(prefix="hasten-real-"))
    try:
        if case.data:
            DATA[case.data](checkout_dir, scratch)
        for name in case.stubs:
            (scratch / "stubs").mkdir(exist_ok=True)
            (scratch / "stubs" / f"{name}.py").write_text(STUBS[name])
        cwd = checkout_dir if case.cwd == "checkout" else scratch
        row = {"case": case.name, "repeat": repeat, "fetched_from": origin}
        row["truth"] = truth_run(case, checkout_dir, scratch, cwd)
        row["profile"] = profile_run(case, checkout_dir, scratch, cwd, verify)
        return row
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# --- judging --------------------------------------------------------------------------------

def _share_interval(asrun: list[float], free: list[float], n: int = 2000) -> tuple[float, float]:
    """A 95% bootstrap interval of 1 - median(free) / median(as run), steps resampled in each condition."""
    rng = random.Random(0)
    shares = sorted(1 - statistics.median(rng.choices(free, k=len(free))) /
                    statistics.median(rng.choices(asrun, k=len(asrun))) for _ in range(n))
    return max(0.0, shares[int(0.025 * n)]), max(0.0, shares[int(0.975 * n) - 1])


def truth(case: Case, runs: list[dict]) -> dict:
    """The pooled truth of a case: the median step as run and with the data made free (steps of
    every repeat pooled: a load spike of seconds on this shared machine moves a mean, not a
    median), the data share with its bootstrap interval, the expected verdict."""
    ok = [r["truth"] for r in runs if r["truth"].get("asrun_s")]
    if not ok:
        return {"measured": False, "why": "the script failed without hasten"}
    asrun = [s for t in ok for s in t["asrun_steps"]]
    if case.in_memory:
        return {"measured": True, "asrun_s": statistics.median(asrun), "asrun_mean_s": statistics.mean(asrun),
                "datafree_s": None, "data_share": 0.0,
                "interval": [0.0, 0.0], "verdict": "compute-bound", "decided": True,
                "how": "by construction: the whole batch is in memory before the loop"}
    made_free = [t for t in ok if t.get("datafree_s") and (t.get("loaders_replayed") or t.get("data_fn_replaced"))]
    if not made_free:
        return {"measured": False, "asrun_s": statistics.median(asrun),
                "why": "no DataLoader and no batch function to replay: the data path could not be made free"}
    asrun = [s for t in made_free for s in t["asrun_steps"]]
    free = [s for t in made_free for s in t["datafree_steps"]]
    a, f = statistics.median(asrun), statistics.median(free)
    share = max(0.0, 1 - f / a)
    lo, hi = _share_interval(asrun, free)
    verdict = classify(share, 0.0, wait_interval=(lo, hi))[0]
    return {"measured": True, "asrun_s": a, "datafree_s": f, "data_share": share, "interval": [lo, hi],
            "asrun_mean_s": statistics.mean(asrun), "datafree_mean_s": statistics.mean(free),
            # of the means: a stall of seconds in some as-run steps counts here, not in the median's share
            "data_share_of_means": max(0.0, 1 - statistics.mean(free) / statistics.mean(asrun)),
            "steps": [len(asrun), len(free)], "verdict": verdict, "decided": verdict != "balanced",
            # an undecided truth (its interval holds the 5% line) admits the verdicts either end gives
            "admits": sorted({verdict, classify(lo, 0.0)[0], classify(hi, 0.0)[0]}), "how": "measured"}


def judge(rows: list[dict]) -> dict:
    by_case = {c.name: [r for r in rows if r["case"] == c.name and "skipped" not in r] for c in CASES}
    cases, crashes, right, judged, same, repeated, overheads = [], [], 0, 0, 0, 0, []
    right_decided = judged_decided = 0
    input_bound, top_verified, within_25 = 0, 0, 0
    for case in CASES:
        runs = by_case[case.name]
        if not runs:
            continue
        t = truth(case, runs)
        verdicts = []
        for r in runs:
            p = r["profile"]
            if r["truth"].get("error") is None and p["exit"] != 0:
                crashes.append({"case": case.name, "repeat": r["repeat"], "exit": p["exit"],
                                "error": p.get("error")})
            if p.get("verdict"):
                verdicts.append(p["verdict"])
                if t["measured"]:
                    judged += 1
                    right += p["verdict"] in t.get("admits", [t["verdict"]])
                    if t.get("decided", True):
                        judged_decided += 1
                        right_decided += p["verdict"] == t["verdict"]
                if p["verdict"] == "input-bound":
                    input_bound += 1
                    fix = p.get("top_fix") or {}
                    if fix.get("verified"):
                        top_verified += 1
                        within_25 += abs(fix["predicted"] / fix["verified"] - 1) <= 0.25
                if t.get("verdict") == "compute-bound" and t.get("asrun_s") and p.get("per_step"):
                    # the median of the profile's measured steps against the truth's median as-run step
                    # (separate processes; medians, as for the truth: contention stalls of seconds hit
                    # either run at random here)
                    overheads.append(statistics.median(p["per_step"]["span_s"]) / t["asrun_s"] - 1)
        if len(verdicts) >= 2:
            repeated += 1
            same += len(set(verdicts)) == 1
        cases.append({"case": case.name, "truth": t, "verdicts": verdicts,
                      "data_shares": [r["profile"].get("data_share") for r in runs],
                      "exits": [r["profile"]["exit"] for r in runs]})
    return {
        "cases": cases,
        "verdicts_right": f"{right}/{judged}", "verdicts_right_fraction": right / judged if judged else None,
        "verdicts_right_decided_truths": f"{right_decided}/{judged_decided}",
        "crashes": len(crashes), "crash_list": crashes,
        "top_fix_verified_input_bound": f"{top_verified}/{input_bound}",
        "top_prediction_within_25pct": f"{within_25}/{top_verified}",
        "same_verdict_every_repeat": f"{same}/{repeated}", "same_verdict_fraction": same / repeated if repeated else None,
        "overhead_compute_bound_median": statistics.median(overheads) if overheads else None,
        "overhead_compute_bound": overheads,
    }


def _pct(v) -> str:
    return "-" if v is None else f"{v:.0%}"


def table(summary: dict) -> str:
    lines = ["| case | truth: median step as run / data free (ms) | true data share (95%) | expected | hasten verdicts | hasten data share | hasten exit |",
             "|---|---|---|---|---|---|---|"]
    for c in summary["cases"]:
        t = c["truth"]
        steps = (f"{t['asrun_s'] * 1e3:.1f} / {t['datafree_s'] * 1e3:.1f}" if t.get("datafree_s")
                 else f"{t['asrun_s'] * 1e3:.0f} / -" if t.get("asrun_s") else "-")
        expected = (t["verdict"] + ("" if t.get("decided") else f" (undecided: {' or '.join(t['admits'])})")
                    if t["measured"] else f"not measured ({t['why']})")
        share = _pct(t.get("data_share")) + (f" ({_pct(t['interval'][0])}-{_pct(t['interval'][1])})"
                                             if t.get("interval") and t.get("datafree_s") else "")
        lines.append(f"| {c['case']} | {steps} | {share} | {expected} | "
                     f"{', '.join(c['verdicts']) or '-'} | {', '.join(_pct(s) for s in c['data_shares'])} | "
                     f"{', '.join(map(str, c['exits']))} |")
    return "\n".join(lines)


def _hasten_commit() -> str:
    p = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "hasten"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    return p.stdout.strip() + ("+uncommitted hasten/ changes" if dirty else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs per case (the goal: the same verdict 3 of 3)")
    ap.add_argument("--verify", action="store_true", help="profile with --verify (re-runs with each fix applied)")
    ap.add_argument("--seed", type=int, default=0, help="seeds the order of the cases in each repeat")
    ap.add_argument("--only", default=None, help="run the cases whose name contains this")
    ap.add_argument("--fresh", action="store_true", help="forget the runs already in the results file")
    ap.add_argument("--out", type=Path, default=OUT,
                    help="the summary file, its runs beside it as NAME.runs.jsonl.gz (a check of one case "
                         "elsewhere leaves the benchmark's own alone)")
    args = ap.parse_args()
    out = args.out.resolve()
    result = ({"runs": []} if args.fresh else load_results(out)) or {"runs": []}
    done = {(r["case"], r["repeat"]) for r in result["runs"]}
    todo = [(rep, c) for rep, c in interleaved([c for c in CASES if args.only is None or args.only in c.name],
                                               args.repeats, args.seed) if (c.name, rep) not in done]
    t_start, n_done = time.perf_counter(), 0
    print(f"{len(todo)} runs to go ({len(done)} already in {out.name})", flush=True)
    with MeasuredConditions("cpu") as cond:
        for rep, case in todo:
            row = run_case(case, rep, args.verify)
            if "skipped" in row:
                print(f"{case.name}: skipped, {row['skipped']}", flush=True)
                continue
            row["hasten"] = _hasten_commit()
            row["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            result["runs"].append(row)
            result["summary"] = judge(result["runs"])
            result["runs_brief"] = [brief(r) for r in result["runs"]]
            write_results(out, result)
            n_done += 1
            elapsed = time.perf_counter() - t_start
            left = elapsed / n_done * (len(todo) - n_done)
            p, t = row["profile"], row["truth"]
            print(f"[{n_done}/{len(todo)}] {case.name} (repeat {rep}): as run "
                  f"{(t.get('asrun_s') or 0) * 1e3:.0f} ms, data free "
                  f"{(t.get('datafree_s') or 0) * 1e3:.0f} ms{' ' + t['error'][-150:] if t.get('error') else ''}; "
                  f"hasten exit {p['exit']}, "
                  f"{p.get('verdict') or p.get('error', '')[:200]} (data {_pct(p.get('data_share'))}); "
                  f"{elapsed / 60:.1f} min in, about {left / 60:.1f} min left", flush=True)
    result["conditions"] = cond.as_dict()
    # a resumed benchmark ran in several sessions: each one's conditions are kept
    result.setdefault("conditions_per_session", []).append(result["conditions"])
    result["hardware"] = hardware_label(result["conditions"]["environment"])
    result["cases"] = [{"case": c.name, "repo": c.source.name, "commit": c.source.commit, "licence": c.source.licence,
                        "script": c.script, "args": list(c.args), "variant": c.variant, "cwd": c.cwd,
                        "pythonpath": c.pythonpath, "taskset": c.taskset, "data": c.data, "data_fn": c.data_fn,
                        "stubs": list(c.stubs)}
                       for c in CASES]
    result["summary"] = judge(result["runs"])
    result["runs_brief"] = [brief(r) for r in result["runs"]]
    write_results(out, result)
    s = result["summary"]
    print(table(s))
    print(f"right verdicts {s['verdicts_right']} ({s['verdicts_right_decided_truths']} against decided truths), "
          f"crashes {s['crashes']}, same verdict every repeat "
          f"{s['same_verdict_every_repeat']}, overhead on compute-bound cases (median) "
          f"{_pct(s['overhead_compute_bound_median'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
