"""Every GPU claim of hasten measured on one GPU, section by section, within one overall
budget (20 minutes of an H100 including start-up); every run is written to
``<out>/<section>.json`` the moment it ends (a run cut off, or a later failure, keeps
what finished), one short table ends the run, and ``--report`` makes a page of it.

    python benchmarks/gpu_suite.py --data cifar10-jpeg.tar.xz --out gpu-results      # run (again: resumes)
    python benchmarks/gpu_suite.py --report --out gpu-results                        # gpu-results/report.md
    python benchmarks/gpu_suite.py --only speedrun,ablation                          # some sections
    python benchmarks/gpu_suite.py --smoke                                           # CPU, toy sizes

Sections (``gpu.plan.SECTIONS``; their modules under benchmarks/gpu/ say what each
measures and what its clock holds):

- speedrun: the airbench94 preset and its torch.compile variant, and the peer (airbench
  0.1.8's train94 on the same GPU and data, same clock spans), n = 20 each, interleaved
  in rounds after one untimed full run each; accuracy and time (mean, 95% interval),
  FLOPs, achieved TFLOP/s, fraction of the bf16 matmul rate; hasten against the peer.
- ablation: the speedrun ladder to the peer's mean accuracy; time and epochs per rung.
- echo: ``hasten echo``'s GPU preset at R about 6: e = 1, fixed e, AutoEcho, n = 3.
- large_batch: ResNet-18 at batch 512 / 2048 / 8192, SGD against LARS, n = 2; group BN.
- throughput: fp32 (TF32 off) vs bf16, channels_last vs not; GpuLoader vs a torch DataLoader.
- tests: ``pytest -m gpu``.

Budgets: each section has its own (``gpu.plan.FULL``) and the suite one overall
(``--budget-s``, by default their sum); work starts only if its estimate fits the time
left of both, and a section that cannot start is skipped with the reason. A section
that fails writes its JSON with an ``error`` and its finished runs, and the suite goes
on; the exit status is then 1. Each section starts from the same process-wide torch
settings (cuDNN autotuning, TF32, threads): what one changes is put back before the
next. Each JSON holds the conditions it ran under (``MeasuredConditions``), its budget
and wall time, and a ``headline`` (key number, n, spread) that the table shows.
``--resume`` (the default when ``--out`` already holds results of a full run) runs
only the sections without a finished record, so the same command continues a run
that a time limit cut off. docs/gpu.md: install, run, read the report.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# The sections live in benchmarks/gpu/; hasten itself runs from this checkout when it is not
# installed, with the wheels of ``benchmarks/gpu/install.sh --offline`` ($HASTEN_SITE); the
# subprocesses (pytest, the peer) get the same path.
SITE = Path(os.environ.get("HASTEN_SITE", "/tmp/hasten-site"))
_paths = [str(HERE), str(REPO)] + ([str(SITE)] if SITE.is_dir() else [])
for _p in reversed(_paths):
    if _p not in sys.path:
        sys.path.insert(0, _p)
os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(
    [str(REPO)] + _paths[2:] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))

import numpy as np
import torch
from gpu.context import Context, restore_torch_settings, torch_settings
from gpu.plan import FULL, SECTIONS, SMOKE, STARTUP_S

from hasten.environment import pick_device
from hasten.errors import ConfigError
from hasten.rundir import runs_root, write_json

from _common import RESULTS, MeasuredConditions, add_data_argument

DEFAULT_OUT = RESULTS / "gpu"
DEFAULT_SDIST = os.path.join(".whl", "airbench-0.1.8.tar.gz")


def section_functions() -> dict:
    """name -> section(ctx) -> dict; imported here so that ``--table`` needs none of them."""
    from gpu.echo_section import echo
    from gpu.large_batch_section import large_batch
    from gpu.pytest_section import tests
    from gpu.speedrun_sections import ablation, speedrun
    from gpu.throughput_section import throughput

    return {"speedrun": speedrun, "ablation": ablation, "echo": echo, "large_batch": large_batch,
            "throughput": throughput, "tests": tests}


def parse_only(text: str | None) -> list[str]:
    if not text:
        return list(SECTIONS)
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown or not names:
        raise ConfigError(f"--only: unknown section(s) {', '.join(unknown) or '(none given)'}; "
                          f"choose from {','.join(SECTIONS)}")
    return [n for n in SECTIONS if n in names]  # always in the suite's order: later sections read earlier ones


def seed_everything(seed: int = 0) -> None:
    """The same random state at the start of every section: a section's result does not
    depend on which sections ran before it."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run_sections(names: list[str], ctx: Context, functions: dict) -> list[dict]:
    """Run ``names`` in order; each record is written to ``<out>/<name>.json`` as soon as it
    is complete (runs inside a section are written as they end: ``Context.checkpoint``).
    An exception becomes ``status: error`` with the results checkpointed before it, and
    the next section runs; a section with less than its ``min_s`` left of the overall
    budget is skipped with the reason. Each section starts from the same torch settings."""
    records = []
    settings = torch_settings()
    for name in names:
        budget = ctx.sizes.budget_s[name]
        ctx.say(f"\n== {name} (budget {budget:.0f} s, {ctx.overall_left():.0f} s left overall) ==")
        ctx.begin(name)
        record = {"section": name, "smoke": ctx.smoke, "budget_s": budget,
                  "overall_left_s": round(ctx.overall_left(), 1)}
        reason = ctx.skip_reason(name)
        if reason is not None:
            record.update(status="skipped", skipped=reason, budget_skip=True, wall_s=0.0,
                          headline={"key": f"skipped: {reason}", "n": 0, "spread": ""})
            ctx.results[name] = record
            write_json(ctx.out / f"{name}.json", record)
            ctx.say(f"{name}: skipped ({reason})")
            records.append(record)
            continue
        seed_everything(0)
        cond = MeasuredConditions(ctx.device, seconds=0.2 if ctx.smoke else 1.0)
        try:
            with cond:
                result = functions[name](ctx)
            record.update(result)
            record.setdefault("status", "ok")
        except Exception as exc:  # one section's failure must not cost the others their run
            record.update(ctx.partial)  # what the section had finished: never discarded
            record.update(status="error", error=f"{type(exc).__name__}: {exc}",
                          traceback=traceback.format_exc(limit=12).splitlines()[-12:])
            ctx.say(f"{name}: error: {type(exc).__name__}: {exc}")
        record["wall_s"] = round(ctx.elapsed(), 2)
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()  # the next section may be a subprocess (pytest) on the same GPU
        record["conditions"] = cond.as_dict()
        changed = restore_torch_settings(settings)
        if changed:
            record["torch_settings_restored"] = {k: {"before": a, "after": b} for k, (a, b) in changed.items()}
        ctx.results[name] = record
        write_json(ctx.out / f"{name}.json", record)
        ctx.say(f"{name}: {record['status']} in {record['wall_s']:.0f} s -> {ctx.out / (name + '.json')}")
        records.append(record)
    return records


