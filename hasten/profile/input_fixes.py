"""The input fixes of a run, each predicted with :class:`hasten.profile.input_model.InputModel`.

- more DataLoader workers (or, for a loop without a DataLoader, its batch function moved into
  one): the fewest workers within 2% of the best step the model allows;
- making the batches in the loop (``num_workers=0``), where receiving them from workers and
  their CPU on the step's cores cost more than making them;
- batch echoing at a whole e <= R (Choi et al., 2019), discounted by the extra steps echoed
  training needs to reach the same accuracy (:data:`BATCH_ECHO_STEPS`);
- the device-resident loader (:mod:`hasten.profile.resident_fix`), the batch's rows made at once
  (:mod:`hasten.profile.per_row`), the data prepared once (:mod:`hasten.profile.prepare_once`).

Every prediction is then held to the bound of the run's data share by
:func:`hasten.profile.ranking.admit`.

Changes the training math: no (analysis only); echoing does, and says so.
"""

from __future__ import annotations

from hasten.cores import quota_capped
from hasten.profile.bounds import gain_bound
from hasten.profile.fix_code import echo_apply, echo_code
from hasten.profile.input_model import InputModel, input_model
from hasten.profile.per_row import per_row_fix
from hasten.profile.prepare_once import prepare_once
from hasten.profile.records import INPUT, Analysis, RankSummary, Recommendation
from hasten.profile.resident_fix import resident_fixes
from hasten.profile.thresholds import MAX_WORKERS

# Steps to the target accuracy with batch echoing at factor e, relative to no
# echoing, measured: means over 3 seeds of 156.7 steps without echoing and 233.3,
# 383.3 and 743.3 at e = 2, 4 and 6 (a small CNN on CIFAR-10-JPEG at 16x16, batch 64,
# learning rate 0.05, to 40% accuracy on 1,000 test images). An echoed step is worth
# less than a fresh one; this is by how much. The echo sweep (docs/results/echo.md)
# also finds batch echoing the weakest variant.
BATCH_ECHO_STEPS = ((1.0, 1.0), (2.0, 233.3 / 156.7), (4.0, 383.3 / 156.7), (6.0, 743.3 / 156.7))
ECHO_SOURCE = "benchmarks/results/echo_sweep.json at commit 8b1ade8 (batch echoing, CIFAR-10 small CNN, 3 seeds)"


def echo_steps_factor(e: float) -> float:
    """Steps to target with batch echoing at e relative to none (piecewise linear in e)."""
    pts = BATCH_ECHO_STEPS
    if e >= pts[-1][0]:
        return pts[-1][1]
    for (e0, s0), (e1, s1) in zip(pts, pts[1:]):
        if e0 <= e <= e1:
            return s0 + (s1 - s0) * (e - e0) / (e1 - e0)
    return 1.0


def per_step_iter_of(a: Analysis, d0: dict) -> bool:
    """Whether the loop starts a new pass of its training loader every step (``next(iter(loader))``)."""
    train = [ld for ld in a.loaders if ld.get("training")]
    return bool(train) and train[0].get("iterators", 0) >= 0.5 * max(1, d0.get("steps_seen", 0))


def batch_function(a: Analysis, d0: dict | None = None) -> str:
    """The call that makes a batch in a loop without a DataLoader: the function whose calls were timed
    (:mod:`hasten.profile.inject.batch_fn`), else where the samples found the data time (a function a
    sample happened to land in, of a short run's few: regression/main.py's data was once called
    ``_releaseLock(...)``, logging's at-fork hook)."""
    name = ((d0 or {}).get("batch_fn") or {}).get("name")
    if name:
        return f"{name}(...)"
    for w in a.where_data:
        at = w.get("at", "")
        if ":" in at and not at.endswith(("<module>", "main")):
            return at.split(":", 1)[1] + "(...)"
    return "get_batch(...)"


