"""Step boundaries on a GPU: work is asynchronous there, so a time is read only after the device is done.

Changes the training math: no.
"""

from __future__ import annotations

from hasten.profile.inject.state import State


def sync(st: State | None) -> None:
    # GPU work is asynchronous: without this a step would look as long as its launches.
    if st is not None and st.device == "cuda":
        import torch
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
