"""The tests that need a GPU: ``python -m pytest -n 0 -m gpu -q`` in a subprocess, from the
repository root; passed, failed, skipped and error counts from pytest's summary line.
The section fails when a test fails or errors, or pytest itself cannot run, or it is
still running when the time left runs out (it is stopped then: the timeout is the
section's time left, at most ``tests_timeout_s``)."""

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


def timeout_for(ctx) -> float:
    """pytest's time limit: the section's time left (budgets enforced), at most ``tests_timeout_s``."""
    limit = ctx.sizes.tests_timeout_s
    return max(min(limit, ctx.time_left()), 1.0) if ctx.enforce_budgets else limit


def gpu_test_files() -> list[str]:
    """The test files that hold GPU tests (``pytest.mark.gpu``): collecting only them saves
    importing every other test module (half a minute on 2 CPU cores)."""
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py") if "mark.gpu" in p.read_text())


def tests(ctx) -> dict:
    # -n 0: in one process, not pyproject's xdist workers (each of which imports torch and the test modules
    # again: 8.7 CPU seconds against 2.9 for the 7 GPU tests skipped on a CPU); the GPU tests share one device
    cmd = [sys.executable, "-m", "pytest", "-n", "0", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider",
           *gpu_test_files()]
    timeout = timeout_for(ctx)
    try:
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return {"command": "python -m pytest -n 0 -m gpu -q -rs", "status": "error", "timeout_s": timeout,
                "error": f"pytest -m gpu still running after {timeout:.0f} s (the time left): stopped",
                "output_tail": out.strip().splitlines()[-40:],
                "headline": {"key": f"stopped after {timeout:.0f} s", "n": 0, "spread": ""}}
    output = done.stdout + done.stderr
    counts = parse_summary(output)
    tail = output.strip().splitlines()[-40:]
    result = {"command": "python -m pytest -n 0 -m gpu -q -rs", "returncode": done.returncode, "timeout_s": timeout,
              **counts,
              "output_tail": tail,
              "headline": {"key": f"{counts['passed']} passed, {counts['failed']} failed, "
                                  f"{counts['skipped']} skipped", "n": 1, "spread": ""}}
    ran = sum(counts[k] for k in ("passed", "failed", "skipped", "errors"))
    if counts["failed"] or counts["errors"] or done.returncode not in (0, 5) or (done.returncode == 0 and not ran):
        result["status"] = "error"
        result["error"] = (f"pytest -m gpu: {counts['failed']} failed, {counts['errors']} errors, "
                           f"exit status {done.returncode}")
    return result
