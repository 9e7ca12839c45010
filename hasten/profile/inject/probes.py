"""The probes: turning one off when it fails, and the two that run outside the loop's steps.

**Do no harm.** A probe that fails, with any exception or a result that is not finite,
is dropped with one line saying which and why (:func:`drop`); the command's run and the
report of the measured steps go on. hasten's own probe code runs through
:func:`guarded`, so that its exceptions never reach the user's loop; an exception that
escapes a replayed step of the user's own loop ends the command, and drops the probe
in flight (:func:`in_flight`, :func:`hasten.profile.inject.report.probe_failed`).
``--no-probe`` turns any of them off beforehand (:mod:`hasten.profile.inject.settings`).

Outside the loop's steps, once the replayed steps are done, right before the process
writes its report and exits:

- :func:`loader_alone`: batches pulled from the training loader's live iterator with no
  step between (prefetched batches drained first): the time to produce one, and the
  workers' CPU per batch from /proc;
- :func:`handoff`: for a loop without workers, the time to receive a batch from one
  worker process (a DataLoader of :class:`Repeat`): the cost that moving the batches
  into workers would add;
- :func:`handout`: for a loop whose batch function was timed, the time to hand out a batch
  kept in a fixed set (the wrapper of ``batch_fn=pool:N``, a fresh copy each): the cost that
  the set's every step pays in place of making a batch.

Changes the training math: no (the process trains no further).
"""

from __future__ import annotations

import math
import statistics
import time

from hasten.cpu_time import pid_cpu_s, runqueue_s
from hasten.profile.inject import device_sync, messages
from hasten.profile.inject.settings import NEEDS_REPLAY
from hasten.profile.inject.state import State

# The replayed kinds of step each probe runs.
KINDS = {"replay": ("step_alone",), "autocast": ("autocast",), "comm": ("comm_off", "comm_bf16"), "loader": ()}
PROBE_OF_KIND = {kind: probe for probe, kinds in KINDS.items() for kind in kinds}


def drop(st: State, probe: str, why: str, ended_run: bool = False, raised: bool = False) -> None:
    """Turn ``probe`` off for the rest of the run, its steps unused, with one line saying why.

    Dropping the replay drops the probes compared with it (autocast, comm). ``ended_run``:
    its failure ended the process (the launcher tells a peer rank's end apart by it);
    ``raised``: the loop raised in its replayed step (the command failed under the profile)."""
    names = [probe] + ([p for p in NEEDS_REPLAY if p in st.probes] if probe == "replay" else [])
    for name in names:
        if name not in st.probes:
            continue
        if name == "comm" and name != probe and not (st.ddp and st.world_size > 1):
            st.probes.discard(name)  # it would not have run: nothing to say
            continue
        st.probes.discard(name)
        for kind in KINDS[name]:
            st.records[kind] = []
        if name == "loader":
            st.loader_probe = {}
        reason = why if name == probe else "it is compared with the replayed step, whose probe was dropped"
        st.dropped.append({"probe": name, "why": reason, "ended_run": ended_run and name == probe,
                           **({"raised": True} if raised and name == probe else {})})
        messages.say(st, f"{name} probe dropped: {reason}")
    if st.step_kind in PROBE_OF_KIND and PROBE_OF_KIND[st.step_kind] not in st.probes:
        st.comm_mode = "real"


def guarded(st: State, probe: str, fn) -> None:
    """Run hasten's own probe code ``fn(st)``: an exception, or a reason it returns, drops the probe."""
    if probe not in st.probes:
        return
    import torch
    threads = torch.get_num_threads()
    try:
        why = fn(st)
    except Exception as exc:
        why = messages.error_line(exc)
    finally:
        if torch.get_num_threads() != threads:  # the script's thread count is the script's: put it back
            torch.set_num_threads(threads)
            st.threads.setdefault("restored_after", []).append(probe)
    if why:
        drop(st, probe, why)


def in_flight(st: State) -> str | None:
    """The probe whose replayed step is running, if one is."""
    if st.phase != "replay":
        return None
    probe = PROBE_OF_KIND.get(st.step_kind)
    return probe if probe in st.probes else None


def drop_unfinite(st: State) -> None:
    """Drop a probe whose replayed steps have a time that is not finite."""
    for probe, kinds in KINDS.items():
        for kind in kinds:
            bad = next((k for r in st.records[kind] for k, v in r.items()
                        if isinstance(v, float) and not math.isfinite(v)), None)
            if bad:
                drop(st, probe, f"a {kind} step's {bad} is not finite")
                break
    lp = st.loader_probe
    if any(isinstance(v, float) and not math.isfinite(v) for v in lp.values()):
        drop(st, "loader", "a time of the loader alone is not finite")


