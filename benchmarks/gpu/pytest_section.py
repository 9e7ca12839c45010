"""The tests that need a GPU: ``python -m pytest -m gpu -q`` in a subprocess, from the
repository root; passed, failed, skipped and error counts from pytest's summary line.
The section fails when a test fails or errors, or pytest itself cannot run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COUNTS = ("passed", "failed", "skipped", "errors", "deselected", "xfailed", "xpassed")


def parse_summary(output: str) -> dict:
    """Counts from pytest's last summary line, e.g. ``3 passed, 1 skipped, 740 deselected in 6.2s``."""
    lines = [line for line in output.strip().splitlines() if re.search(r"\d+ \w+.* in [\d.]+s", line)]
    counts = dict.fromkeys(COUNTS, 0)
    for number, word in re.findall(r"(\d+) (\w+)", lines[-1] if lines else ""):
        word = "errors" if word == "error" else word
        if word in counts:
            counts[word] = int(number)
    return counts


def tests(ctx) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=ctx.sizes.tests_timeout_s)
    output = done.stdout + done.stderr
    counts = parse_summary(output)
    tail = output.strip().splitlines()[-40:]
    result = {"command": "python -m pytest -m gpu -q -rs", "returncode": done.returncode, **counts,
              "output_tail": tail,
              "headline": {"key": f"{counts['passed']} passed, {counts['failed']} failed, "
                                  f"{counts['skipped']} skipped", "n": 1, "spread": ""}}
    ran = sum(counts[k] for k in ("passed", "failed", "skipped", "errors"))
    if counts["failed"] or counts["errors"] or done.returncode not in (0, 5) or (done.returncode == 0 and not ran):
        result["status"] = "error"
        result["error"] = (f"pytest -m gpu: {counts['failed']} failed, {counts['errors']} errors, "
                           f"exit status {done.returncode}")
    return result
