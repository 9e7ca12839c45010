"""The real-scripts benchmark's own parts: its environment's torchvision patch and pairing, the busy
neighbours, the image folders it makes, and the goal figures its summary computes (issue 43)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
if str(BENCHMARKS) not in sys.path:  # the scripts import each other, as when run from benchmarks/
    sys.path.insert(0, str(BENCHMARKS))

import profile_real_scripts as bench  # noqa: E402
import real_script_cases as cases  # noqa: E402
import _real_script_env as env  # noqa: E402

TORCHVISION_INIT = """import os
import torch
from .extension import _HAS_OPS  # usort:skip
from torchvision import _meta_registrations, datasets, io, models, ops, transforms, utils  # usort:skip
from torchvision import _autograd_registrations  # usort:skip
try:
    from .version import __version__  # noqa: F401
except ImportError:
    pass
"""


def test_patch_removes_only_the_two_registration_imports(tmp_path):
    init = tmp_path / "__init__.py"
    init.write_text(TORCHVISION_INIT)
    assert env.patch_torchvision(init)
    text = init.read_text()
    assert "_meta_registrations" not in text and "_autograd_registrations" not in text
    kept = [line for line in TORCHVISION_INIT.splitlines() if "registrations" not in line]
    assert text.splitlines() == kept
    assert not env.patch_torchvision(init)  # a second run finds nothing to remove
    assert init.read_text() == text


def test_torchvision_pairing():
    assert env.torchvision_for("2.13.0+cpu") == "0.28.*"
    assert env.torchvision_for("2.4.1") == "0.19.*"
    with pytest.raises(SystemExit):
        env.torchvision_for("1.13.1")


def test_busy_processes_spin_while_inside_and_are_gone_after():
    with bench.Busy(2) as busy:
        pids = [p.pid for p in busy.procs]
        assert len(pids) == 2 and all(p.poll() is None for p in busy.procs)
    assert all(p.poll() is not None for p in busy.procs)
    for pid in pids:
        with pytest.raises(OSError):
            os.kill(pid, 0)  # reaped: no such process any more


def test_cases_needing_the_environment_are_skipped_with_the_way_to_it(monkeypatch):
    case = next(c for c in cases.CASES if c.needs == "timm")
    monkeypatch.setattr(bench.importlib.util, "find_spec", lambda name: None)
    assert "_real_script_env.py" in bench.skip_reason(case)
    assert bench.run_case(case, 0, verify="none")["skipped"] == bench.skip_reason(case)
    other = next(c for c in cases.CASES if c.needs == "gymnasium")
    assert "pip install gymnasium" in bench.skip_reason(other)


def test_image_folder_layout(tmp_path):
    cases._image_folder(tmp_path, train=10, val=4, size=(64, 48), classes=2, distinct=3)
    for split, n in (("train", 10), ("val", 4)):
        files = sorted((tmp_path / "images" / split).glob("class*/*.jpg"))
        assert len(files) == n
        assert {f.parent.name for f in files} == {"class0", "class1"}
    with Image.open(next((tmp_path / "images" / "train").glob("class1/*.jpg"))) as im:
        assert im.size == (64, 48) and im.mode == "RGB"
    # each class's photos are distinct images, not one image under every name
    names = sorted((tmp_path / "images" / "train" / "class0").glob("*.jpg"))
    assert len({f.read_bytes() for f in names}) == 3


def _run(case, repeat, verdict, *, asrun=0.2, free=0.1, exit=0, fix=None):
    return {"case": case, "repeat": repeat, "busy": 2,
            "truth": {"asrun_s": asrun, "datafree_s": free, "asrun_steps": [asrun] * 8,
                      "datafree_steps": [free] * 8, "loaders_replayed": 1},
            "profile": {"exit": exit, "verdict": verdict, "top_fix": fix}}


def test_goal_figures():
    a, b = cases.CASES[0].name, cases.CASES[1].name   # both measured through their DataLoader
    # a: truly input-bound (half the step is data: a data fix gives at most x2)
    fix_ok = {"fix": "workers", "predicted": 1.6, "verified": 1.9, "bound": 2.0, "verified_interval": [1.8, 2.0]}
    fix_over = {"fix": "workers", "predicted": 2.5, "verified": 1.5, "bound": 3.0, "verified_interval": None}
    rows = [_run(a, 0, "input-bound", fix=fix_ok), _run(a, 1, "input-bound", fix=fix_over),
            _run(a, 2, "input-bound", fix=fix_ok),
            # b: truly compute-bound, and hasten broke it once
            _run(b, 0, "compute-bound", free=0.2), _run(b, 1, "input-bound", free=0.2),
            _run(b, 2, None, free=0.2, exit=1)]
    s = bench.judge(rows)
    g = s["goals"]
    assert g["verdicts_right"][0] == pytest.approx(4 / 5)
    assert g["same_verdict_every_repeat"][0] == pytest.approx(1 / 2) and g["same_verdict_every_repeat"][2] is False
    assert g["scripts_broken"][:1] == [1] and g["scripts_broken"][2] is False
    assert [x["repeat"] for x in s["predictions_above_bound"]] == [1]      # 2.5 > the truth's x2 ceiling
    assert g["top_fix_verified_with_interval_input_bound"][0] == pytest.approx(2 / 3)
    # verified x1.9 and x1.9 within 15% of the x2 ceiling, x1.5 not
    assert s["verified_to_truth_ceiling_within_15pct"] == "2/3"
    assert g["verified_within_15pct_of_truth"][2] is False
    assert "MISSED" in bench.goals_text(s)


def test_a_compute_fix_is_not_held_to_the_data_free_truth():
    # an input-bound verdict's #1 may be bf16 autocast (the top fix of every kind is shown): the truth's
    # data-free ceiling (x2 here) neither bounds it nor is its yardstick; a data fix above it is flagged
    a = cases.CASES[0].name
    bf16 = {"fix": "bf16 autocast", "kind": "compute", "predicted": 2.5, "verified": 2.4, "bound": 40.0,
            "verified_interval": [2.3, 2.5]}
    old_bf16 = {k: v for k, v in bf16.items() if k != "kind"}   # a run recorded before kinds were kept
    data = {"fix": "device-resident loader", "kind": "input", "predicted": 2.5, "verified": 1.95, "bound": 3.0,
            "verified_interval": [1.9, 2.0]}
    s = bench.judge([_run(a, 0, "input-bound", fix=bf16), _run(a, 1, "input-bound", fix=old_bf16),
                     _run(a, 2, "input-bound", fix=data)])
    assert [x["repeat"] for x in s["predictions_above_bound"]] == [2]
    assert s["verified_to_truth_ceiling_within_15pct"] == "1/1"


def test_no_runs_judge_no_goal_as_met():
    s = bench.judge([{"case": cases.CASES[0].name, "repeat": 0, "skipped": "needs x"}])
    assert all(met is None for _, _, met in s["goals"].values())


def test_estimate_uses_past_walls_and_skips():
    measured, guessed = cases.CASES[0], next(c for c in cases.CASES if c.needs is None and c is not cases.CASES[0])
    past = [{"case": measured.name, "truth": {"wall_s": 30}, "profile": {"wall_s": 10}}]
    assert bench.estimate([(0, measured), (1, guessed)], past) == pytest.approx(40 + guessed.est_s)
    cores = bench.usable_cores()
    assert bench.estimate([(0, measured)], past, busy=2) == pytest.approx(40 * (cores + 2) / cores)
