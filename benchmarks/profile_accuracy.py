"""How right is ``hasten profile``? Verdicts, R and predicted speedups on constructed bottlenecks.

Each scenario is a plain-PyTorch script from tests/profile_scripts whose
bottleneck is known by construction: input-bound loops at R = 2, 4 and 8
(storage latency slept per item), R = 4 with CPU decoding (CPU work on both
sides), a mixed loader (latency and decoding against sleep and CPU in the step),
R = 4 while a busy process loads the machine, a compute-bound MLP, a
communication-bound 2-rank gloo DDP job under torchrun, and a GPU case where a
GPU exists. For each: the verdict, true and estimated R, and the top fix that
--verify can apply, with its predicted and verified speedup.

Goals: every verdict right, R within 20%, the top fix's
verified speedup within 25% of its prediction.

Within every repeat the scenarios run in a freshly shuffled order
(``hasten.timing.interleaved``); the load average and matmul rate before and after
are recorded (``hasten.environment.MeasuredConditions``).

    python benchmarks/profile_accuracy.py [--repeats 2]

Writes benchmarks/results/profile_accuracy.json and profile_accuracy.png.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch

from hasten.environment import MeasuredConditions, hardware_label
from hasten.profile.launcher import ProfileConfig, ProfileFailed, profile
from hasten.profile.verdict import Recommendation
from hasten.rundir import write_json
from hasten.timing import interleaved

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "profile_scripts"
RESULTS = Path(__file__).parent / "results"
PY = sys.executable

# name, command, expected verdict, R by construction (None: not an input question), load the machine?
SCENARIOS = [
    ("input R=2 (latency)", [PY, SCRIPTS / "input_bound.py", "--item-sleep", "0.001", "--batch", "16",
                             "--step-sleep", "0.008"], "input-bound", 2.0, False),
    ("input R=4 (latency)", [PY, SCRIPTS / "input_bound.py", "--item-sleep", "0.002", "--batch", "16",
                             "--step-sleep", "0.008"], "input-bound", 4.0, False),
    ("input R=8 (latency)", [PY, SCRIPTS / "input_bound.py", "--item-sleep", "0.004", "--batch", "16",
                             "--step-sleep", "0.008"], "input-bound", 8.0, False),
    ("input R=4 (CPU decode)", [PY, SCRIPTS / "input_bound.py", "--item-sleep", "0", "--item-work", "0.002",
                                "--batch", "8", "--step-sleep", "0", "--step-work", "0.004"], "input-bound", 4.0, False),
    ("mixed R=2", [PY, SCRIPTS / "input_bound.py", "--item-sleep", "0.001", "--item-work", "0.001", "--batch", "8",
                   "--step-sleep", "0.004", "--step-work", "0.004"], "input-bound", 2.0, False),
    ("input R=4, loaded", [PY, SCRIPTS / "input_bound.py", "--item-sleep", "0.002", "--batch", "16",
                           "--step-sleep", "0.008"], "input-bound", 4.0, True),
    ("compute-bound MLP", [PY, SCRIPTS / "compute_bound.py"], "compute-bound", None, False),
    ("comm-bound 2-rank DDP", [PY, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                               SCRIPTS / "ddp_comm.py"], "communication-bound", None, False),
]


def run_scenario(name, command, expected, r_true, loaded, args) -> dict:
    busy = None
    if loaded:  # one extra busy process on top of whatever else shares the machine
        busy = subprocess.Popen([PY, "-c", "while True: pass"])
    try:
        cfg = ProfileConfig(tuple(str(c) for c in command), warmup=args.warmup, steps=args.steps,
                            probe_steps=args.probe_steps, verify=True, capture=True, timeout_s=180)
        t0 = time.perf_counter()
        a = profile(cfg, log=lambda m: None)
        wall = time.perf_counter() - t0
    except ProfileFailed as exc:
        return {"scenario": name, "error": str(exc).splitlines()[0]}
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    top = next((r for r in a.recommendations if r.verified_speedup is not None), None)
    if top is None:  # no fix recommended: check the "no gain" prediction of a rejected one instead
        top = next((Recommendation(fix=f"{r['fix']} (rejected)", how="", predicted_speedup=r["predicted_speedup"],
                                   basis="", changes_math=False, verified_speedup=r["verified_speedup"])
                    for r in a.rejected if r.get("verified_speedup") is not None), None)
    return {
        "scenario": name, "command": [_portable(c) for c in command],
        "loaded": loaded, "expected": expected, "verdict": a.verdict, "severity": a.severity,
        "verdict_right": a.verdict == expected, "r_true": r_true, "r_estimated": a.upstream_ratio,
        "r_error": None if r_true is None or a.upstream_ratio is None else a.upstream_ratio / r_true - 1,
        "step_time_s": a.step_time_s, "data_wait_fraction": a.data_wait_fraction,
        "comm_fraction": a.comm_fraction, "compute_fraction": a.compute_fraction,
        "top_fix": top.fix if top else None, "predicted": top.predicted_speedup if top else None,
        "verified": top.verified_speedup if top else None,
        "verify_error": top.verified_speedup / top.predicted_speedup - 1 if top else None,
        "first_recommendation": a.recommendations[0].fix if a.recommendations else None,
        "recommendations": [{"fix": r.fix, "predicted": r.predicted_speedup, "verified": r.verified_speedup}
                            for r in a.recommendations],
        "rejected": a.rejected, "wall_s": wall,
    }


def _portable(arg) -> str:
    """A command word without this machine's paths: the interpreter as python, scripts repo-relative."""
    arg = str(arg)
    if arg == PY:
        return "python"
    return str(Path(arg).relative_to(ROOT)) if arg.startswith(str(ROOT)) else arg


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if "error" not in r]
    fig, (ax_r, ax_s) = plt.subplots(1, 2, figsize=(11, 4), dpi=110)
    with_r = [r for r in rows if r["r_true"] is not None]
    xs = range(len(with_r))
    ax_r.bar([x - 0.2 for x in xs], [r["r_true"] for r in with_r], 0.4, label="R by construction")
    ax_r.bar([x + 0.2 for x in xs], [r["r_estimated"] for r in with_r], 0.4, label="R estimated")
    ax_r.set_xticks(list(xs), [r["scenario"] for r in with_r], rotation=30, ha="right", fontsize=7)
    ax_r.set_title("upstream ratio R")
    ax_r.legend(fontsize=8)
    with_fix = [r for r in rows if r["predicted"] is not None]
    top = max([r["predicted"] for r in with_fix] + [r["verified"] for r in with_fix] + [1.0]) * 1.1
    ax_s.plot([0, top], [0, top], color="grey", linewidth=1)
    ax_s.fill_between([0, top], [0, 0.75 * top], [0, 1.25 * top], color="grey", alpha=0.15, label="within 25%")
    for kind, marker in (("workers", "o"), ("echo", "s"), ("autocast", "^"), ("bf16 gradient", "D")):
        pts = [r for r in with_fix if kind in r["top_fix"]]
        if pts:
            ax_s.scatter([r["predicted"] for r in pts], [r["verified"] for r in pts], marker=marker, label=kind)
    ax_s.set_xlabel("predicted speedup")
    ax_s.set_ylabel("verified speedup (re-run with the fix)")
    ax_s.set_xlim(0, top)
    ax_s.set_ylim(0, top)
    ax_s.set_title("top fix: verified against predicted")
    ax_s.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0, help="seeds the order of scenarios in each repeat")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--probe-steps", type=int, default=6)
    args = ap.parse_args()
    torch.set_num_threads(1)
    scenarios = list(SCENARIOS)
    if torch.cuda.is_available():
        scenarios.append(("GPU input R=4", [PY, SCRIPTS / "input_bound.py", "--item-sleep", "0.002", "--batch",
                                            "16", "--step-sleep", "0.008"], "input-bound", 4.0, False))
    rows = []
    with MeasuredConditions("cpu") as cond:
        for rep, sc in interleaved(scenarios, args.repeats, args.seed):
            row = run_scenario(*sc, args)
            row["repeat"] = rep
            rows.append(row)
            print(f"{row['scenario']:24s} " + (row.get("error") or
                  f"{row['verdict']:20s} R {_fmt(row['r_true'], '.1f'):>4s}/{_fmt(row['r_estimated'], '.2f'):>5s}  "
                  f"{_fmt(row['top_fix'], 's'):26s} x{_fmt(row['predicted'], '.2f')} -> x{_fmt(row['verified'], '.2f')}"),
                  flush=True)
    conditions = cond.as_dict()
    env = conditions["environment"]
    print(cond.summary())
    ok = [r for r in rows if "error" not in r]
    summary = {
        "verdicts_right": f"{sum(r['verdict_right'] for r in ok)}/{len(rows)}",
        "r_within_20pct": f"{sum(abs(r['r_error']) <= 0.2 for r in ok if r['r_error'] is not None)}/"
                          f"{sum(r['r_error'] is not None for r in ok)}",
        "verified_within_25pct": f"{sum(abs(r['verify_error']) <= 0.25 for r in ok if r['verify_error'] is not None)}/"
                                 f"{sum(r['verify_error'] is not None for r in ok)}",
        "max_r_error": max((abs(r["r_error"]) for r in ok if r["r_error"] is not None), default=None),
        "max_verify_error": max((abs(r["verify_error"]) for r in ok if r["verify_error"] is not None), default=None),
    }
    print("summary: " + ", ".join(f"{k} {v if not isinstance(v, float) else f'{v:.0%}'}" for k, v in summary.items()))
    result = {
        "hardware": hardware_label(env), "conditions": conditions, "torch": torch.__version__,
        "gpu_scenario": "run" if torch.cuda.is_available() else "skipped: no GPU on this machine",
        "n": args.repeats, "warmup": args.warmup, "steps": args.steps, "probe_steps": args.probe_steps,
        "summary": summary, "scenarios": rows,
    }
    write_json(RESULTS / "profile_accuracy.json", result)
    plot(rows, RESULTS / "profile_accuracy.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
