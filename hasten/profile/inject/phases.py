"""The phases every instrumented process goes through, counted in steps.

``warmup`` (discarded), ``measure`` (the real run), ``epoch_wait`` (the loop's own steps,
not recorded, until the replayed ones fit in its training loader's pass:
:mod:`hasten.profile.inject.epoch_fit`), ``replay`` (the counterfactual probes,
interleaved step by step: ``step_alone``, the first batch that reached the model
replayed, so data is free; ``comm_off``, the same with DDP's ``noop_hook``;
``comm_bf16``, with hasten's bf16-compressing hook; ``autocast``, under bf16 autocast),
then ``loader_alone`` (batches pulled from the training loader's iterator with no step
between: the time to produce one). Identical on every rank, so that collectives line up.

Changes the training math: only in the replayed steps (a repeated batch; in ``comm_off``
steps, gradients not averaged); the process exits right after them.
"""

from __future__ import annotations

import math
import statistics
import time

from hasten.cpu_time import pid_cpu_s
from hasten.profile.inject import autocast_check, cpu_window, ddp, epoch_fit, probes
from hasten.profile.inject.state import State, is_training_loader
from hasten.profile.shares import could_decide, stalled, sum_interval


def plan(st: State) -> list[tuple[str, int]]:
    steps = [("warmup", st.warmup), ("measure", st.steps)]
    kinds = replay_kinds(st)
    if kinds:
        # steps of the loop's own until the replayed ones fit in its loader's pass (epoch_fit.fits)
        steps += [("epoch_wait", 0), ("replay", st.probe_steps * len(kinds))]
    if "loader" in st.probes:
        steps.append(("loader_alone", 0))
    return steps


def replay_kinds(st: State) -> tuple[str, ...]:
    # Interleaved, not one after another: a spell of load from other jobs then hits all alike.
    if "replay" not in st.probes:
        return ()
    kinds = ["step_alone"]
    if "comm" in st.probes and st.ddp and st.world_size > 1:
        kinds += ["comm_off", "comm_bf16"]
    if "autocast" in st.probes:
        kinds.append("autocast")
    return tuple(kinds)


ORDER = ("warmup", "measure", "epoch_wait", "replay", "loader_alone", "done")
WORKER_QUEUES = 5  # the stopping rule wants at least this many prefetch queues of batches in the window
# ... and a window at least this long: a scheduler's time slice (milliseconds) landing in one step of a
# window of sub-millisecond steps is most of it (pytorch/examples' regression/main.py: 12 steps, 11 ms)
MIN_WINDOW_S = 1.0


def advance(st: State) -> None:
    """At a step boundary: on to the next phase whose steps are due (entering it), as far as they go."""
    while st.phase != "done":
        counts = dict(plan(st))
        names = list(counts)
        if st.phase in counts:
            if st.phase == "epoch_wait":
                if not epoch_fit.fits(st, len(replay_kinds(st))):
                    return
            elif st.phase_step < counts[st.phase]:
                return
            if st.phase == "measure" and _measure_on(st):
                st.steps += st.phase_step  # twice the steps: the interval narrows by about 1/sqrt(2)
                return
            _leave(st)
            i = names.index(st.phase)
            st.phase = names[i + 1] if i + 1 < len(names) else "done"
        else:  # its probes were dropped: on to the next planned phase
            st.phase = next(p for p in ORDER[ORDER.index(st.phase) + 1:] if p in counts or p == "done")
        st.phase_step = 0
        _enter(st)  # (entering a phase may drop a probe, and with it a replayed kind)
        if st.phase == "loader_alone":
            return


def _enter(st: State) -> None:
    if st.phase == "measure":
        if st.settings.seconds > 0:
            _steps_for_seconds(st)
        st.worker_cpu = {"start": _training_worker_cpu(st), "batches0": _training_batches(st)}
        st.threads = {"intra_op": _torch_threads(), "inter_op": _torch_threads("interop")}
        st.measure_t0 = time.perf_counter()
        st.cpu_window = cpu_window.start(st)
    if st.phase == "epoch_wait":
        probes.guarded(st, "autocast", autocast_check.bf16_pays)  # milliseconds, before the trial's full step
        probes.guarded(st, "autocast", autocast_check.trial)
        if _any_rank(st, "autocast" not in st.probes) and "autocast" in st.probes:
            probes.drop(st, "autocast", "dropped on another rank")  # every rank replays the same kinds
        epoch_fit.plan(st, replay_kinds)
    if st.phase == "replay":
        # Without a training DataLoader, the replayed steps hand the model its kept arguments.
        st.replay_args = st.model_args is not None and not any(is_training_loader(st, lid)
                                                               for lid in st.loaders)
        probes.guarded(st, "comm", ddp.calibrate_link)


