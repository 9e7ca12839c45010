"""``hasten echo``: data echoing (Choi et al., 2019) through the streaming pipeline.

One run (default): train without echoing and with the requested echo factor and
variant, both behind the same simulated slow storage, to the same target
accuracy; print and save fresh examples, steps, wall time to the target, final
accuracy and idle fraction.

``--sweep``: the paper's two findings. (a) Fresh examples to the target against e
for each variant (no storage delay: counts do not depend on speed). (b) Wall-time
speedup against e at R about 2, 4 and 6, with AutoEcho beside the fixed factors,
and AutoEcho against no echoing where the step outlasts the pipeline (R < 1: it
should switch itself off and cost nothing).
Runs are interleaved over ``--repeats`` seeds so that a slow spell of a shared
machine hits every configuration alike. Writes PNG plots, a table and JSON.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch

from hasten.echo import VARIANTS
from hasten.environment import hardware_label, pick_device
from hasten.errors import ConfigError
from hasten.progress import progress
from hasten.recipes.echo import EchoRunConfig, EvalSet, measure_step_time, parse_echo, train_to_target, validate
from hasten.rundir import RunDir, write_json

SWEEP_FACTORS = (2.0, 4.0, 6.0)
SWEEP_RATIOS = (2.0, 4.0, 6.0)
NOT_INPUT_BOUND_WIDTH = 48  # R < 1 group: AutoEcho should switch itself off


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default=os.environ.get("HASTEN_DATA"),
                   help="image folder or archive with train/<class>/* and test/<class>/* (default $HASTEN_DATA)")
    p.add_argument("--echo", default="auto", help="echo factor: a number >= 1 or 'auto' (default auto)")
    p.add_argument("--variant", default="example-before", help=f"one of {', '.join(VARIANTS)}")
    delay = p.add_mutually_exclusive_group()
    delay.add_argument("--upstream-delay", type=float, default=None, metavar="SECONDS",
                       help="simulated storage latency per example read")
    delay.add_argument("--upstream-ratio", type=float, default=None, metavar="R",
                       help="set the latency so that upstream/step time is about R (measured first; default 4)")
    p.add_argument("--target", type=float, default=None, help="test accuracy to reach (CPU default 0.40)")
    p.add_argument("--e-max", type=float, default=8.0, help="AutoEcho's largest factor")
    p.add_argument("--sweep", action="store_true", help="run the paper's two sweeps instead of one comparison")
    p.add_argument("--repeats", type=int, default=1, help="runs (seeds) per configuration")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (1: on a shared CPU a second thread made steps 5x slower)")
    p.add_argument("--workers", type=int, default=0, help="decode processes (0: a decode thread)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the results JSON here")
    p.add_argument("--plots", default=None, metavar="DIR", help="also write the sweep's PNG plots here")


def run(args: argparse.Namespace) -> int:
    if not args.data:
        raise ConfigError("pass --data PATH: an image folder or archive with train/<class>/ and test/<class>/ "
                          "(e.g. cifar10-jpeg.tar.xz), or set HASTEN_DATA")
    if args.repeats < 1:
        raise ConfigError(f"--repeats must be >= 1; got {args.repeats}")
    if args.upstream_ratio is not None and not args.upstream_ratio >= 0:
        raise ConfigError(f"--upstream-ratio must be >= 0; got {args.upstream_ratio}")
    device = pick_device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    try:
        base = validate(EchoRunConfig(data=args.data, variant=args.variant, echo=parse_echo(args.echo),
                                      upstream_delay_s=args.upstream_delay or 0.0, target=args.target,
                                      e_max=args.e_max, device=str(device), workers=args.workers))
    except ValueError as e:  # a bad option value: one line for the user, not a traceback
        raise ConfigError(str(e)) from None
    with RunDir("echo", device=device) as rd:
        rd.write_config({**vars(args), "device": str(device)})
        h = base.hyp()
        eval_set = EvalSet(_open_test(args.data), h["image_size"], device)
        print(f"hasten echo: {hardware_label(rd.environment)}, torch {torch.__version__}, "
              f"target accuracy {h['target']:.2f}")
        batch = h["batch_size"]
        entries: list[dict] = []

        def run_jobs(jobs, rep):
            for group, cfg in jobs:
                cfg = EchoRunConfig(**{**cfg.__dict__, "seed": rep})
                result = train_to_target(cfg, eval_set=eval_set,
                                         log=lambda **r: rd.log(group=group, echo_cfg=str(cfg.echo), **r))
                result["group"] = group
                if cfg.echo != 1.0:
                    # R is measured by the run without echoing of the same group and seed (run first).
                    base_run = next((e for e in reversed(entries) if e["group"] == group and e["seed"] == rep
                                     and e["echo_factor"] == 1.0), None)
                    result["upstream_ratio"] = base_run["upstream_ratio"] if base_run else None
                entries.append(result)
                rd.log(event="run", **{k: v for k, v in result.items() if k != "config"})
                bar.update(1)

        if args.sweep:
            jobs_a = _sweep_a_jobs(base)
            bar = progress(total=(len(jobs_a) + len(_sweep_b_jobs(base, 0.0, batch))) * args.repeats,
                           desc="echo runs")
            for rep in range(args.repeats):
                run_jobs(jobs_a, rep)
                if rep == 0:
                    # The delay for R comes from the step times of the (a) runs just made: hundreds
                    # of steps under the same load, steadier than a separate short measurement.
                    step_s = float(np.median([e["step_time_s"] for e in entries]))
                    jobs_b = _sweep_b_jobs(base, step_s, batch)
                    print(f"hasten echo: step time {step_s * 1e3:.1f} ms (batch {batch}, median of the (a) runs)")
                run_jobs(jobs_b, rep)
        else:
            step_s = measure_step_time(args.data, str(device), eval_set=eval_set)
            print(f"hasten echo: step time {step_s * 1e3:.1f} ms (batch {batch})")
            jobs = _single_jobs(base, args, step_s, batch)
            bar = progress(total=len(jobs) * args.repeats, desc="echo runs")
            for rep in range(args.repeats):
                run_jobs(jobs, rep)
        bar.close()
        summary = summarize(entries)
        results = {
            "command": "hasten echo " + " ".join(argv_of(args)),
            "hardware": hardware_label(rd.environment),
            "torch": torch.__version__,
            "dataset": "CIFAR-10-JPEG" if "cifar10-jpeg" in os.path.basename(args.data) else args.data,
            "note": "2 CPU cores shared with other jobs; compare ratios measured in one run",
            "step_time_s": step_s,
            "repeats": args.repeats,
            "hyperparameters": h,
            "baseline": [e for e in entries if e["echo_factor"] == 1.0],
            "results": entries,
            "summary": summary,
        }
        rd.write_results(results)
        if args.json:
            write_json(args.json, results)
        print(format_table(summary))
        if args.sweep:
            for path in plot_sweep(summary, [rd.path] + ([args.plots] if args.plots else [])):
                print(f"plot: {path}")
        print(f"run directory: {rd.path}")
    return 0


def argv_of(args: argparse.Namespace) -> list[str]:
    return [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
            if not k.startswith("_") and k != "command" and v not in (None, False)]


def _open_test(data: str):
    from hasten.stream.records import open_records

    return open_records(data, "test")


def _single_jobs(base: EchoRunConfig, args, step_s: float, batch: int) -> list[tuple[str, EchoRunConfig]]:
    if args.upstream_delay is None:
        ratio = 4.0 if args.upstream_ratio is None else args.upstream_ratio
        base = EchoRunConfig(**{**base.__dict__, "upstream_delay_s": ratio * step_s / batch})
    group = f"delay={base.upstream_delay_s * 1e3:.3f}ms"
    jobs = [(group, EchoRunConfig(**{**base.__dict__, "echo": 1.0}))]
    if base.echo != 1.0:
        jobs.append((group, base))
    return jobs


def _sweep_a_jobs(base: EchoRunConfig) -> list[tuple[str, EchoRunConfig]]:
    """(a): e = 1 and each variant at each factor, without storage delay."""
    jobs = [("a", EchoRunConfig(**{**base.__dict__, "echo": 1.0, "upstream_delay_s": 0.0}))]
    for variant in VARIANTS:
        jobs += [("a", EchoRunConfig(**{**base.__dict__, "variant": variant, "echo": e, "upstream_delay_s": 0.0}))
                 for e in SWEEP_FACTORS]
    return jobs


def _sweep_b_jobs(base: EchoRunConfig, step_s: float, batch: int) -> list[tuple[str, EchoRunConfig]]:
    """(b): e = 1, each factor and AutoEcho at each R (the delay is R step times per
    batch); e = 1 and AutoEcho at R < 1."""
    jobs = []
    for ratio in SWEEP_RATIOS:
        delay = ratio * step_s / batch
        jobs += [(f"R={ratio:g}", EchoRunConfig(**{**base.__dict__, "variant": "example-before", "echo": e,
                                                  "upstream_delay_s": delay}))
                 for e in (1.0, *SWEEP_FACTORS, "auto")]
    # Not input-bound: no delay and a network 3x wider, whose step outlasts decoding a batch.
    jobs += [("R<1", EchoRunConfig(**{**base.__dict__, "variant": "example-before", "echo": e,
                                     "upstream_delay_s": 0.0, "width": NOT_INPUT_BOUND_WIDTH}))
             for e in (1.0, "auto")]
    return jobs


def _stats(values) -> dict:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"mean": None, "std": None, "n": 0}
    return {"mean": float(np.mean(vals)), "std": float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0,
            "n": len(vals)}


def summarize(entries: list[dict]) -> list[dict]:
    """Mean and spread per (group, variant, echo), with speedups over e = 1 of the same group."""
    keys = []
    for e in entries:
        k = (e["group"], e["variant"] if e["echo_factor"] != 1.0 else "none", str(e["echo_factor"]))
        if k not in keys:
            keys.append(k)
    rows = []
    for group, variant, echo in keys:
        runs = [e for e in entries if e["group"] == group and str(e["echo_factor"]) == echo
                and (e["variant"] if e["echo_factor"] != 1.0 else "none") == variant]
        row = {"group": group, "variant": variant, "echo_factor": echo, "n": len(runs),
               "reached": sum(r["reached_target"] for r in runs)}
        for field in ("fresh_examples_to_target", "steps_to_target", "wall_time_to_target_s", "final_accuracy",
                      "idle_fraction", "upstream_ratio", "storage_ratio", "mean_echo_factor"):
            row[field] = _stats([r[field] for r in runs])
        rows.append(row)
    for row in rows:
        base = next(r for r in rows if r["group"] == row["group"] and r["echo_factor"] == "1.0")
        b, w = base["wall_time_to_target_s"]["mean"], row["wall_time_to_target_s"]["mean"]
        row["speedup"] = b / w if b and w else None
        bf, f = base["fresh_examples_to_target"]["mean"], row["fresh_examples_to_target"]["mean"]
        row["fresh_ratio"] = f / bf if bf and f else None
    return rows


def _fmt(stat: dict, scale: float = 1.0, digits: int = 0) -> str:
    if stat["mean"] is None:
        return "-"
    s = f"{stat['mean'] * scale:.{digits}f}"
    if stat["n"] > 1:
        s += f"±{stat['std'] * scale:.{digits}f}"
    return s


def format_table(rows: list[dict]) -> str:
    head = (f"{'group':8} {'variant':15} {'e':>5} {'n':>2} {'R meas':>8} {'fresh':>12} {'steps':>10} "
            f"{'wall s':>11} {'speedup':>7} {'final acc':>11} {'idle':>5}")
    lines = [head, "-" * len(head)]
    for r in rows:
        e = r["echo_factor"] if r["echo_factor"] != "auto" else f"a{r['mean_echo_factor']['mean']:.1f}"
        speedup = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        lines.append(
            f"{r['group']:8} {r['variant']:15} {e:>5} {r['n']:>2} {_fmt(r['upstream_ratio'], 1, 1):>8} "
            f"{_fmt(r['fresh_examples_to_target']):>12} {_fmt(r['steps_to_target']):>10} "
            f"{_fmt(r['wall_time_to_target_s'], 1, 1):>11} "
            f"{speedup:>7} "
            f"{_fmt(r['final_accuracy'], 100, 1):>11} {_fmt(r['idle_fraction'], 100, 0):>5}"
        )
    return "\n".join(lines)


def plot_sweep(rows: list[dict], dirs: list) -> list[str]:
    """(a) fresh examples to target vs e per variant; (b) speedup vs e per R, AutoEcho marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig, ax = plt.subplots(figsize=(6, 4))
    base = next((r for r in rows if r["group"] == "a" and r["echo_factor"] == "1.0"), None)
    for variant in VARIANTS:
        pts = [(1.0, base)] if base else []
        pts += [(float(r["echo_factor"]), r) for r in rows if r["group"] == "a" and r["variant"] == variant]
        pts = [(e, r) for e, r in pts if r["fresh_examples_to_target"]["mean"] is not None]
        if pts:
            ax.errorbar([e for e, _ in pts], [r["fresh_examples_to_target"]["mean"] for _, r in pts],
                        yerr=[r["fresh_examples_to_target"]["std"] for _, r in pts], marker="o", capsize=3,
                        label=variant)
    ax.set_xlabel("echo factor e")
    ax.set_ylabel("fresh examples to target")
    ax.set_title("(a) fresh examples to target vs echo factor")
    ax.legend()
    fig.tight_layout()
    figs = {"echo_fresh_examples.png": fig}

    fig, ax = plt.subplots(figsize=(6, 4))
    for ratio in SWEEP_RATIOS:
        group = f"R={ratio:g}"
        pts = [(float(r["echo_factor"]), r["speedup"]) for r in rows
               if r["group"] == group and r["echo_factor"] != "auto" and r["speedup"]]
        if not pts:
            continue
        base = next(r for r in rows if r["group"] == group and r["echo_factor"] == "1.0")
        measured = base["upstream_ratio"]["mean"]
        label = f"{group}" + (f" (measured {measured:.1f})" if measured else "")
        line = ax.plot([e for e, _ in pts], [s for _, s in pts], marker="o", label=f"fixed e, {label}")[0]
        auto = next((r for r in rows if r["group"] == group and r["echo_factor"] == "auto" and r["speedup"]), None)
        if auto:
            ax.scatter([auto["mean_echo_factor"]["mean"]], [auto["speedup"]], marker="*", s=160,
                       color=line.get_color(), edgecolors="black", zorder=3, label=f"AutoEcho, {group}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("echo factor e (AutoEcho: its mean e)")
    ax.set_ylabel("wall-time speedup to target vs e = 1")
    ax.set_title("(b) speedup vs echo factor at upstream ratio R")
    ax.legend(fontsize=7)
    fig.tight_layout()
    figs["echo_speedup.png"] = fig
    for d in dirs:
        os.makedirs(d, exist_ok=True)
        for name, f in figs.items():
            path = os.path.join(str(d), name)
            f.savefig(path, dpi=120)
            written.append(path)
    for f in figs.values():
        plt.close(f)
    return written
