"""``hasten echo``: data echoing (Choi et al., 2019) through the streaming pipeline.

One run (default): train without echoing and with the requested echo factor and
variant, both behind the same simulated slow storage, to the same target
accuracy; print and save fresh examples, steps, wall time to the target, final
accuracy and idle fraction.

``--sweep``: the benchmark in the paper's regime (``hasten.recipes.echo.sweep``):
a fixed budget with a learning-rate schedule, tuned baseline and echo settings,
fresh examples to the target per variant, the shuffle-buffer study, and wall
time to the target at R about 2, 4, 6 and 8 with AutoEcho; writes PNG plots, a
table and JSON (``benchmarks/echo_sweep.py`` runs the same with its conditions).
Each finished run goes to a journal under ``runs/`` named for the sweep's settings,
so the same command after a stop resumes where it was.

The method is in ``hasten.recipes.echo``: ``run`` (one run), ``compare`` (the
comparison) and ``sweep`` (the sweep); this parses, runs it and prints.
"""

from __future__ import annotations

import argparse
import os

import torch

from hasten import cli_types as t
from hasten.echo import VARIANTS
from hasten.environment import hardware_label, pick_device
from hasten.errors import ConfigError
from hasten.rundir import RunDir, RunJournal, stable_run_path, write_json
from hasten.stream.store_url import HELP_SCHEMES, data_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", type=data_argument, default=os.environ.get("HASTEN_DATA") or None,
                   help="image folder or archive with train/<class>/* and test/<class>/*, a directory of shards "
                        f"(hasten data pack) or their URL ({HELP_SCHEMES}; docs/remote.md; default $HASTEN_DATA)")
    p.add_argument("--echo", type=t.echo_factor, default="auto", help="echo factor: a number >= 1 or 'auto'")
    p.add_argument("--variant", default="example-before", choices=VARIANTS, help="where examples are repeated")
    delay = p.add_mutually_exclusive_group()
    delay.add_argument("--upstream-delay", type=t.nonneg_float, default=None, metavar="SECONDS",
                       help="simulated storage latency per example read")
    delay.add_argument("--upstream-ratio", type=t.nonneg_float, default=4.0, metavar="R",
                       help="set the latency so that upstream/step time is about R (measured first)")
    p.add_argument("--target", type=t.float_range(0, 1, lo_open=True, hi_open=True), default=None,
                   help="test accuracy to reach (CPU default 0.40)")
    p.add_argument("--e-max", type=t.float_range(1), default=8.0, help="AutoEcho's largest factor")
    p.add_argument("--sweep", action="store_true", help="run the paper's two sweeps instead of one comparison")
    p.add_argument("--repeats", type=t.positive_int, default=1,
                   help="runs (seeds) per configuration (--sweep: default 3)")
    p.add_argument("--device", type=t.device, default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--threads", type=t.int_range(1, t.MAX_THREADS), default=1,
                   help="torch CPU threads (1: on a shared CPU a second thread made steps 5x slower)")
    p.add_argument("--workers", type=t.int_range(0, t.MAX_WORKERS), default=0,
                   help="decode processes (0: a decode thread)")
    p.add_argument("--json", type=t.output_file, default=None, metavar="PATH",
                   help="also write the results JSON here")
    p.add_argument("--plots", type=t.output_dir, default=None, metavar="DIR",
                   help="also write the sweep's PNG plots here")


def config_from(args: argparse.Namespace, device: torch.device):
    """A ``SweepConfig`` with ``--sweep``, else a ``ComparisonConfig``."""
    from hasten.recipes.echo import EchoRunConfig
    from hasten.recipes.echo.compare import ComparisonConfig
    from hasten.recipes.echo.config import SweepConfig

    if not args.data:
        raise ConfigError("pass --data PATH: an image folder or archive with train/<class>/ and test/<class>/ "
                          "(e.g. cifar10-jpeg.tar.xz), or set HASTEN_DATA")
    if args.sweep:
        return SweepConfig(data=args.data, seeds=args.repeats if args.repeats != 1 else 3, e_max=args.e_max,
                           device=str(device))
    changes = {"target": args.target} if args.target is not None else {}
    base = EchoRunConfig.for_device(device, data=args.data, variant=args.variant, echo=args.echo,
                                    upstream_delay_s=args.upstream_delay or 0.0, e_max=args.e_max,
                                    workers=args.workers, **changes)
    return ComparisonConfig(base, repeats=args.repeats,
                            upstream_ratio=None if args.upstream_delay is not None else args.upstream_ratio)


def run(args: argparse.Namespace) -> int:
    from hasten.recipes.echo import compare as echo_compare, report as echo_report, sweep as echo_sweep

    device = pick_device(args.device)
    cfg = config_from(args, device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    with RunDir("echo", device=device) as rd:
        rd.write_config({**vars(args), "device": str(device)})
        target = "the baseline's (tuned)" if args.sweep else f"{cfg.base.target:.2f}"
        print(f"hasten echo: {hardware_label(rd.environment)}, torch {torch.__version__}, target accuracy {target}")

        def log(**record) -> None:
            rd.log(**record)
            if record.get("event") == "step_time":
                print(f"hasten echo: step time {record['step_time_s'] * 1e3:.1f} ms "
                      f"(batch {cfg.base.batch_size}, {record['source']})")
            elif record.get("event") == "target":
                print(f"hasten echo: target {record['target']:.4f} (baseline mean - std), "
                      f"step time {record['step_time_s'] * 1e3:.1f} ms")

        if args.sweep:
            settings = echo_sweep.journal_settings(cfg)
            journal = RunJournal(stable_run_path("echo-sweep", settings) / "runs.jsonl", settings,
                                 meta={"git_commit": rd.environment.get("git_commit")})
            print(f"hasten echo: resuming, {len(journal)} finished runs in {journal.path}" if len(journal) else
                  f"hasten echo: each finished run goes to {journal.path} (rerun the command to resume)")
            result = echo_sweep.run(cfg, log=log, journal=journal)
        else:
            result = echo_compare.compare(cfg, log=log)
        report = {"command": rd.environment["command"], "hardware": hardware_label(rd.environment), **result}
        rd.write_results(report)
        if args.json:
            write_json(args.json, report)
        print(echo_report.format_table(report["summary"], legend=True))
        if args.sweep:
            for directory in [rd.path] + ([args.plots] if args.plots else []):
                for path in echo_report.write_plots(report["summary"], directory):
                    print(f"plot: {path}")
        print(f"run directory: {rd.path}")
    return 0
