"""The tests that read a clock, checked two ways: beside busy processes, and against broken code.

Usage (from the repository root)::

    python scripts/timing_tests.py load --busy 4 --repeat 5   # every timing test, 5 times, beside 4 busy processes
    python scripts/timing_tests.py mutants                    # each hand-made mutant below: which test fails
    python scripts/timing_tests.py report                     # rewrite the page section from the stored results

A test that passes or fails with the machine's load is no evidence, so the tests of
`hasten profile`'s shares, verdicts and predictions build workloads whose truth is known by
construction (sleeps of tens of milliseconds, CPU work counted in CPU time). ``load`` shows
that they hold beside ``--busy`` processes that spin on the CPU; ``mutants`` shows that they
still fail when the code is wrong: each mutant breaks a verdict threshold, the share
arithmetic, the Amdahl bound or a measurement in a copy of the package, and the timing tests
run against it (``-x``: the first failing test is the one named). Results go to
``docs/results/timing_tests.json`` and a section of ``docs/results/mutation.md`` (which
``scripts/mutation.py`` keeps when it rewrites the rest of that page).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS_JSON = REPO / "docs" / "results" / "timing_tests.json"
REPORT_MD = REPO / "docs" / "results" / "mutation.md"
BEGIN, END = "<!-- timing-tests: begin -->", "<!-- timing-tests: end -->"

# The verdict's unit tests, run against a mutant only when the timing tests miss it: a share
# inside the dead band (3 to 7%) is too small to build end to end on a loaded machine.
UNIT_TESTS = ["tests/test_profile_verdict.py", "tests/test_profile_report.py"]

# Every test that decides on a clock reading of the machine it runs on.
TIMING_TESTS = [
    "tests/test_profile_loops.py",
    "tests/test_profile_shares.py",
    "tests/test_profile_fixes.py",  # verified speedups are re-runs timed
    "tests/test_profile_verify.py",  # --verify's speed-ups: re-runs of a command, timed
    "tests/test_profile_launcher.py",
    "tests/test_profile_profiler.py",
    "tests/test_commands_profile.py",
    "tests/test_profile_attach_check.py",  # a silent Python named within 10 s
    "tests/test_stream_echo_stage_autoecho.py",
    "tests/test_stream_slow_storage.py",
    "tests/test_distributed_algorithms.py::test_torus_groups_rows_columns_subgroups_and_errors",
]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # inside the repository
    old: str  # must occur exactly once
    new: str
    why: str  # what a user would get from it


VERDICT = "hasten/profile/verdict.py"
THRESHOLDS = "hasten/profile/thresholds.py"
BOUNDS = "hasten/profile/bounds.py"
RANKING = "hasten/profile/ranking.py"
ATTRIBUTION = "hasten/profile/attribution.py"
MUTANTS = [
    Mutant("input threshold x5", THRESHOLDS, "INPUT_MODERATE = 0.10", "INPUT_MODERATE = 0.5",
           "a step that waits 40% of the time for data called compute-bound or balanced"),
    Mutant("high-severity threshold", THRESHOLDS, "INPUT_HIGH = 0.20", "INPUT_HIGH = 0.90",
           "a step that waits 80% of the time rated moderate"),
    Mutant("communication threshold x10", THRESHOLDS, "COMM_MODERATE = 0.05", "COMM_MODERATE = 0.5",
           "exposed gradient exchange up to half the step not reported"),
    Mutant("verdict picks the smaller share", VERDICT, "input_wins = wait >= comm if",
           "input_wins = wait < comm if", "the wrong bottleneck named"),
    Mutant("dead band and interval ignored", VERDICT,
           "w_lo, w_hi = widened(wait, *(wait_interval or (wait, wait)), DEAD_BAND)", "w_lo, w_hi = wait, wait",
           "a step waiting 8 to 12% of the time, or with an interval across 10%, called input- or compute-bound"),
    Mutant("data share of the fastest rank's step", VERDICT,
           "step = max(s.step_s for s in sums)", "step = min(s.step_s for s in sums)",
           "shares of the wrong step time across ranks"),
    Mutant("data share halved", VERDICT, "wait = mean(s.data_s / s.step_s for s in sums)",
           "wait = mean(s.data_s / s.step_s / 2 for s in sums)", "the data wait under-reported by half"),
    Mutant("compute share ignores communication", VERDICT,
           "compute_fraction=max(0.0, 1.0 - wait - comm_frac - other)", "compute_fraction=max(0.0, 1.0 - wait - other)",
           "shares that add up to more than the step"),
    Mutant("communication share halved", VERDICT, "comm_frac = min(comm / step, max(0.0, 1.0 - wait - other))",
           "comm_frac = min(comm / step / 2, max(0.0, 1.0 - wait - other))", "exposed communication under-reported"),
    Mutant("the rest called data", ATTRIBUTION, '"data_s": wait * batch[0]', '"data_s": wait',
           "a sleep or checkpoint write between the step and the next forward called data (no DataLoader)"),
    Mutant("contended CPU not counted", ATTRIBUTION, "        return min(max(0.0, c - idle) / rate, observed)",
           "        return 0.0",
           "DataLoader workers that take the step's cores called compute-bound"),
    Mutant("R inverted", VERDICT, "upstream_ratio=produce / alone if", "upstream_ratio=alone / produce if",
           "upstream ratio R = consume / produce instead of produce / consume"),
    Mutant("Amdahl bound doubled", BOUNDS, "    return step / rest if rest > 1e-12 else math.inf",
           "    return 2 * step / rest if rest > 1e-12 else math.inf", "predictions allowed past what the wait allows"),
    Mutant("Amdahl bound of the whole step", BOUNDS, "    rest = step - removable\n",
           "    rest = step - removable / 4\n", "the most a data fix can give understated"),
    Mutant("every prediction unbounded", RANKING, "        rec.predicted_speedup = min(rec.predicted_speedup, rec.bound)\n",
           "        rec.predicted_speedup = rec.predicted_speedup * 1.5\n", "a fix predicted beyond what the measured shares allow"),
]


def _pytest(args: list[str], cwd: Path, env: dict | None = None, timeout: float = 1800) -> tuple[int, str, float]:
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header",
                            "-o", "addopts=", *args], cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=timeout)
        code, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as exc:
        code, out = 124, f"timed out after {timeout} s\n{exc.stdout or ''}"
    return code, out, time.perf_counter() - t0


def _summary_line(out: str) -> str:
    lines = [ln for ln in out.splitlines() if re.search(r"\d+ (passed|failed|error)", ln)]
    return lines[-1].strip("= ") if lines else out.strip().splitlines()[-1] if out.strip() else ""


def _conditions() -> dict:
    return {"python": platform.python_version(), "cpus": os.cpu_count(), "machine": platform.machine(),
            "load_average_1m": round(os.getloadavg()[0], 2), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def _store(key: str, value) -> dict:
    results = json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.exists() else {}
    results[key] = value
    RESULTS_JSON.write_text(json.dumps(results, indent=1) + "\n")
    return results


def run_load(busy: int, repeat: int) -> dict:
    """Every timing test ``repeat`` times while ``busy`` processes spin on the CPU."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    runs = []
    try:
        time.sleep(1.0)
        for i in range(repeat):
            before = os.getloadavg()[0]
            code, out, took = _pytest(TIMING_TESTS, REPO)
            # The 1-minute average trails the spinners by a minute: the figure after the run is the one to read.
            runs.append({"run": i + 1, "exit_code": code, "summary": _summary_line(out), "seconds": round(took, 1),
                         "load_average_1m_before": round(before, 2), "load_average_1m_after": round(os.getloadavg()[0], 2)})
            print(f"load run {i + 1}/{repeat}: {runs[-1]['summary']} in {took:.0f} s "
                  f"(load {before:.1f}; about {(repeat - i - 1) * took / 60:.0f} min left)", flush=True)
            if code != 0:
                print(out[-4000:], flush=True)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    return {"busy": busy, "repeat": repeat, "runs": runs, "all_passed": all(r["exit_code"] == 0 for r in runs),
            "conditions": _conditions()}


