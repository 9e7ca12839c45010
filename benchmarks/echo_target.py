"""Data echoing at a real target (Choi et al., 2019): all 50,000 CIFAR-10-JPEG training
images, the speedrun network at widths 16, 32, 64, 75% test accuracy, R = 2, 4, 8.

Runs ``hasten.recipes.echo.target.run_target`` (its module docstring has the design;
``SweepConfig.at_target`` the numbers): no echoing, echo factors 2 and 4 (learning rate
tuned on a grid per factor) and AutoEcho (not told R), 3 seeds, the slow source on a
modelled clock (``hasten.recipes.echo.clock``) with every training step measured.

Writes benchmarks/results/echo_target.json and echo_target.png. Each run goes to a
journal (``echo_target.runs.jsonl``) as it finishes; the same command again resumes
(``--fresh`` starts over). About 30 runs of 2 to 5 minutes on 2 cores.

    python benchmarks/echo_target.py [--data PATH] [--seeds 3] [--threads 2]

Run under the shared benchmark lock: the steps' times are the measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from hasten.recipes.echo.config import SweepConfig
from hasten.recipes.echo.sweep import add_journal_arguments, open_journal
from hasten.recipes.echo.target import accuracy_margin, run_target, target_table
from hasten.rundir import write_json

from _common import RESULTS, MeasuredConditions, add_data_argument, require_data


def plot(report: dict, path: Path) -> Path:
    """Speed-up over no echoing against R, per echo factor, with the ideal min(e, R)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    rows = [r for r in report["summary"] if r["echo_factor"] != "1.0"]
    for factor in dict.fromkeys(r["echo_factor"] for r in rows):
        pts = [(r["ratio"], r["speedup"]) for r in rows if r["echo_factor"] == factor and r["speedup"]]
        if pts:
            ax.errorbar([p[0] for p in pts], [p[1]["mean"] for p in pts],
                        yerr=[p[1]["ci95"] or 0 for p in pts], marker="o", capsize=3,
                        label="AutoEcho" if factor == "auto" else f"e = {float(factor):g}")
    ratios = sorted({r["ratio"] for r in report["summary"]})
    for factor in sorted({float(r["echo_factor"]) for r in rows if r["echo_factor"] != "auto"}):
        ax.plot(ratios, [min(factor, x) for x in ratios], ":", color="grey")
    ax.set_xlabel("upstream ratio R (modelled source)")
    ax.set_ylabel("speed-up in wall time to 75% over e = 1")
    ax.set_title(f"{report['dataset']}: speedrun net 16-32-64, 95% intervals, n = {report['config']['seeds']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_data_argument(ap)
    ap.add_argument("--seeds", type=int, default=3, help="seeds per setting (default 3)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    add_journal_arguments(ap, str(RESULTS / "echo_target.json"))
    args = ap.parse_args()
    if args.markdown:
        report = json.loads(Path(args.markdown).read_text())
        print(target_table(report["summary"]))
        return 0
    if args.seeds < 1 or args.threads < 1:
        ap.error("--seeds and --threads must be >= 1")
    require_data(args.data, "echo_target")
    torch.set_num_threads(args.threads)
    cfg = SweepConfig.at_target(args.data, seeds=args.seeds)
    journal = open_journal(args, cfg)

    def log(**record) -> None:
        if record.get("event") == "run":
            reached = f"{record['steps_to_target']} steps" if record["reached_target"] else "not reached"
            print(f"{record['phase']}: e={record['echo_factor']} lr={record['lr']:g} seed={record['seed']}: "
                  f"target {reached}, step {record['step_time_s'] * 1e3:.0f} ms, end acc {record['end_accuracy']}",
                  flush=True)

    with MeasuredConditions("cpu", argv=sys.argv) as cond:
        report = run_target(cfg, log=log, journal=journal)
    results = {"benchmark": "echo_target", "conditions": cond.as_dict(), **report,
               "baseline_margin": accuracy_margin(report)}
    out = Path(args.out)
    write_json(out, results)
    print(target_table(report["summary"]))
    print(cond.summary())
    print("goals:", json.dumps(report["goals"], indent=1))
    print(f"plot: {plot(results, out.with_suffix('.png'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
