"""``hasten train``: large-batch data-parallel training (see hasten.recipes.train).

One process:      hasten train --data cifar10-jpeg.tar.xz --model resnet18 --batch-size 1024
Several, CPU:     torchrun --nproc-per-node 4 -m hasten train ... --bn-group 2
Several nodes:    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
                      --rdzv-endpoint HOST:29400 -m hasten train ...
Survive a lost worker: torchrun --max-restarts 3 ... -m hasten train ... --checkpoint-every 200
                  (restarted workers resume from the newest checkpoint of the same run directory)
"""

from __future__ import annotations

import argparse
import gc
import os
import sys

from hasten import cli_types as t
from hasten.distributed.hooks import HOOKS
from hasten.models.resnet import MODELS
from hasten.recipes.train import (DEFAULT_BASE_LR, DEFAULT_LR_SCALING, LOADERS, LR_SCALINGS, OPTIMIZERS,
                                  TrainConfig)
from hasten.stream.store_url import HELP_SCHEMES, data_argument

_D = TrainConfig()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", type=data_argument, default=os.environ.get("HASTEN_DATA") or None,
                   help="dataset: image folder or archive (ImageNet layout too), CIFAR-10 binary, or with --loader "
                   f"stream a directory of tar shards (hasten data pack), also at a URL ({HELP_SCHEMES}; "
                   "docs/remote.md); default $HASTEN_DATA or the CIFAR-10 download")
    p.add_argument("--model", default=_D.model, choices=sorted(MODELS))
    p.add_argument("--width", type=t.positive_int, default=_D.width, help="channels of the first stage")
    p.add_argument("--image-size", type=t.positive_int, default=None, help="resize image folders to SxS")
    p.add_argument("--train-subset", type=t.nonneg_int, default=0, help="train on N random images (0 = all)")
    p.add_argument("--loader", choices=LOADERS, default=_D.loader,
                   help="device: decode once, keep the set on the device; stream: decode per epoch in "
                   "worker processes (datasets larger than memory)")
    p.add_argument("--workers", type=t.int_range(0, t.MAX_WORKERS), default=0,
                   help="decode processes per rank (--loader stream)")
    p.add_argument("--batch-size", type=t.positive_int, default=_D.batch_size, help="global batch, all ranks")
    p.add_argument("--epochs", type=t.positive_float, default=_D.epochs)
    p.add_argument("--optimizer", choices=OPTIMIZERS, default=_D.optimizer)
    p.add_argument("--lr", type=t.positive_float, default=None,
                   help=f"base learning rate (when not given, by optimizer: {DEFAULT_BASE_LR})")
    p.add_argument("--lr-scaling", choices=LR_SCALINGS, default=None,
                   help=f"linear: peak = lr x batch / base-batch (when not given, by optimizer: "
                   f"{DEFAULT_LR_SCALING})")
    p.add_argument("--base-batch", type=t.positive_int, default=_D.base_batch, help="for linear scaling")
    p.add_argument("--momentum", type=t.fraction, default=_D.momentum)
    p.add_argument("--weight-decay", type=t.nonneg_float, default=_D.weight_decay)
    p.add_argument("--trust-coefficient", type=t.positive_float, default=_D.trust_coefficient, help="LARS eta")
    p.add_argument("--warmup-epochs", type=t.nonneg_float, default=None,
                   help=f"linear warm-up; less than --epochs (default: {_D.warmup_epochs:g}, or --epochs / 5 when "
                   "that is less)")
    p.add_argument("--decay-power", type=t.nonneg_float, default=_D.decay_power, help="polynomial decay power")
    p.add_argument("--label-smoothing", type=t.fraction, default=_D.label_smoothing)
    p.add_argument("--bn-group", type=t.positive_int, default=_D.bn_group, help="replicas sharing BN statistics")
    p.add_argument("--ghost-batch", type=t.nonneg_int, default=0, help="virtual BN batch inside a replica (0 = off)")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (BN, loss, gradients in fp32)")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--hook", choices=HOOKS, default=_D.hook, help="gradient all-reduce (hasten.distributed)")
    p.add_argument("--compress", choices=["bf16"], default=None, help="compress gradients on the wire")
    p.add_argument("--retries", type=t.int_range(0, 1000), default=_D.retries,
                   help=f"tries after the first of each request to shards at a URL (default {_D.retries}), with "
                   "backoff from 0.5 s doubling to 20 s (the default waits 36-72 s in all: a store restarting)")
    p.add_argument("--checkpoint-every", type=t.nonneg_int, default=0, help="steps between checkpoints (0: end)")
    p.add_argument("--resume", type=resume_type, help="checkpoint file, a run directory holding checkpoint.pt, or "
                   "'auto': the newest complete checkpoint in this run's directory (fresh if none); workers that "
                   "torchrun restarts always resume as 'auto'")
    p.add_argument("--run-dir", type=t.output_dir, help="run directory (default: $HASTEN_RUNS/train-<digest of the "
                   "data and training settings>, the same for every rank and restart)")
    p.add_argument("--collective-timeout", type=t.positive_float, default=_D.collective_timeout,
                   help="seconds a collective waits for a dead or hung peer rank before stopping")
    p.add_argument("--seed", type=t.seed, default=_D.seed)
    p.add_argument("--deterministic", action="store_true", help="deterministic algorithms only")
    p.add_argument("--device", type=t.device, default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--noise-scale", action="store_true",
                   help="estimate the gradient noise scale B_simple (McCandlish et al. 2018) during training: in the "
                   "metrics, and a suggested batch at the end (DDP: every step, from each rank's gradient and the "
                   "averaged one; one process: a probe every 10 steps, about 10%% more time)")
    p.add_argument("--json", type=t.output_file, help="also write the final report to this JSON file")


