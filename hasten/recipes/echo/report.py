"""Summary rows, tables, goals and plots for the echo sweep and comparison
(``hasten.recipes.echo.sweep``, ``hasten.recipes.echo.compare``): mean and spread per
(group, variant, e) (``hasten.stats``), the speedup against e = 1, the paper's goals,
the markdown of docs/results/echo.md.

Changes the training math: no (reporting only).
"""

from __future__ import annotations

import os

from hasten.stats import describe

SUMMARY_FIELDS = ("fresh_examples_to_target", "steps_to_target", "wall_time_to_target_s", "end_accuracy",
                  "final_accuracy", "idle_fraction", "upstream_ratio", "mean_echo_factor", "duplicate_rate",
                  "step_time_s")


# ----------------------------------------------------------------------------- Summary rows
def summarize(entries: list[dict]) -> list[dict]:
    """Mean and spread per (group, variant, echo) with the speedup (mean wall time of
    e = 1 over the row's) and the fresh-example ratio against e = 1 of the same group."""
    keyed: dict[tuple, list[dict]] = {}
    for e in entries:
        key = (e["group"], "none" if e["echo_factor"] == 1.0 else e["variant"], str(e["echo_factor"]))
        keyed.setdefault(key, []).append(e)
    rows = []
    for (group, variant, echo), runs in keyed.items():
        row = {"group": group, "variant": variant, "echo_factor": echo, "n": len(runs),
               "reached": sum(r["reached_target"] for r in runs), "lr": runs[0].get("lr"),
               "budget_steps": runs[0].get("budget_steps"), "shuffle_buffer": runs[0].get("shuffle_buffer")}
        row.update({f: describe([r.get(f) for r in runs]) for f in SUMMARY_FIELDS})
        rows.append(row)
    for row in rows:
        base = next((r for r in rows if r["group"] == row["group"] and r["echo_factor"] == "1.0"), None)
        b = base["wall_time_to_target_s"]["mean"] if base else None
        w = row["wall_time_to_target_s"]["mean"]
        # A configuration that missed the target on some seed has no honest mean time.
        complete = row["reached"] == row["n"] and base is not None and base["reached"] == base["n"]
        row["speedup"] = b / w if b and w and complete else None
        bf = base["fresh_examples_to_target"]["mean"] if base else None
        f = row["fresh_examples_to_target"]["mean"]
        row["fresh_ratio"] = f / bf if bf and f else None
    return rows


def _fmt(stat: dict, scale: float = 1.0, digits: int = 0) -> str:
    if stat["mean"] is None:
        return "-"
    s = f"{stat['mean'] * scale:.{digits}f}"
    if stat["n"] > 1:
        s += f"±{stat['std'] * scale:.{digits}f}"
    return s


# What format_table's columns mean, printed under it.
TABLE_LEGEND = (
    "e: echo factor (a2.9: AutoEcho, its mean factor 2.9); n: runs; lr: learning rate (-: the preset's); "
    "R meas: upstream time / step time, measured at e = 1\n"
    "fresh to tgt, steps, wall s: fresh examples, steps and seconds until the target accuracy; speedup: "
    "e = 1's wall time / the row's\n"
    "end acc: % at the end of the step budget (--sweep); final acc: % on the test set after the run; "
    "dup %: examples repeating another of their batch;\n"
    "idle: % of wall time waiting for input; ±: standard deviation over the n runs; -: not measured or not reached")


def format_table(rows: list[dict], legend: bool = False) -> str:
    """The summary rows as a text table; with ``legend``, :data:`TABLE_LEGEND` under it."""
    g = max([5] + [len(r["group"]) for r in rows])
    head = (f"{'group':{g}} {'variant':15} {'e':>5} {'n':>2} {'lr':>5} {'R meas':>8} {'fresh to tgt':>13} "
            f"{'steps':>9} {'wall s':>10} {'speedup':>7} {'end acc':>9} {'final acc':>9} {'dup %':>5} {'idle':>4}")
    lines = [head, "-" * len(head)]
    for r in rows:
        e = r["echo_factor"] if r["echo_factor"] != "auto" else f"a{r['mean_echo_factor']['mean']:.1f}"
        speedup = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        lines.append(
            f"{r['group']:{g}} {r['variant']:15} {e:>5} {r['n']:>2} {_lr(r['lr']):>5} "
            f"{_fmt(r['upstream_ratio'], 1, 1):>8} "
            f"{_fmt(r['fresh_examples_to_target']):>13} {_fmt(r['steps_to_target']):>9} "
            f"{_fmt(r['wall_time_to_target_s'], 1, 1):>10} {speedup:>7} {_fmt(r['end_accuracy'], 100, 1):>9} "
            f"{_fmt(r['final_accuracy'], 100, 1):>9} {_fmt(r['duplicate_rate'], 100, 1):>5} "
            f"{_fmt(r['idle_fraction'], 100, 0):>4}")
    if legend:
        lines.append(TABLE_LEGEND)
    return "\n".join(lines)


def _lr(lr) -> str:
    return f"{lr:.3g}" if lr is not None else "-"


