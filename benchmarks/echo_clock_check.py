"""Does the modelled slow source (``hasten.recipes.echo.clock``) give the wall time a real
sleeping one does? Side by side on the small sweep (benchmarks/echo_sweep.py's defaults:
10,000 CIFAR-10-JPEG images at 16x16, SmallNet, 469 steps of batch 64).

For R = 2, 4, 8 and e = 1, 4 and AutoEcho, each run trains the whole budget twice, in a
shuffled order: once reading through ``hasten.stream.slow_storage.SlowStorage`` (threads
sleeping for a shared link whose bandwidth makes a batch take R step times; 8 requests
of 32 examples in flight, 4 read ahead), once with ``ModelledClocks`` at the same
bandwidth and the same read-ahead (12 requests = 384 examples). Reports the modelled
over the real wall time per setting, mean and 95% interval over 3 repeats.

    python benchmarks/echo_clock_check.py [--data PATH] [--repeats 3]

Writes benchmarks/results/echo_clock_check.json. About 5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import torch

from hasten.recipes.echo.clock import ModelledClocks
from hasten.recipes.echo.config import RunSpec, SweepConfig
from hasten.recipes.echo.data import load_data
from hasten.recipes.echo.sweep import current_step_time, source_for, train_budget
from hasten.rundir import write_json
from hasten.timing import interleaved

from _common import RESULTS, MeasuredConditions, add_data_argument, mean_ci, paired_ratios, require_data

IN_FLIGHT, PREFETCH, REQUEST = 8, 4, 32


def one(cfg: SweepConfig, data, ratio: float, echo, mode: str, seed: int) -> dict:
    step_s = current_step_time(cfg, data)
    src = replace(source_for(cfg, data, ratio, step_s), latency_s=0.001, request_examples=REQUEST,
                  in_flight=IN_FLIGHT, prefetch=PREFETCH)
    spec = RunSpec(echo=echo, lr=cfg.lr, steps=cfg.steps, seed=seed, e_max=cfg.e_max)
    if mode == "real":
        r = train_budget(cfg, data, spec, source=src, final_eval=False)
        wall = r["wall_time_s"]
    else:
        # The same bandwidth per example (mean wire size) and read-ahead as the real source.
        per_example = ratio * step_s / cfg.batch_size
        clocks = ModelledClocks([per_example], lead=(IN_FLIGHT + PREFETCH) * REQUEST)
        r = train_budget(cfg, data, spec, clocks=clocks, final_eval=False)
        wall = r["clock_wall_s"][0]
    return {"ratio": ratio, "echo": echo, "mode": mode, "seed": seed, "wall_s": wall, "steps": r["steps"],
            "step_time_s": r["step_time_s"], "mean_echo_factor": r["mean_echo_factor"],
            "calibration_step_s": step_s, "source": {"link_bytes_per_s": src.link_bytes_per_s}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_data_argument(ap)
    ap.add_argument("--repeats", type=int, default=3, help="repeats of every setting (default 3)")
    ap.add_argument("--out", default=str(RESULTS / "echo_clock_check.json"), help="results JSON")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    require_data(args.data, "echo_clock_check")
    torch.set_num_threads(1)
    cfg = SweepConfig(data=args.data, eval_points=())
    data = load_data(cfg)
    settings = [(r, e) for r in (2.0, 4.0, 8.0) for e in (1.0, 4.0, "auto")]
    runs = []
    with MeasuredConditions("cpu", argv=sys.argv) as cond:
        for rep, (ratio, echo) in interleaved(settings, args.repeats, seed=1):
            pair = []
            for mode in (("real", "modelled") if (rep + len(runs)) % 2 == 0 else ("modelled", "real")):
                pair.append(one(cfg, data, ratio, echo, mode, seed=rep))
            runs += pair
            by = {p["mode"]: p for p in pair}
            print(f"R={ratio:g} e={echo}: real {by['real']['wall_s']:.1f} s (mean e {by['real']['mean_echo_factor']:.2f}),"
                  f" modelled {by['modelled']['wall_s']:.1f} s (mean e {by['modelled']['mean_echo_factor']:.2f})",
                  flush=True)
    rows = []
    for ratio, echo in settings:
        real = {r["seed"]: r for r in runs if (r["ratio"], r["echo"], r["mode"]) == (ratio, echo, "real")}
        model = {r["seed"]: r for r in runs if (r["ratio"], r["echo"], r["mode"]) == (ratio, echo, "modelled")}
        rows.append({"ratio": ratio, "echo": echo,
                     "real_wall_s": mean_ci([real[s]["wall_s"] for s in real]),
                     "modelled_wall_s": mean_ci([model[s]["wall_s"] for s in model]),
                     "modelled_over_real": mean_ci(paired_ratios({s: m["wall_s"] for s, m in model.items()},
                                                                 {s: r["wall_s"] for s, r in real.items()})),
                     "real_mean_e": mean_ci([real[s]["mean_echo_factor"] for s in real]),
                     "modelled_mean_e": mean_ci([model[s]["mean_echo_factor"] for s in model])})
    write_json(Path(args.out), {"benchmark": "echo_clock_check", "conditions": cond.as_dict(), "config": vars(args),
                                "runs": runs, "summary": rows})
    print("| R | e | real wall s | modelled wall s | modelled / real | mean e real / modelled |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        f = lambda s, d=1: f"{s['mean']:.{d}f} ± {s['ci95']:.{d}f}" if s["ci95"] is not None else f"{s['mean']:.{d}f}"
        print(f"| {r['ratio']:g} | {r['echo']} | {f(r['real_wall_s'])} | {f(r['modelled_wall_s'])} | "
              f"{f(r['modelled_over_real'], 3)} | {f(r['real_mean_e'], 2)} / {f(r['modelled_mean_e'], 2)} |")
    print(cond.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