def _leave(st: State) -> None:
    st.comm_mode = "real"
    if st.phase == "measure":
        close_window(st)


def close_window(st: State) -> None:
    """The measured window ends: the workers' CPU over it, the cores other processes left, the threads.

    At the window's planned end, or where the command ends on its own inside it
    (:func:`hasten.profile.inject.report.at_exit`): the steps measured so far are then the report's."""
    if st.worker_cpu and "batches" not in st.worker_cpu:
        end = _training_worker_cpu(st)
        st.worker_cpu.update(end=end, batches=_training_batches(st) - st.worker_cpu["batches0"],
                             cpu_s=_worker_cpu_delta(st.worker_cpu.get("start"), end), in_flight=_in_flight(st))
        st.cpu_window = cpu_window.finish(st, st.cpu_window, st.worker_cpu.get("cpu_s"))
        now = _torch_threads()
        if st.threads and now != st.threads.get("intra_op"):
            st.threads["intra_op_end"] = now  # the script changed it during the window


def _measure_on(st: State) -> bool:
    """The stopping rule: whether the window goes on, because the data share's interval straddles a
    verdict threshold that more steps could settle, or it is shorter than :data:`MIN_WINDOW_S`, and
    twice the window still fits the time bound (``--decide-within``). Every rank takes the same
    decision (any rank's need)."""
    if st.settings.decide_s <= 0:  # the same on every rank: no rank waits for the others' answer
        return False
    flag = False
    elapsed = time.perf_counter() - st.measure_t0
    if 2 * elapsed <= st.settings.decide_s:
        share, lo, hi = data_share(st)
        from hasten.profile.thresholds import DEAD_BAND, INPUT_HIGH, INPUT_MODERATE
        flag = could_decide(share, lo, hi, (INPUT_MODERATE, INPUT_HIGH), DEAD_BAND)
        # The workers' CPU per batch is their CPU over the window by the batches drawn in it; they may have
        # made up to a full prefetch queue more or fewer: a window of at least five queues keeps that within 20%.
        flag = flag or _training_batches(st) - st.worker_cpu.get("batches0", 0) < WORKER_QUEUES * _in_flight(st)
        flag = flag or elapsed < MIN_WINDOW_S
    flag = _any_rank(st, flag)
    if flag:
        st.extended += 1
    return flag


def _in_flight(st: State) -> int:
    """Batches the training loader's workers may hold made ahead: workers x prefetch factor."""
    if st.train_iter is None:
        return 0
    it = st.train_iter[0]
    return getattr(it, "_num_workers", 0) * (getattr(it, "_prefetch_factor", 2) or 0)


def data_share(st: State) -> tuple[float, float, float]:
    """The measured steps' data share and its interval, as the verdict will weigh it
    (:func:`hasten.profile.attribution.data_split`, on the steps :func:`hasten.profile.shares.stalled`
    leaves in)."""
    from hasten.profile.attribution import data_split
    recs = [r for r in st.records["measure"] if not r.get("excluded")] or st.records["measure"]
    recs = [r for r, s in zip(recs, stalled(recs)) if not s]  # as the verdict will (verdict.clean_steps)
    loader_driven = any(is_training_loader(st, lid) for lid in st.loaders)
    d = {"loader_driven": loader_driven,
         "outside": {"counts": dict(st.outside_counts), "batch_found": bool(st.batch_lines),
                     "batch_call_only": st.batch_call_only}}
    split = data_split(d, recs)
    spans = sum(r["span_s"] for r in recs)
    share = split["data_s"] * len(recs) / spans if spans > 0 else math.nan
    add = _workers_share(st, recs) if loader_driven and recs and spans > 0 else (0.0, 0.0, 0.0)
    if add[0] <= 0:
        return share, split["data_lo"], split["data_hi"]
    return sum_interval((share, split["data_lo"], split["data_hi"]), add)  # as the verdict sums them