def goals(rows: list[dict], ratios) -> dict:
    """The benchmark's goals, read off the summary rows."""
    out = {"per_ratio": []}
    for ratio in ratios:
        group = f"R={ratio:g}"
        fixed = [r for r in rows if r["group"] == group and r["echo_factor"] not in ("1.0", "auto") and r["speedup"]]
        auto = next((r for r in rows if r["group"] == group and r["echo_factor"] == "auto"), None)
        best = max(fixed, key=lambda r: r["speedup"], default=None)
        out["per_ratio"].append({
            "group": group, "best_fixed_e": best["echo_factor"] if best else None,
            "best_fixed_speedup": best["speedup"] if best else None,
            "autoecho_speedup": auto["speedup"] if auto else None,
            "autoecho_mean_e": auto["mean_echo_factor"]["mean"] if auto else None,
            "autoecho_vs_best": auto["speedup"] / best["speedup"] if auto and best and auto["speedup"] else None})
    base = next((r for r in rows if r["group"] == "a" and r["echo_factor"] == "1.0"), None)
    if base and base["final_accuracy"]["mean"] is not None:
        b = base["final_accuracy"]
        out["final_accuracy"] = [
            {"variant": r["variant"], "echo_factor": r["echo_factor"], "budget_steps": r["budget_steps"],
             "mean": r["final_accuracy"]["mean"], "std": r["final_accuracy"]["std"],
             "baseline_mean": b["mean"], "baseline_std": b["std"],
             # "within the seeds' spread": not below the baseline's mean minus its std (one
             # baseline seed has no spread to be within: None)
             "within_spread": r["final_accuracy"]["mean"] >= b["mean"] - b["std"] if b["std"] is not None else None}
            for r in rows if r["group"] == "a" and r is not base and r["final_accuracy"]["mean"] is not None]
    nb_base = next((r for r in rows if r["group"] == "R<1" and r["echo_factor"] == "1.0"), None)
    nb_auto = next((r for r in rows if r["group"] == "R<1" and r["echo_factor"] == "auto"), None)
    if nb_base and nb_auto and nb_base["wall_time_to_target_s"]["mean"] and nb_auto["wall_time_to_target_s"]["mean"]:
        out["not_input_bound_autoecho_slowdown"] = (nb_auto["wall_time_to_target_s"]["mean"]
                                                   / nb_base["wall_time_to_target_s"]["mean"] - 1)
    return out


def write_plots(rows: list[dict], directory: str | os.PathLike) -> list[str]:
    """The sweep's two PNG plots (hasten.plots) in ``directory``; their paths."""
    from hasten.plots import plot_echo_fresh_examples, plot_echo_speedup

    return [str(plot_echo_fresh_examples(rows, os.path.join(directory, "echo_fresh_examples.png"))),
            str(plot_echo_speedup(rows, os.path.join(directory, "echo_speedup.png")))]


# ----------------------------------------------------------------------------- Markdown for docs/results
def _md(stat: dict, scale: float = 1.0, digits: int = 0) -> str:
    return _fmt(stat, scale, digits).replace("±", " ± ")


def _head(*columns: str) -> list[str]:
    """A markdown table's header and separator lines."""
    return ["| " + " | ".join(columns) + " |", "| --- " * len(columns) + "|"]


def markdown_tables(report: dict) -> str:
    """The results page's tables, from a report of ``run``: counts per variant and factor,
    the shuffle-buffer study, wall time to the target per R."""
    rows = report["summary"]
    out = _head("variant", "e", "n", "lr", "budget steps", "reached", "fresh examples to target", "steps to target",
                "end acc % (5k)", "final acc % (10k)", "duplicates %")
    for r in rows:
        if r["group"] != "a":
            continue
        out.append(f"| {r['variant']} | {r['echo_factor']} | {r['n']} | {r['lr']:g} | {r['budget_steps']} | "
                   f"{r['reached']}/{r['n']} | {_md(r['fresh_examples_to_target'])} | {_md(r['steps_to_target'])} | "
                   f"{_md(r['end_accuracy'], 100, 1)} | {_md(r['final_accuracy'], 100, 1)} | "
                   f"{_md(r['duplicate_rate'], 100, 1)} |")
    out += ["", *_head("shuffle buffer (items)", "predicted duplicates %", "measured duplicates %", "reached",
                       "fresh examples to target", "steps to target", "end acc %")]
    for e in report["results"]:
        if e["group"] != "buffer":
            continue
        out.append(f"| {e['shuffle_buffer']} | {100 * e['predicted_duplicate_rate']:.1f} | "
                   f"{100 * e['duplicate_rate']:.1f} | {'yes' if e['reached_target'] else 'no'} | "
                   f"{e['fresh_examples_to_target'] or '-'} | {e['steps_to_target'] or '-'} | "
                   f"{100 * e['end_accuracy']:.1f} |")
    out += ["", *_head("R (asked)", "measured R", "e", "n", "reached", "wall s to target", "speedup",
                       "fresh examples", "steps", "idle %")]
    for r in sorted((r for r in rows if r["group"].startswith("R")),
                    key=lambda r: (r["group"] != "R<1", r["group"], r["echo_factor"] == "auto",
                                   r["echo_factor"])):
        e = r["echo_factor"] if r["echo_factor"] != "auto" else f"auto (mean {r['mean_echo_factor']['mean']:.1f})"
        speed = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        out.append(f"| {r['group'][2:] if r['group'] != 'R<1' else '0.5'} | {_md(r['upstream_ratio'], 1, 1)} | {e} | "
                   f"{r['n']} | {r['reached']}/{r['n']} | {_md(r['wall_time_to_target_s'], 1, 1)} | {speed} | "
                   f"{_md(r['fresh_examples_to_target'])} | {_md(r['steps_to_target'])} | "
                   f"{_md(r['idle_fraction'], 100, 0)} |")
    return "\n".join(out)
