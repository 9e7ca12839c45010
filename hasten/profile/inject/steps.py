"""Steps: where one ends and the next begins, and what each one's time went to.

**A step is an optimizer step.** A global post-hook on ``torch.optim.Optimizer.step``
(every optimizer, library-built ones included) ends a step; with several optimizers, the
first one to step sets the pace. Micro-batches of gradient accumulation (``no_sync`` or
not) fall inside one step.

**Without an optimizer**, a step ends at each top-level ``backward()``: when the first
one returns and no ``torch.optim`` optimizer has been built (a loop that updates its
weights by hand), steps are counted that way, and the report says so. The weight update
then falls outside compute: with a DataLoader, in the step's work; without one, in its
data wait. An optimizer that steps during the warm-up after all takes the pace back.

**Compute** is the time inside a top-level compute interval: a module call, ``backward``,
the optimizer's step, ``clip_grad_norm_``, a ``torch.distributed`` collective
(:mod:`hasten.profile.inject.torch_patches` opens and closes them). The rest of a step
is data wait (a DataLoader's ``__next__``) or, without a DataLoader, time outside compute.

A step that also drew batches from another loader (a validation pass), or ran more
forwards in eval mode / under ``no_grad`` than training ones, is recorded as excluded
and named.

Changes the training math: no.
"""

from __future__ import annotations

import statistics
import time

from hasten.cpu_time import runqueue_s
from hasten.profile.inject import fixes, messages, phases, probes, report, state
from hasten.profile.inject.device_sync import sync
from hasten.profile.inject.state import RECORDS, State, is_training_loader


# ---- compute intervals: nested calls count once, at the outermost
#
# A hook that opens or closes an interval runs outside compute, in the step: its own time there (from the
# hook's entry to the interval's start, from the interval's end to the hook's return) is hasten's, measured
# as it runs and taken out of the step (``entered``, :func:`hook_done`), as :func:`leave_out` does. In a
# step of 0.2 ms a few microseconds of it a step were counted as the loop's time outside compute.

def begin_compute(st: State, entered: float | None = None) -> None:
    """Open a compute interval (nested ones count once); ``entered``: when the hook calling it began."""
    if st.cdepth == 0:
        st.c_cpu0 = time.process_time()
        st.c_t0 = time.perf_counter()
        if entered is not None and st.span is not None:
            st.span["t0"] += max(0.0, st.c_t0 - max(entered, st.span["t0"]))
    st.cdepth += 1


def end_compute(st: State) -> None:
    """Close a compute interval; at the outermost, the hook calls :func:`hook_done` before it returns."""
    if st.cdepth <= 0:
        return
    st.cdepth -= 1
    if st.cdepth == 0 and st.span is not None:
        st.c_end = time.perf_counter()
        st.span["compute_s"] += st.c_end - st.c_t0
        st.span["compute_cpu_s"] += time.process_time() - st.c_cpu0


def hook_done(st: State) -> None:
    """A hook that closed the outermost compute interval returns: its time since, hasten's, out of the step."""
    if st.c_end is not None and st.span is not None and st.cdepth == 0:
        st.span["t0"] += time.perf_counter() - st.c_end
    st.c_end = None


def leave_out(st: State, t0: float, c0: float) -> None:
    """Leave the time since ``t0`` (CPU ``c0``), hasten's own work inside a step, out of the step."""
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    if st.span is not None:
        st.span["t0"] += dt
        st.span["cpu0"] += dc
    if st.cdepth > 0:
        st.c_t0 += dt
        st.c_cpu0 += dc


# ---- the open step

def open_step(st: State) -> None:
    # The step's clock starts last: reading /proc for the run-queue wait took 5-30 us, which in a step of
    # 0.2 ms (pytorch/examples' regression) was a tenth of the step outside compute, hasten's, not the loop's.
    span = {"rq0": runqueue_s(), "cpu0": time.process_time(), "compute_s": 0.0, "compute_cpu_s": 0.0,
            "loader": {}, "loader_cpu": {}, "loader_batches": {}, "comm_s": 0.0, "train_fwd": 0, "eval_fwd": 0,
            "epoch_start": False, "rq_loader": 0.0, "batch_fn_s": 0.0}
    span["t0"] = time.perf_counter()
    st.span, st.c_end = span, None


