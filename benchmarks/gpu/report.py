"""The GPU suite's report page: ``<out>/report.md`` generated from the sections' JSON
(``python benchmarks/gpu_suite.py --report --out DIR``), never written by hand. Every
mean is given with its 95% interval (Student t) where the section ran two or more runs.
"""

from __future__ import annotations

from pathlib import Path

from _common import mean_ci
from gpu.plan import pm


def _cell(x, fmt=".2f", scale=1.0) -> str:
    if isinstance(x, dict):
        return pm(x, scale, fmt)
    return "-" if x is None else f"{x * scale:{fmt}}"


def _table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines + [""]


def _status(r: dict) -> str:
    s = r.get("status", "?")
    why = r.get("error") or r.get("skipped")
    return f"{s}: {why}" if why else s


def speedrun_part(r: dict) -> list[str]:
    rows = []
    for name, job in r.get("jobs", {}).items():
        frac = job.get("fraction_of_matmul_rate")
        rows.append([name, job.get("status", "?"), job.get("n_runs", len(job.get("runs", []))),
                     _cell(job.get("accuracy"), ".2f", 100), _cell(job.get("time_s"), ".3f"),
                     _cell(job.get("achieved_tflops"), ".1f"),
                     f"{frac:.0%} of {r.get('device_matmul_dtype', '')}" if frac is not None else "-",
                     job.get("error") or job.get("skipped") or ""])
    lines = _table(["job", "status", "n", "TTA accuracy %", "time s", "TFLOP/s", "matmul rate", "note"], rows)
    c = r.get("comparison")
    if c:
        lines += [f"hasten ({c['hasten']}) against the peer, per round (paired): time ratio "
                  f"{pm(c['time_ratio'], 1, '.3f')}, accuracy {pm(c['accuracy_delta_pt'], 1, '+.2f')} points.", ""]
    if r.get("order"):
        lines += [f"Order of the runs (round, job): {', '.join(f'{a}:{b}' for a, b in r['order'][:60])}"
                  + (" ..." if len(r["order"]) > 60 else ""), ""]
    return lines


def ablation_part(r: dict) -> list[str]:
    rows = [[x["rung"], x["n_runs"], f"{x['reached']}/{x['n_runs']}", _cell(x["epochs_to_target"], ".1f"),
             _cell(x["time_to_target_s"], ".2f"), _cell(x["final_accuracy"], ".2f", 100), _cell(x["time_s"], ".2f")]
            for x in r.get("rungs", [])]
    head = [f"Target {r['target']:.2%} ({r.get('target_source', '')}).", ""] if r.get("target") else []
    return head + _table(["rung", "n", "reached", "epochs to target", "s to target", "final accuracy %", "time s"],
                         rows)


def echo_part(r: dict) -> list[str]:
    rows = []
    for label, c in r.get("configs", {}).items():
        runs = r.get("runs", {}).get(label, [])
        reached = [x["wall_time_to_target_s"] for x in runs if x.get("reached_target")]
        rows.append([label, c["n_runs"], f"{c['reached']}/{c['n_runs']}", _cell(mean_ci(reached), ".1f"),
                     _cell(c.get("fresh_examples_to_target"), ".0f"), _cell(c.get("mean_echo_factor"), ".2f"),
                     _cell(c.get("idle_fraction"), ".2f")])
    head = []
    if r.get("upstream_ratio_measured") is not None:
        head = [f"R asked {r.get('upstream_ratio_asked')}, measured {r['upstream_ratio_measured']:.2f} "
                f"(e = 1 runs); storage delay {1e6 * r.get('upstream_delay_s', 0):.0f} us per example.", ""]
    return head + _table(["config", "n", "reached", "s to target", "fresh examples", "mean e", "idle"], rows)


