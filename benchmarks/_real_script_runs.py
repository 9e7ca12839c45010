"""One run of a real script for ``profile_real_scripts.py``: its truth (``truth_run``), ``hasten profile``
on it (``profile_run``) and the fix truth of its verified #1 fix (``fix_truth_run``), each in a scratch
folder with the case's data (``prepared``), beside ``Busy`` spinners in the busy condition, with time
limits ``stretch``-ed by them.

Changes the training math: no (the scripts run unchanged; measurement only).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import _real_script_fix_truth as fix_truth
from _real_script_fix import supported as fix_supported
from _real_script_pieces import run_group
from real_script_cases import DATA, STUBS, Case
from real_script_fetch import checkout

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PY = sys.executable


def _fill(args, checkout_dir: Path, scratch: Path) -> list[str]:
    return [a.format(checkout=checkout_dir, scratch=scratch) for a in args]


def _portable(text: str, checkout_dir: Path, scratch: Path) -> str:
    return (text.replace(str(checkout_dir), "<checkout>").replace(str(scratch), "<scratch>")
            .replace(str(ROOT), "<hasten>").replace(sys.prefix, "<python>"))


def _env(case: Case, checkout_dir: Path, scratch: Path) -> dict:
    # `hasten profile -- python SCRIPT` finds python on PATH: this interpreter's first (the environment of
    # _real_script_env.py when the benchmark runs from it)
    env = {**os.environ, "PATH": os.pathsep.join((str(Path(PY).parent), os.environ.get("PATH", ""))), **dict(case.env)}
    extra = [str(checkout_dir)] if case.pythonpath else []
    if case.stubs:  # stand-ins for an online service the script logs to (real_script_cases.STUBS)
        extra.append(str(scratch / "stubs"))
    if extra:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (*extra, env.get("PYTHONPATH")) if p)
    return env


def _pin(case: Case) -> list[str]:
    return ["taskset", "-c", case.taskset] if case.taskset else []


def _tail(text: str, n: int = 6) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def stretch(busy: int) -> int:
    """How much longer the time limits are beside ``busy`` spinning processes: 1 + busy. A limit only
    catches a hang; beside 2 spinners on 2 cores a step took up to 3 x its quiet time (a DataLoader's
    workers queue behind the spinners too), and minGPT chargpt's truth ran past a quiet 400 s."""
    return 1 + busy


def truth_run(case: Case, checkout_dir: Path, scratch: Path, cwd: Path, fix: dict | None = None,
              limit: float = 400) -> dict:
    """The script under ``_real_script_truth.py``: as run against data free, or with ``fix``
    (``REAL_TRUTH_FIX``, ``REAL_TRUTH_ORDER``, ``REAL_TRUTH_PAIRS``: the fix truth) against its fix."""
    out = scratch / ("fix_truth.json" if fix else "truth.json")
    env = {**_env(case, checkout_dir, scratch), "REAL_TRUTH_OUT": str(out), "REAL_TRUTH_WARMUP": str(case.truth_warmup),
           "REAL_TRUTH_BLOCK": str(case.truth_block), "REAL_TRUTH_PAIRS": str(case.truth_pairs),
           "REAL_TRUTH_DATA_FN": case.data_fn or "", **(fix or {})}
    cmd = [*_pin(case), PY, str(HERE / "_real_script_truth.py"), str(checkout_dir / case.script),
           *_fill(case.args, checkout_dir, scratch)]
    t0 = time.perf_counter()
    code, _, err = run_group(cmd, limit, cwd=cwd, env=env)
    if code == 124 and not err:
        err = f"timed out after {limit:.0f} s"
    row = json.loads(out.read_text()) if out.exists() else {}
    row.update(exit=code, wall_s=time.perf_counter() - t0)
    if code != 0 or row.get("asrun_s") is None:
        row["error"] = _portable(_tail(err), checkout_dir, scratch)
    return row