def finished(out: Path, names: list[str], smoke: bool) -> dict[str, dict]:
    """The sections of ``names`` with a finished record in ``out`` of the same kind of run
    (smoke or not): status ok, or skipped for a reason other than the budget."""
    done = {}
    for name in names:
        try:
            r = json.loads((out / f"{name}.json").read_text())
        except (OSError, ValueError):
            continue
        if r.get("smoke") == smoke and (r.get("status") == "ok"
                                        or r.get("status") == "skipped" and not r.get("budget_skip")):
            done[name] = r
    return done


def table(records: list[dict]) -> str:
    """The one short table: section, status, key number, n, spread, wall time / budget."""
    lines = [f"{'section':<12} {'status':<8} {'n':>3}  {'wall/budget s':>13}  {'key number':<60}  spread"]
    for r in records:
        h = r.get("headline") or {}
        key = h.get("key") or r.get("error") or r.get("skipped") or ""
        if r.get("status") == "error" and r.get("error") and r.get("error") not in key:
            key = f"{r['error']} | {key}"
        lines.append(f"{r['section']:<12} {r.get('status', '?'):<8} {h.get('n', '-')!s:>3}  "
                     f"{r.get('wall_s', 0):>6.0f}/{r.get('budget_s', 0):<6.0f}  {key[:100]:<60}  {h.get('spread', '')}")
    return "\n".join(lines)


