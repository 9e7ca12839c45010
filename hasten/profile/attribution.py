"""Where a step's time goes besides compute: data (waited for, or made on the lines that make the batch),
the CPU the data path takes from the step, and the rest, by line.

- :func:`data_split`: the data wait per step and its share's interval. With a DataLoader,
  the time in its ``__next__``; without one, the time outside compute in the share the
  stack sampler found on the lines that make the batch
  (:mod:`hasten.profile.inject.batch_source`), the rest being neither data nor compute;
- :func:`cpu_use`: the workers' CPU against the cores the step leaves idle: what runs on
  the step's own cores adds to the step, beside the wait, and never less than the time they
  held the loop's thread off its core;
- :func:`data_free_step`: the step with its data made free, never below what was measured;
- :func:`other_where`, :func:`batch_where`: the lines the rest and the batch were sampled in;
  :func:`compute_in_rest`: the share of the rest that was the model, a loss, backward or an
  optimizer's step all the same (compute, never "neither").

Changes the training math: no (analysis only).
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from hasten.profile.contention import workers_delay
from hasten.profile.shares import product_interval, ratio_interval, wilson
from hasten.stats import mean

if TYPE_CHECKING:
    from hasten.profile.records import RankSummary


def _span(r: dict) -> float:
    return r["span_s"] if "span_s" in r else r["wait_s"] + r["work_s"]


def data_split(d: dict, measured: list[dict]) -> dict:
    """The data wait per step and its share's interval; the rest of the step outside compute.

    With a DataLoader, the data wait is the time in its ``__next__``, and the rest is the step's
    time in neither the loader nor compute. Without one, the time outside compute is data only
    in the share the stack sampler found on the lines that make the batch
    (:mod:`hasten.profile.inject.batch_source`), or where a function of the script's makes it
    (``get_batch()``), the time in its calls, timed: a sleep, logging or ``loss.item()``
    between the optimizer's step and the next forward is the rest, not data. Of the rest, the
    samples' share on the lines that make the batch is data too (an inline transform of the
    function's result); none where those lines only call it (``batch_call_only``,
    :func:`hasten.profile.inject.batch_source.only_the_call`), and none in the estimate, all in the
    interval, where no sample fell outside the function."""
    waits = [r["wait_s"] for r in measured]
    spans = [_span(r) for r in measured]
    wait = mean(waits)
    outside = d.get("outside")
    if d.get("loader_driven", True) or outside is None:
        _, lo, hi = ratio_interval(waits, spans)
        rest = [_span(r) - r["wait_s"] - r["compute_s"] for r in measured if "compute_s" in r]
        other = max(0.0, mean(rest)) if len(rest) == len(measured) and rest else 0.0
        return {"data_s": wait, "data_lo": lo, "data_hi": hi, "other_s": other}
    counts = outside.get("counts", {})
    found = bool(outside.get("batch_found"))
    n = counts.get("batch", 0) + counts.get("other", 0) + counts.get("hasten", 0)
    if found and measured and all("batch_fn_s" in r for r in measured):
        # The batch function's calls were timed (hasten.profile.inject.batch_fn.time_calls): that time is
        # data, exactly; the samples say only how much of the rest outside compute is on the other lines
        # that make the batch (an inline transform of its result). A run of sub-millisecond steps gets
        # few samples at 20 a second, and a timer needs none.
        timed = [r["batch_fn_s"] for r in measured]
        rest = [max(0.0, w - t) for w, t in zip(waits, timed)]
        inside = counts.get("in_batch_fn", 0)
        if outside.get("batch_call_only"):  # the lines only call the function: none of the rest is data
            batch = (0.0, 0.0, 0.0)
        elif n - inside <= 0:
            # No sample outside the function: the estimate is what was timed, the interval open to all of the
            # rest. Wilson's 0.5 for no samples called half of a weight update by hand and a loss.item() data.
            batch = (0.0, 0.0, 1.0)
        else:
            batch = wilson(counts.get("batch", 0) - inside, n - inside)
        _, t_lo, t_hi = ratio_interval(timed, spans)
        _, r_lo, r_hi = product_interval(ratio_interval(rest, spans), batch)
        return {"data_s": mean(timed) + mean(rest) * batch[0], "data_lo": t_lo + r_lo,
                "data_hi": min(1.0, t_hi + r_hi), "other_s": mean(rest) * (1 - batch[0]), "batch_found": True}
    batch = wilson(counts.get("batch", 0), n) if found else (0, 0, 0)
    share, lo, hi = product_interval(ratio_interval(waits, spans), batch)
    return {"data_s": wait * batch[0], "data_lo": lo, "data_hi": hi, "other_s": wait * (1 - batch[0]),
            "batch_found": found}


def cpu_use(s: RankSummary, alone: float, cores: float, micro: float, loader_driven: bool, threads: int = 1,
            window: dict | None = None) -> dict:
    """The CPU the training loader's workers take from the step's cores, and what that costs the step.

    The workers' CPU per step c is read from /proc (per step's batches). The step alone (its
    replay: data made free, the workers idle with their queues full; the least disturbed of its
    steps, as the workers finish the batches they were asked for ahead into the first ones)
    keeps k = its CPU / its wall time of the C cores the job has busy; the cores it leaves idle, and all C while the
    loop waits in the loader for a batch not made yet, are where the workers run without
    taking anything from the step:

        idle = (C - k) x step alone + C x (data wait - the loop's CPU in it)   (core-seconds per step)

    (Where the batches are ready, the loop's time in the loader is its own CPU receiving them,
    and a worker is handed its next batch's indices at the end of it: it runs during the step.)

    The rest of c, ``max(0, c - idle)``, runs on the step's own cores, and each second of it
    costs the step a second of a thread's time: torch's intra-op work is split evenly over its
    T threads, which meet at a barrier after each op, so one thread off its core holds up the
    others (work that divided freely over k cores would lose a k-th of it: this is the upper
    end). Where other jobs leave the job fewer cores than it has threads, a thread runs
    C / T of the time, and a second of its CPU taken is T / C seconds of the step's:

        delay = max(0, c - idle) / min(1, C / T)
 That delay, as
    a share of the step as measured (``data_cpu_share``), adds to the data wait's share in the
    verdict. The step's own CPU is the replay's, not the measured steps': there, threads that
    spin at a barrier while another is off its core count as CPU the step needs (and so does a
    thread spinning between ops, where a worker taking its core costs nothing: the model is the
    upper end). So it never says more than was measured: the delay is at most what the measured
    steps' work (less their wait, the median) took over the replayed step's. Without
    workers, the data CPU is spent in the loop's own thread, in turn with the step: it shows
    as the data wait.

    Where the measured window's CPU was read (``window``, Linux's /proc), the estimate is
    :func:`hasten.profile.contention.workers_delay`'s instead, from the window's totals: the
    replayed step's numbers above moved from run to run by more than the cost they decide. There
    the delay is never less than the time the workers held the loop's thread off its core, as its
    run-queue wait measured it (``data_cpu_held_s``: idle core time does not mean the workers
    used it, issue 43 item 8)."""
    if not loader_driven or not s.worker_cpu_per_batch_s or not alone or alone <= 0 or s.step_s <= 0:
        return {}
    c = s.worker_cpu_per_batch_s * max(1.0, micro)
    wait = s.wait_s
    n, q = s.worker_batches, s.in_flight  # the workers made between n - q and n + q batches over the window
    c_lo, c_hi = (c * n / (n + q), c * n / max(1, n - q)) if n else (c, c)
    if window and s.own_cpu_steps:
        return _from_window(s, c, c_lo, c_hi, cores, threads, idle_seen_per_step(window, s.window_steps),
                            others_per_step(window, s.window_steps))
    if s.calm_alone and s.calm_alone[0] > 0 and s.calm_alone[1] is not None:
        wall, own_cpu = s.calm_alone
    else:  # no replay (dropped, or the command ended first): the measured steps outside their wait
        wall = max(s.step_s - wait, 1e-9)
        own_cpu = max(0.0, (s.cpu_s or 0.0) - (s.data_cpu_s or 0.0))
    k = min(cores, own_cpu / wall)
    idle = (cores - k) * wall + cores * max(0.0, wait - (s.data_cpu_s or 0.0))
    observed = math.inf  # the measured steps' work over the replayed step's: the most the delay can be
    if s.calm_alone and s.work_median_s is not None:
        observed = max(0.0, s.work_median_s - s.calm_alone[0])
    rate = min(1.0, cores / max(1, threads))  # of a core, what each of the step's threads gets

    def delay(c: float) -> float:
        return min(max(0.0, c - idle) / rate, observed)

    def share(c: float) -> float:  # of the step as measured, what the workers' CPU on its cores adds
        return min(1.0 - wait / s.step_s, delay(c) / s.step_s)

    return {"data_cpu_per_step_s": c, "step_cpu_per_step_s": own_cpu, "step_cores": k, "idle_core_s": idle,
            "thread_rate": rate,
            "demand_cores": (c + own_cpu) / wall, "contended": delay(c) > 0, "data_cpu_delay_s": delay(c),
            "data_cpu_observed_s": observed if math.isfinite(observed) else None,
            "data_cpu_share": share(c), "data_cpu_share_interval": (share(c_lo), share(c_hi))}


def idle_seen_per_step(window: dict, steps: int) -> float | None:
    """Idle core time per step over the measured window, as /proc/stat counted it (None where not read)."""
    if not steps or window.get("busy_s") is None or not window.get("wall_s") or not window.get("cores"):
        return None
    return max(0.0, window["cores"] * window["wall_s"] - window["busy_s"]) / steps


def others_per_step(window: dict, steps: int) -> float:
    """Other processes' CPU per step over the measured window (0 where not read)."""
    return (window.get("others_s") or 0.0) / steps if steps else 0.0


def _from_window(s: RankSummary, c: float, c_lo: float, c_hi: float, cores: float, threads: int,
                 idle_seen: float | None, others: float) -> dict:
    """:func:`cpu_use` from the measured window's totals (:func:`hasten.profile.contention.workers_delay`)."""
    queued = list(s.queued_steps) if len(s.queued_steps) == len(s.work_steps) else None
    d = workers_delay((c, c_lo, c_hi), list(s.cpu_steps), list(s.span_steps), list(s.own_cpu_steps),
                      list(s.work_steps), cores, threads, idle_seen, queued=queued, others=others)
    if not d:
        return {}
    own = sum(s.own_cpu_steps) / len(s.own_cpu_steps)
    t = sum(s.work_steps) / len(s.work_steps)

    def share(delay: float) -> float:  # of the step as measured, what the workers' CPU on its cores adds
        return min(1.0 - s.wait_s / s.step_s, delay / s.step_s)

    observed = None  # the measured steps' work over the replayed step's, for the record (not a cap: see above)
    if s.calm_alone and s.work_median_s is not None:
        observed = max(0.0, s.work_median_s - s.calm_alone[0])
    lo, hi = d["delay_interval_s"]
    return {"data_cpu_per_step_s": c, "step_cpu_per_step_s": own, "step_cores": d["step_cores"],
            "idle_core_s": d["idle_core_s"], "idle_core_interval_s": d["idle_core_interval_s"],
            "thread_rate": d["thread_rate"], "demand_cores": (c + own) / t, "contended": d["delay_s"] > 0,
            "data_cpu_held_s": d["held_s"],
            "data_cpu_delay_s": d["delay_s"], "data_cpu_observed_s": observed, "estimate": "window totals",
            "data_cpu_share": share(d["delay_s"]), "data_cpu_share_interval": (share(lo), share(hi))}


def fastest_step(s: RankSummary) -> float | None:
    """The least a step can take with its data made free, as measured: the measured steps' work less the
    time the loop's thread sat in the run queue (``own_s``: another process, a worker or another job,
    held its core); else the least disturbed replayed step (the data made free, measured); None
    where neither was measured.

    Whatever the workers' CPU costs the step, freeing the data cannot make its work shorter than the
    work its own thread did. (Where torch's other threads wait at a barrier for one that is off its
    core, the loop's thread spins and that time stays in: the floor is then above the truth, and a
    prediction at it errs low.)"""
    if s.own_work_s is not None:
        return s.own_work_s
    return s.calm_alone[0] if s.calm_alone else None


def data_free_step(step: float, wait: float, delay: float, fastest: float | None) -> float:
    """The step with its data made free: less its data wait (``wait``, per step) and what the workers' CPU
    on its own cores costs it (``delay``, :func:`cpu_use`), never below ``fastest``
    (:func:`fastest_step`) unless the step less its wait is already faster (that was measured).

    timm's train.py with one worker beside another job had the workers' cost (their CPU, none of
    it on an idle core, at the rate a thread of the step gets a core) and the wait add up to more
    than the step: "data made free: step 0.0 ms", a prediction of x231,837,393 (issue 43)."""
    free = step - wait
    return max(1e-9, free - delay, min(free, fastest or 0.0))


def batch_where(d0: dict) -> list[dict]:
    """Where the batch is made, by function (``{"at": "train.py:get_batch", "share"}``), from the samples on
    the lines that make it (a loop without a DataLoader)."""
    outside = d0.get("outside") or {}
    rows = outside.get("lines", {}).get("batch", [])
    total = outside.get("counts", {}).get("batch", 0)
    if d0.get("loader_driven", True) or not rows or not total:
        return []
    return [{"at": f"{x['at'].rsplit(':', 1)[0]}:{x.get('function', '?')}", "share": x["samples"] / total}
            for x in rows]


# A line that calls the model, a loss, autograd's backward or an optimizer's step is compute, wherever the
# sample fell in it: `loss = F.cross_entropy(model(x), y)`, `loss.backward()`, `optimizer.step()` (issue 43).
COMPUTE_CALL = re.compile(r"\.backward\(|\bautograd\.(backward|grad)\(|\b\w*(optim\w*|opt)\.step\(|\bF\.\w+\("
                          r"|(^|[^.\w])(self\.)?(model|net|module|generator|discriminator|encoder|decoder|ddp_model"
                          r"|raw_model)(\.forward)?\(")


def compute_samples(x: dict) -> int:
    """Of a sampled line's samples outside compute (``x``: a line of the report's ``outside``), those that
    were compute all the same: their stack held a module's forward, autograd's backward or an optimizer's
    step (``compute_samples``, from the sampler), or, where the sampler did not say, all of them when the
    line's code calls one (:data:`COMPUTE_CALL`)."""
    if x.get("compute_samples") is not None:
        return min(x["samples"], x["compute_samples"])
    return x["samples"] if COMPUTE_CALL.search(x.get("code") or "") else 0


def _rest_lines(d0: dict, loader_driven: bool) -> tuple[dict[str, dict], int]:
    """The rest's sampled lines (compute taken out) by place, and the samples the rest's share is spread over."""
    outside = d0.get("outside") or {}
    lines, counts = outside.get("lines", {}), outside.get("counts", {})
    kinds = ("other", "batch") if loader_driven else ("other",)  # with a DataLoader, data is its __next__ only
    rows: dict[str, dict] = {}
    for kind in kinds:
        for x in lines.get(kind, []):
            row = rows.setdefault(x["at"], {**x, "samples": 0, "compute": 0})
            row["samples"] += x["samples"]
            row["compute"] += compute_samples(x)
    # The sampler files the rest's samples whose stack was in torch's forward, autograd or an optimizer under
    # "compute" (a part of counts["other"], hasten.profile.inject.sampler): compute, whatever their line.
    for x in lines.get("compute", []):
        row = rows.setdefault(x["at"], {**x, "samples": 0, "compute": 0})
        row["samples"] += x["samples"]
        row["compute"] += x["samples"]
    if counts.get("hasten"):  # hasten's own hooks, running in the step: said as such, not as a line of the loop
        rows["hasten profile's own hooks"] = {"at": "hasten profile's own hooks", "samples": counts["hasten"],
                                              "compute": 0}
    total = max(sum(counts.get(k, 0) for k in (*kinds, "hasten")), sum(r["samples"] for r in rows.values()))
    return rows, total


def compute_in_rest(d0: dict, loader_driven: bool) -> float:
    """The share of the rest's samples (neither data nor communication, outside the compute hooks) that
    were compute all the same (:func:`compute_samples`): time the verdict counts as compute."""
    rows, total = _rest_lines(d0, loader_driven)
    return sum(r["compute"] for r in rows.values()) / total if total else 0.0


# The fewest samples of the rest (compute taken out) its lines are named from: pytorch/examples' regression,
# a second of 0.2 ms steps, had its whole rest, 47% of the step, put on one line (hasten's own hooks) by one
# sample (issue 43). With 5, a line that holds all of them holds more than half the rest (Wilson, 95%).
MIN_NAMED = 5


def other_where(d0: dict, other: float, loader_driven: bool) -> list[dict]:
    """The lines the rest of the step (neither data, compute nor communication) was sampled in, with shares
    (``other``: the rest's share of the step, compute already taken out); none from fewer than
    :data:`MIN_NAMED` samples."""
    rows, total = _rest_lines(d0, loader_driven)
    compute = sum(r["compute"] for r in rows.values())
    if not total or other <= 0 or total - compute < MIN_NAMED:
        return []
    out = [{"at": r["at"], "code": r.get("code", ""), "function": r.get("function", ""),
            "share": other * (r["samples"] - r["compute"]) / (total - compute)}
           for r in rows.values() if r["samples"] > r["compute"]]
    return sorted(out, key=lambda r: -r["share"])[:3]
