"""What a user waits for: whole ``hasten speedrun`` commands, first run included.

    python benchmarks/speedrun_command.py --data ../shared/data/cifar10-jpeg.tar.xz --repeats 3
    python benchmarks/speedrun_command.py --configs cpu,cpu-first5000 --repeats 3

Each run is a fresh process, ``hasten speedrun --data DATA --json ...`` with an empty
decode cache, so its wall time is the user's wait from the command to its last line:
import, decoding the archive, warm-up, training, per-epoch output and the final
evaluation. Beside it: the timed part the speedrun itself reports (airbench's
rules), the CPU seconds of the process and its decode workers, and the TTA accuracy.

Configurations (``--configs``), all through the same command and code path:

- ``cpu``: the ``cpu`` preset as it is now;
- ``cpu-first5000``: the same, its whitening layer set from the first 5,000
  training images as airbench does (hasten before the fix: of a class-ordered
  archive such as CIFAR-10-JPEG that is one class);
- ``cpu-0.1``: hasten 0.1's ``cpu`` preset (8 epochs of batch 512, first-5,000
  whitening; ``hasten.recipes.speedrun.CPU_0_1``).

The configurations run interleaved, in a fresh shuffled order per repeat
(``hasten.timing.interleaved``), repeat i with seed i for all of them. Every
finished run is written to the JSON at once and skipped on a rerun (resume);
a progress line gives the time left. Reports mean and 95% confidence interval
(Student t) per configuration and the paired accuracy difference per seed.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hasten.rundir import write_json
from hasten.timing import interleaved

from _common import RESULTS, MeasuredConditions, add_data_argument, mean, mean_ci, paired_differences, require_data

CONFIGS = {  # name -> changes to the cpu preset (applied in the child, see child_main)
    "cpu": {},
    "cpu-first5000": {"whiten_sample": "first"},
    "cpu-0.1": "CPU_0_1",
}


def child_main(config: str, argv: list[str]) -> int:
    """The speedrun command itself, with the ``cpu`` preset changed as ``config`` says."""
    from hasten.cli import main
    from hasten.recipes import speedrun

    changes = CONFIGS[config]
    speedrun.PRESETS["cpu"] = (getattr(speedrun, changes) if isinstance(changes, str)
                               else speedrun.PRESETS["cpu"].replace(**changes))
    return main(["speedrun", "--preset", "cpu", *argv])


def run_one(config: str, seed: int, data: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="hasten-speedrun-bench-") as tmp:
        out = Path(tmp) / "summary.json"
        env = dict(os.environ, HASTEN_CACHE=str(Path(tmp) / "cache"), HASTEN_RUNS=str(Path(tmp) / "runs"),
                   HASTEN_PROGRESS="0")
        cmd = [sys.executable, __file__, "--child", config, "--", "--data", data, "--seed", str(seed),
               "--json", str(out)]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise SystemExit(f"{config} seed {seed} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
        summary = json.loads(out.read_text())
    run = summary["runs"][0]
    return {"config": config, "seed": seed, "wall_s": wall,
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "timed_s": run["time_s"], "tta_accuracy": run["tta_accuracy"], "accuracy": run["accuracy"],
            "first_output_line": proc.stdout.splitlines()[0] if proc.stdout else ""}


def summarize(runs: list[dict], configs: list[str]) -> dict:
    rows = {}
    for c in configs:
        mine = [r for r in runs if r["config"] == c]
        if mine:
            rows[c] = {k: mean_ci([r[k] for r in mine]) for k in ("wall_s", "timed_s", "cpu_s", "tta_accuracy")}
    paired = {}
    base = {r["seed"]: r["tta_accuracy"] for r in runs if r["config"] == "cpu"}
    for c in (c for c in configs if c != "cpu"):
        diffs = paired_differences(base, {r["seed"]: r["tta_accuracy"] for r in runs if r["config"] == c})
        if diffs:
            paired[f"cpu minus {c}"] = mean_ci(diffs)
    return {"configs": rows, "paired_tta_accuracy": paired}


@contextlib.contextmanager
def exclusive(path: Path | None):
    if path is None:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child_main(argv[1], argv[3:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_argument(p)
    p.add_argument("--configs", default="cpu,cpu-first5000", help=f"comma-separated, of {', '.join(CONFIGS)}")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS / "speedrun_command.json")
    p.add_argument("--lock", type=Path,
                   help="hold an exclusive flock on this file during each run (not between runs), so that other "
                        "benchmarks sharing the machine take turns with these runs instead of overlapping them")
    args = p.parse_args(argv)
    configs = args.configs.split(",")
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown or args.repeats < 1:
        p.error(f"unknown configs {unknown}" if unknown else "--repeats must be >= 1")
    require_data(args.data, "speedrun_command")
    data = str(Path(args.data).resolve())
    done = json.loads(args.out.read_text()) if args.out.exists() else {"runs": []}
    finished = {(r["config"], r["seed"]) for r in done["runs"]}
    plan = [(rep, c) for rep, c in interleaved(configs, args.repeats, seed=0) if (c, rep) not in finished]
    print(f"{len(finished)} run(s) already in {args.out}; {len(plan)} to go")
    spent = []
    for i, (rep, config) in enumerate(plan):
        left = mean(spent) * (len(plan) - i) if spent else None
        print(f"[{i + 1}/{len(plan)}] {config} seed {rep}" + (f", about {left / 60:.0f} min left" if left else ""),
              flush=True)
        with exclusive(args.lock), MeasuredConditions("cpu", argv=sys.argv) as cond:
            run = run_one(config, rep, data)
        run["conditions"] = cond.as_dict()
        spent.append(run["wall_s"])
        done["runs"].append(run)
        done.update(summarize(done["runs"], list(CONFIGS)))
        done["conditions"] = span_conditions(done["runs"])
        write_json(args.out, done)
        print(f"    wall {run['wall_s']:.0f} s (timed part {run['timed_s']:.0f} s, CPU {run['cpu_s']:.0f} s), "
              f"TTA accuracy {run['tta_accuracy']:.4f}", flush=True)
    summary = summarize(done["runs"], list(CONFIGS))
    print(f"\n{'config':<15} {'n':>2} {'wall s':>14} {'timed s':>14} {'CPU s':>8} {'TTA accuracy':>18}")
    for c, row in summary["configs"].items():
        def cell(k, fmt):
            m, h = row[k]["mean"], row[k]["ci95"]
            return (fmt.format(m) + (" +- " + fmt.format(h) if h is not None else "")).rjust(14)
        print(f"{c:<15} {row['wall_s']['n']:>2} {cell('wall_s', '{:.0f}')} {cell('timed_s', '{:.0f}')} "
              f"{row['cpu_s']['mean']:>8.0f} {cell('tta_accuracy', '{:.4f}'):>18}")
    for name, d in summary["paired_tta_accuracy"].items():
        ci = f" +- {d['ci95']:.4f}" if d["ci95"] is not None else ""
        print(f"paired TTA accuracy, {name}: {d['mean']:+.4f}{ci} (n = {d['n']})")
    print(f"wrote {args.out}")
    return 0


def span_conditions(runs: list[dict]) -> dict:
    """The whole benchmark's conditions from its runs' own (each run measures its own): the
    load and matmul rate before the first run and after the last, their total wall time, the
    environment of the last; the per-run blocks stay in each run."""
    first, last = runs[0]["conditions"], runs[-1]["conditions"]
    return {"load_average_before": first["load_average_before"], "load_average_after": last["load_average_after"],
            "matmul_gflops_before": first["matmul_gflops_before"], "matmul_gflops_after": last["matmul_gflops_after"],
            "wall_s": sum(r["conditions"]["wall_s"] for r in runs), "runs": len(runs),
            "environment": last["environment"]}


if __name__ == "__main__":
    sys.exit(main())
