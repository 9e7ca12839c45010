"""All-reduce on an emulated cluster: one network namespace per rank, tc-shaped links.

Two experiments, each rank on its own shaped link (see hasten.harness.netns):

1. flat: equal 1 Gbit/s links, N = 2, 4, 8; ring, 2-D torus (most square grid),
   single reducer (naive) and gloo's own all_reduce (native);
2. two-level: N = 8 as 2 "nodes" x 4 ranks, 1 Gbit/s inside a node and 0.25 Gbit/s
   (4x slower) between nodes; flat ring, native, and the hierarchical torus
   (grid 2x4: rows = nodes).

Every timing is the slowest rank's, after a barrier, n timed iterations after one
warm-up, the algorithms and sizes interleaved in a shuffled order every round
(``hasten.harness.collectives.bench_worker``); each result is checked for the right
sum. The load average and matmul rate before and after are recorded
(``hasten.environment.MeasuredConditions``). The cost model is calibrated
by a rank 0 <-> peer ping-pong before each run, then predicts every algorithm.
Prints a table and the performance goals (PASS/MISS), writes
``benchmarks/results/allreduce_emulated.json`` and ``allreduce_emulated.png``.
Needs root (network namespaces); about 4.5 minutes on 2 cores.

    python benchmarks/allreduce_emulated.py [--iters 5] [--quick]

Defaults: ``--iters 5`` timed iterations (after 1 warm-up) per algorithm and size;
sizes 64K, 1M, 16M, 64M (``--quick``: 64K, 1M, 4M).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from hasten.harness.netns import probe
from hasten.recipes.allreduce import AllreduceConfig, format_table, human, run
from hasten.rundir import write_json

from _common import RESULTS, MeasuredConditions, hardware_label

LINK_GBIT, INTER_GBIT, LOCAL = 1.0, 0.25, 4
MB = 1 << 20


def row(report: dict, algo: str, nbytes: int) -> dict:
    return next(r for r in report["results"] if r["algo"] == algo and r["bytes"] == nbytes)


def criteria(flat: dict, two: dict, big: int) -> list[tuple[str, bool, str]]:
    """The performance goals, each with the measured numbers behind it."""
    out = []
    t = {(n, a): row(flat[n], a, big)["time_s"] for n in flat for a in ("ring", "naive", "native")}
    ns = sorted(flat)
    lo, hi = ns[0], ns[-1]
    naive_growth, ideal = t[hi, "naive"] / t[lo, "naive"], (hi - 1) / (lo - 1)
    out.append(("naive time grows ~linearly with N", naive_growth > 0.7 * ideal,
                f"t(N={hi})/t(N={lo}) = {naive_growth:.2f} (linear: {ideal:.1f})"))
    ring_growth = t[hi, "ring"] / t[lo, "ring"]
    bw_ideal = (2 * (hi - 1) / hi) / (2 * (lo - 1) / lo)
    out.append(("ring time about flat from N=2 to 8", ring_growth < 1.25 * bw_ideal,
                f"t(N={hi})/t(N={lo}) = {ring_growth:.2f} (bandwidth-optimal: {bw_ideal:.2f})"))
    busbw = row(flat[hi], "ring", big)["busbw_gbps"] * 8
    out.append((f"ring busbw at {human(big)} >= 85% of link", busbw >= 0.85 * LINK_GBIT,
                f"{busbw:.3f} Gbit/s = {busbw / LINK_GBIT:.0%} of {LINK_GBIT:g} Gbit/s"))
    speedups = {r["bytes"]: row(flat[hi], "naive", r["bytes"])["time_s"] / r["time_s"]
                for r in flat[hi]["results"] if r["algo"] == "ring" and r["bytes"] >= min(16 << 20, big)}
    out.append((f"ring >= 3x faster than naive at N={hi}, >= {human(min(16 << 20, big))}", min(speedups.values()) >= 3,
                ", ".join(f"{human(b)}: {s:.1f}x" for b, s in speedups.items())))
    vs_native = max(row(flat[n], "ring", big)["time_s"] / row(flat[n], "native", big)["time_s"] for n in ns)
    out.append(("ring within 1.2x of gloo's all_reduce", vs_native <= 1.2,
                f"worst ring/native at {human(big)}: {vs_native:.2f}"))
    hier = row(two, "ring", big)["time_s"] / row(two, "torus", big)["time_s"]
    out.append(("hierarchical torus beats flat ring on 4x-slower inter-node links", hier > 1,
                f"ring/torus = {hier:.2f} at {human(big)}"))
    points = [(abs(r["time_s"] - r["predicted_time_s"]) / r["time_s"], r["algo"], rep["world_size"],
               r["bytes"]) for rep in [*flat.values(), two] for r in rep["results"] if r["bytes"] >= 1 << 20]
    large = [p for p in points if p[3] >= 16 << 20]
    small = [p for p in points if p[3] < 16 << 20]

    def worst(ps):
        e, algo, n, b = max(ps)
        return f"worst {e:.0%} ({algo}, N={n}, {human(b)}) over {len(ps)} points"

    out.append(("cost model within 25% for messages >= 1M", max(points)[0] <= 0.25,
                f">= 16M: {worst(large)}; 1M..4M: {worst(small)}" if small and large else worst(points)))
    return out


def plot(flat: dict, two: dict, big: int, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.3))
    ns = sorted(flat)
    ax = axes[0]
    for algo in ("naive", "ring", "torus", "native"):
        ms = [row(flat[n], algo, big)["time_s"] for n in ns]
        err = [row(flat[n], algo, big)["time_std_s"] for n in ns]
        line = ax.errorbar(ns, ms, yerr=err, marker="o", capsize=3, label=algo)
        ax.plot(ns, [row(flat[n], algo, big)["predicted_time_s"] for n in ns], "--",
                color=line[0].get_color(), alpha=0.5)
    ax.set(xlabel="ranks N", ylabel="time (s); dashed: cost model", xticks=ns,
           title=f"{human(big)} all-reduce, {LINK_GBIT:g} Gbit/s links")
    ax.legend()
    ax = axes[1]
    hi = flat[ns[-1]]
    for algo in ("naive", "ring", "torus", "native"):
        rs = [r for r in hi["results"] if r["algo"] == algo]
        ax.plot([r["bytes"] for r in rs], [r["busbw_gbps"] * 8 for r in rs], "o-", label=algo)
    ax.axhline(LINK_GBIT, color="gray", ls=":", label="link rate")
    ax.set(xscale="log", xlabel="message size (bytes)", ylabel="busbw (Gbit/s)",
           title=f"N = {ns[-1]}, flat {LINK_GBIT:g} Gbit/s")
    ax.set_xscale("log", base=2)
    ax.legend()
    ax = axes[2]
    algos = [a for a in ("ring", "native", "torus") if any(r["algo"] == a for r in two["results"])]
    xs = range(len(algos))
    ax.bar(xs, [row(two, a, big)["time_s"] for a in algos],
           yerr=[row(two, a, big)["time_std_s"] for a in algos], capsize=4, color="C1")
    ax.plot(xs, [row(two, a, big)["predicted_time_s"] for a in algos], "k_", ms=30, mew=2,
            label="cost model")
    ax.set_xticks(list(xs), ["flat ring", "native", "hierarchical\ntorus 2x4"][:len(algos)])
    ax.set(ylabel="time (s)", title=f"{human(big)}, 2 nodes x {LOCAL}: "
                                    f"{LINK_GBIT:g} / {INTER_GBIT:g} Gbit/s")
    ax.legend()
    for a in axes:
        a.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=5, help="timed iterations per algorithm and size (default 5)")
    p.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    a = p.parse_args()
    reason = probe()
    if reason is not None:
        raise SystemExit(f"network namespaces unavailable: {reason}")
    sizes = (64 << 10, MB, 4 * MB) if a.quick else (64 << 10, MB, 16 * MB, 64 * MB)
    big = sizes[-1]
    common = {"network": "emulated", "iters": a.iters, "warmup": 1, "sizes": sizes, "link_gbit": LINK_GBIT}
    started = time.time()
    flat = {}
    with MeasuredConditions("cpu") as cond:
        for n in (2, 4, 8):
            flat[n] = run(AllreduceConfig(world=n, **common))
            if flat[n]["network"]["kind"] != "emulated":
                raise SystemExit(f"network namespaces unavailable: {flat[n]['network']}")
            print(f"\nN = {n}, {flat[n]['network']['description']}")
            print(format_table(flat[n]["results"]))
        two = run(AllreduceConfig(world=8, inter_gbit=INTER_GBIT, local_size=LOCAL,
                                  algos=("ring", "native", "torus"), **common))
    print(f"\nN = 8, {two['network']['description']}")
    print(format_table(two["results"]))
    conditions = cond.as_dict()
    env = conditions["environment"]
    print(cond.summary())
    checks = criteria(flat, two, big)
    print("\ngoals:")
    for name, ok, detail in checks:
        print(f"  {'PASS' if ok else 'MISS'}  {name}: {detail}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_json(RESULTS / "allreduce_emulated.json", {
        "benchmark": "allreduce_emulated", "conditions": conditions, "iters": a.iters, "warmup": 1,
        "wall_s": time.time() - started, "flat": {str(n): r for n, r in flat.items()},
        "two_level": two,
        "criteria": [{"name": n, "pass": ok, "detail": d} for n, ok, d in checks]})
    title = (f"gloo on {hardware_label(env)}, torch {env['torch']}, network namespaces + tc htb "
             f"(no added latency); mean +- std of {a.iters} runs; load average "
             f"{conditions['load_average_before'][0]:.1f}->{conditions['load_average_after'][0]:.1f}")
    plot(flat, two, big, RESULTS / "allreduce_emulated.png", title)
    print(f"\nwrote {RESULTS / 'allreduce_emulated.json'} and .png in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
