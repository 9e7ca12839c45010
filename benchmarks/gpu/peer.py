"""The peer: the real airbench package (``airbench==0.1.8`` from PyPI, Keller Jordan;
its ``train94`` is airbench94, 94.01% on canonical CIFAR-10 in 3.83 s on an A100 as
published), run on the same GPU and the same CIFAR-10-JPEG copy as hasten's speedrun.

airbench is a benchmark dependency only, never one of the package: its source
distribution travels to the GPU machine in the ``.whl`` carry folder (docs/gpu.md)
and is unpacked into a scratch folder here, not installed (it has no compiled parts;
nothing is built). ``convert_for_airbench`` writes hasten's decoded images in the
format airbench's ``CifarLoader`` reads: ``cifar10/train.pt`` and ``cifar10/test.pt``,
each ``torch.save({'images': uint8 (N, 32, 32, 3) NHWC, 'labels': int64 (N,),
'classes': [names]})`` (without them it would try to download canonical CIFAR-10).
The same decoded pixels, so the two systems see the same data.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from collections import deque
from pathlib import Path

import torch

from gpu.plan import mean_std
from hasten.data import ImageDataset
from hasten.errors import ConfigError

PEER = "airbench==0.1.8"
SDIST_NAME = "airbench-0.1.8.tar.gz"
# PyPI's sha256 of airbench-0.1.8.tar.gz (what `pip download airbench==0.1.8 --no-binary :all:` fetches).
SDIST_SHA256 = "f85885d8afe9018b8da132a4224ad7b47d75c9f99fd985d0a687567a25cf4a33"
PUBLISHED = "94.01% on canonical CIFAR-10 (n=1000) in 3.83 s on an A100 (airbench README, airbench94.py)"
RUNNER = Path(__file__).with_name("peer_run.py")


def convert_for_airbench(data: ImageDataset, folder: Path) -> dict:
    """Write ``folder/train.pt`` and ``folder/test.pt`` as airbench's CifarLoader reads them."""
    folder.mkdir(parents=True, exist_ok=True)
    shapes = {}
    for split in ("train", "test"):
        part = getattr(data, split)
        images = part.images.permute(0, 2, 3, 1).contiguous()  # hasten: NCHW; airbench: NHWC (as CIFAR's numpy)
        torch.save({"images": images, "labels": part.labels.clone(), "classes": list(data.classes)},
                   folder / f"{split}.pt")
        shapes[split] = list(images.shape)
    return {"folder": folder.name, "format": "torch.save dict: images uint8 NHWC, labels int64, classes",
            "shapes": shapes, "classes": list(data.classes)}


def check_converted(folder: Path, data: ImageDataset) -> bool:
    """Read the files back: every pixel and label equal to hasten's, classes in the same order."""
    for split in ("train", "test"):
        saved = torch.load(folder / f"{split}.pt")
        part = getattr(data, split)
        if not (torch.equal(saved["images"].permute(0, 3, 1, 2), part.images)
                and torch.equal(saved["labels"], part.labels) and saved["classes"] == list(data.classes)):
            return False
    return True


def locate_airbench(sdist: str | os.PathLike | None) -> dict:
    """Where airbench 0.1.8 is: the source distribution ``sdist`` (checked against PyPI's
    sha256), else an installed ``airbench`` package; ``found`` False when neither is."""
    if sdist is not None and Path(sdist).is_file():
        digest = hashlib.sha256(Path(sdist).read_bytes()).hexdigest()
        if digest != SDIST_SHA256:
            raise ConfigError(f"{sdist} is not PyPI's {SDIST_NAME} (sha256 {digest[:12]}..., expected "
                              f"{SDIST_SHA256[:12]}...): fetch it with `pip download {PEER} --no-deps "
                              f"--no-binary :all:`")
        with tarfile.open(sdist) as tf:
            names = tf.getnames()
            runner = tf.extractfile("airbench-0.1.8/airbench/lib_airbench94.py").read().decode()
        return {"found": True, "kind": "sdist", "path": Path(sdist).name, "sha256": digest,
                "has_train94": "def train94(" in runner and "airbench-0.1.8/airbench/utils.py" in names}
    spec = importlib.util.find_spec("airbench")
    if spec is not None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("airbench")
        except PackageNotFoundError:
            found = None
        return {"found": found == "0.1.8", "kind": "installed", "version": found,
                "path": Path(spec.origin).parent.name}
    return {"found": False, "kind": None, "looked_for": [str(sdist) if sdist else None, "import airbench"]}