def input_fixes(a: Analysis, s: RankSummary, d0: dict, memory_bytes: float) -> list[Recommendation]:
    """Every input fix that fits this run, predicted (see the module)."""
    m = input_model(a, s)
    if m.step - m.free <= 0:
        return []
    a.cpu.update(producer_s=m.producer, data_cpu_s=m.data_cpu, main_cpu_s=m.main_cpu)
    recs = []
    if m.workers < worker_cap(a.cpu):
        recs.append(_workers_fix(a, m, d0, s.handoff_s))
    if a.loader_driven and m.workers and m.data_cpu > 0 and not per_step_iter_of(a, d0):
        recs.append(_in_loop_fix(m))
    if a.upstream_ratio is not None and a.upstream_ratio > 1.2:
        recs.append(_echo_fix(a, m, d0))
    if a.loader_driven:
        recs += resident_fixes(a, d0, m.free, memory_bytes)
    else:
        lines = ((d0.get("outside") or {}).get("lines") or {}).get("batch", [])
        bound = gain_bound(a, INPUT)
        per_row = per_row_fix(lines, m.data, m.step)
        if per_row is not None:
            recs.append(per_row)
        once = prepare_once(d0, lines, m, bound, a.data_interval[0], batch_function(a, d0), s.handout_s,
                            memory_bytes)
        if once is not None and per_row is None:
            recs.append(Recommendation(**once))
    return recs


def worker_cap(cpu: dict) -> int:
    """The most DataLoader workers a fix may ask for: the cores the job may run on (its affinity and
    the cores its measured window saw, capped by the cgroup quota as ``hasten.cores`` counts it), at
    most ``MAX_WORKERS``. More workers than cores is what PyTorch warns "might get DataLoader running
    slow or even freeze" (issue 43: 3 workers on 2 cores, promoted on one run, measured x0.97)."""
    caps = [int(x) for x in (cpu.get("affinity"), cpu.get("window_cores")) if x]
    return min(MAX_WORKERS, quota_capped(min(caps), cpu.get("quota"))) if caps else MAX_WORKERS


def handoff_caveat(m: InputModel, handoff_s: float | None, probes_note: str) -> tuple[str | None, str | None]:
    """Whether moving the batches made in the loop into workers can be predicted, and why it may not pay:
    ``(unpredicted, below_because)``.

    Each batch then comes from another process (pickled or put in shared memory, queued, the loop woken to
    take it), and the loop pays that hand-off every batch, as :class:`InputModel` adds it. Not measured
    (``handoff_s`` None: the loader probe off or failed), the prediction would be the data share's
    Amdahl bound whatever the hand-off costs: pytorch/examples' regression, 0.05 ms of data in a 0.2 ms
    step, was predicted x1.67 with 2 workers and verified x0.16 (issue 43). Measured above the time it
    replaces, the fix cannot pay, and says so."""
    if m.workers:
        return None, None
    if handoff_s is None:
        return (f"not predicted: what receiving a batch from a worker process costs was not measured "
                f"({probes_note}), and it is paid every batch: on a step of {m.step * 1e3:.2f} ms whose batches "
                f"take {m.data * 1e3:.2f} ms to make, it may cost more than it saves"), None
    if m.handoff >= m.data:
        return None, (f"receiving a step's batches from a worker takes {m.handoff * 1e3:.2f} ms (measured), "
                      f"more than the {m.data * 1e3:.2f} ms the loop takes to make them")
    return None, None


