"""Mutation testing of the modules where a silent bug changes hasten's results.

Usage (from the repository root, with the ``mutation`` extra installed)::

    pip install -e ".[mutation]"
    python scripts/mutation.py                      # every module in MODULES
    python scripts/mutation.py --module optim.lars  # one module (repeat --module for more)
    python scripts/mutation.py --report-only        # rewrite the report from the stored results

Tool: mutmut 3 (https://github.com/boxed/mutmut). For each module the script
makes a scratch copy of the package and the tests in ``.mutation/<module>/``,
writes mutmut's ``[tool.mutmut]`` config there (only that one file is mutated,
only the test files mapped to it below are run, ``-x -q -p no:cacheprovider``),
runs ``mutmut run`` and reads back every mutant's status and diff. Results are
merged into ``docs/results/mutation.json`` and ``docs/results/mutation.md`` is
regenerated from it (modules not rerun keep their last results and dates).

Two things mutmut 3 would otherwise get wrong here, handled in the scratch copy only:

* mutmut skips every decorated function (``@torch.no_grad()``, ``@contextmanager``),
  and those include ``WeightAverage.update``, ``tta.evaluate``, ``Lars.step`` and
  ``AutoEcho.paused``. The copy rewrites ``@dec`` above a ``def f`` as the equivalent
  ``f = dec(f)`` after it, so these functions are mutated like any other.
* mutmut runs, for each mutant, only the tests that called the mutated function in
  its own process. The all-reduce tests call ring and torus inside forked ranks, so
  for modules marked ``in_subprocesses`` every mutant gets every mapped test.

A mutant counts as equivalent (left out of the score) only when a person judged it so
in ``scripts/mutation_equivalent.toml``, with a reason; a judgement whose mutated line
no longer matches the mutant is reported as stale and not applied.
"""

from __future__ import annotations

import argparse
import ast
import datetime as _dt
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / ".mutation"
RESULTS_JSON = REPO / "docs" / "results" / "mutation.json"
REPORT_MD = REPO / "docs" / "results" / "mutation.md"
EQUIVALENT_TOML = REPO / "scripts" / "mutation_equivalent.toml"
MUTMUT_VERSION = "3.8.1"  # the version this driver was written against (pinned in the extra)
GOAL = 0.80  # share of non-equivalent mutants the tests must kill, per module


@dataclass(frozen=True)
class Target:
    """One module to mutate and the fast test files that exercise it."""
    source: str
    tests: tuple[str, ...]
    in_subprocesses: bool = False  # the tests run this module's code in forked ranks
    deselect: str = "not slow and not gpu"  # pytest -m expression applied to every run
    keyword: str | None = None  # pytest -k expression applied to every run


