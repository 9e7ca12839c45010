"""Serve runs of the peer, airbench 0.1.8's ``train94`` (Keller Jordan's airbench94), one
at a time on request, so that the speedrun section interleaves them with hasten's runs
on the same GPU. Started by ``benchmarks/gpu/peer.py`` (``PeerProcess``) in a process of
its own (airbench's globals, cuDNN state and allocator stay out of hasten's process),
with the working directory holding ``cifar10/train.pt`` and ``cifar10/test.pt``
(airbench's ``CifarLoader('cifar10')`` reads them there) and airbench on
``PYTHONPATH``. Imports nothing from hasten.

Protocol (lines): the process prints ``@@ready {json}`` once airbench is imported;
each ``run N`` on its standard input trains ``train94(run=N)`` and prints
``@@result {json}`` (``tta_accuracy``, ``time_s``: airbench's own clock; ``wall_s``:
the whole call), or ``@@error message``; ``quit`` ends it. airbench's own table is
printed as it comes; the parent echoes it.

Timing: airbench's own CUDA-event clock (``airbench.utils.train``): the whitening
set-up, every training epoch (including its loader's first-epoch normalisation,
flip and padding on the device) and the final TTA evaluation; not the data loading
onto the GPU, building the network, or the per-epoch validation. That is the span
hasten's speedrun times. ``train94`` returns only the network, so the final row of
its table (TTA accuracy and total seconds) is read where airbench prints it.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

TAG_READY, TAG_RESULT, TAG_ERROR = "@@ready", "@@result", "@@error"


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


def say(tag: str, payload) -> None:
    text = payload if isinstance(payload, str) else json.dumps(payload)
    print(f"{tag} {text}", flush=True)


def main(argv=None) -> int:
    import airbench
    import torch
    from airbench import lib_airbench94, utils

    cuda = torch.cuda.is_available()  # airbench itself needs CUDA; the wiring is tested without
    final = capture_final_rows(utils)
    say(TAG_READY, {"peer": "airbench==0.1.8 train94", "airbench_file": os.path.basename(lib_airbench94.__file__),
                    "hyp": lib_airbench94.hyp, "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name() if cuda else None, "pid": os.getpid()})
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            return 0
        if words[0] != "run" or len(words) != 2:
            say(TAG_ERROR, f"unknown request {line.strip()!r}: 'run N' or 'quit'")
            continue
        final.clear()
        try:
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            airbench.train94(run=int(words[1]), verbose=True)
            if cuda:
                torch.cuda.synchronize()
            wall = time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which decides
            say(TAG_ERROR, f"{type(exc).__name__}: {exc} | " + " / ".join(traceback.format_exc().splitlines()[-3:]))
            continue
        if "time_s" not in final:
            say(TAG_ERROR, "airbench printed no final row (is this airbench 0.1.8?)")
            continue
        say(TAG_RESULT, {**final, "wall_s": wall, "run": int(words[1])})
        if cuda:
            torch.cuda.empty_cache()  # hasten's next run shares the GPU
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
