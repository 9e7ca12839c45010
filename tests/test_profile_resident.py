"""The device-resident loader fix, verified by hasten itself (issue 32, item 5): in its verification run
the training loader's batches are gathered from the warm-up's batches kept in memory."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hasten.profile.inject import resident
from hasten.profile.launcher import ProfileConfig, profile
from profile_helpers import verify_only, verify_rounds

SCRIPTS = Path(__file__).parent / "profile_scripts"


class _Iter:
    """A loader iterator's stand-in: batch k holds rows 10k .. 10k+3, a per-batch step count, a name."""

    def __init__(self):
        self.drawn = 0

    def next(self):
        k, self.drawn = self.drawn, self.drawn + 1
        rows = torch.arange(10 * k, 10 * k + 4)
        return {"x": rows.float().unsqueeze(1), "y": rows, "step": torch.tensor(k), "name": "batch"}


def test_after_the_warm_up_batches_are_gathered_from_the_warm_ups_batches_without_the_loader():
    it, st = _Iter(), SimpleNamespace(phase="warmup")
    warm = [resident.draw(st, it, _Iter.next) for _ in range(3)]
    assert it.drawn == 3 and [int(b["step"]) for b in warm] == [0, 1, 2]
    st.phase = "measure"
    pool_rows = {10 * k + r for k in range(3) for r in range(4)}
    for _ in range(20):
        b = resident.draw(st, it, _Iter.next)
        assert b["x"].shape == (4, 1) and set(b["y"].tolist()) <= pool_rows
        assert torch.equal(b["x"].squeeze(1).long(), b["y"])  # the rows' tensors stay paired
        assert int(b["step"]) == 0 and b["name"] == "batch"  # not rows: handed on as the first batch had them
    assert it.drawn == 3  # the loader was never asked again


@pytest.mark.slow
def test_verify_measures_the_device_resident_loader(monkeypatch):
    verify_rounds(monkeypatch, 2)  # x5 by construction: 2 rounds verify it
    verify_only(monkeypatch, "resident")  # the workers and echo fixes' re-runs: test_profile_launcher's
    # 16 items x 2 ms of storage latency a batch against an 8 ms step: gathered from memory, the sleeps are gone
    cmd = (sys.executable, str(SCRIPTS / "input_bound.py"), "--item-sleep", "0.002")
    a = profile(ProfileConfig(cmd, warmup=3, steps=12, probe_steps=4, capture=True, timeout_s=240, verify=True),
                log=lambda m: None)
    fixes = a.recommendations + [SimpleNamespace(**r) for r in a.rejected if "fix" in r]
    res = next(r for r in fixes if r.fix == "device-resident loader")
    assert res.apply == "resident" and res.verified_speedup is not None, a.notes
    # by construction x5 (40 ms as run, 8 ms of step): far above any overhead of the gather
    assert res.verified_speedup > 2