# module -> the test files that cover it (paths relative to the repository root; a
# "file.py::test" node id is allowed). Keep this to fast tests: every surviving
# mutant runs all the tests mapped here.
SPEEDRUN_TESTS = ("tests/test_recipes_speedrun.py", "tests/test_recipes_speedrun_timing.py")
SPEEDRUN_TIMING = SPEEDRUN_TESTS[1]
MODULES: dict[str, Target] = {
    "nn.tta": Target("hasten/nn/tta.py", ("tests/test_nn_tta.py",)),
    "data.device_augment": Target("hasten/data/device_augment.py", (
        "tests/test_data_device_augment.py", "tests/test_data_device_loader.py",
        "tests/test_data_host_loader.py")),
    "data.host_augment": Target("hasten/data/host_augment.py", (
        "tests/test_data_host_augment.py",
        "tests/test_stream_echo_stage.py::test_stream_augmentation_is_a_reference_crop_flip_covering_pad_4")),
    "nn.whitening": Target("hasten/nn/whitening.py", ("tests/test_nn_whitening.py",)),
    "nn.ema": Target("hasten/nn/ema.py", (
        "tests/test_nn_ema.py",
        f"{SPEEDRUN_TIMING}::test_lookahead_decays_on_schedule_and_copies_back_at_the_end",
        f"{SPEEDRUN_TIMING}::test_ema_is_evaluated_on_a_copy_and_leaves_the_live_model_alone")),
    # The whole file but its real-data run (which skips in the scratch copy anyway).
    "recipes.speedrun": Target("hasten/recipes/speedrun.py", SPEEDRUN_TESTS, keyword="not cifar_subset"),
    "recipes.speedrun_train": Target("hasten/recipes/speedrun_train.py", SPEEDRUN_TESTS, keyword="not cifar_subset"),
    "recipes.speedrun_cost": Target("hasten/recipes/speedrun_cost.py", SPEEDRUN_TESTS, keyword="not cifar_subset"),
    "recipes.loop": Target("hasten/recipes/loop.py", ("tests/test_recipes_loop.py",)),
    "optim.schedules": Target("hasten/optim/schedules.py", ("tests/test_optim_schedules.py",)),
    "echo.stages": Target("hasten/echo/stages.py", ("tests/test_echo_stages.py",)),
    "echo.auto": Target("hasten/echo/auto.py", ("tests/test_echo_auto.py", "tests/test_echo_auto_rules.py")),
    # 2-5 ranks cover odd and even rings and fewer elements than ranks; 6 and 8 ranks add
    # little for the ring and cost more than the rest together. The torus keeps 6 (2x3, 3x2).
    "distributed.ring": Target("hasten/distributed/ring.py", (
        *(f"tests/test_distributed_algorithms.py::test_algorithms_equal_backend_all_reduce[{n}]"
          for n in (2, 3, 4, 5)),
        "tests/test_distributed_algorithms.py::test_nccl_code_paths_over_gloo",
        "tests/test_distributed_algorithms.py::test_ring_names_the_step_a_peer_failed_in",
        "tests/test_distributed_algorithms.py::test_torus_groups_rows_columns_subgroups_and_errors",
        "tests/test_distributed_algorithms.py::test_without_process_group_is_a_clear_error",
    ), in_subprocesses=True),
    "distributed.torus": Target("hasten/distributed/torus.py", (
        *(f"tests/test_distributed_algorithms.py::test_algorithms_equal_backend_all_reduce[{n}]"
          for n in (2, 4, 6)),
        "tests/test_distributed_algorithms.py::test_nccl_code_paths_over_gloo",
        "tests/test_distributed_algorithms.py::test_torus_groups_rows_columns_subgroups_and_errors",
        "tests/test_distributed_algorithms.py::test_torus_after_a_new_process_group_makes_new_rows_and_columns",
        "tests/test_distributed_algorithms.py::test_grid_parsing_and_validation",
    ), in_subprocesses=True),
    "optim.lars": Target("hasten/optim/lars.py", ("tests/test_optim_lars.py",)),
}

# mutmut's statuses, grouped for the report. A timeout counts as killed: the mutant
# made the tests run past mutmut's limit (a hang or a runaway loop), which a user notices.
KILLED, TIMEOUT, SURVIVED, NO_TESTS = "killed", "timeout", "survived", "no tests"
EQUIVALENT = "equivalent"
NOT_CHECKED = "not checked"


def load_toml(path: Path) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    with open(path, "rb") as f:
        return tomllib.load(f)


def load_equivalents(path: Path = EQUIVALENT_TOML) -> dict[str, dict]:
    """``{mutant name: {"changed": mutated line, "reason": why}}`` from the human judgements."""
    data = load_toml(path)
    out = {}
    for entry in data.get("mutant", []):
        missing = {"name", "changed", "reason"} - set(entry)
        if missing:
            raise ValueError(f"{path.name}: entry {entry} lacks {sorted(missing)}")
        if not entry["reason"].strip():
            raise ValueError(f"{path.name}: {entry['name']} has an empty reason")
        if entry["name"] in out:
            raise ValueError(f"{path.name}: {entry['name']} is listed twice")
        out[entry["name"]] = {"changed": entry["changed"], "reason": entry["reason"].strip()}
    return out


def mutated_lines(diff: str) -> list[str]:
    """The '+' lines of a mutant's unified diff (without the marker)."""
    return [ln[1:] for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]