def resume_type(text: str) -> str:
    """``--resume``: ``auto``, or a checkpoint file or run directory that exists."""
    return text if str(text).strip() == "auto" else t.existing_path(text)


def run(args: argparse.Namespace) -> int:
    from hasten.distributed.faults import PeerLostError
    from hasten.recipes.train import default_run_path, plan_resume, train
    from hasten.rundir import RunDir, write_json

    fields = {k: getattr(args, k) for k in TrainConfig.__dataclass_fields__}
    # The learning rate and its scaling default by optimizer (LARS's peak lr is not scaled).
    if args.lr is None:
        fields["lr"] = DEFAULT_BASE_LR[args.optimizer]
    if args.lr_scaling is None:
        fields["lr_scaling"] = DEFAULT_LR_SCALING[args.optimizer]
    # The warm-up defaults to 2 epochs, scaled down for short runs (--epochs 1: 0.2).
    if args.warmup_epochs is None:
        fields["warmup_epochs"] = min(_D.warmup_epochs, args.epochs / 5)
    cfg = TrainConfig(**fields)
    # Validate before making a run directory or starting any process group.
    cfg.validate(int(os.environ.get("WORLD_SIZE", "1")))
    main = int(os.environ.get("RANK", "0")) == 0
    run_path = args.run_dir or default_run_path(cfg)
    # A worker that torchrun restarted continues the run its predecessor left.
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    plan = plan_resume(cfg, run_path, args.resume, restarted=restarted)
    if main and plan.note:
        print(f"hasten train: {plan.note}", file=sys.stderr, flush=True)
    if plan.finished is not None:  # nothing to train or evaluate: its result as it was
        if main:
            if args.json:
                write_json(args.json, plan.finished)
            print(result_line(plan.finished, finished=True))
        return 0
    run_dir = RunDir("train", path=run_path) if main else None
    failed = True  # until train returns: a run directory it made and left bare is removed
    try:
        report = train(cfg, run_dir=run_dir, resume=plan.state, run_path=run_path)
        failed = False
    except PeerLostError as exc:
        # The last words of a lost peer's survivors, or of a run stopped by SIGTERM or
        # SIGINT: one line, with the checkpoint to resume from; no traceback.
        print(f"hasten train: {exc}", file=sys.stderr, flush=True)
        # Interpreter teardown garbage-collects every object torch made (seconds on a
        # busy machine) while torchrun waits to restart the job: skip that work.
        gc.freeze()
        return exc.exit_code
    finally:
        if run_dir is not None:
            run_dir.close(failed=failed)
    if main:
        if args.json:
            write_json(args.json, report)
        print(result_line(report))
        if report.get("noise_scale"):
            print(noise_scale_line(report["noise_scale"], report["global_batch"]))
    return 0


def result_line(report: dict, finished: bool = False) -> str:
    """The end-of-run line. ``finished``: the report of a run that had ended before this command."""
    trained = report["steps"] - (report.get("resumed_from_step") or 0)
    rate = f"{report['images_per_s']:.0f} images/s"
    if finished:
        rate = f"already complete (trained at {rate})"
    elif trained <= 0:  # resumed at its last step: no step timed now
        rate = "already complete, nothing trained"
    return (f"{report['dataset']}: accuracy {report['accuracy']:.4f} after {report['steps']} steps "
            f"({report['epochs']:.2f} epochs) at global batch {report['global_batch']} on "
            f"{report['world_size']} process(es); {rate}; run dir {report.get('run_dir')}")


def noise_scale_line(ns: dict, batch: int) -> str:
    """The end-of-run line: the estimate, the batch it suggests, and why."""
    import math

    if not math.isfinite(ns["used"]):
        return f"noise scale: no usable estimate ({ns['measurements']} measurements); {ns['why']}"
    return (f"noise scale B_simple ~ {ns['used']:.0f} (tr(Sigma) over |G|^2, each averaged over the run; {ns['measurements']} "
            f"measurements, {ns['how']}; {100 * ns['overhead_fraction']:.1f}% of the time): suggested global batch "
            f"~{ns['suggested_batch']}: {ns['why']}")
