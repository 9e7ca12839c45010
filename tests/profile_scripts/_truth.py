"""Ground truth for the profile tests and benchmark: a script times its own optimizer steps.

Set by the caller in the environment, never by ``hasten profile``:

- ``HASTEN_TRUTH_OUT``: write ``{"step_s": mean seconds per optimizer step}`` here
  (``.rank<N>`` appended under torchrun) after ``HASTEN_TRUTH_WARMUP`` + ``HASTEN_TRUTH_STEPS``
  steps, then exit;
- ``HASTEN_TRUTH_MODE``: ``asrun`` (default), ``datafree`` (the script reuses its first batch
  instead of making new ones) or ``commoff`` (the script skips its gradient averaging).

Without ``HASTEN_TRUTH_OUT`` the script runs as written and :meth:`Truth.tick` does nothing.
"""

import json
import os
import time


class Truth:
    def __init__(self) -> None:
        self.out = os.environ.get("HASTEN_TRUTH_OUT")
        self.mode = os.environ.get("HASTEN_TRUTH_MODE", "asrun") if self.out else "asrun"
        self.warmup = int(os.environ.get("HASTEN_TRUTH_WARMUP", "3"))
        self.steps = int(os.environ.get("HASTEN_TRUTH_STEPS", "10"))
        self.n = 0
        self.t0 = None

    @property
    def data_free(self) -> bool:
        return self.mode == "datafree"

    @property
    def comm_off(self) -> bool:
        return self.mode == "commoff"

    def tick(self) -> None:
        """Call right after each optimizer step."""
        if not self.out:
            return
        self.n += 1
        if self.n == self.warmup:
            self.t0 = time.perf_counter()
        elif self.n == self.warmup + self.steps:
            path = self.out + (f".rank{os.environ['RANK']}" if "RANK" in os.environ else "")
            with open(path, "w") as f:
                json.dump({"step_s": (time.perf_counter() - self.t0) / self.steps, "mode": self.mode}, f)
            os._exit(0)


def sleep_module():
    """An nn.Module that stands for accelerator time: it sleeps ``s`` seconds in its forward."""
    import torch

    class Device(torch.nn.Module):
        def __init__(self, s: float) -> None:
            super().__init__()
            self.s = s

        def forward(self, x):
            time.sleep(self.s)
            return x

    return Device


def decode_dataset():
    """A Dataset class whose items each cost ``work`` seconds of CPU (:func:`burn`), as decoding a JPEG
    does: ``decode_dataset()(work)``, 100,000 items of 32 random features and a label of two classes."""
    import torch

    class Decode(torch.utils.data.Dataset):
        def __init__(self, work: float) -> None:
            self.work = work

        def __len__(self):
            return 100000

        def __getitem__(self, i):
            burn(self.work)
            return torch.randn(32), i % 2

    return Decode


def burn(seconds: float) -> None:
    """Busy CPU for ``seconds`` of this process's CPU time (decoding, tokenizing): CPU seconds, which a
    loaded machine stretches in wall time but not in amount."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