def loader_alone(st: State) -> str | None:
    """Pull batches from the training loader's iterator with no step between: the time to produce one.

    From the pass under way; where it ends before a batch is timed (the loop drew its last batch), from
    a fresh pass of the same loader (the process trains no further). Returns why not, where neither
    gives a batch (the probe is dropped, said)."""
    if st.train_iter is None:
        return None
    it, orig = st.train_iter
    owner = getattr(it, "_hasten_owner", None)
    for fresh in (False, True):
        if fresh:
            if owner is None:
                break
            it = iter(owner)
        timed = _time_alone(it, orig, max(st.probe_steps, 2))
        if timed is not None:
            st.loader_probe = timed
            return None
    return "skipped: the training loader's pass ended before a batch was timed alone"


def _time_alone(it, orig, n: int) -> dict | None:
    """Up to ``n`` batches of iterator ``it`` timed, its prefetched ones drained first (they would come
    for free); None where the pass ends before one is timed."""
    workers = getattr(it, "_num_workers", 0)
    try:
        for _ in range(getattr(it, "_prefetch_factor", 0) * workers):
            orig(it)
    except StopIteration:
        return None
    times = []
    pids = [w.pid for w in getattr(it, "_workers", [])]
    w0 = [pid_cpu_s(p) for p in pids]
    t0, c0 = time.perf_counter(), time.process_time()
    while len(times) < n:
        t, rq = time.perf_counter(), runqueue_s()
        try:
            orig(it)
        except StopIteration:
            break
        times.append(time.perf_counter() - t - (runqueue_s() - rq))
    wall, cpu, got = time.perf_counter() - t0, time.process_time() - c0, len(times)
    if not got:
        return None
    w1 = [pid_cpu_s(p) for p in pids]
    wcpu = (sum(w1) - sum(w0)) / got if pids and None not in w0 and None not in w1 else None
    return {"batches": got, "batch_s": statistics.median(times) if workers == 0 else wall / got,
            "main_cpu_s": cpu / got, "worker_cpu_s": wcpu, "workers": workers}


class Repeat:
    """A map-style dataset of one cached batch (module level: spawned workers must import it)."""

    def __init__(self, batch, n: int) -> None:
        self.batch, self.n = batch, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return self.batch


def handoff(st: State) -> None:
    """Seconds the loop would pay per batch to receive it from a worker process (loops without workers): a
    batch as the loop makes it (its batch function's result, else the model's arguments) sent by one worker."""
    batch = next((b for b in (st.cached, st.batch_fn_result, st.model_args) if b is not None), None)
    if batch is None or (st.train_iter is not None and getattr(st.train_iter[0], "_num_workers", 0)):
        return
    try:
        st.loader_probe["handoff_s"] = handoff_time(batch, max(st.probe_steps, 4))
    except Exception as exc:  # a batch a worker cannot send (CUDA tensors, ...): no estimate
        st.loader_probe["handoff_error"] = repr(exc)


def handoff_time(batch, n: int) -> float:
    """Median seconds the loop takes to receive ``batch`` from one DataLoader worker that has it ready
    (unpickling or mapping its shared memory, the queue, the wake-up), over ``n`` batches after 3."""
    from torch.utils.data import DataLoader
    it = iter(DataLoader(Repeat(batch, n + 4), batch_size=None, num_workers=1))
    for _ in range(3):
        next(it)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        next(it)
        times.append(time.perf_counter() - t)
    del it
    return statistics.median(times)


HANDOUT_CALLS, HANDOUT_BLOCKS = 20, 5  # a block's mean per call, the median over the blocks


def handout(st: State) -> None:
    """Seconds a batch kept in a fixed set takes to be handed out (:func:`handout_time`), and its bytes (the
    set's memory), for a loop whose batch function was timed (its result, kept for the hand-off probe)."""
    from hasten.profile.inject.batches import batch_nbytes
    if st.batch_fn_result is None:
        return
    try:
        st.loader_probe["handout_s"] = handout_time(st.batch_fn_result, lambda: device_sync.sync(st))
        st.loader_probe["batch_fn_bytes"] = batch_nbytes(st.batch_fn_result)
    except Exception as exc:  # a batch that cannot be copied: no estimate (the fixed set is then not predicted)
        st.loader_probe["handout_error"] = repr(exc)


def handout_time(batch, sync=lambda: None) -> float:
    """Median seconds per call of :func:`hasten.profile.inject.batch_fn.pooled`'s wrapper handing out ``batch``
    from a set of one (the call, the lookup, a fresh copy of its tensors), over blocks of calls, each block's
    run-queue wait taken out (another job holding the core is not the copy's cost); ``sync`` waits for the
    device's copies at each block's end."""
    from hasten.profile.inject.batch_fn import pooled
    hand_out = pooled(lambda: batch, 1)
    hand_out()  # the set made
    per_call = []
    for _ in range(HANDOUT_BLOCKS):
        t, rq = time.perf_counter(), runqueue_s()
        for _ in range(HANDOUT_CALLS):
            hand_out()
        sync()
        per_call.append(max(0.0, time.perf_counter() - t - (runqueue_s() - rq)) / HANDOUT_CALLS)
    return statistics.median(per_call)