def print_plan(names: list[str], sizes, smoke: bool, overall_s: float, say) -> None:
    total = sum(sizes.budget_s[n] for n in names)
    say(f"plan ({'smoke: CPU, toy sizes' if smoke else 'one GPU'}): " + ", ".join(
        f"{n} {sizes.budget_s[n]:.0f} s" for n in names)
        + f"; sections {total:.0f} s, overall budget {overall_s:.0f} s"
        + ("" if smoke else f" + start-up about {STARTUP_S} s = {(overall_s + STARTUP_S) / 60:.1f} min"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    add_data_argument(p, "CIFAR-10-JPEG archive or folder, with --smoke a synthetic toy folder when there is none")
    p.add_argument("--out", type=Path, help=f"folder for <section>.json (default {os.path.relpath(DEFAULT_OUT)}; "
                                            "with --smoke $HASTEN_RUNS/gpu-suite-smoke)")
    p.add_argument("--only", help=f"comma-separated sections, of {','.join(SECTIONS)}")
    p.add_argument("--smoke", action="store_true", help="every section on the CPU at toy sizes (a minute)")
    p.add_argument("--device", default="auto", help="auto|cuda|cuda:N (the full suite needs CUDA)")
    p.add_argument("--budget-s", type=float, help="overall budget in seconds (default: the sections' budgets "
                                                  "added up; with --smoke none unless given)")
    p.add_argument("--resume", action=argparse.BooleanOptionalAction, default=None,
                   help="run only the sections without a finished record in --out (default: on for a full "
                        "run, off for --smoke and --only)")
    p.add_argument("--peer-sdist", default=DEFAULT_SDIST,
                   help="airbench-0.1.8.tar.gz, PyPI's source distribution (default %(default)s)")
    p.add_argument("--table", action="store_true", help="print the table of the JSONs in --out and stop")
    p.add_argument("--report", action="store_true", help="write <out>/report.md from the JSONs in --out and stop")
    args = p.parse_args(argv)
    say = functools.partial(print, flush=True)
    out = args.out or (runs_root() / "gpu-suite-smoke" if args.smoke else DEFAULT_OUT)
    try:
        names = parse_only(args.only)
        if args.table or args.report:
            records = [json.loads((out / f"{n}.json").read_text()) for n in names if (out / f"{n}.json").exists()]
            if not records:
                raise ConfigError(f"no section results in {out}: run the suite with --out {out} first")
            say(table(records))
            if args.report:
                from gpu.report import write_report

                say(f"report: {write_report(out, records)}")
            return 0
        if args.smoke:
            device, sizes = torch.device("cpu"), SMOKE
            data = args.data if os.path.exists(args.data) else None
        else:
            device, sizes = pick_device(args.device), FULL
            if device.type != "cuda":
                raise ConfigError("the full suite needs a CUDA device; on a CPU run --smoke")
            if not os.path.exists(args.data):
                raise ConfigError(f"no dataset at {args.data}: pass --data PATH or set HASTEN_DATA")
            data = args.data
        if args.budget_s is not None and not args.budget_s > 0:
            raise ConfigError(f"--budget-s must be > 0 seconds; got {args.budget_s:g}")
    except ConfigError as exc:
        print(f"benchmarks/gpu_suite.py: error: {exc}", file=sys.stderr)
        return 2
    resume = args.resume if args.resume is not None else not (args.smoke or args.only)
    kept = finished(out, names, args.smoke) if resume else {}
    if kept:
        say(f"resuming: {', '.join(kept)} finished in {out} (--no-resume runs them again)")
    todo = [n for n in names if n not in kept]
    if args.smoke:
        make_deterministic()
    overall = args.budget_s if args.budget_s is not None else sum(sizes.budget_s[n] for n in todo)
    print_plan(todo, sizes, args.smoke, overall, say)
    ctx = Context(device=device, sizes=sizes, out=out, data_path=data, smoke=args.smoke,
                  peer_sdist=args.peer_sdist, say=say, overall_s=overall,
                  enforce_budgets=True if args.budget_s is not None else None)
    ctx.results.update(kept)
    start = time.perf_counter()
    try:
        records = run_sections(todo, ctx, section_functions())
    finally:
        ctx.close()
    records = [kept.get(n) or next(r for r in records if r["section"] == n) for n in names]
    left = [r["section"] for r in records if r["status"] != "ok" and not (r["status"] == "skipped"
                                                                          and not r.get("budget_skip"))]
    say(f"\n{table(records)}\nsuite: {time.perf_counter() - start:.0f} s on {device}; JSON in {out}; "
        + ("all sections done" if not left else f"not finished: {', '.join(left)}")
        + f"; the report: python benchmarks/gpu_suite.py --report --out {out}")
    return exit_status(records)


def make_deterministic() -> None:
    """The smoke run's process, the same on every machine: one torch thread (toy sizes on
    a shared CPU: a second thread waits on a busy core at every op, several times slower,
    as hasten echo --threads notes; and thread-count-dependent kernels stay out), one
    inter-op thread, and the same for the subprocesses it starts (pytest, decode workers)."""
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set, or inter-op work already ran: keep what is there
        pass
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def exit_status(records: list[dict]) -> int:
    """1 when any section failed (a counted skip is no failure), else 0."""
    return 1 if any(r["status"] == "error" for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
