"""``hasten speedrun``: train the CIFAR-10 speedrun recipe N times and report
(see hasten.recipes.speedrun).

Stopped (Ctrl-C, SIGTERM), it says in one line where its checkpoint is;
``hasten speedrun <same options> --resume auto`` continues it.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

from hasten import cli_types as t
from hasten.cores import prefer_passive_wait
from hasten.errors import ConfigError

prefer_passive_wait()  # before torch loads OpenMP: hasten.cores says why
from hasten.recipes.speedrun import PRESETS  # noqa: E402 (torch is imported here)


def local_data(text: str) -> str:
    """``--data``: a local path that exists; a URL is refused in one line that says what to do."""
    from hasten.stream.store_url import is_url

    if is_url(text):
        raise argparse.ArgumentTypeError(
            f"{text}: hasten speedrun reads a local image folder, archive or CIFAR-10 binary files (the whole "
            "set in memory), not a URL; download the data first, or stream shards from the URL with "
            "hasten train --loader stream --data URL")
    return t.existing_path(text)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", type=local_data, default=os.environ.get("HASTEN_DATA") or None,
                   help="dataset: image folder or archive (e.g. cifar10-jpeg.tar.xz), or the CIFAR-10 binary "
                        "files; default $HASTEN_DATA, else download canonical CIFAR-10")
    p.add_argument("--runs", type=t.positive_int, default=1, help="number of training runs")
    p.add_argument("--device", type=t.device, default="auto",
                   help="auto|cuda|cuda:N|cpu (default auto: CUDA when present)")
    p.add_argument("--preset", default="auto", choices=["auto", *PRESETS],
                   help="recipe preset (default auto: airbench94 on CUDA, cpu on CPU)")
    p.add_argument("--seed", type=t.seed, default=0, help="seed of the first run; run i uses seed+i")
    p.add_argument("--epochs", type=t.positive_float, help="override the preset's epoch count")
    p.add_argument("--batch-size", type=t.positive_int,
                   help="override the preset's batch size (lr is per 1024 examples)")
    p.add_argument("--train-subset", type=t.nonneg_int, default=0,
                   help="train on a seeded random subset of this many training images (quick CPU runs; 0 = all)")
    p.add_argument("--threads", type=t.positive_int,
                   help="torch threads (default: every core; one per core others leave free when waiting threads "
                        "spin on a busy machine; see hasten.cores)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (CUDA; compiled in the warm-up)")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up run")
    p.add_argument("--ablate", action="store_true",
                   help="run the ablation ladder (tricks added one by one) instead of N runs of the full recipe")
    p.add_argument("--target", type=t.float_range(0, 1, lo_open=True),
                   help="accuracy target for --ablate (epochs and time to reach it); default: 0.94 on CUDA, 0.80 on CPU")
    p.add_argument("--resume", type=resume_type,
                   help="'auto': continue the newest stopped job of the same settings under $HASTEN_RUNS (else "
                        "runs/), fresh if there is none; or a run directory or checkpoint file to continue")
    p.add_argument("--json", type=t.output_file, help="also write the summary JSON here")


def set_threads(requested: int | None, resumed: int | None = None) -> str:
    """Set torch's CPU threads: ``requested``, else those of the run being resumed
    (so that it ends bit for bit as if never stopped), else as ``hasten.cores.core_share``
    picks from the load at start. Returns the line saying so."""
    import torch

    from hasten.cores import core_share

    if requested is not None:
        torch.set_num_threads(requested)
        return f"threads: {requested} (--threads)"
    if resumed is not None:
        torch.set_num_threads(resumed)
        return f"threads: {resumed}, as the run it resumes (--threads N to choose)"
    share = core_share()
    torch.set_num_threads(share.threads)
    return share.line()


def resume_type(text: str) -> str:
    """``--resume``: ``auto``, or a run directory or checkpoint file that exists."""
    return text if str(text).strip() == "auto" else t.existing_path(text)


def run(args: argparse.Namespace) -> int:
    import torch

    threads = torch.get_num_threads()
    try:
        return _run(args)
    finally:  # called in-process (tests, notebooks), the caller's thread count is theirs
        torch.set_num_threads(threads)


def _run(args: argparse.Namespace) -> int:
    from hasten.distributed.faults import stop_signal
    from hasten.environment import describe_environment, hardware_label, pick_device
    from hasten.recipes import speedrun
    from hasten.rundir import RunDir, write_json

    device = pick_device(args.device)
    preset, why = speedrun.choose_preset(args.preset, device)
    # Ghost batch norm splits each batch into chunks: the preset's, and with --ablate a rung's.
    ghosts = {PRESETS[preset].net.ghost_batch_size}
    if args.ablate:
        ghosts |= {changes.get("net.ghost_batch_size", 0) for _, changes in speedrun.LADDER}
    for ghost in sorted(ghosts - {0}):
        if args.batch_size is not None and args.batch_size % ghost:
            raise ConfigError(f"--batch-size {args.batch_size} must be a multiple of {ghost}, the ghost batch-norm "
                              f"size of {'an --ablate rung' if args.ablate else f'the {preset} preset'}")
    changes = {k: v for k, v in (("epochs", args.epochs), ("batch_size", args.batch_size)) if v is not None}
    if args.compile:
        changes["compile"] = True
    config = speedrun.SpeedrunConfig(
        recipe=speedrun.build_recipe(preset, **changes), preset=preset, device=str(device), data=args.data,
        runs=args.runs, seed=args.seed, train_subset=args.train_subset, warmup=not args.no_warmup,
        ablate=args.ablate, target=args.target if args.target is not None else speedrun.default_target(device))
    print(f"device: {device} ({hardware_label(describe_environment(device))}); preset: {preset} ({why}); "
          f"{speedrun.precision(config.recipe, device)}")

    plan = speedrun.plan_resume(config, args.resume)
    if plan.note:
        print(f"hasten speedrun: {plan.note}", file=sys.stderr, flush=True)
    if device.type == "cpu":
        print(set_threads(args.threads, plan.state.get("torch_threads") if plan.state else None))
    run_dir = RunDir("speedrun", device=device, path=plan.run_path)
    print(f"run directory: {run_dir.path}")
    try:
        summary = speedrun.run(config, run_dir=run_dir, log=functools.partial(print, flush=True), resume=plan.state)
    except BaseException as exc:
        run_dir.close(failed=True)  # no run directory left behind empty
        sig = stop_signal(exc)
        if sig is None:
            raise
        # Ctrl-C or SIGTERM: one line saying what there is to resume.
        print(f"hasten speedrun: stopped by {sig.name}; {stopped_at(run_dir.path, config)}", file=sys.stderr,
              flush=True)
        return 128 + sig
    run_dir.close()
    if args.json:
        write_json(args.json, summary)
    if not config.ablate:
        n = len(summary["runs"])

        def spread(std: float, digits: int) -> str:  # one run has no spread to state
            return f" +- {std:.{digits}f}" if n > 1 else ""

        print(f"\n{n} run(s) of {preset} on {summary['data']}: TTA accuracy "
              f"{summary['mean_accuracy']:.4f}{spread(summary['std_accuracy'], 4)}, time "
              f"{summary['mean_time_s']:.2f}{spread(summary['std_time_s'], 2)} s, "
              f"{summary['flops_per_run'] / 1e12:.2f} TFLOP per run, {summary['achieved_tflops']:.3f} TFLOP/s achieved")
        for i, r in enumerate(summary["runs"]):
            if r["resumed"]:
                parts = " + ".join(f"{t:.2f}" for t in r["time_parts_s"])
                print(f"run {i} was stopped and resumed: its time is {parts} = {r['time_s']:.2f} s (timed before "
                      "each stop, up to its last checkpoint, plus after)")
    return 0


def stopped_at(run_path, config) -> str:
    """What a stopped job leaves: its checkpoint and how to resume it, or that there is none."""
    from hasten.checkpoint import load_checkpoint, newest_checkpoint
    from hasten.recipes.speedrun import describe_checkpoint

    newest = newest_checkpoint(run_path) if run_path.exists() else None
    if newest is None:
        return ("no checkpoint yet (one is written at each epoch end, after the warm-up), nothing to resume; "
                "rerun to start again")
    state = load_checkpoint(newest.path)
    return (f"run directory {run_path} ({describe_checkpoint(state, config)}); resume with: "
            "hasten speedrun <same options> --resume auto")