def unpack_sdist(sdist: str | os.PathLike, into: Path) -> Path:
    """The folder to put on ``PYTHONPATH``: the sdist's ``airbench/`` package, unpacked."""
    with tarfile.open(sdist) as tf:
        members = [m for m in tf.getmembers() if m.name.startswith("airbench-0.1.8/airbench/") and m.isfile()]
        tf.extractall(into, members=members, filter="data")
    return into / "airbench-0.1.8"


def run_peer(workdir: Path, pythonpath: Path | None, runs: int, budget_s: float, say) -> dict:
    """``peer_run.py`` in a subprocess; its output is echoed; its JSON is returned."""
    out = workdir / "peer_runs.json"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, str(RUNNER), "--runs", str(runs), "--budget-s", str(budget_s), "--json", str(out)]
    tail: deque[str] = deque(maxlen=30)
    with subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:
        for line in proc.stdout:
            tail.append(line.rstrip())
            say(f"  peer| {line.rstrip()}")
    if proc.returncode != 0:
        raise RuntimeError(f"the peer exited with status {proc.returncode}: {' / '.join(list(tail)[-5:])}")
    return json.loads(out.read_text())


def peer(ctx) -> dict:
    data = ctx.dataset()
    workdir = ctx.scratch / "peer"
    conversion = convert_for_airbench(data, workdir / "cifar10")
    conversion["round_trip_equal"] = check_converted(workdir / "cifar10", data)
    if not conversion["round_trip_equal"]:
        raise RuntimeError("the converted data differ from hasten's decoded images")
    source = locate_airbench(ctx.peer_sdist)
    result = {"peer": PEER, "published": PUBLISHED, "data": data.name, "conversion": conversion,
              "peer_source": source}
    if ctx.device.type != "cuda":
        return {**result, "status": "skipped", "skipped": "needs CUDA", "n_runs": 0,
                "headline": {"key": "skipped: needs CUDA (data converted, peer "
                                    + ("located)" if source["found"] else "not found here)"), "n": 0, "spread": ""}}
    if not source["found"]:
        raise ConfigError(f"{PEER} not found: put {SDIST_NAME} at {ctx.peer_sdist} (docs/gpu.md)")
    pythonpath = unpack_sdist(ctx.peer_sdist, ctx.scratch / "peer-src") if source["kind"] == "sdist" else None
    report = run_peer(workdir, pythonpath, ctx.sizes.peer_runs, ctx.time_left(), ctx.say)
    runs = report.pop("runs")
    acc, acc_std = mean_std([r["tta_accuracy"] for r in runs])
    t, t_std = mean_std([r["time_s"] for r in runs])
    result.update(report, n_runs=len(runs), peer_mean_accuracy=acc, peer_std_accuracy=acc_std,
                  peer_mean_time_s=t, peer_std_time_s=t_std, peer_runs=runs,
                  timed_peer="airbench's own CUDA-event clock: whitening set-up, training epochs (with the "
                             "loader's first-epoch preprocessing on the device), final TTA evaluation; not "
                             "loading data onto the GPU, building the net, per-epoch validation",
                  timed_hasten="hasten.recipes.speedrun: the same spans (see the speedrun section's `timed`)")
    hasten = ctx.previous("speedrun")
    row = next((p for p in (hasten or {}).get("presets", []) if p["preset"] == "airbench94"), None)
    if row is None:
        result.update(hasten_mean_accuracy=None, accuracy_delta=None, time_ratio=None,
                      note="no hasten airbench94 result in this run or in the output folder: run the speedrun "
                           "section first")
        key = f"peer {acc:.2%} in {t:.2f} s (no hasten result to compare)"
    else:
        result.update(hasten_mean_accuracy=row["mean_accuracy"], hasten_mean_time_s=row["mean_time_s"],
                      hasten_n_runs=row["n_runs"],
                      accuracy_delta=100 * (row["mean_accuracy"] - acc),  # points, hasten minus peer
                      time_ratio=row["mean_time_s"] / t)                  # hasten / peer
        key = (f"hasten/peer time x{result['time_ratio']:.2f}, accuracy {result['accuracy_delta']:+.2f} pt "
               f"(peer {acc:.2%} in {t:.2f} s)")
    result["headline"] = {"key": key, "n": len(runs), "spread": f"peer ±{100 * acc_std:.2f} pt, ±{t_std:.2f} s"}
    return result
