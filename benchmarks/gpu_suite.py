"""Every GPU claim of hasten measured on one GPU, section by section, in at most 20
minutes of an H100 including start-up; each section's JSON is written to
``<out>/<section>.json`` the moment it finishes (a run cut off keeps what finished),
and one short table ends the run.

    python benchmarks/gpu_suite.py --data .whl/cifar10-jpeg.tar.xz                   # all sections
    python benchmarks/gpu_suite.py --only speedrun,peer,ablation,tests               # some of them
    python benchmarks/gpu_suite.py --smoke                                          # CPU, toy sizes
    python benchmarks/gpu_suite.py --table --out benchmarks/results/gpu             # the table again

Sections (``gpu.plan.SECTIONS``; their modules under benchmarks/gpu/ say what each
measures and what its clock holds):

- speedrun: the airbench94 preset, n = 20 after an untimed full run; accuracy and
  time (mean, std), FLOPs, achieved TFLOP/s, fraction of the bf16 matmul rate.
- peer: airbench 0.1.8's train94 on the same GPU and data, n = 20, same clock spans;
  accuracy_delta (hasten minus peer, points) and time_ratio (hasten / peer).
- ablation: the speedrun ladder to the peer's mean accuracy; time and epochs per rung.
- echo: ``hasten echo``'s GPU preset at R about 6: e = 1, fixed e, AutoEcho, n = 3.
- large_batch: ResNet-18 at batch 512 / 2048 / 8192, SGD against LARS, n = 2; group BN.
- throughput: bf16 vs fp32, channels_last vs not; GpuLoader vs a torch DataLoader.
- tests: ``pytest -m gpu``.

A section that fails writes its JSON with an ``error`` and the suite goes on; the
exit status is then 1. Each JSON holds the conditions it ran under
(``hasten.environment.MeasuredConditions``), its budget and wall time, and a
``headline`` (key number, n, spread) that the table shows. On the device machine
of this workplace a command may run 10 minutes: docs/gpu.md gives the two commands.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the sections live in benchmarks/gpu/
    sys.path.insert(0, str(HERE))

import torch
from gpu.context import Context
from gpu.plan import FULL, SECTIONS, SMOKE, STARTUP_S

from hasten.environment import MeasuredConditions, pick_device
from hasten.errors import ConfigError
from hasten.rundir import runs_root, write_json

DEFAULT_OUT = HERE / "results" / "gpu"
DEFAULT_DATA = os.path.join("..", "shared", "data", "cifar10-jpeg.tar.xz")
DEFAULT_SDIST = os.path.join(".whl", "airbench-0.1.8.tar.gz")


def section_functions() -> dict:
    """name -> section(ctx) -> dict; imported here so that ``--table`` needs none of them."""
    from gpu.echo_section import echo
    from gpu.large_batch_section import large_batch
    from gpu.peer import peer
    from gpu.pytest_section import tests
    from gpu.speedrun_sections import ablation, speedrun
    from gpu.throughput_section import throughput

    return {"speedrun": speedrun, "peer": peer, "ablation": ablation, "echo": echo,
            "large_batch": large_batch, "throughput": throughput, "tests": tests}


def parse_only(text: str | None) -> list[str]:
    if not text:
        return list(SECTIONS)
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown or not names:
        raise ConfigError(f"--only: unknown section(s) {', '.join(unknown) or '(none given)'}; "
                          f"choose from {','.join(SECTIONS)}")
    return [n for n in SECTIONS if n in names]  # always in the suite's order: later sections read earlier ones


def run_sections(names: list[str], ctx: Context, functions: dict) -> list[dict]:
    """Run ``names`` in order; each record is written to ``<out>/<name>.json`` as soon as it
    is complete, an exception becoming ``status: error`` without stopping the others."""
    records = []
    for name in names:
        ctx.say(f"\n== {name} (budget {ctx.sizes.budget_s[name]:.0f} s) ==")
        ctx.begin(name)
        record = {"section": name, "smoke": ctx.smoke, "budget_s": ctx.sizes.budget_s[name]}
        cond = MeasuredConditions(ctx.device)
        try:
            with cond:
                result = functions[name](ctx)
            record.update(result)
            record.setdefault("status", "ok")
        except Exception as exc:  # one section's failure must not cost the others their run
            record.update(status="error", error=f"{type(exc).__name__}: {exc}",
                          traceback=traceback.format_exc(limit=12).splitlines()[-12:])
            ctx.say(f"{name}: error: {type(exc).__name__}: {exc}")
        record["wall_s"] = round(ctx.elapsed(), 2)
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()  # the next section may be a subprocess (the peer, pytest) on the same GPU
        record["conditions"] = cond.as_dict()
        ctx.results[name] = record
        write_json(ctx.out / f"{name}.json", record)
        ctx.say(f"{name}: {record['status']} in {record['wall_s']:.0f} s -> {ctx.out / (name + '.json')}")
        records.append(record)
    return records


def table(records: list[dict]) -> str:
    """The one short table: section, status, key number, n, spread, wall time / budget."""
    lines = [f"{'section':<12} {'status':<8} {'n':>3}  {'wall/budget s':>13}  {'key number':<60}  spread"]
    for r in records:
        h = r.get("headline") or {}
        key = h.get("key") or r.get("error") or r.get("skipped") or ""
        lines.append(f"{r['section']:<12} {r.get('status', '?'):<8} {h.get('n', '-')!s:>3}  "
                     f"{r.get('wall_s', 0):>6.0f}/{r.get('budget_s', 0):<6.0f}  {key[:100]:<60}  {h.get('spread', '')}")
    return "\n".join(lines)


def print_plan(names: list[str], sizes, smoke: bool, say) -> None:
    total = sum(sizes.budget_s[n] for n in names)
    say(f"plan ({'smoke: CPU, toy sizes' if smoke else 'one GPU'}): " + ", ".join(
        f"{n} {sizes.budget_s[n]:.0f} s" for n in names)
        + f"; sections {total:.0f} s" + ("" if smoke else f" + start-up about {STARTUP_S} s = "
                                         f"{(total + STARTUP_S) / 60:.1f} min (limit 20)"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--data", default=os.environ.get("HASTEN_DATA") or DEFAULT_DATA,
                   help="CIFAR-10-JPEG archive or folder (default $HASTEN_DATA, else %(default)s); with --smoke a "
                        "synthetic toy folder when there is none")
    p.add_argument("--out", type=Path, help=f"folder for <section>.json (default {os.path.relpath(DEFAULT_OUT)}; "
                                            "with --smoke $HASTEN_RUNS/gpu-suite-smoke)")
    p.add_argument("--only", help=f"comma-separated sections, of {','.join(SECTIONS)}")
    p.add_argument("--smoke", action="store_true", help="every section on the CPU at toy sizes (minutes)")
    p.add_argument("--device", default="auto", help="auto|cuda|cuda:N (the full suite needs CUDA)")
    p.add_argument("--peer-sdist", default=DEFAULT_SDIST,
                   help="airbench-0.1.8.tar.gz, PyPI's source distribution (default %(default)s)")
    p.add_argument("--table", action="store_true", help="print the table of the JSONs in --out and stop")
    args = p.parse_args(argv)
    say = functools.partial(print, flush=True)
    out = args.out or (runs_root() / "gpu-suite-smoke" if args.smoke else DEFAULT_OUT)
    try:
        names = parse_only(args.only)
        if args.table:
            records = [json.loads((out / f"{n}.json").read_text()) for n in names if (out / f"{n}.json").exists()]
            say(table(records))
            return 0 if records else 2
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
    except ConfigError as exc:
        print(f"benchmarks/gpu_suite.py: error: {exc}", file=sys.stderr)
        return 2
    if args.smoke:
        # Toy sizes on a shared CPU: a second thread waits on a busy core at every op (several
        # times slower for small steps, as hasten echo --threads notes).
        torch.set_num_threads(1)
    print_plan(names, sizes, args.smoke, say)
    ctx = Context(device=device, sizes=sizes, out=out, data_path=data, smoke=args.smoke,
                  peer_sdist=args.peer_sdist, say=say)
    start = time.perf_counter()
    try:
        records = run_sections(names, ctx, section_functions())
    finally:
        ctx.close()
    say(f"\n{table(records)}\nsuite: {time.perf_counter() - start:.0f} s on {device}; JSON in {out}")
    return exit_status(records)


def exit_status(records: list[dict]) -> int:
    """1 when any section failed (a counted skip is no failure), else 0."""
    return 1 if any(r["status"] == "error" for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