# ---------------------------------------------------------------- scratch copy

_MOVABLE_DECORATOR = re.compile(r"^@(torch\.no_grad\(\)|torch\.inference_mode\(\)|contextmanager|"
                                r"contextlib\.contextmanager)$")


def undecorate(source: str) -> str:
    """Rewrite ``@dec`` / ``def f`` as ``def f`` / ``f = dec(f)`` for the decorators above.

    Same behaviour, but mutmut 3 mutates undecorated functions only.
    """
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits = []  # (decorator line index, line index after the function, indent, name, decorator)
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or len(node.decorator_list) != 1:
            continue
        dec = node.decorator_list[0]
        text = "@" + ast.get_source_segment(source, dec)
        if not _MOVABLE_DECORATOR.match(text):
            continue
        indent = " " * node.col_offset
        edits.append((dec.lineno - 1, node.end_lineno, indent, node.name, text[1:]))
    for dec_line, end, indent, name, dec in sorted(edits, reverse=True):
        lines.insert(end, f"{indent}{name} = {dec}({name})\n")
        assert lines[dec_line].strip() == "@" + dec
        del lines[dec_line]
    return "".join(lines)


def prepare_workspace(name: str, target: Target) -> Path:
    ws = WORK / name
    if ws.exists():
        shutil.rmtree(ws)
    ws.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "hasten", ws / "hasten", ignore=ignore)
    shutil.copytree(REPO / "tests", ws / "tests", ignore=ignore)
    src = ws / target.source
    src.write_text(undecorate(src.read_text()))
    config = {
        "source_paths": ["hasten"],
        "only_mutate": [target.source],
        "pytest_add_cli_args_test_selection": list(target.tests),
        "pytest_add_cli_args": ["-p", "no:cacheprovider", "-m", target.deselect,
                                *(["-k", target.keyword] if target.keyword else [])],
        "use_git_change_detection": False,
        # mutmut's wall-clock limit per mutant is (test time + constant) * multiplier. Its
        # defaults (1 s, x15) turn a fast test that waits for a busy CPU into a "timeout";
        # these leave room for a shared machine and still end a real hang.
        "timeout_constant": 20.0,
        "timeout_multiplier": 10.0,
    }
    lines = ["", "[tool.mutmut]"] + [f"{k} = {json.dumps(v)}" for k, v in config.items()]
    (ws / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text() + "\n".join(lines) + "\n")
    return ws


# ---------------------------------------------------------------- inside the scratch copy

def drive(settings: dict) -> None:
    """Run mutmut in the current directory (a scratch copy) and write result.json."""
    import torch

    # mutmut forks every mutant from a process that has already run the tests. A child forked
    # after torch's OpenMP pool has started can block forever in its next parallel region,
    # which mutmut would then count as a "timeout" (a kill). One thread, kept at one (the
    # tests' conftest asks for two), leaves no pool to inherit.
    torch.set_num_threads(1)
    torch.set_num_threads = lambda n: None
    import mutmut.__main__ as mm
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.runners.harness import PytestRunner
    from mutmut.state import state
    from mutmut.stats import status_by_exit_code
    from mutmut.utils.file_utils import walk_mutatable_files
    from mutmut.utils.format_utils import mangled_name_from_mutant_name

    regular_args = PytestRunner._pytest_args_regular_run

    def fastest_first(self, tests):
        # With -x the first failing test ends the run: try the quick ones first.
        durations = state().duration_by_test
        return regular_args(self, sorted(tests, key=lambda t: (durations.get(t, 0.0), t)))

    PytestRunner._pytest_args_regular_run = fastest_first

    if settings["in_subprocesses"]:
        original = mm.collect_or_load_stats

        def collect_then_widen(runner, **kwargs):
            original(runner, **kwargs)
            # Calls made inside forked ranks never reach mutmut's in-process stats.
            everything = runner.list_all_tests().ids
            for path in walk_mutatable_files():
                data = SourceFileMutationData(path=path)
                data.load()
                for key in data.exit_code_by_key:
                    state().tests_by_mangled_function_name[mangled_name_from_mutant_name(key)] |= everything

        mm.collect_or_load_stats = collect_then_widen

    start = time.monotonic()
    if settings.get("harvest"):  # read what a stopped run left behind, run nothing
        export(elapsed=None)
        return
    try:
        mm.cli.main(["run", "--max-children", str(settings["jobs"])], standalone_mode=False)
    except SystemExit as exc:
        if exc.code:
            raise
    # A timeout counts as killed, so make sure it was the mutant and not a busy machine:
    # run every timed-out mutant once more, on its own.
    timed_out = [key for path in walk_mutatable_files() for key, code in _exit_codes(path).items()
                 if status_by_exit_code[code] == "timeout"]
    if timed_out:
        print(f"[mutation] rerunning {len(timed_out)} timed-out mutants", flush=True)
        try:
            mm.cli.main(["run", "--max-children", "1", *timed_out], standalone_mode=False)
        except SystemExit as exc:
            if exc.code:
                raise
    export(elapsed=time.monotonic() - start)


