"""The profile's three outputs: a ten-second terminal report, a timeline PNG, and JSON.

Changes the training math: no.
"""

from __future__ import annotations

from pathlib import Path

from hasten.profile.records import Analysis
from hasten.profile.thresholds import DEAD_BAND, INPUT_MODERATE

BAR_WIDTH = 40


def _bar(a: Analysis) -> str:
    data = round(a.data_wait_fraction * BAR_WIDTH)
    comm = round(a.comm_fraction * BAR_WIDTH)
    other = round(a.other_fraction * BAR_WIDTH)
    return "[" + "#" * data + "~" * comm + "=" * max(0, BAR_WIDTH - data - comm - other) + "." * other + "]"


def _interval(a: Analysis) -> str:
    lo, hi = a.data_interval
    return f"{lo:.0%}-{hi:.0%}"


def _why(a: Analysis) -> str:
    """The headline's reason: which kind of input-bound, how near the line, where the rest went."""
    cpu = a.cpu or {}
    if a.verdict == "input-bound" and a.input_kind == "cpu":
        held = cpu.get("data_cpu_held_s") or 0.0
        how = (f"their {cpu['data_cpu_per_step_s'] * 1e3:.0f} ms of CPU held its loop thread off its core "
               f"{held * 1e3:.0f} ms" if held and held >= cpu["data_cpu_delay_s"] else
               f"their {cpu['data_cpu_per_step_s'] * 1e3:.0f} ms of CPU run on the step's own cores")
        # The share is held to the step less its wait; the ms go with it, the model's own said where more
        # (kuangliu/pytorch-cifar on 0.56 cores: "costs the step 93% (51 ms a step ..." of a 41 ms step)
        cost = cpu["data_cpu_share"] * a.step_time_s
        ms = (f"{cost * 1e3:.0f} ms a step" if cpu["data_cpu_delay_s"] <= cost * 1.005 else
              f"{cost * 1e3:.0f} ms a step, all of the step but its wait, where the model of their cost says "
              f"{cpu['data_cpu_delay_s'] * 1e3:.0f} ms")
        return (f"its data path competes with the step for the cores: the loader's workers' CPU costs the step "
                f"{cpu['data_cpu_share']:.0%} ({ms}: {how}, it keeps "
                f"{cpu['step_cores']:.2f} of {cpu['available']:.2f} cores busy), and the step waits for data "
                f"{a.data_wait_fraction:.0%} of the time: data {a.data_share:.0%} in all "
                f"(95% interval {_interval(a)})")
    if a.verdict == "input-bound":
        making = "waits for data" if a.loader_driven else "makes its batch"
        if cpu.get("contended") and cpu.get("data_cpu_share"):
            return (f"the step {making} {a.data_wait_fraction:.0%} of the time, and its loader's workers' CPU on "
                    f"the step's own cores costs it {cpu['data_cpu_share']:.0%} more: data {a.data_share:.0%} "
                    f"(95% interval {_interval(a)})")
        return f"the step {making} {a.data_wait_fraction:.0%} of the time (95% interval {_interval(a)})"
    if a.verdict == "balanced":
        what = "data" if a.input_kind == "wait" else "the data path's CPU share"
        line = a.near if a.near is not None else INPUT_MODERATE
        why = (f"within {DEAD_BAND:.0%} of the {line:.0%} threshold" if abs(a.data_share - line) <= DEAD_BAND
               else f"the interval holds the {line:.0%} threshold" + (
                   f" after {a.steps} steps, the most --decide-within allowed" if a.extended else ""))
        return f"near the line: {what} {a.data_share:.0%} of the step (95% interval {_interval(a)}), {why}"
    return {"communication-bound": f"exposed gradient communication is {a.comm_fraction:.0%} of the step",
            "compute-bound": "the step's own work sets the pace",
            "host-bound": "the host cannot launch work as fast as the GPU runs it"}[a.verdict]


def _x(v: float | None) -> str:
    return "-" if v is None else f"x{v:.2f}" if v < 1e6 else "x(no bound)"


def _data_gain(a: Analysis) -> str:
    """What the data share could gain, the most any input fix gives (Amdahl), with its interval."""
    low, point, high = a.data_gain
    free = a.data_free_step_s if a.data_free_step_s is not None else a.step_time_s
    pace = ", at the step's own pace on the cores it would have" if a.input_kind == "cpu" else ""
    return (f"  data made free: step {free * 1e3:.1f} ms{pace}, at most {_x(point)} ({_x(low)}-{_x(high)} over "
            f"the data share's interval, {a.data_share:.0%} of the step)")