def large_batch_part(r: dict) -> list[str]:
    rows = [[x["config"], x["n_runs"], x.get("steps"), _cell(mean_ci(x.get("accuracy_runs", [])), ".2f", 100),
             _cell(x.get("images_per_s"), ".0f")] for x in r.get("rows", [])]
    head = [f"{r['epochs']:g} epochs for every configuration ({r.get('epochs_rule', {}).get('rule', '')}).", ""] \
        if r.get("epochs") is not None else []
    return head + _table(["config", "n", "steps", "accuracy %", "images/s"], rows)


def throughput_part(r: dict) -> list[str]:
    rows = [[x["config"], _cell(mean_ci(x.get("samples", [])), ".0f"), _cell(x.get("speedup_vs_fp32"), ".2f"),
             "on" if any((x.get("tf32") or {}).values()) else "off"] for x in r.get("training_step", [])]
    rows += [[x["loader"], _cell(mean_ci([s["images_per_s"] for s in x.get("samples", [])]), ".0f"), "-", "-"]
             for x in r.get("loaders", [])]
    return _table(["configuration", "images/s", "vs fp32", "TF32"], rows)


def tests_part(r: dict) -> list[str]:
    if "passed" not in r:
        return []
    return [f"{r['passed']} passed, {r['failed']} failed, {r['skipped']} skipped, {r['errors']} errors "
            f"(`{r.get('command', 'pytest -m gpu')}`).", ""]


PARTS = {"speedrun": speedrun_part, "ablation": ablation_part, "echo": echo_part, "large_batch": large_batch_part,
         "throughput": throughput_part, "tests": tests_part}


def render(records: list[dict], source: str) -> str:
    env = next((r["conditions"]["environment"] for r in records if r.get("conditions")), {})
    smoke = any(r.get("smoke") for r in records)
    lines = ["# GPU suite report", "",
             f"Generated from the JSON in `{source}` by `python benchmarks/gpu_suite.py --report`"
             + (" (a smoke run: CPU, toy sizes; the numbers say nothing about a GPU)" if smoke else "") + ".",
             f"Device: {env.get('gpu') or env.get('cpu') or '?'}; torch {env.get('torch', '?')}, CUDA "
             f"{env.get('cuda') or '-'}, cuDNN {env.get('cudnn') or '-'}; hasten commit "
             f"{(env.get('git_commit') or '?')[:10]}{' (with local changes)' if env.get('git_dirty') else ''}.",
             "± is the 95% interval of the mean (Student t); n is the number of runs.", "",
             "## Summary", ""]
    rows = []
    for r in records:
        h = r.get("headline") or {}
        rows.append([r["section"], _status(r) if r.get("status") != "ok" else "ok", h.get("n", "-"),
                     f"{r.get('wall_s', 0):.0f} / {r.get('budget_s', 0):.0f}",
                     (h.get("key") or "").replace("|", "/")])
    lines += _table(["section", "status", "n", "wall / budget s", "key number"], rows)
    for r in records:
        part = PARTS.get(r["section"])
        lines += [f"## {r['section']}", "", f"Status: {_status(r)}; {r.get('wall_s', 0):.0f} s of "
                                            f"{r.get('budget_s', 0):.0f} s." + (" Cut short by the budget."
                                                                                if r.get("cut_short") else ""), ""]
        if r.get("timed"):
            lines += [f"Timed: {r['timed']}.", ""]
        if part is not None:
            try:
                lines += part(r)
            except (KeyError, TypeError, ValueError) as exc:  # a partial record: say so, keep the page
                lines += [f"(incomplete record: {type(exc).__name__}: {exc})", ""]
        cond = r.get("conditions") or {}
        if cond:
            lines += [f"Conditions: load {cond.get('load_average_before', ['?'])[0]} -> "
                      f"{cond.get('load_average_after', ['?'])[0]}, matmul {cond.get('matmul_gflops_before')} -> "
                      f"{cond.get('matmul_gflops_after')} GFLOP/s.", ""]
    return "\n".join(lines).rstrip() + "\n"


def write_report(out: Path, records: list[dict]) -> Path:
    path = Path(out) / "report.md"
    path.write_text(render(records, str(out)))
    return path