def export(elapsed) -> None:
    """Write result.json: every mutant's status and diff (``elapsed`` None: a stopped run)."""
    import mutmut
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code
    from mutmut.utils.file_utils import walk_mutatable_files

    mutants = {}
    for path in walk_mutatable_files():
        for key, code in sorted(_exit_codes(path).items()):
            mutants[key] = {"status": status_by_exit_code[code], "diff": get_diff_for_mutant(key, path=path)}
    Path("result.json").write_text(json.dumps(
        {"mutmut": mutmut.__version__, "elapsed_s": None if elapsed is None else round(elapsed),
         "partial": elapsed is None, "mutants": mutants}, indent=1))


def _exit_codes(path) -> dict:
    from mutmut.mutation.data import SourceFileMutationData

    data = SourceFileMutationData(path=path)
    data.load()
    return data.exit_code_by_key


# ---------------------------------------------------------------- report

@dataclass
class Summary:
    counts: dict[str, int] = field(default_factory=dict)
    survivors: list[tuple[str, str, str]] = field(default_factory=list)  # name, status, diff
    equivalents: list[tuple[str, str, str]] = field(default_factory=list)  # name, reason, diff
    stale: list[str] = field(default_factory=list)
    unchecked: int = 0

    @property
    def scored(self) -> int:
        return sum(v for k, v in self.counts.items() if k != EQUIVALENT)

    @property
    def detected(self) -> int:
        return self.counts.get(KILLED, 0) + self.counts.get(TIMEOUT, 0)

    @property
    def score(self) -> float:
        return self.detected / self.scored if self.scored else float("nan")


def summarise(mutants: dict, equivalents: dict) -> Summary:
    s = Summary()
    for name, m in sorted(mutants.items(), key=lambda kv: _natural(kv[0])):
        status = m["status"]
        if status == NOT_CHECKED:  # a stopped run: this mutant was never tried
            s.unchecked += 1
            continue
        judged = equivalents.get(name)
        if status in (SURVIVED, NO_TESTS) and judged is not None:
            if judged["changed"].strip() in [ln.strip() for ln in mutated_lines(m["diff"])]:
                status = EQUIVALENT
                s.equivalents.append((name, judged["reason"], m["diff"]))
            else:
                s.stale.append(name)
        s.counts[status] = s.counts.get(status, 0) + 1
        if status not in (KILLED, TIMEOUT, EQUIVALENT):
            s.survivors.append((name, status, m["diff"]))
    return s


def _natural(name: str):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _short_diff(diff: str) -> str:
    """The diff without its file header: the mutated function's changed lines and a little context."""
    return "\n".join(ln for ln in diff.splitlines() if not ln.startswith(("---", "+++")))


def survivors_markdown(name: str, s: Summary) -> str:
    out = [f"### {name}: {len(s.survivors)} not killed", ""]
    for mutant, status, diff in s.survivors:
        out += [f"`{mutant}` ({status})", "", "```diff", _short_diff(diff), "```", ""]
    return "\n".join(out)


