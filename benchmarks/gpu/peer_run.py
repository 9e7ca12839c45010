"""Run the peer, airbench 0.1.8's ``train94`` (Keller Jordan's airbench94), n times on
this GPU and write what its own clock measured. Started by ``benchmarks/gpu/peer.py``
in a subprocess of its own (airbench's globals, cuDNN state and allocator stay out of
hasten's process), with the working directory holding ``cifar10/train.pt`` and
``cifar10/test.pt`` (airbench's ``CifarLoader('cifar10')`` reads them there) and
airbench on ``PYTHONPATH``. Imports nothing from hasten.

Timing: airbench's own CUDA-event clock (``airbench.utils.train``): the whitening
set-up, every training epoch (including its loader's first-epoch normalisation,
flip and padding on the device) and the final TTA evaluation; not the data loading
onto the GPU, building the network, or the per-epoch validation. That is the span
hasten's speedrun times. ``train94`` returns only the network, so the final row of
its table (TTA accuracy and total seconds) is read where airbench prints it.
One full untimed run first (airbench's ``warmup94`` trains a single step; a full run
also autotunes the evaluation's shapes, as hasten's warm-up does).

    python peer_run.py --runs 20 --budget-s 150 --json peer_runs.json
"""

from __future__ import annotations

import argparse
import json
import os
import time


def capture_final_rows(utils) -> dict:
    """Wrap ``utils.print_training_details`` so that each run's final row (TTA accuracy,
    total seconds) lands in the returned dict; airbench's table still prints."""
    final: dict = {}
    original = utils.print_training_details

    def capture(variables, is_final_entry):
        if is_final_entry:
            final["tta_accuracy"] = float(variables["tta_val_acc"])
            final["time_s"] = float(variables["total_time_seconds"])
        return original(variables, is_final_entry)

    utils.print_training_details = capture
    return final


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--budget-s", type=float, default=float("inf"), help="start no run after this many seconds")
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)

    import airbench
    import torch
    from airbench import lib_airbench94, utils

    cuda = torch.cuda.is_available()  # airbench itself needs CUDA; the wiring is tested without
    final = capture_final_rows(utils)

    def one(run) -> dict:
        final.clear()
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        airbench.train94(run=run, verbose=True)
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        if "time_s" not in final:
            raise SystemExit("peer_run.py: airbench printed no final row (is this airbench 0.1.8?)")
        return {**final, "wall_s": wall}

    report = {"peer": "airbench==0.1.8 train94", "airbench_file": os.path.basename(lib_airbench94.__file__),
              "hyp": lib_airbench94.hyp, "torch": torch.__version__, "gpu": torch.cuda.get_device_name() if cuda else None,
              "n_planned": args.runs, "runs": [], "cut_short": False}
    start = time.perf_counter()
    report["warmup_run"] = one(0)
    per_run = report["warmup_run"]["wall_s"]
    for i in range(args.runs):
        if report["runs"] and time.perf_counter() - start + per_run > args.budget_s:
            report["cut_short"] = True
            break
        report["runs"].append(one(i + 1))
        per_run = report["runs"][-1]["wall_s"]
        _write(args.json, report)  # after every run: a peer cut off keeps its runs
    _write(args.json, report)
    return 0


def _write(path: str, report: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(report, f, indent=2)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    raise SystemExit(main())