def close_step(st: State, host_end: float) -> None:
    sp = st.span
    if st.autocast_ctx is not None:  # a forward under it raised, and its hook never came
        st.autocast_ctx.__exit__(None, None, None)
        st.autocast_ctx = None
    if sp is None:
        return
    sync(st)
    hook_done(st)  # a step that ends at backward()'s return: hasten's time since the interval closed
    now, cpu = time.perf_counter(), time.process_time()
    if st.cdepth:  # close the optimizer's own interval into this step
        sp["compute_s"] += now - st.c_t0
        sp["compute_cpu_s"] += cpu - st.c_cpu0
    span_s = now - sp["t0"]
    train_loaders = {lid for lid in sp["loader"] if is_training_loader(st, lid)}
    other = {st.loaders[lid]["name"]: st.loaders[lid]["batches_in_span"] for lid in sp["loader"]
             if lid not in train_loaders}
    loader_s = sum(sp["loader"][lid] for lid in train_loaders)
    loader_cpu = sum(sp["loader_cpu"][lid] for lid in train_loaders)
    outside = max(0.0, span_s - sp["compute_s"])
    via_loader = bool(train_loaders)
    excluded = None
    if other:
        excluded = "other loader: " + ", ".join(f"{k} ({v} batches)" for k, v in other.items())
    elif sp["eval_fwd"] > sp["train_fwd"] and sp["eval_fwd"] > (statistics.median(st.eval_counts)
                                                                if st.eval_counts else 0):
        excluded = f"evaluation: {sp['eval_fwd']} forwards in eval mode or under no_grad"
    st.eval_counts = (st.eval_counts + [sp["eval_fwd"]])[-50:]
    rq = runqueue_s() - sp["rq0"]
    data = loader_s if via_loader else outside
    rec = {"span_s": span_s, "wait_s": data, "work_s": span_s - data, "loader_s": loader_s, "outside_s": outside,
           "compute_s": sp["compute_s"], "comm_s": sp["comm_s"], "cpu_s": cpu - sp["cpu0"],
           "compute_cpu_s": sp["compute_cpu_s"], "data_cpu_s": loader_cpu if via_loader else
           max(0.0, cpu - sp["cpu0"] - sp["compute_cpu_s"]), "via_loader": via_loader,
           # micro-batches: the training loader's batches in the step (a GAN's three forwards take one),
           # or without a loader, the training forwards
           "micro": sum(sp["loader_batches"][lid] for lid in train_loaders) if via_loader else sp["train_fwd"],
           "eval_fwd": sp["eval_fwd"], "epoch_start": sp["epoch_start"],
           "host_s": host_end - sp["t0"], "own_s": span_s - data - max(0.0, rq - sp["rq_loader"]),
           "own_wait_s": data - (sp["rq_loader"] if via_loader else 0.0)}
    if st.batch_fn_code is not None and not via_loader:  # the batch function's calls, timed (batch_fn)
        rec["batch_fn_s"] = min(sp["batch_fn_s"], outside)
    if excluded:
        rec["excluded"] = excluded
    if st.settings.switch:  # a verification run switching its fix between steps (fixes.switch_fix)
        rec["fix_on"] = bool(st.apply)
    probe = probes.PROBE_OF_KIND.get(st.step_kind)
    if st.step_kind in RECORDS and (probe is None or probe in st.probes):  # a dropped probe's steps are not used
        st.records[st.step_kind].append(rec)
    st.span = None


def end_step(st: State) -> None:
    """The step boundary: record the step that ends, move through the phases, open the next one."""
    host_end = time.perf_counter()
    closed = st.span is not None
    close_step(st, host_end)
    st.cdepth = 0  # the optimizer's own interval is closed into the step; an exception may have left others open
    st.steps_seen += 1
    if closed and st.phase in ("warmup", "measure", "replay"):
        st.phase_step += 1
    phases.advance(st)
    fixes.switch_fix(st)
    if st.phase == "loader_alone":
        probes.guarded(st, "loader", probes.loader_alone)
        probes.guarded(st, "loader", probes.handout)
        probes.guarded(st, "loader", probes.handoff)
        st.phase = "done"
    if st.phase == "done":
        report.finish(st)
    st.step_kind = st.phase
    if st.phase == "replay":
        kinds = phases.replay_kinds(st)
        st.step_kind = kinds[st.phase_step % len(kinds)]
        st.comm_mode = {"comm_off": "noop", "comm_bf16": "bf16"}.get(st.step_kind, "real")
    open_step(st)


# ---- the optimizer step: the step boundary; without an optimizer, backward()

def after_backward(st: State) -> None:
    """A top-level ``backward()`` returned: the step boundary where no optimizer was built."""
    if st.cdepth:  # inside another interval: a closure's backward, inside the optimizer's step
        return
    if st.pace == "unknown":
        if st.steps_seen or st.optimizers_built:
            st.pace = "optimizer"
            return
        st.pace = "backward"
    if st.pace == "backward":
        end_step(st)


def optimizer_pre(opt, args, kwargs) -> None:
    entered = time.perf_counter()
    st = state.current
    if st is None or st.finished or st.in_probe:
        return
    try:
        begin_compute(st, entered)
        st.opt_depth = st.cdepth
    except Exception as exc:
        messages.hasten_failed(st, "optimizer step pre-hook", exc)


def optimizer_post(opt, args, kwargs) -> None:
    st = state.current
    if st is None or st.finished or st.in_probe:
        return
    try:
        st.opt_depth = 0
        if st.pace == "backward":
            if st.phase != "warmup":  # steps are backward() calls now: this one is compute within one
                end_compute(st)
                hook_done(st)
                return
            st.phase_step, st.records["warmup"] = 0, []  # an optimizer after all: the warm-up starts again
        st.pace = "optimizer"
        if st.primary_opt is None:
            st.primary_opt = id(opt)
        if id(opt) != st.primary_opt:
            end_compute(st)
            hook_done(st)
            return
        end_step(st)
    except Exception as exc:
        messages.hasten_failed(st, "optimizer step hook", exc)