def _workers_fix(a: Analysis, m: InputModel, d0: dict, handoff_s: float | None = None) -> Recommendation:
    most = worker_cap(a.cpu)
    options = [(w, m.step_with(w)[0]) for w in range(max(m.workers + 1, min(2, most)), most + 1)]
    best = min(step for _, step in options)
    w = next(w for w, step in options if step <= best * 1.02)
    predicted = m.speedup(m.step_with(w)[0])
    off = "loader" in a.probes_off or any(d.get("probe") == "loader" for d in a.dropped)
    unpredicted, below = handoff_caveat(m, handoff_s, "its probe was off" if off else
                                        "the loader probe did not run or could not send the batch")
    if not a.loader_driven:
        fn = batch_function(a, d0)
        return Recommendation(
            fix=f"make batches in a DataLoader with {w} workers",
            how=("class Batches(torch.utils.data.IterableDataset):\n"
                 f"         def __iter__(self):\n             while True:\n                 yield {fn}\n"
                 f"     batches = iter(DataLoader(Batches(), batch_size=None, num_workers={w}, "
                 "persistent_workers=True))\n"
                 "     # in the loop: x, y = next(batches)   (seed each worker: torch.utils.data.get_worker_info())"),
            predicted_speedup=predicted, changes_math=False, apply=f"batch_fn=workers:{w}", basis=m.basis(w),
            unpredicted=unpredicted, below_because=below)
    train = [ld for ld in a.loaders if ld.get("training")]
    # An IterableDataset yields every item in every worker unless it splits them by worker,
    # which its workers' first batches showed when it had workers (loader._check_workers).
    dup = train[0].get("worker_duplicates") if train else None
    split = bool(dup) and dup["distinct"] == dup["workers"]
    shard = ("\n     # an IterableDataset: split its items by worker (torch.utils.data.get_worker_info()), "
             "or each worker yields all of them" if train and train[0].get("iterable") and not split else "")
    if per_step_iter_of(a, d0):  # next(iter(loader)) every step: a new pass (and workers) each time
        return Recommendation(
            fix=f"one iterator, {w} DataLoader workers",
            how=f"it = iter(DataLoader(..., num_workers={w}, persistent_workers=True))   # once; then "
                "x, y = next(it) each step (a new iter() at StopIteration)" + shard,
            predicted_speedup=predicted, changes_math=False, apply=f"workers={w},keep_iter", basis=m.basis(w),
            unpredicted=unpredicted, below_because=below)
    return Recommendation(
        fix=f"{w} DataLoader workers", how=f"DataLoader(..., num_workers={w}, persistent_workers=True)" + shard,
        predicted_speedup=predicted, changes_math=False, apply=f"workers={w}", basis=m.basis(w),
        unpredicted=unpredicted, below_because=below)


def _in_loop_fix(m: InputModel) -> Recommendation:
    # Receiving a batch from a worker costs the loop CPU, and the workers' CPU may take the
    # step's cores: where making a batch costs less than that, the loop is faster making it.
    step, limit = m.step_with(0)
    return Recommendation(
        fix="make the batches in the loop (num_workers=0)", how="DataLoader(..., num_workers=0)",
        predicted_speedup=m.speedup(step), changes_math=False, apply="workers=0",
        basis=f"the loop takes {m.receive * 1e3:.1f} ms a step receiving batches from {m.workers} workers, and "
              f"their CPU on the step's cores costs it {m.delay * 1e3:.1f} ms; making a step's batches costs at "
              f"most their {m.data_cpu * 1e3:.1f} ms of CPU: step {step * 1e3:.1f} ms, set by {limit}, "
              f"{m.against()}")


def _echo_fix(a: Analysis, m: InputModel, d0: dict) -> Recommendation:
    r = a.upstream_ratio

    def echoed_step(e: float) -> float:
        return m.step_with(m.workers, e)[0] if m.workers else m.data / e + m.free

    # Whole factors only: each batch is used e times, and "1.3 times" is no way to use one.
    candidates = [float(e) for e in range(2, max(2, int(min(r, 6.0))) + 1)]
    e = max(candidates, key=lambda e: m.speedup(echoed_step(e)) / echo_steps_factor(e))
    rate = m.speedup(echoed_step(e))
    # Under gradient accumulation a step's micro-batches are echoed together: copies of one
    # micro-batch inside a step would make its gradient one micro-batch's (issue 34).
    group = max(1, round(m.batches_per_step))
    if a.loader_driven:
        apply = echo_apply(e, group)
        how = echo_code(apply)  # the call --verify makes (hasten.profile.inject.fixes.echoed)
    elif group == 1:
        how = f"if step % {round(e):d} == 0: x, y = {batch_function(a, d0)}   # reuse each batch for {round(e):d} steps"
        apply = f"batch_fn=echo:{round(e):d}"  # hasten.profile.inject.batch_fn
    else:
        how = (f"if step % {round(e):d} == 0: batches = [{batch_function(a, d0)} for _ in range({group})]   "
               f"# reuse each step's {group} micro-batches for {round(e):d} steps")
        apply = None
    return Recommendation(
        fix=f"batch echoing e={e:g}{' of whole steps' if group > 1 else ''}", how=how,
        predicted_speedup=rate / echo_steps_factor(e), step_rate_factor=1 / echo_steps_factor(e),
        changes_math=True, apply=apply, math_note=f"each batch trained on {e:g} times",
        basis=f"R={r:.2f}; steps x{rate:.2f} faster, each worth 1/{echo_steps_factor(e):.2f} of a fresh "
              f"one ({ECHO_SOURCE})")
