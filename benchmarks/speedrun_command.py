"""What a user waits for: whole ``hasten speedrun`` commands, first run included.

    python benchmarks/speedrun_command.py --data ../shared/data/cifar10-jpeg.tar.xz --repeats 3
    python benchmarks/speedrun_command.py --configs cpu,cpu-first5000 --repeats 3

Each run is a fresh process, ``hasten speedrun --data DATA --json ...`` with an empty
decode cache, so its wall time is the user's wait from the command to its last line:
import, decoding the archive, warm-up, training, per-epoch output and the final
evaluation. Beside it: the timed part the speedrun itself reports (airbench's
rules), the CPU seconds of the process and its decode workers, and the TTA accuracy.

Configurations (``--configs``), all through the same command and code path:

- ``cpu``: the ``cpu`` preset as it is now (threads from the cores other processes
  leave free, OpenMP's passive wait);
- ``cpu-e5.5``: 5.5 epochs instead of 6.5;
- ``cpu-w24``: widths 24, 48, 96 instead of 32, 64, 128;
- ``cpu-spin`` / ``cpu-passive``: the preset with OpenMP's spinning wait
  (``OMP_WAIT_POLICY=ACTIVE``) / sleeping wait (``PASSIVE``) whatever the load;
  ``hasten speedrun`` asks for the sleeping wait when others keep half a core busy
  (``hasten.cores``); with spinning threads it uses one per core others leave free;
- ``cpu-t1``: one thread (``--threads 1``), against which the busy-machine choice
  of all cores (threads that sleep while they wait) is checked;
- ``cpu-first5000``: whitening from the first 5,000 training images as airbench does
  (of a class-ordered archive such as CIFAR-10-JPEG that is one class);
- ``cpu-0.1``: hasten 0.1's ``cpu`` preset (8 epochs of batch 512, first-5,000
  whitening; ``hasten.recipes.speedrun.CPU_0_1``);
- ``cpu-e7`` / ``cpu-e7.5`` / ``cpu-ls0.1``: 7 or 7.5 epochs, or label smoothing 0.1,
  the search for a preset that holds 86% with margin (run on tuning seeds, ``--seed0 10``).

``--busy K`` runs K processes that spin on the CPU for the whole of every run (the
"busy machine" goal: at most 2.2x the idle time with 2 of them on 2 cores); such
runs are kept apart from idle ones in the JSON and the table.

The goal's machine does 0.19 TFLOP/s of float32 matmul (2 threads, 2048^3); each
run measures that rate here just before it starts (``reference_matmul_gflops``), and
the table gives the wall time scaled to the goal's machine by it (wall x rate / 190):
a projection, since convolutions need not scale as matmul does.

The configurations run interleaved, in a fresh shuffled order per repeat
(``hasten.timing.interleaved``), repeat i with seed i for all of them. Every
finished run is written to the JSON at once and skipped on a rerun (resume);
a progress line gives the time left. Reports mean and 95% confidence interval
(Student t) per configuration and the paired accuracy difference per seed.
"""

from __future__ import annotations

import sys

if sys.argv[1:2] == ["--child"]:
    # The child is `hasten speedrun`: like the command, it chooses OpenMP's wait from the load
    # before anything below loads torch (a configuration's own OMP_WAIT_POLICY stays).
    from hasten.cores import prefer_passive_wait

    prefer_passive_wait()

import argparse
import contextlib
import fcntl
import json
import os
import resource
import subprocess
import tempfile
import time
from pathlib import Path

from hasten.rundir import write_json
from hasten.timing import interleaved

from _common import RESULTS, MeasuredConditions, add_data_argument, mean, mean_ci, paired_differences, require_data

# name -> changes to the cpu preset (applied in the child, see child_main), extra
# command-line flags, environment
CONFIGS: dict[str, dict] = {
    "cpu": {},
    "cpu-e5.5": {"flags": ["--epochs", "5.5"]},
    "cpu-w24": {"recipe": {"net.widths": (24, 48, 96)}},
    "cpu-spin": {"env": {"OMP_WAIT_POLICY": "ACTIVE"}},
    "cpu-passive": {"env": {"OMP_WAIT_POLICY": "PASSIVE"}},
    "cpu-t1": {"flags": ["--threads", "1"]},
    "cpu-first5000": {"recipe": {"whiten_sample": "first"}},
    "cpu-0.1": {"recipe": "CPU_0_1"},
    # issue 47's search: where the ~10% of spare time buys the most accuracy
    "cpu-e7": {"flags": ["--epochs", "7"]},
    "cpu-e7.5": {"flags": ["--epochs", "7.5"]},
    "cpu-ls0.1": {"recipe": {"label_smoothing": 0.1}},
}
GOAL_MATMUL_GFLOPS = 190.0  # the goal machine's float32 matmul rate (2 threads, 2048^3)


def child_main(config: str, argv: list[str]) -> int:
    """The speedrun command itself, with the ``cpu`` preset changed as ``config`` says."""
    from hasten.cli import main
    from hasten.recipes import speedrun
    changes = CONFIGS[config].get("recipe", {})
    speedrun.PRESETS["cpu"] = (getattr(speedrun, changes) if isinstance(changes, str)
                               else speedrun.PRESETS["cpu"].replace(**changes))
    return main(["speedrun", "--preset", "cpu", *CONFIGS[config].get("flags", []), *argv])