def _workers_share(st: State, recs: list[dict]) -> tuple[float, float, float]:
    """What the training loader's workers' CPU on the step's cores adds to the data share so far, with its
    interval, as the verdict will weigh it (:func:`hasten.profile.contention.workers_delay`, from the
    window's totals so far): a run whose numbers cannot tell yet goes on measuring."""
    from hasten.profile.attribution import idle_seen_per_step, others_per_step
    from hasten.profile.contention import workers_delay
    q = _in_flight(st)
    batches = _training_batches(st) - st.worker_cpu.get("batches0", 0)
    if not q or batches <= 0 or not st.cpu_window:
        return 0.0, 0.0, 0.0
    cpu = _worker_cpu_delta(st.worker_cpu.get("start"), _training_worker_cpu(st))
    window = cpu_window.finish(st, st.cpu_window, cpu)  # reads /proc/stat; the window goes on
    if not cpu or not window:
        return 0.0, 0.0, 0.0
    micro = statistics.median([r.get("micro") or 1 for r in recs])
    c = cpu / batches * max(1.0, micro)
    steps = [r for r in recs if r.get("cpu_s") is not None]
    if not steps:
        return 0.0, 0.0, 0.0
    wait = sum(r["wait_s"] for r in recs) / len(recs)
    step = sum(r["span_s"] for r in recs) / len(recs)
    d = workers_delay((c, c * batches / (batches + q), c * batches / max(1, batches - q)),
                      [r["cpu_s"] for r in steps], [r["span_s"] for r in steps],
                      [r["cpu_s"] - (r.get("data_cpu_s") or 0.0) for r in steps], [r["work_s"] for r in steps],
                      min(window["cores"], max(0.05, window["free"])), _torch_threads(),
                      idle_seen_per_step(window, len(st.records["measure"])),
                      queued=[max(0.0, r["work_s"] - r["own_s"]) for r in steps if "own_s" in r] or None,
                      others=others_per_step(window, len(st.records["measure"])))
    if not d:
        return 0.0, 0.0, 0.0
    most = 1.0 - wait / step
    lo, hi = d["delay_interval_s"]
    return min(most, d["delay_s"] / step), min(most, lo / step), min(most, hi / step)


def _torch_threads(kind: str = "intra") -> int:
    import torch
    return torch.get_num_threads() if kind == "intra" else torch.get_num_interop_threads()


def _any_rank(st: State, flag: bool) -> bool:
    """Whether ``flag`` holds on any rank (the ranks' replayed steps must stay in line)."""
    import torch
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return flag
    ar = getattr(dist.all_reduce, "__wrapped__", dist.all_reduce)
    t = torch.tensor([int(flag)], dtype=torch.int64, device="cuda" if st.device == "cuda" else "cpu")
    ar(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def _steps_for_seconds(st: State) -> None:
    """--seconds: measure as many steps as fit, from the warm-up's step time; every rank agrees."""
    spans = [r["span_s"] for r in st.records["warmup"][1:]] or [r["span_s"] for r in st.records["warmup"]]
    per = statistics.median(spans) if spans else (time.perf_counter() - st.t_start) / max(1, st.steps_seen)
    n = max(3, math.ceil(st.settings.seconds / max(per, 1e-6)))
    try:
        import torch
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            t = torch.tensor([n], dtype=torch.int64, device="cuda" if st.device == "cuda" else "cpu")
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
            n = int(t.item())
    except Exception:
        pass
    st.steps = n


def _training_batches(st: State) -> int:
    return sum(d["batches"] for lid, d in st.loaders.items() if is_training_loader(st, lid))


def _training_worker_cpu(st: State) -> dict[int, float]:
    """CPU seconds of each live worker of the training loader, by pid (/proc).

    The latest training iterator's workers are read from it: an iterator's ``_workers`` are
    started after the base class's ``__init__``, so the pids noted there may miss them."""
    pids = {p for lid, d in st.loaders.items() if is_training_loader(st, lid) for p in d["pids"]}
    if st.train_iter is not None:
        pids |= {getattr(w, "pid", None) for w in getattr(st.train_iter[0], "_workers", None) or []} - {None}
    times = {p: pid_cpu_s(p) for p in pids}
    return {p: t for p, t in times.items() if t is not None}


def _worker_cpu_delta(start: dict[int, float] | None, end: dict[int, float]) -> float | None:
    """The workers' CPU over the window: a worker started inside it counts from zero."""
    if not end:
        return None
    return max(0.0, sum(t - (start or {}).get(p, 0.0) for p, t in end.items()))