def format_report(a: Analysis) -> str:
    """Verdict first, then the time breakdown as a bar (``#`` data wait, ``~`` exposed communication,
    ``=`` compute, ``.`` the rest) and where the rest went, then the fixes (verified ones first)."""
    kind = "CPU, " if a.verdict == "input-bound" and a.input_kind == "cpu" else ""
    head = a.verdict.upper() + (f" ({kind}{a.severity})" if a.severity else "")
    micro = f", {a.micro_batches:g} micro-batches" if a.micro_batches > 1 else ""
    step = "optimizer step" if a.steps_from == "optimizer" else "step (backward to backward)"
    rest = f"  . rest {a.other_fraction:.0%}" if a.other_fraction >= 0.005 else ""
    lines = [f"hasten profile: {head}: {_why(a)}",
             f"  {step} {a.step_time_s * 1e3:.1f} ms{micro}  {_bar(a)}  # data {a.data_wait_fraction:.0%}  "
             f"= compute {a.compute_fraction:.0%}  ~ comm {a.comm_fraction:.0%}{rest}"]
    if a.upstream_ratio is not None:
        made = "to produce alone" if a.loader_driven else "to make in the loop"
        lines.append(f"  R = {a.upstream_ratio:.2f}: a step's batches take "
                     f"{a.upstream_ratio * a.step_alone_s * 1e3:.1f} ms {made}, "
                     f"{a.step_alone_s * 1e3:.1f} ms to consume alone")
    for w in a.other_where:
        if w["share"] >= 0.02:
            code = w.get("code", "").split("  #")[0].strip()
            code = f" `{code}`" if code else ""
            lines.append(f"  {w['share']:.0%} of the step in {w['at']}{code} (neither data, compute nor "
                         "communication)")
    lines.append(_data_gain(a))
    source = (f"{a.num_workers} loader workers" if a.loader_driven
              else "no DataLoader: data is the time on the lines that make the model's input")
    lines.append(f"  ({a.ranks} rank{'s' if a.ranks > 1 else ''}, {a.device}, {source}, "
                 f"{a.steps} steps after {a.warmup} warm-up"
                 + (f"; the window doubled {a.extended} time(s) to decide" if a.extended else "") + ")")
    cpu = a.cpu or {}
    if cpu.get("available") is not None:
        parts = [f"{cpu['available']:.2f} cores available (affinity {cpu.get('affinity')}"
                 + (f", quota {cpu['quota']:g}" if cpu.get("quota") else "")
                 + (f", probe {cpu['probe']:.2f}" if cpu.get("probe") is not None else "") + ")"]
        if cpu.get("main_cpu_per_step_s") is not None:
            parts.append(f"main process {cpu['main_cpu_per_step_s'] * 1e3:.1f} ms CPU per step")
        if cpu.get("worker_cpu_per_batch_s") is not None:
            parts.append(f"workers {cpu['worker_cpu_per_batch_s'] * 1e3:.1f} ms CPU per batch")
        if cpu.get("window_others_s") is not None and cpu.get("window_wall_s"):
            parts.append(f"other processes used {cpu['window_others_s'] / cpu['window_wall_s']:.2f} of its "
                         f"{cpu['window_cores']} cores over the window")
        threads = a.threads or {}
        if threads.get("intra_op"):
            changed = (f" (the script set {threads['intra_op_end']} during the window)"
                       if threads.get("intra_op_end") else "")
            parts.append(f"torch threads {threads['intra_op']}{changed}, inter-op {threads.get('inter_op')}")
        lines.append("  CPU: " + ", ".join(parts))
    others = [d for d in a.loaders if not d.get("training")]
    for ex in a.excluded:
        lines.append(f"  excluded: {ex['steps']} step(s) with {ex['reason']}")
    for d in others:
        lines.append(f"  not the training loop: {d['name']} ({d['batches']} batches, eval-mode or no-grad forwards)")
    for x in a.dropped:
        ranks = f" (rank {', '.join(map(str, x['ranks']))})" if a.ranks > 1 else ""
        lines.append(f"  probe dropped{ranks}: {x['probe']}: {x['why']}")
    if a.probes_off:
        lines.append(f"  probes off (--no-probe): {', '.join(a.probes_off)}")
    if a.recommendations:
        lines.append(f"  fixes, best first{'':36s}predicted  verified  error")
        for i, r in enumerate(a.recommendations, 1):
            notes = []
            if r.verified_speedup is None:
                notes.append("unverified" if r.apply else "unverified: needs a code change")
            if r.promoted:
                notes.append("promoted by its verification")
            if r.changes_math:
                notes.append(f"changes the math: {r.math_note}" if r.math_note else "changes the math")
            err = r.prediction_error
            err_s = "-" if err is None else f"{err:+.0%}"
            note = f"  [{'; '.join(notes)}]" if notes else ""
            # the name in full, however long (the columns after it move, nothing is cut)
            lines.append(f"  {i}. {r.fix:48s} {_x(r.predicted_speedup):>9s} {_x(r.verified_speedup):>9s} "
                         f"{err_s:>6s}{note}")
            lines.append(f"     {r.how}")
            if r.verification:  # the measured speed-up with its interval, n, cost and what it decided (verify.py)
                lines.append(f"     {r.verification['text']}")
    else:
        lines.append("  no fix is predicted (or verified) to pay more than 5%")
    for r in a.rejected:
        v = r.get("verified_speedup")
        measured = f" (verified x{v:.2f})" if v is not None and "verified x" not in r["why"] else ""
        lines.append(f"  not recommended: {r['fix']}: {r['why']}{measured}")
        if r.get("verification"):
            lines.append(f"     {r['verification']['text']}")
    for note in a.notes:
        lines.append(f"  note: {note}")
    if a.cost.get("per_verified_fix_s"):
        c = a.cost
        n = c.get("verify_runs")
        runs = f" ({n} run{'' if n == 1 else 's'})" if n else ""
        lines.append(f"  cost: profile run {c['profile_run_s']:.0f} s, verification {c['verify_runs_s']:.0f} s{runs}: "
                     f"{c['per_verified_fix_s']:.0f} s per verified fix ({c['fixes_verified']} verified)")
    elif a.cost.get("profile_run_s"):
        lines.append(f"  cost: profile run {a.cost['profile_run_s']:.0f} s")
    return "\n".join(lines)


