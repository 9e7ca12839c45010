"""benchmarks/jpeg_decoders.py --smoke and benchmarks/pipeline_peers.py: they run with whatever is
installed, skip (and name) what is not, and every route crops the same box."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPT = BENCH / "jpeg_decoders.py"

# Makes the optional routes' packages look absent in a child process: only hasten's required
# dependencies (torch, numpy, Pillow, simplejpeg) are left.
BLOCKER = '''
import importlib.abc, importlib.metadata, sys
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("cv2", "nvidia"):
            raise ImportError(f"{name} blocked by the test")
        return None
sys.meta_path.insert(0, _Block())
_real = importlib.metadata.distribution
def _distribution(name):
    if name in ("turbojpeg", "pyturbojpeg"):
        raise importlib.metadata.PackageNotFoundError(name)
    return _real(name)
importlib.metadata.distribution = _distribution
'''


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    """Ten photo-like JPEGs of about 300x200: every crop box at 224 and 128 is decoded at full scale."""
    root = tmp_path_factory.mktemp("jpegs") / "c0"
    root.mkdir()
    rng = np.random.default_rng(0)
    for i in range(10):
        h, w = (200, 300) if i % 2 else (260, 190)
        yy, xx = np.mgrid[0:h, 0:w]
        img = np.stack([xx * 0.6 + 40, yy * 0.7 + 30, (xx + yy) * 0.3 + 60], -1) + rng.normal(0, 12, (h, w, 3))
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(root / f"{i:02d}.jpg", quality=90)
    return root


def _run(folder: Path, out: Path, env_path: Path | None = None) -> subprocess.CompletedProcess:
    import os

    env = dict(os.environ)
    if env_path is not None:
        env["PYTHONPATH"] = f"{env_path}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--folder", str(folder), "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env=env)


def test_smoke_every_installed_route_runs_on_the_same_boxes(jpegs, tmp_path):
    out = tmp_path / "r.json"
    proc = _run(jpegs, out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(out.read_text())
    assert r["data"]["images"] == 8 and r["repeats"] == 1 and "load_average_before" in r["conditions"]
    for name, row in r["decoders"].items():
        assert row["images_per_cpu_s"]["224"]["mean"] > 0 and row["images_per_cpu_s"]["128"]["mean"] > 0, name
    # The same box through the same filter (antialiased bilinear) gives the same pixels to rounding;
    # a route that cropped another box, or forgot cv2's BGR order, would differ by tens of levels.
    diff = {name: row["mean_abs_diff_vs_pillow_full"] for name, row in r["decoders"].items()}
    assert diff["Pillow full"] == {"224": 0.0, "128": 0.0}
    for name in ("simplejpeg full", "simplejpeg DCT-scaled (hasten before)", "hasten region (decode_region)",
                 "PyTurboJPEG scaled", "PyTurboJPEG crop + scaled", "Pillow draft"):
        if name in diff:
            assert diff[name]["224"] < 1.0 and diff[name]["128"] < 1.0, (name, diff[name])
    for name in diff:
        if name.startswith("cv2"):  # other filters (INTER_AREA, plain bilinear), same box and channels
            assert diff[name]["224"] < 6.0, (name, diff[name])
    assert r["resize_ms_per_image"]["torch interpolate antialias (uint8)"]["224"]["mean"] > 0
    assert "route (one thread)" in proc.stdout
    if importlib.util.find_spec("cv2") is None:
        assert "OpenCV" in r["skipped"]


def test_smoke_runs_with_only_the_required_dependencies(jpegs, tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(BLOCKER)
    out = tmp_path / "r.json"
    proc = _run(jpegs, out, env_path=tmp_path / "site")
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(out.read_text())
    assert {"OpenCV", "PyTurboJPEG", "hasten region", "DALI"} <= set(r["skipped"])
    assert set(r["decoders"]) == {"Pillow full", "Pillow draft", "simplejpeg full",
                                  "simplejpeg DCT-scaled (hasten before)"}
    assert r["dali"] == {} and "skipped DALI" in proc.stderr


def _peers():
    sys.path.insert(0, str(BENCH))
    try:
        import pipeline_peers
    finally:
        sys.path.remove(str(BENCH))
    return pipeline_peers


def test_dali_absent_is_one_clear_line(monkeypatch):
    peers = _peers()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n.startswith("nvidia") else real(n, *a))
    monkeypatch.setattr(peers, "_reason", False)
    assert not peers.dali_available()
    with pytest.raises(RuntimeError, match=r"^DALI is not installed \(pip install nvidia-dali-cuda120"):
        peers.dali_cpu_iter([("x.jpg", 0)], 32, 4, 1, 0)


def test_dali_cpu_iter_gives_each_file_once_as_uint8_nchw(jpegs):
    peers = _peers()
    if not peers.dali_available():
        pytest.skip(peers.dali_unavailable_reason())
    files = [(str(p), i % 3) for i, p in enumerate(sorted(jpegs.glob("*.jpg")))]
    make = peers.dali_cpu_iter(files, size=32, batch_size=4, threads=1, seed=0)
    batches = list(make())
    assert [len(x) for x, _ in batches] == [4, 4, 2]
    for x, y in batches:
        assert x.dtype == torch.uint8 and tuple(x.shape[1:]) == (3, 32, 32) and y.dtype == torch.int64
    labels = sorted(int(v) for _, y in batches for v in y)
    assert labels == sorted(c for _, c in files)
    x = torch.cat([b for b, _ in batches]).float()
    assert x.std() > 5 and 40 < x.mean() < 220  # decoded pictures, not zero padding
    assert len(list(make())) == 3  # the callable makes a fresh epoch each time
