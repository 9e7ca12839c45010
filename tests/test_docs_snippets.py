"""Every Python block in README.md and docs/*.md runs as the program a user would paste.

A ```python block runs as it is. A ```diff block (the README shows adoption as a small diff
over a plain PyTorch loop) runs as the program after the change: its context and ``+``
lines, without the ``-`` lines and without the marker column. docs/results/ holds result
pages, not programs, and is not read.

Each block runs in a fresh interpreter, in a directory of its own that holds the small data
the blocks name: ``cifar10-jpeg.tar.xz`` (10 classes of 32x32 JPEGs in the layout
``hasten data jpeg`` writes, 52 training and 4 test images per class, enough for one batch
of 512) and ``imagenet-shards/`` (the same images packed as ``hasten data pack`` packs
them). The blocks pick their device themselves, so here they run on the CPU. A block that
starts torch.distributed (``init_distributed`` or ``init_process_group``) runs under
torchrun with 2 local processes on gloo, as it would on a machine without a GPU. No block
is skipped: one that cannot run here is a fragment to complete, not an exception to list.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = ("python", "diff")
# A block takes 2 to 15 CPU seconds (torchrun's three interpreters the most); the limit is
# there to end a hang, with room for a machine shared with other jobs.
TIMEOUT_S = 120
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
PER_CLASS = {"train": 52, "test": 4}
DISTRIBUTED = re.compile(r"\b(init_distributed|init_process_group)\(")
FENCE = re.compile(r"^```(\S*)\s*$")


def diff_to_program(text: str) -> str:
    """The program after a diff: context and ``+`` lines without their marker, no ``-`` lines."""
    lines = []
    for line in text.splitlines():
        if line.startswith("-"):
            continue
        if line[:1] in ("+", " "):
            line = line[1:]
        elif line:
            raise ValueError(f"diff line without a marker (' ', '+' or '-'): {line!r}")
        lines.append(line)
    return "\n".join(lines) + "\n"


def code_blocks(page: Path) -> list[tuple[str, str]]:
    """``(id, program)`` for each python or diff block of ``page``; the id is ``PAGE:LINE``
    of the opening fence, the page relative to the repository."""
    blocks, language, start, body = [], None, 0, []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        fence = FENCE.match(line)
        if language is None:
            if fence:
                language, start, body = fence.group(1), number, []
        elif fence and not fence.group(1):
            if language in LANGUAGES:
                text = "\n".join(body) + "\n"
                blocks.append((f"{page.relative_to(ROOT)}:{start}", diff_to_program(text) if language == "diff" else text))
            language = None
        else:
            body.append(line)
    return blocks


BLOCKS = [block for page in PAGES for block in code_blocks(page)]

def _param(block_id: str, program: str):
    marks = [pytest.mark.multiproc] if DISTRIBUTED.search(program) else []
    return pytest.param(block_id, program, marks=marks, id=block_id)


def _jpeg(rng: np.random.Generator, label: int) -> bytes:
    """A 32x32 JPEG whose mean colour says its class, so a few steps learn something."""
    img = rng.integers(0, 96, (32, 32, 3), dtype=np.uint8)
    img[..., label % 3] += np.uint8(16 * label + 8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "JPEG", quality=75)
    return buf.getvalue()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """``cifar10-jpeg.tar.xz`` and ``imagenet-shards/``, made once for every block."""
    root = tmp_path_factory.mktemp("docs-data")
    rng = np.random.default_rng(0)
    archive = root / "cifar10-jpeg.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        for split, n in PER_CLASS.items():
            for label, name in enumerate(CLASSES):
                for i in range(n):
                    data = _jpeg(rng, label)
                    info = tarfile.TarInfo(f"{split}/{name}/{i:04d}.jpg")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    from hasten.stream.pack import pack

    pack(archive, root / "imagenet-shards", shard_bytes=64 << 10)
    return root


def test_blocks_found():
    """The extraction sees the blocks the pages hold (README's diffs and docs' programs)."""
    pages = {block_id.split(":")[0] for block_id, _ in BLOCKS}
    assert "README.md" in pages and "docs/streaming.md" in pages
    assert len(BLOCKS) >= 10


def test_diff_to_program():
    diff = "+import math\n x = 1\n-x = 2\n+y = math.sqrt(x)\n\n print(y)\n"
    assert diff_to_program(diff) == "import math\nx = 1\ny = math.sqrt(x)\n\nprint(y)\n"
    with pytest.raises(ValueError, match="without a marker"):
        diff_to_program("x = 1\n")


def run_block(program: str, data_dir: Path, work: Path) -> tuple[int | None, str]:
    """Run ``program`` in ``work`` (beside links to the data) as a user would: ``(exit
    status, stderr)``, status None after ``TIMEOUT_S``."""
    work.mkdir()
    for entry in data_dir.iterdir():
        (work / entry.name).symlink_to(entry)
    (work / "snippet.py").write_text(program)
    command = [sys.executable, "snippet.py"]
    if DISTRIBUTED.search(program):
        command[1:1] = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
           "HASTEN_CACHE": str(work / "cache"), "HASTEN_RUNS": str(work / "runs")}
    try:
        done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        return None, exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
    return done.returncode, done.stderr


@pytest.fixture(scope="module")
def block_runs(request, data_dir, tmp_path_factory):
    """The selected blocks, started as soon as the data is made and run two at a time
    (each is mostly one process: two keep 2 cores busy): a future per block id."""
    selected = [item.callspec.params["block_id"] for item in request.session.items
                if item.module is request.module and item.originalname == "test_block_runs"]
    programs = dict(BLOCKS)
    pool = ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1))
    futures = {block_id: pool.submit(run_block, programs[block_id], data_dir, tmp_path_factory.mktemp("block") / "work")
               for block_id in selected}
    yield futures
    pool.shutdown(cancel_futures=True)


@pytest.mark.parametrize("block_id, program", [_param(*block) for block in BLOCKS])
def test_block_runs(block_id, program, block_runs):
    status, stderr = block_runs[block_id].result()
    if status is None:
        pytest.fail(f"{block_id} did not finish within {TIMEOUT_S} s:\n{stderr[-6000:]}\n--- program ---\n{program}")
    assert status == 0, f"{block_id} exited {status}:\n{stderr[-6000:]}\n--- program ---\n{program}"