def _first_failure(out: str) -> str | None:
    m = re.search(r"^FAILED (\S+)", out, re.M) or re.search(r"^ERROR (\S+)", out, re.M)
    return m[1] if m else None


def run_mutants(names: list[str] | None) -> dict:
    """Apply each mutant to a scratch copy of the package and run the timing tests against it."""
    chosen = [m for m in MUTANTS if not names or m.name in names]
    rows = []
    with tempfile.TemporaryDirectory(prefix="hasten-mutants-") as tmp:
        for i, m in enumerate(chosen):
            work = Path(tmp) / f"m{i}"
            for part in ("hasten", "tests"):
                shutil.copytree(REPO / part, work / part, ignore=shutil.ignore_patterns("__pycache__"))
            shutil.copy(REPO / "pyproject.toml", work / "pyproject.toml")
            src = work / m.path
            text = src.read_text()
            if text.count(m.old) != 1:
                raise SystemExit(f"timing_tests: mutant {m.name!r}: {m.old!r} occurs {text.count(m.old)} times "
                                 f"in {m.path} (the code moved: update the mutant)")
            src.write_text(text.replace(m.old, m.new))
            # The copy first on the path, for this process and every process a test starts.
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(work), os.environ.get("PYTHONPATH", "")])}
            where = subprocess.run([sys.executable, "-c", "import hasten; print(hasten.__file__)"], cwd=work,
                                   env=env, capture_output=True, text=True).stdout.strip()
            if not where.startswith(str(work)):
                raise SystemExit(f"timing_tests: the mutant copy is not what Python imports ({where})")
            code, out, took = _pytest(["-x", *TIMING_TESTS], work, env=env)
            caught, by = _first_failure(out), "timing"
            if caught is None:
                code, out, more = _pytest(["-x", *UNIT_TESTS], work, env=env)
                caught, by, took = _first_failure(out), "unit", took + more
            rows.append({"mutant": m.name, "file": m.path, "old": m.old.strip(), "new": m.new.strip(), "why": m.why,
                         "caught_by": caught, "caught_by_kind": by if caught else None, "exit_code": code,
                         "seconds": round(took, 1)})
            print(f"[{i + 1}/{len(chosen)}] {m.name}: {'caught by ' + caught if caught else 'NOT CAUGHT'} "
                  f"({took:.0f} s)", flush=True)
            shutil.rmtree(work)
            _store("mutants", _mutant_summary(_merged(rows)))  # each as it finishes: a stopped run keeps them
    return _mutant_summary(_merged(rows))