def results_json(a: Analysis, command: list[str], environment: dict) -> dict:
    """The report as JSON (verdict, fractions, R, ranks, device, recommendations) and its context."""
    d = a.as_dict()
    d["recommendations"] = [{k: r[k] for k in ("fix", "how", "predicted_speedup", "verified_speedup", "basis",
                                               "changes_math", "math_note", "kind", "apply", "verified_step_s", "bound",
                                               "promoted", "prediction_error", "verification")}
                            for r in d["recommendations"]]
    d["command"] = command
    d["environment"] = environment
    return d


def plot_timeline(a: Analysis, path: str | Path) -> Path:
    """Rank 0's measured steps as stacked bars (data wait under the step's work), and the breakdown."""
    from hasten.plots import plt, save_figure

    steps = a.per_step
    xs = range(a.warmup, a.warmup + len(steps))
    wait = [s["wait_s"] * 1e3 for s in steps]
    work = [s["work_s"] * 1e3 for s in steps]
    fig, (ax, ax_b) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=110, gridspec_kw={"width_ratios": [3, 1]})
    ax.bar(xs, wait, color="tab:red", label="data wait" if a.loader_driven else "outside compute (data and rest)")
    ax.bar(xs, work, bottom=wait, color="tab:blue", label="step work (compute + comm)")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("ms")
    ax.set_title(f"per-step timeline, rank 0: {a.verdict}")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    parts = [("data", a.data_wait_fraction, "tab:red"), ("compute", a.compute_fraction, "tab:blue"),
             ("comm", a.comm_fraction, "tab:green"), ("rest", a.other_fraction, "tab:gray")]
    bottom = 0.0
    for label, frac, color in parts:
        ax_b.bar([0], [frac * 100], bottom=bottom, color=color, label=f"{label} {frac:.0%}")
        bottom += frac * 100
    ax_b.set_xticks([])
    ax_b.set_ylabel("% of step")
    ax_b.set_ylim(0, 100)
    ax_b.legend(fontsize=8, loc="upper right")
    ax_b.set_title("breakdown")
    return save_figure(fig, path)
