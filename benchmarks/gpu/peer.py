"""The peer: the real airbench package (``airbench==0.1.8`` from PyPI, Keller Jordan;
its ``train94`` is airbench94, 94.01% on canonical CIFAR-10 in 3.83 s on an A100 as
published), run on the same GPU and the same CIFAR-10-JPEG copy as hasten's speedrun,
its runs interleaved with hasten's (the speedrun section drives ``PeerProcess``, one
run per request) and kept in the speedrun section's JSON.

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
import queue
import subprocess
import sys
import tarfile
import threading
import time
from collections import deque
from pathlib import Path

import torch

from gpu.peer_run import TAG_ERROR, TAG_READY, TAG_RESULT
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


class PeerProcess:
    """``peer_run.py`` in a process of its own, serving one airbench run per ``run(n)``;
    its printed lines go to ``say`` as they come. ``close()`` ends it (also on error)."""

    def __init__(self, workdir: Path, pythonpath: Path | None, say, *, start_timeout_s: float = 120.0):
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if pythonpath is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), *filter(None, [env.get("PYTHONPATH")])])
        self.say = say
        self.tail: deque[str] = deque(maxlen=30)
        self.proc = subprocess.Popen([sys.executable, str(RUNNER)], cwd=workdir, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        self._lines: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True, name="hasten-peer-reader")
        self._reader.start()
        try:
            self.info = self._wait(TAG_READY, start_timeout_s)
        except BaseException:
            self.close()
            raise

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)  # end of output: the process ended

    def _wait(self, tag: str, timeout_s: float | None) -> dict:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                self.close()
                raise TimeoutError(f"the peer gave no {tag} within {timeout_s:.0f} s")
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                status = self.proc.wait()
                raise RuntimeError(f"the peer exited with status {status}: {' / '.join(list(self.tail)[-5:])}")
            if line.startswith(tag + " "):
                return json.loads(line[len(tag) + 1:])
            if line.startswith(TAG_ERROR + " "):
                raise RuntimeError(f"the peer failed: {line[len(TAG_ERROR) + 1:]}")
            self.tail.append(line)
            self.say(f"  peer| {line}")

    def run(self, n: int, timeout_s: float | None = None) -> dict:
        """One ``train94(run=n)``: ``tta_accuracy``, ``time_s`` (airbench's clock), ``wall_s``."""
        self.proc.stdin.write(f"run {n}\n")
        self.proc.stdin.flush()
        return self._wait(TAG_RESULT, timeout_s)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            except (BrokenPipeError, ValueError, OSError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=2)


def prepare_peer(ctx) -> tuple[dict, tuple | None]:
    """Convert the data for airbench and find it: ``(record, (workdir, pythonpath))``, or
    ``(record with status "skipped" and the reason, None)`` when the peer cannot run here.
    The converted data live in scratch space; the peer's results go to the suite's JSON."""
    data = ctx.dataset()
    workdir = ctx.scratch / "peer"
    conversion = convert_for_airbench(data, workdir / "cifar10")
    conversion["round_trip_equal"] = check_converted(workdir / "cifar10", data)
    if not conversion["round_trip_equal"]:
        raise RuntimeError("the converted data differ from hasten's decoded images")
    source = locate_airbench(ctx.peer_sdist)
    record = {"peer": PEER, "published": PUBLISHED, "conversion": conversion, "peer_source": source,
              "timed": "airbench's own CUDA-event clock: whitening set-up, training epochs (with the loader's "
                       "first-epoch preprocessing on the device), final TTA evaluation; not loading data onto the "
                       "GPU, building the net, per-epoch validation"}
    if ctx.device.type != "cuda":
        return {**record, "status": "skipped", "skipped": "needs CUDA"}, None
    if not source["found"]:
        return {**record, "status": "skipped",
                "skipped": f"{PEER} not found: put {SDIST_NAME} at {ctx.peer_sdist} (docs/gpu.md)"}, None
    pythonpath = unpack_sdist(ctx.peer_sdist, ctx.scratch / "peer-src") if source["kind"] == "sdist" else None
    return record, (workdir, pythonpath)
