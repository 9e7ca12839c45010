"""All-reduce on loopback (no emulated network): what the algorithms cost on this machine's CPU.

On loopback every "link" is a kernel memory copy on the same (here: 2, shared)
cores, so there is no topology: the numbers say how much CPU each algorithm
spends, not how it would scale on a network. N = 2, 4, 8; sizes 1K .. 256M;
ring, torus, naive and gloo's own all_reduce, interleaved in a shuffled order every
round; the load average and matmul rate before and after are recorded. Prints tables, writes
``benchmarks/results/allreduce_loopback.json`` and ``allreduce_loopback.png``.

    python benchmarks/allreduce_loopback.py [--iters 3]

Defaults: ``--iters 3`` timed iterations (after 1 warm-up) per algorithm and size.
No root needed.
"""

from __future__ import annotations

import argparse
import time

from hasten.recipes.allreduce import AllreduceConfig, format_table, run
from hasten.rundir import write_json

from _common import RESULTS, MeasuredConditions, hardware_label

SIZES = (1 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20)  # 1K, 64K, 1M, 16M, 256M


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=3, help="timed iterations per algorithm and size (default 3)")
    a = p.parse_args()
    started = time.time()
    reports = {}
    with MeasuredConditions("cpu") as cond:
        for n in (2, 4, 8):
            reports[n] = run(AllreduceConfig(world=n, sizes=SIZES, iters=a.iters, warmup=1))
            print(f"\nN = {n}, loopback")
            print(format_table(reports[n]["results"]))
    conditions = cond.as_dict()
    env = conditions["environment"]
    print(cond.summary())
    write_json(RESULTS / "allreduce_loopback.json", {
        "benchmark": "allreduce_loopback", "conditions": conditions, "iters": a.iters, "warmup": 1,
        "wall_s": time.time() - started, "runs": {str(n): r for n, r in reports.items()}})

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4), sharey=True)
    for ax, (n, rep) in zip(axes, reports.items()):
        for algo in ("naive", "ring", "torus", "native"):
            rs = [r for r in rep["results"] if r["algo"] == algo]
            ax.plot([r["bytes"] for r in rs], [r["busbw_gbps"] for r in rs], "o-", label=algo)
        ax.set(xlabel="message size (bytes)", title=f"N = {n}, loopback")
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("busbw (GB/s)")
    axes[0].legend()
    fig.suptitle(f"gloo on loopback, {hardware_label(env)}, torch {env['torch']}; mean of "
                 f"{a.iters} runs; load average {conditions['load_average_before'][0]:.1f}->"
                 f"{conditions['load_average_after'][0]:.1f}", fontsize=9)
    fig.tight_layout()
    fig.savefig(RESULTS / "allreduce_loopback.png", dpi=110)
    plt.close(fig)
    print(f"\nwrote {RESULTS / 'allreduce_loopback.json'} and .png in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