def reference_matmul_gflops(seconds: float = 3.0) -> float:
    """The goal's yardstick, measured now in a fresh process: float32 2048^3 matmul on
    2 threads, the best of repeated products over ``seconds``."""
    code = ("import torch, time; torch.set_num_threads(2); a = torch.randn(2048, 2048); b = torch.randn(2048, 2048); "
            "a @ b; best = 1e9; end = time.perf_counter() + %r\n"
            "while time.perf_counter() < end:\n t = time.perf_counter(); a @ b; best = min(best, time.perf_counter() - t)\n"
            "print(2 * 2048 ** 3 / best / 1e9)" % seconds)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def _die_with_parent() -> None:
    """In a spinner: SIGKILL when the benchmark dies, however it dies (Linux's
    PR_SET_PDEATHSIG): a benchmark stopped by a signal runs no ``finally``, and spinners
    it left behind once made the next "idle" run a busy one."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


@contextlib.contextmanager
def spinners(k: int):
    """``k`` processes that keep a core busy each until the block ends."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=_die_with_parent)
             for _ in range(k)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def run_one(config: str, seed: int, data: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="hasten-speedrun-bench-") as tmp:
        out = Path(tmp) / "summary.json"
        env = dict(os.environ, HASTEN_CACHE=str(Path(tmp) / "cache"), HASTEN_RUNS=str(Path(tmp) / "runs"),
                   HASTEN_PROGRESS="0", **CONFIGS[config].get("env", {}))
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
            "precision": summary.get("precision"),
            "first_output_line": proc.stdout.splitlines()[0] if proc.stdout else "",
            "threads_line": next((line for line in proc.stdout.splitlines() if line.startswith("threads:")), None)}


def row_name(run: dict) -> str:
    """A table row: the configuration, and the busy processes beside it if any."""
    return run["config"] + (f" busy{run['busy']}" if run.get("busy") else "")


def summarize(runs: list[dict]) -> dict:
    rows = {}
    for name in dict.fromkeys(row_name(r) for r in runs):
        mine = [r for r in runs if row_name(r) == name]
        keys = ["wall_s", "timed_s", "cpu_s", "tta_accuracy"]
        if all("scaled_wall_s" in r for r in mine):
            keys.append("scaled_wall_s")
        rows[name] = {k: mean_ci([r[k] for r in mine]) for k in keys}
    paired = {}
    base = {r["seed"]: r["tta_accuracy"] for r in runs if row_name(r) == "cpu"}
    for name in (n for n in rows if n != "cpu"):
        diffs = paired_differences(base, {r["seed"]: r["tta_accuracy"] for r in runs if row_name(r) == name})
        if diffs:
            paired[f"cpu minus {name}"] = mean_ci(diffs)
    idle = {n: rows[n]["wall_s"]["mean"] for n in rows if " busy" not in n}
    busy_ratio = {n: rows[n]["wall_s"]["mean"] / idle[n.split(" busy")[0]]
                  for n in rows if " busy" in n and n.split(" busy")[0] in idle}
    return {"configs": rows, "paired_tta_accuracy": paired, "busy_over_idle_wall": busy_ratio}


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
    p.add_argument("--seed0", type=int, default=0, help="the first repeat's seed (repeat i uses seed0 + i)")
    p.add_argument("--busy", type=int, default=0, help="processes spinning on the CPU beside every run")
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
    finished = {(r["config"], r["seed"], r.get("busy", 0)) for r in done["runs"]}
    plan = [(args.seed0 + rep, c) for rep, c in interleaved(configs, args.repeats, seed=args.seed0)
            if (c, args.seed0 + rep, args.busy) not in finished]
    print(f"{len(finished)} run(s) already in {args.out}; {len(plan)} to go")
    spent = []
    for i, (rep, config) in enumerate(plan):
        left = mean(spent) * (len(plan) - i) if spent else None
        print(f"[{i + 1}/{len(plan)}] {config} seed {rep}" + (f" beside {args.busy} busy" if args.busy else "")
              + (f", about {left / 60:.0f} min left" if left else ""), flush=True)
        with exclusive(args.lock):
            rate = reference_matmul_gflops()  # before the spinners: the machine's own rate
            with spinners(args.busy), MeasuredConditions("cpu", argv=sys.argv) as cond:
                run = run_one(config, rep, data)
        run["conditions"] = cond.as_dict()
        run["busy"] = args.busy
        run["reference_matmul_gflops"] = round(rate, 1)
        run["scaled_wall_s"] = run["wall_s"] * rate / GOAL_MATMUL_GFLOPS
        spent.append(run["wall_s"])
        done["runs"].append(run)
        done.update(summarize(done["runs"]))
        done["conditions"] = span_conditions(done["runs"])
        write_json(args.out, done)
        print(f"    wall {run['wall_s']:.0f} s (timed part {run['timed_s']:.0f} s, CPU {run['cpu_s']:.0f} s, "
              f"{run['precision']}; scaled to the goal machine {run['scaled_wall_s']:.0f} s at {rate:.0f} GFLOP/s), "
              f"TTA accuracy {run['tta_accuracy']:.4f}", flush=True)
    summary = summarize(done["runs"])
    print(f"\n{'config':<22} {'n':>2} {'wall s':>14} {'scaled s':>14} {'timed s':>14} {'CPU s':>8} "
          f"{'TTA accuracy':>18}")
    for c, row in summary["configs"].items():
        def cell(k, fmt):
            if k not in row:
                return "-".rjust(14)
            m, h = row[k]["mean"], row[k]["ci95"]
            return (fmt.format(m) + (" +- " + fmt.format(h) if h is not None else "")).rjust(14)
        print(f"{c:<22} {row['wall_s']['n']:>2} {cell('wall_s', '{:.0f}')} {cell('scaled_wall_s', '{:.0f}')} "
              f"{cell('timed_s', '{:.0f}')} {row['cpu_s']['mean']:>8.0f} {cell('tta_accuracy', '{:.4f}'):>18}")
    for name, ratio in summary["busy_over_idle_wall"].items():
        print(f"{name}: {ratio:.2f}x the idle wall time")
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
