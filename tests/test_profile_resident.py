"""The device-resident loader fix, verified by hasten itself (issue 32, item 5): in its verification run
the training loader's batches are gathered from the warm-up's batches kept in memory. Its verification on a
real command (the profile's recommendation, its re-runs, x10 by construction) shares its runs with the
verification's own tests: tests/test_profile_verify.py::test_verify_measures_the_device_resident_loader."""

from types import SimpleNamespace

import torch

from hasten.profile.inject import resident


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
