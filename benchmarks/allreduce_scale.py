"""The cost model at the 2-D torus paper's scale: all-reduce time against N up to 4,096 ranks.

Extends hasten.distributed.cost_model from the 2-8 ranks measured on the emulated
cluster to 4-4,096 ranks for the 1-D ring, the 2-D torus (most square grid,
64 x 64 at 4,096), recursive halving-doubling and the single reducer. Two link
settings:

- "calibrated": beta and gamma measured on the emulated 1 Gbit/s cluster with 8
  ranks (read from ``results/allreduce_emulated.json``; run that benchmark first),
  and alpha from its 2-rank ping-pong: the 8-rank ring-step alpha that the
  benchmark predicts with is mostly 8 processes queueing for 2 CPU cores, a cost
  of this machine, not of a network of 4,096 hosts;
- "fast": an assumed 100 Gbit/s link with 5 us per message and the calibrated
  gamma, to show where the ring's 2(N-1) alpha latency term takes over.

Messages: 100 MB (ResNet-50's fp32 gradients, 25.6 M parameters) and 1 MB.
These are model predictions, not measurements; recursive halving-doubling, the
model's best algorithm at every N here, is shown beside the torus and the ring.
The machine's conditions are recorded like every benchmark's
(``hasten.environment.MeasuredConditions``), though nothing here is timed. Prints a
table, writes ``benchmarks/results/allreduce_scale.json`` and ``allreduce_scale.png``.

    python benchmarks/allreduce_scale.py
"""

from __future__ import annotations

import json

from hasten.distributed.cost_model import Link, simulate
from hasten.rundir import write_json

from _common import RESULTS, MeasuredConditions

NS = [4, 16, 64, 256, 1024, 2048, 4096]
MESSAGES = {"100MB": 100e6, "1MB": 1e6}
ALGOS = ("naive", "ring", "halving_doubling", "torus")


def calibrated_link() -> Link:
    data = json.loads((RESULTS / "allreduce_emulated.json").read_text())
    cal = data["flat"]["8"]["calibration"]
    return Link(cal["link"]["pingpong_alpha_s"], cal["link"]["beta_s_per_byte"], cal["gamma_s_per_byte"])


def main() -> None:
    cal = calibrated_link()
    links = {"calibrated": cal, "fast": Link(5e-6, 8 / 100e9, cal.gamma)}
    out = {}
    with MeasuredConditions("cpu") as cond:
        for lname, link in links.items():
            for mname, nbytes in MESSAGES.items():
                out[f"{lname}/{mname}"] = simulate(NS, nbytes, link, ALGOS)
    best = {key: {str(n): min(ALGOS, key=lambda a: sim[a][i]) for i, n in enumerate(NS)} for key, sim in out.items()}
    print(f"calibrated link: alpha {cal.alpha * 1e6:.0f} us, {cal.gbit_per_s:.2f} Gbit/s, "
          f"gamma {cal.gamma * 1e9:.3f} ns/byte; fast link: 5 us, 100 Gbit/s (assumed)")
    print(f"{'link/message':<18} {'algo':<17} " + " ".join(f"{n:>9}" for n in NS) + "   (seconds)")
    for key, sim in out.items():
        for algo in ALGOS:
            print(f"{key:<18} {algo:<17} " + " ".join(f"{t:9.3g}" for t in sim[algo]))
        print(f"{key:<18} {'best':<17} " + " ".join(f"{best[key][str(n)][:9]:>9}" for n in NS))
    print(cond.summary())
    write_json(RESULTS / "allreduce_scale.json", {
        "benchmark": "allreduce_scale", "kind": "cost-model prediction, not a measurement",
        "ns": NS, "messages_bytes": MESSAGES,
        "links": {k: {"alpha_s": v.alpha, "beta_s_per_byte": v.beta, "gamma_s_per_byte": v.gamma,
                      "gbit_per_s": v.gbit_per_s} for k, v in links.items()},
        "predicted_time_s": out, "best_algorithm": best,
        "calibration_source": "results/allreduce_emulated.json (flat, N = 8)",
        "conditions": cond.as_dict()})

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(17, 4))
    labels = {"naive": "single reducer", "ring": "1-D ring", "halving_doubling": "halving-doubling",
              "torus": "2-D torus"}
    for ax, (key, sim) in zip(axes, out.items()):
        for algo in ALGOS:
            ax.plot(NS, sim[algo], "o-", label=labels[algo])
        lname, mname = key.split("/")
        link = links[lname]
        ax.set(xscale="log", yscale="log", xlabel="ranks N", ylabel="predicted time (s)",
               title=f"{mname}; {lname} link ({link.alpha * 1e6:.0f} us, {link.gbit_per_s:.3g} Gbit/s)")
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("alpha-beta-gamma model (hasten.distributed.cost_model); calibrated on the emulated "
                 "cluster; predictions, not measurements", fontsize=9)
    fig.tight_layout()
    fig.savefig(RESULTS / "allreduce_scale.png", dpi=110)
    plt.close(fig)
    print(f"wrote {RESULTS / 'allreduce_scale.json'} and .png")


if __name__ == "__main__":
    main()