def write_report(results: dict, equivalents: dict) -> None:
    rows, details = [], []
    missed = []
    for name in MODULES:
        r = results.get(name)
        if r is None:
            rows.append(f"| {name} | not run yet | | | | | | | |")
            continue
        s = summarise(r["mutants"], equivalents)
        c = s.counts
        other = sum(v for k, v in c.items() if k not in (KILLED, TIMEOUT, SURVIVED, NO_TESTS, EQUIVALENT))
        ok = s.score >= GOAL
        if not ok:
            missed.append(f"{name} ({100 * s.score:.0f}%)")
        partial = f" (run stopped: {s.unchecked} more not tried)" if s.unchecked else ""
        rows.append(f"| {name} | {sum(c.values())}{partial} | {c.get(KILLED, 0)} | {c.get(TIMEOUT, 0)} | "
                    f"{c.get(SURVIVED, 0)} | {c.get(NO_TESTS, 0) + other} | {c.get(EQUIVALENT, 0)} | "
                    f"**{100 * s.score:.1f}%**{'' if ok else ' (below 80%)'} | {r['date']} |")
        details.append(survivors_markdown(name, s) if s.survivors else f"### {name}: every mutant killed\n")
        if s.equivalents:
            details.append(f"Judged equivalent ({len(s.equivalents)}):\n")
            for mutant, reason, diff in s.equivalents:
                plus = "; ".join(ln.strip() for ln in mutated_lines(diff))
                details.append(f"- `{mutant}`: `{plus}`: {reason}")
            details.append("")
        if s.stale:
            details.append("Stale equivalence judgements (the mutant no longer matches; not applied): "
                           + ", ".join(f"`{m}`" for m in s.stale) + "\n")
    tests = "\n".join(f"| {n} | `{t.source}` | {', '.join(f'`{x}`' for x in t.tests)}"
                      f"{f' (-k `{t.keyword}`)' if t.keyword else ''} |" for n, t in MODULES.items())
    versions = sorted({(r["mutmut"], r["python"], r["torch"]) for r in results.values()})
    text = f"""# Mutation testing

Each mutant is a small change to one module (an operator, a constant, a
comparison, a dropped argument); a mutant is *killed* when at least one of the
module's tests fails with it. A surviving mutant is a change to the algorithm
that the tests do not notice. Goal: at least 80% of the non-equivalent mutants
killed in each module.

Command (rewrites this page; `--module NAME` reruns one module, the others keep their results):

    pip install -e ".[mutation]"
    nice -n 19 python scripts/mutation.py

Tool: mutmut {', '.join(sorted({v[0] for v in versions})) or MUTMUT_VERSION} (Python {', '.join(sorted({v[1] for v in versions}))},
torch {', '.join(sorted({v[2] for v in versions}))}). The script, `scripts/mutation.py`, explains its
adjustments: decorated functions (`@torch.no_grad()`, `@contextmanager`) are
mutated too; the all-reduce modules, whose code runs in forked ranks, get every
mapped test per mutant; torch runs on one thread (a mutant forked after torch's
thread pool started could hang and pass for a kill); every timed-out mutant is
run once more on its own. Score = (killed + timeout) / (all mutants -
equivalent); "no tests" (a mutant in code no mapped test runs) counts against
the score. A row marked "run stopped" is a run cut short: its score covers the
mutants it tried. Equivalent mutants are only those judged so by hand in
`scripts/mutation_equivalent.toml`, each with its reason (listed below).

| module | mutants | killed | timeout | survived | no tests / other | equivalent | killed % | run on |
|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

{"Below the goal: " + ", ".join(missed) + "." if missed else "Every module that has run meets the goal."}
{"Not run yet: " + ", ".join(n for n in MODULES if n not in results) + "." if set(MODULES) - set(results) else ""}

Tests run per module (`-x -q -p no:cacheprovider -m "not slow and not gpu"`):

| module | source | tests |
|---|---|---|
{tests}

## Surviving mutants

{chr(10).join(details)}
"""
    # scripts/timing_tests.py owns a section of this page: keep it.
    if REPORT_MD.exists():
        from timing_tests import BEGIN, END
        before = REPORT_MD.read_text()
        if BEGIN in before and END in before:
            text = text.rstrip("\n") + "\n\n" + before[before.index(BEGIN):before.index(END) + len(END)] + "\n"
    REPORT_MD.write_text(text)


