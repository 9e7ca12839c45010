"""DDP training steps with each comm hook, with and without bf16 compression, on the emulated cluster.

4 ranks, each in its own network namespace with a 1 Gbit/s link; a 4.2 M-parameter
MLP (16.8 MB of fp32 gradients, 25 MB buckets), local batch 32. Times a full
training step (forward, backward with the hook's all-reduce, SGD step), slowest
rank, after one warm-up step. Also checks that the hooks' uncompressed runs end with
the same weights as plain DDP (native). Prints a table, writes
``benchmarks/results/allreduce_ddp.json`` and ``allreduce_ddp.png``.

    python benchmarks/allreduce_ddp.py [--steps 5]

Defaults: ``--steps 5`` timed steps per hook. Needs root (network namespaces).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from hasten.distributed import data_parallel as dp
from hasten.harness.launch import spawn
from hasten.harness.netns import EmulatedCluster, probe
from hasten.environment import describe_environment, hardware_label
from hasten.rundir import write_json
from hasten.timing import Stopwatch

RESULTS = Path(__file__).resolve().parent / "results"
WORLD, LINK_GBIT, WIDTH, LOCAL_BATCH = 4, 1.0, 1024, 32
CASES = [("native", None), ("ring", None), ("torus", None), ("naive", None),
         ("native", "bf16"), ("ring", "bf16")]


def _model() -> torch.nn.Module:
    dp.seed_everything(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def _worker(rank: int, world: int, steps: int) -> dict:
    out = {}
    for hook, compress in CASES:
        model = dp.wrap_ddp(_model(), hook=hook, compress=compress)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        gen = torch.Generator().manual_seed(rank)
        times = []
        clock = Stopwatch()
        for step in range(steps + 1):
            x = torch.randn(LOCAL_BATCH, WIDTH, generator=gen)
            dist.barrier()
            clock.start()
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            t = torch.tensor([clock.stop()], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            if step:
                times.append(t.item())
        out[f"{hook}+{compress or 'fp32'}"] = {
            "times_s": times, "weights": torch.cat([p.detach().flatten() for p in model.parameters()])}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5, help="timed steps per hook, after 1 warm-up (default 5)")
    a = p.parse_args()
    reason = probe()
    if reason is not None:
        raise SystemExit(f"network namespaces unavailable: {reason}")
    started = time.time()
    with EmulatedCluster(WORLD, LINK_GBIT) as cluster:
        res = spawn(_worker, WORLD, (a.steps,), timeout_s=120, placement=cluster.placement)[0]
        network = cluster.describe()
    ref = res["native+fp32"]["weights"]
    n_params = ref.numel()
    rows = []
    print(f"{WORLD} ranks, {network}; {n_params / 1e6:.1f} M params, local batch {LOCAL_BATCH}")
    print(f"{'hook':<14} {'step ms':>9} {'+-':>7} {'max |w - native|':>17}")
    for key, r in res.items():
        mean, std = statistics.fmean(r["times_s"]), statistics.stdev(r["times_s"])
        diff = (r["weights"] - ref).abs().max().item()
        rows.append({"hook": key, "n": len(r["times_s"]), "step_s": mean, "step_std_s": std,
                     "times_s": r["times_s"], "max_abs_weight_diff_vs_native": diff})
        print(f"{key:<14} {mean * 1e3:9.1f} {std * 1e3:7.1f} {diff:17.2e}")
    env = describe_environment("cpu")
    write_json(RESULTS / "allreduce_ddp.json", {
        "benchmark": "allreduce_ddp", "environment": env, "world_size": WORLD, "network": network,
        "params": n_params, "local_batch": LOCAL_BATCH, "steps": a.steps,
        "note": "2 CPU cores shared with other engineers' jobs while this ran",
        "wall_s": time.time() - started, "results": rows})

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(range(len(rows)), [r["step_s"] for r in rows], yerr=[r["step_std_s"] for r in rows],
           capsize=4)
    ax.set_xticks(range(len(rows)), [r["hook"] for r in rows], rotation=20)
    ax.set_ylabel("training step (s)")
    ax.set_title(f"DDP step, {WORLD} ranks, {LINK_GBIT:g} Gbit/s emulated links, "
                 f"{n_params / 1e6:.1f} M params\n{hardware_label(env)}, torch {env['torch']}, "
                 f"mean +- std of {a.steps} steps, CPU shared", fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(RESULTS / "allreduce_ddp.png", dpi=110)
    plt.close(fig)
    print(f"wrote {RESULTS / 'allreduce_ddp.json'} and .png in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