def fix_truth_run(case: Case, checkout_dir: Path, scratch: Path, cwd: Path, row: dict, limit: float) -> dict:
    """The fix truth of a run's verified #1 fix (``_real_script_fix_truth.py``): the script as run
    against the same with the fix, in shuffled pairs of blocks of one process, at most ``limit`` s."""
    top = row["profile"].get("top_fix") or {}
    apply = fix_truth.apply_of(top)
    if not fix_supported(apply):
        return {"measured": False, "apply": apply, "fix": top.get("fix"),
                "why": f"the benchmark does not apply {apply!r}" if apply else "no apply string for this fix"}
    pairs = max(case.truth_pairs, fix_truth.PAIRS)
    seed = zlib.crc32(f"{case.name}/{row['repeat']}".encode())
    t = truth_run(case, checkout_dir, scratch, cwd, limit=limit, fix={
        "REAL_TRUTH_FIX": apply, "REAL_TRUTH_PAIRS": str(pairs), "REAL_TRUTH_ORDER": fix_truth.order(pairs, seed),
        "REAL_TRUTH_BLOCK": str(fix_truth.block_steps(case.truth_block, row["truth"].get("asrun_s")))})
    t.update(fix_truth.ratio(t) if t.get("fix_steps") else {"ratio": None, "interval": None, "n": 0},
             apply=apply, fix=top.get("fix"), seed=seed, measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    t["measured"] = t["ratio"] is not None and t["interval"] is not None and not t.get("fix_error")
    if not t["measured"]:
        t["why"] = t.get("fix_error") or t.get("error") or f"{t['n']} pair(s) of blocks measured, too few for an interval"
    return t


def _verified_interval(rec: dict) -> list[float] | None:
    """The 95% interval of a fix's verified speedup, as the profile's JSON gives it (``verification``:
    hasten.profile.verify)."""
    if (rec.get("verification") or {}).get("interval"):
        return list(rec["verification"]["interval"])
    if rec.get("verified_interval"):
        return list(rec["verified_interval"])
    if rec.get("verified_low") is not None and rec.get("verified_high") is not None:
        return [rec["verified_low"], rec["verified_high"]]
    return None


def profile_run(case: Case, checkout_dir: Path, scratch: Path, cwd: Path, verify: bool, slower: int = 1) -> dict:
    """``hasten profile --json`` on the case; its own ``--timeout`` and the benchmark's limit ``slower``
    times the quiet ones (``stretch``)."""
    js = scratch / "profile.json"
    cmd = [*_pin(case), PY, "-m", "hasten", "profile", *case.profile_args, *(["--verify"] if verify else []),
           "--json", str(js), "--quiet",
           "--timeout", str(300 * slower), "--", "python", str(checkout_dir / case.script),
           *_fill(case.args, checkout_dir, scratch)]
    # --verify re-runs the command about 3 times per fix (each under hasten's own --timeout): a slow
    # script's verification takes many minutes, which is its cost, not a hang
    limit = (2400 if verify else 500) * slower
    t0 = time.perf_counter()
    code, out, err = run_group(cmd, limit, cwd=cwd, env=_env(case, checkout_dir, scratch))
    if code == 124 and not out and not err:
        err = f"timed out after {limit} s (the benchmark's limit, not hasten's)"
    row = {"exit": code, "wall_s": time.perf_counter() - t0}
    if js.exists():
        a = json.loads(js.read_text())
        top = (a.get("recommendations") or [None])[0]
        row.update({k: a.get(k) for k in ("verdict", "severity", "step_time_s", "data_share", "data_interval",
                                          "input_kind", "data_wait_fraction", "compute_fraction",
                                          "other_fraction", "data_free_step_s", "steps", "steps_from",
                                          "num_workers", "dropped", "probes_off", "ended_early", "extended",
                                          "near")})
        row["cpu_available"] = (a.get("cpu") or {}).get("available")
        row["top_fix"] = top and {"fix": top.get("fix"), "kind": top.get("kind"), "apply": top.get("apply"),
                                  "predicted": top.get("predicted_speedup"),
                                  "verified": top.get("verified_speedup"), "bound": top.get("bound"),
                                  "verified_interval": _verified_interval(top)}
        row["other_where"] = (a.get("other_where") or [])[:2]
        row["per_step"] = _columns(a.get("per_step"))
        row["notes"] = a.get("notes")
        row["cpu"] = a.get("cpu")
    row["report"] = _portable(_tail(out, 30), checkout_dir, scratch)
    if code != 0:
        row["error"] = _portable(_tail(err + "\n" + out, 8), checkout_dir, scratch)
    return row


def _columns(records: list[dict] | None) -> dict | None:
    """Per-step records as one list per field: the field names once, not once per step."""
    if not records:
        return None
    return {k: [r.get(k) for r in records] for k in records[0]}


class Busy:
    """``k`` processes spinning on the CPU (a pure-Python loop each, as a busy neighbour's would) for as long
    as the block runs, beside the truth and the profile alike; ended by their own ids, and each ends itself
    within a fraction of a second once the benchmark is gone (a SIGKILL runs no ``__exit__``). Each spins in a
    session of its own, as another user's job does, and as the profiled scripts run: in the benchmark's session
    they would share its scheduling group, which the benchmark raises (autogroup nice -20), and take the
    cores from a script in its own group at the default share (a 1-core UNet truth got 3% of a core for 18 min)."""

    # the benchmark's pid is passed in: one read by the spinner could already be init's, had the benchmark died first
    SPIN = ("import os, sys\nwhile os.getppid() == int(sys.argv[1]):\n"
            "    for _ in range(100000):\n        pass\n")

    def __init__(self, k: int):
        self.k, self.procs = k, []

    def __enter__(self):
        self.procs = [subprocess.Popen([PY, "-c", self.SPIN, str(os.getpid())], start_new_session=True)
                      for _ in range(self.k)]
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
            p.wait()


@contextlib.contextmanager
def prepared(case: Case):
    """``(checkout, scratch, cwd, origin)`` for one run of the case: its data made in a fresh scratch
    folder, removed after."""
    src = case.source
    checkout_dir, origin = checkout(src.name, src.commit)
    scratch = Path(tempfile.mkdtemp(prefix="hasten-real-"))
    try:
        if case.data:
            DATA[case.data](checkout_dir, scratch)
        for name in case.stubs:
            (scratch / "stubs").mkdir(exist_ok=True)
            (scratch / "stubs" / f"{name}.py").write_text(STUBS[name])
        yield checkout_dir, scratch, checkout_dir if case.cwd == "checkout" else scratch, origin
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