# ---------------------------------------------------------------- main

def run_module(name: str, jobs: int, harvest: bool = False) -> dict:
    target = MODULES[name]
    ws = WORK / name if harvest else prepare_workspace(name, target)
    if harvest and not (ws / "mutants").is_dir():
        raise SystemExit(f"nothing to harvest for {name}: {ws.relative_to(REPO)} holds no mutmut run")
    settings = {"in_subprocesses": target.in_subprocesses, "jobs": jobs, "harvest": harvest}
    # A mutant that deadlocks the ring fails after 20 s instead of the tests' usual 60 s.
    env = dict(os.environ, HASTEN_PROGRESS="0", HASTEN_TEST_COLLECTIVE_TIMEOUT_S="20",
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)  # the tests must import the mutated copy, nothing else
    log = ws / "mutmut.log"
    print(f"[mutation] {name}: mutmut in {ws.relative_to(REPO)} (output in {log.relative_to(REPO)})",
          flush=True)
    with open(log, "a" if harvest else "w") as out:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "_drive",
                               json.dumps(settings)], cwd=ws, env=env, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"{tail}\nmutmut failed on {name} (exit {proc.returncode}); log: {log}")
    result = json.loads((ws / "result.json").read_text())
    import torch

    result.update(date=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                  python=platform.python_version(), torch=torch.__version__.split("+")[0],
                  source=target.source, tests=list(target.tests), jobs=jobs)
    return result


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_drive"]:
        drive(json.loads(argv[1]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", action="append", choices=sorted(MODULES),
                        help="module to mutate (repeatable; default: all)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="mutants tested in parallel (default 1: the tests use the cores themselves)")
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite the report from docs/results/mutation.json without running")
    parser.add_argument("--harvest", action="store_true",
                        help="record what a stopped run of --module left in .mutation/ (marked partial)")
    parser.add_argument("--survivors-dir", type=Path,
                        help="also write <dir>/mutants-<module>.md for each module below the goal")
    args = parser.parse_args(argv)
    equivalents = load_equivalents()
    results = json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.exists() else {}
    if not args.report_only:
        try:
            import mutmut
        except ImportError:
            raise SystemExit('mutmut is not installed: pip install -e ".[mutation]"') from None
        if mutmut.__version__ != MUTMUT_VERSION:
            print(f"[mutation] warning: written for mutmut {MUTMUT_VERSION}, found {mutmut.__version__}")
        for name in args.module or list(MODULES):
            results = store_result(name, run_module(name, args.jobs, args.harvest))
            s = summarise(results[name]["mutants"], equivalents)
            print(f"[mutation] {name}: {s.detected}/{s.scored} killed ({100 * s.score:.1f}%), "
                  f"{s.counts}", flush=True)
    results = json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.exists() else {}  # with other runs'
    write_report(results, equivalents)
    if args.survivors_dir:
        args.survivors_dir.mkdir(parents=True, exist_ok=True)
        for name, r in results.items():
            s = summarise(r["mutants"], equivalents)
            if s.score < GOAL:
                (args.survivors_dir / f"mutants-{name}.md").write_text(survivors_markdown(name, s))
    print(f"[mutation] wrote {REPORT_MD.relative_to(REPO)}")


def store_result(name: str, result: dict) -> dict:
    """Merge one module's result into the JSON file (other runs may be updating other modules)."""
    import fcntl

    # Diffs are kept only where the report needs them: mutants that were not killed.
    result = dict(result, mutants={k: (m if m["status"] not in (KILLED, TIMEOUT)
                                       else {"status": m["status"], "diff": ""})
                                   for k, m in result["mutants"].items()})
    WORK.mkdir(exist_ok=True)
    with open(WORK / "results.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        results = json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.exists() else {}
        results[name] = result
        RESULTS_JSON.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    return results


if __name__ == "__main__":
    main()