def _merged(rows: list[dict]) -> list[dict]:
    """The stored rows of mutants not rerun, with these, in MUTANTS order."""
    stored = json.loads(RESULTS_JSON.read_text()).get("mutants", {}).get("mutants", []) if RESULTS_JSON.exists() else []
    by_name = {r["mutant"]: r for r in stored} | {r["mutant"]: r for r in rows}
    return [by_name[m.name] for m in MUTANTS if m.name in by_name]


def _mutant_summary(rows: list[dict]) -> dict:
    return {"mutants": rows, "caught": sum(r["caught_by"] is not None for r in rows), "of": len(rows),
            "conditions": _conditions()}


def section(results: dict) -> str:
    """The page section: the load runs and the mutant table."""
    out = [BEGIN, "## The timing tests: beside busy processes, and against broken code", "",
           "The tests that read a clock (" + ", ".join(f"`{t}`" for t in TIMING_TESTS) + ") build workloads "
           "whose truth is known by construction. Command: `python scripts/timing_tests.py load --busy 4 "
           "--repeat 5` and `python scripts/timing_tests.py mutants`.", ""]
    load = results.get("load")
    if load:
        c = load["conditions"]
        out += [f"Beside {load['busy']} busy processes ({c['cpus']} cores, Python {c['python']}, {c['date']}): "
                f"{sum(r['exit_code'] == 0 for r in load['runs'])} of {len(load['runs'])} runs passed.", "",
                "| run | result | seconds | load (1 min) before | after |", "|---|---|---|---|---|"]
        out += [f"| {r['run']} | {r['summary']} | {r['seconds']} | {r['load_average_1m_before']} | "
                f"{r.get('load_average_1m_after', '-')} |" for r in load["runs"]]
        out.append("")
    mut = results.get("mutants")
    if mut:
        out += [f"Hand-made mutants of the verdict code: {mut['caught']} of {mut['of']} caught "
                f"({mut['conditions']['date']}); the first failing test is named. Each runs against the "
                "timing tests first and, only if they all pass, against the verdict's unit tests "
                "(" + ", ".join(f"`{t}`" for t in UNIT_TESTS) + "; marked *unit*).", "",
                "| mutant | change | what a user would get | caught by |", "|---|---|---|---|"]
        why = {m.name: m.why for m in MUTANTS}  # the words are the code's; the results are the run's
        for r in mut["mutants"]:
            change = f"`{r['old']}` -> `{r['new']}`".replace("|", "\\|")
            unit = " (*unit*)" if r.get("caught_by_kind") == "unit" else ""
            out.append(f"| {r['mutant']} | {change} | {why.get(r['mutant'], r['why'])} | "
                       f"{'`' + r['caught_by'] + '`' + unit if r['caught_by'] else '**not caught**'} |")
        out.append("")
    out.append(END)
    return "\n".join(out)


def write_section(results: dict) -> None:
    text = REPORT_MD.read_text() if REPORT_MD.exists() else "# Mutation testing\n"
    block = section(results)
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + block + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    REPORT_MD.write_text(text)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="scripts/timing_tests.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    load = sub.add_parser("load", help="run the timing tests beside busy processes")
    load.add_argument("--busy", type=int, default=4, help="processes spinning on the CPU (default 4)")
    load.add_argument("--repeat", type=int, default=5, help="runs of the timing tests (default 5)")
    mut = sub.add_parser("mutants", help="run the timing tests against each hand-made mutant")
    mut.add_argument("--only", action="append", help="a mutant's name (repeatable); default all")
    sub.add_parser("report", help="rewrite the page section from the stored results")
    args = ap.parse_args(argv)
    if args.cmd == "load":
        if args.busy < 0 or args.repeat < 1:
            ap.error("--busy must be >= 0 and --repeat >= 1")
        results = _store("load", run_load(args.busy, args.repeat))
    elif args.cmd == "mutants":
        unknown = set(args.only or ()) - {m.name for m in MUTANTS}
        if unknown:
            ap.error(f"unknown mutant(s): {', '.join(sorted(unknown))}")
        results = _store("mutants", run_mutants(args.only))
    else:
        results = json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.exists() else {}
    write_section(results)
    print(f"wrote {RESULTS_JSON.relative_to(REPO)} and the section of {REPORT_MD.relative_to(REPO)}")


if __name__ == "__main__":
    main()
