"""DDP training steps with each comm hook, with and without bf16 compression, on the emulated cluster.

4 ranks, each in its own network namespace with a 1 Gbit/s link; a 4.2 M-parameter
MLP (16.8 MB of fp32 gradients, 25 MB buckets), local batch 32. Times a full
training step (forward, backward with the hook's all-reduce, SGD step), slowest
rank, after one warm-up step. Every hook trains its own copy of the model on the
same inputs; each round runs one step of every hook, in a shuffled order
(``hasten.timing.interleaved``, the same order on every rank), so drifting load
spreads over all hooks. The load average and matmul rate before and after are
recorded (``hasten.environment.MeasuredConditions``).

Also compares every hook's final weights with plain DDP's (native): the largest
absolute difference, and the norm of the difference relative to the norm of the
weights and to the norm of what training changed (||w - w_native|| / ||w_native - w_0||):
the scale that says whether a difference matters. Prints a table, writes
``benchmarks/results/allreduce_ddp.json`` and ``allreduce_ddp.png``.

    python benchmarks/allreduce_ddp.py [--steps 10]

Defaults: ``--steps 10`` timed steps per hook. Needs root (network namespaces).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

from hasten.distributed import data_parallel as dp
from hasten.harness.launch import spawn
from hasten.harness.netns import EmulatedCluster, probe
from hasten.rundir import write_json
from hasten.timing import Stopwatch, interleaved

from _common import RESULTS, MeasuredConditions, hardware_label, mean, sample_std

WORLD, LINK_GBIT, WIDTH, LOCAL_BATCH = 4, 1.0, 1024, 32
CASES = [("native", None), ("ring", None), ("torus", None), ("naive", None),
         ("native", "bf16"), ("ring", "bf16")]


def _model() -> torch.nn.Module:
    dp.seed_everything(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _worker(rank: int, world: int, steps: int) -> dict:
    initial = _flat(_model())
    runs = {}
    for hook, compress in CASES:  # one model, optimizer and input stream per hook
        model = dp.wrap_ddp(_model(), hook=hook, compress=compress)
        runs[hook, compress] = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01),
                                "gen": torch.Generator().manual_seed(rank), "times_s": []}
    clock = Stopwatch()
    # Round 0 is every hook's untimed warm-up step; the seed is fixed, so every rank
    # draws the same order of hooks (they must run their collectives in step).
    for step, case in interleaved(CASES, steps + 1, seed=0):
        r = runs[case]
        x = torch.randn(LOCAL_BATCH, WIDTH, generator=r["gen"])
        dist.barrier()
        clock.start()
        loss = r["model"](x).square().mean()
        r["opt"].zero_grad()
        loss.backward()
        r["opt"].step()
        t = torch.tensor([clock.stop()], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if step:
            r["times_s"].append(t.item())
    return {"initial": initial,
            **{f"{hook}+{compress or 'fp32'}": {"times_s": r["times_s"], "weights": _flat(r["model"])}
               for (hook, compress), r in runs.items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10, help="timed steps per hook, after 1 warm-up (default 10)")
    a = p.parse_args()
    if a.steps < 2:
        p.error("--steps must be >= 2 (a spread needs two)")
    reason = probe()
    if reason is not None:
        raise SystemExit(f"network namespaces unavailable: {reason}")
    started = time.time()
    with MeasuredConditions("cpu") as cond:
        with EmulatedCluster(WORLD, LINK_GBIT) as cluster:
            res = spawn(_worker, WORLD, (a.steps,), timeout_s=300, placement=cluster.placement)[0]
            network = cluster.describe()
    conditions = cond.as_dict()
    env = conditions["environment"]
    initial = res.pop("initial")
    ref = res["native+fp32"]["weights"]
    n_params = ref.numel()
    weight_norm, update_norm = ref.norm().item(), (ref - initial).norm().item()
    rows = []
    print(f"{WORLD} ranks, {network}; {n_params / 1e6:.1f} M params, local batch {LOCAL_BATCH}, "
          f"n={a.steps} steps per hook")
    print(f"weights after {a.steps + 1} steps of plain DDP: ||w|| = {weight_norm:.4g}, "
          f"||w - w_0|| = {update_norm:.4g} (what training changed)")
    print(f"{'hook':<14} {'step ms':>9} {'+-':>7} {'max |w - native|':>17} {'/ ||w||':>9} {'/ ||w - w_0||':>13}")
    for key, r in res.items():
        step_s, std = mean(r["times_s"]), sample_std(r["times_s"])
        delta = r["weights"] - ref
        row = {"hook": key, "n": len(r["times_s"]), "step_s": step_s, "step_std_s": std, "times_s": r["times_s"],
               "max_abs_weight_diff_vs_native": delta.abs().max().item(),
               "weight_diff_norm_relative_to_weight_norm": delta.norm().item() / weight_norm,
               "weight_diff_norm_relative_to_update_norm": delta.norm().item() / update_norm}
        rows.append(row)
        print(f"{key:<14} {step_s * 1e3:9.1f} {std * 1e3:7.1f} {row['max_abs_weight_diff_vs_native']:17.2e} "
              f"{row['weight_diff_norm_relative_to_weight_norm']:9.1e} "
              f"{row['weight_diff_norm_relative_to_update_norm']:13.1e}")
    print(cond.summary())
    write_json(RESULTS / "allreduce_ddp.json", {
        "benchmark": "allreduce_ddp", "conditions": conditions, "world_size": WORLD, "network": network,
        "params": n_params, "local_batch": LOCAL_BATCH, "steps": a.steps,
        "weight_norm_native": weight_norm, "update_norm_native": update_norm,
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
                 f"mean +- std of {a.steps} steps; load average {conditions['load_average_before'][0]:.1f}->"
                 f"{conditions['load_average_after'][0]:.1f}", fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(RESULTS / "allreduce_ddp.png", dpi=110)
    plt.close(fig)
    print(f"wrote {RESULTS / 'allreduce_ddp.json'} and .png in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
