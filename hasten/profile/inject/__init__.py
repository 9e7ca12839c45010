"""The start-up module ``hasten profile`` injects into every process of a profiled command.

:mod:`hasten.profile.attach` calls :func:`install` in each Python of a profiled
command (``HASTEN_PROFILE_DIR`` set) once it has imported torch. From then on, in each
process of the user's unmodified command (every torchrun worker included):

- **A step is an optimizer step.** A global post-hook on
  ``torch.optim.Optimizer.step`` (every optimizer, library-built ones included)
  closes a step; with several optimizers, the first one to step sets the pace.
  Micro-batches of gradient accumulation (``no_sync`` or not) fall inside one step.
- **Compute** is the time inside a top-level module call (a module with
  parameters, or a loss module, not nested in another), ``backward``, the
  optimizer's step, ``clip_grad_norm_`` and ``torch.distributed`` collectives.
  Global module forward hooks find the model wherever it is built.
- **Data wait**: where a torch ``DataLoader`` feeds the training steps, the time
  blocked in its ``__next__``; in a loop without one (``get_batch()`` slicing a
  memmap, a list of tensors, a custom iterator), the time of the step spent
  outside compute.
- **The training loop, not the first loop**: a loader counts as a training loader
  when its batches go into training-mode forwards with grad enabled; a step that
  also drew batches from another loader (a validation pass), or ran more forwards
  in eval mode / under ``no_grad`` than training ones (evaluation without a
  loader), is recorded as excluded and named.
- DDP models get one dispatching communication hook, so that the probes can swap
  in ``noop_hook`` and the verification a bf16-compressing hook; a hook the user
  registers later is kept and called through it. Plain collectives
  (``torch.distributed.all_reduce`` and friends) are timed where they are called.
- CPU: the main process's CPU time per step (``time.process_time``, all its
  threads) and each DataLoader worker's, from ``/proc/<pid>/stat``.

Phases, counted in optimizer steps, identical on every rank so that collectives
line up: ``warmup`` (discarded), ``measure`` (the real run), ``replay`` (the
counterfactual probes, interleaved step by step: ``step_alone``, the first batch
that reached the model replayed, so data is free; ``comm_off``, the same with
DDP's ``noop_hook``; ``comm_bf16``, with hasten's bf16-compressing hook;
``autocast``, under bf16 autocast), then ``loader_alone`` (batches pulled from the
training loader's iterator with no step between: the time to produce one). Then
the rank writes ``rank<N>.json`` and leaves with ``os._exit(0)``; every rank leaves
at the same step, outside any collective, so no peer is left waiting.

While the command runs, a daemon thread writes ``rank<N>.status.json`` every
second: steps, forwards, backward calls, batches per loader, and where the main
thread is (sampled stacks), so that the launcher can say what it sees when no
step comes; an uncaught exception's line is written there too.

``HASTEN_PROFILE_APPLY`` applies one fix for the verification runs: ``echo=E``
(batch echoing, via :func:`hasten.echo.echo_copies`), ``workers=N`` (every
DataLoader built with N worker processes; ``workers=N,keep_iter`` also hands
``iter(loader)`` the loader's live iterator, for ``next(iter(loader))`` loops), ``comm=bf16`` (hasten's bf16
all-reduce hook), ``autocast`` (bf16 autocast around each step).

Changes the training math: only with the fixes named above, and only in the
profiled run. The replayed steps train on a repeated batch and, in ``comm_off``
steps, without averaging gradients; the process exits right after them.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import statistics
import sys
import threading
import time

ENV_DIR = "HASTEN_PROFILE_DIR"
RECORDS = ("warmup", "measure", "step_alone", "comm_off", "comm_bf16", "autocast")
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
               "broadcast", "reduce", "all_to_all", "all_to_all_single", "barrier", "gather", "scatter")


class _State:
    def __init__(self) -> None:
        env = os.environ
        self.dir = env[ENV_DIR]
        self.rank = int(env.get("RANK", "0"))
        self.world_size = int(env.get("WORLD_SIZE", "1"))
        self.warmup = int(env.get("HASTEN_PROFILE_WARMUP", "5"))
        self.steps = int(env.get("HASTEN_PROFILE_STEPS", "20"))
        self.seconds = float(env.get("HASTEN_PROFILE_SECONDS", "0") or 0)
        self.probe_steps = int(env.get("HASTEN_PROFILE_PROBE_STEPS", "8"))
        self.probes = env.get("HASTEN_PROFILE_PROBES", "1") == "1"
        self.apply = env.get("HASTEN_PROFILE_APPLY", "")
        self.t_start = time.perf_counter()
        self.phase = "warmup"
        self.phase_step = 0  # optimizer steps completed in the current phase
        self.steps_seen = 0  # optimizer steps of the primary optimizer
        self.primary_opt: int | None = None
        self.records: dict[str, list[dict]] = {p: [] for p in RECORDS}
        self.step_kind = "warmup"
        # the open step ("span"): from the previous optimizer step's end to this one's
        self.span: dict | None = None
        self.cdepth = 0  # nesting of compute intervals
        self.c_t0 = 0.0
        self.c_cpu0 = 0.0
        self.has_params: dict[int, bool] = {}
        # loaders: id -> {"name", "batches", "train_votes", "eval_votes", "workers", "pids", "iters"}
        self.loaders: dict[int, dict] = {}
        self.last_loader: int | None = None  # the loader whose batch awaits a forward
        self.train_iter = None  # the latest iterator of a training loader
        self.cached = None  # a training loader's batch, replayed in the probes
        self.cached_bytes = 0
        self.model_id: int | None = None  # the first module with parameters called in training mode
        self.model_args = None  # the first batch that reached its forward (positional arguments)
        self.pending_copies = 0
        self.fresh_index = 0
        self.autocast_ctx = None
        self.forwards = 0
        self.train_forwards = 0
        self.backwards = 0
        self.eval_counts: list[int] = []
        self.ddp = []
        self.user_hook = None
        self.bf16_state = None
        self.comm_mode = "real"
        self.grad_bytes = 0
        self.allreduce_times: list[tuple[float, float]] = []
        self.allreduce_bf16_times: list[tuple[float, float]] = []
        self.bf16_cast_s = 0.0
        self.loader_probe: dict = {}
        self.worker_cpu: dict = {}  # measure phase: worker CPU seconds and training batches
        self.device = "cpu"
        self.finished = False
        self.error: str | None = None
        self.samples: dict[str, int] = {}
        self.n_samples = 0
        self.data_samples: dict[str, int] = {}  # sampled outside compute inside a step: where data is made
        self.n_data_samples = 0
        self.lock = threading.Lock()


_ST: _State | None = None


# ---------------------------------------------------------------- small helpers

def runqueue_s() -> float:
    """Seconds this thread has waited on a run queue: runnable, but another job held the core.

    Wall time less this is the time a span would take on an otherwise idle machine
    (Linux /proc schedstat; 0 elsewhere)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def pid_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of one process (Linux /proc), else None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def batch_nbytes(batch) -> int:
    """Bytes of the tensors in a batch (tensors, or lists, tuples and dicts of them)."""
    import torch
    if isinstance(batch, torch.Tensor):
        return batch.numel() * batch.element_size()
    if isinstance(batch, (list, tuple)):
        return sum(batch_nbytes(b) for b in batch)
    if isinstance(batch, dict):
        return sum(batch_nbytes(b) for b in batch.values())
    return 0


def _has_tensor(x) -> bool:
    import torch
    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, (list, tuple)):
        return any(_has_tensor(v) for v in x)
    if isinstance(x, dict):
        return any(_has_tensor(v) for v in x.values())
    return False


def _sync() -> None:
    # GPU work is asynchronous: without this a step would look as long as its launches.
    st = _ST
    if st is not None and st.device == "cuda":
        import torch
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()


# ---------------------------------------------------------------- compute intervals

def _enter() -> None:
    st = _ST
    if st.cdepth == 0:
        st.c_t0, st.c_cpu0 = time.perf_counter(), time.process_time()
    st.cdepth += 1


def _exit() -> None:
    st = _ST
    if st.cdepth <= 0:
        return
    st.cdepth -= 1
    if st.cdepth == 0 and st.span is not None:
        st.span["compute_s"] += time.perf_counter() - st.c_t0
        st.span["compute_cpu_s"] += time.process_time() - st.c_cpu0


def _open_span(st: _State) -> None:
    now = time.perf_counter()
    st.span = {"t0": now, "cpu0": time.process_time(), "rq0": runqueue_s(), "compute_s": 0.0, "compute_cpu_s": 0.0,
               "loader": {}, "loader_cpu": {}, "comm_s": 0.0, "train_fwd": 0, "eval_fwd": 0, "epoch_start": False,
               "rq_loader": 0.0}


def _close_span(st: _State, host_end: float) -> None:
    sp = st.span
    if st.autocast_ctx is not None:
        st.autocast_ctx.__exit__(None, None, None)
        st.autocast_ctx = None
    if sp is None:
        return
    _sync()
    now, cpu = time.perf_counter(), time.process_time()
    if st.cdepth:  # close the optimizer's own interval into this step
        sp["compute_s"] += now - st.c_t0
        sp["compute_cpu_s"] += cpu - st.c_cpu0
    span_s = now - sp["t0"]
    train_loaders = {lid for lid in sp["loader"] if _is_training_loader(st, lid)}
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
           "micro": sp["train_fwd"], "eval_fwd": sp["eval_fwd"], "epoch_start": sp["epoch_start"],
           "host_s": host_end - sp["t0"], "own_s": span_s - data - max(0.0, rq - sp["rq_loader"]),
           "own_wait_s": data - (sp["rq_loader"] if via_loader else 0.0)}
    if excluded:
        rec["excluded"] = excluded
    if st.step_kind in RECORDS:
        st.records[st.step_kind].append(rec)
    st.span = None


def _is_training_loader(st: _State, lid: int) -> bool:
    d = st.loaders.get(lid)
    return d is not None and d["train_votes"] > d["eval_votes"]


# ---------------------------------------------------------------- the optimizer step: the step boundary

def _opt_pre(opt, args, kwargs) -> None:
    st = _ST
    if st is None or st.finished:
        return
    _enter()


def _opt_post(opt, args, kwargs) -> None:
    st = _ST
    if st is None or st.finished:
        return
    if st.primary_opt is None:
        st.primary_opt = id(opt)
    if id(opt) != st.primary_opt:
        _exit()
        return
    host_end = time.perf_counter()
    closed = st.span is not None
    _close_span(st, host_end)
    st.cdepth = 0  # the optimizer's own interval is closed into the step; an exception may have left others open
    st.steps_seen += 1
    if closed and st.phase in ("warmup", "measure", "replay"):
        st.phase_step += 1
    _advance(st)
    if st.phase == "loader_alone":
        _probe_loader(st)
        _probe_handoff(st)
        st.phase = "done"
    if st.phase == "done":
        _finish(st)
    st.step_kind = st.phase
    if st.phase == "replay":
        kinds = _replay_kinds(st)
        st.step_kind = kinds[st.phase_step % len(kinds)]
        st.comm_mode = {"comm_off": "noop", "comm_bf16": "bf16"}.get(st.step_kind, "real")
    _open_span(st)
    if st.step_kind == "autocast" or st.apply == "autocast":
        import torch
        st.autocast_ctx = torch.autocast(device_type=st.device, dtype=torch.bfloat16)
        st.autocast_ctx.__enter__()


# ---------------------------------------------------------------- phases

def _phase_plan(st: _State) -> list[tuple[str, int]]:
    plan = [("warmup", st.warmup), ("measure", st.steps)]
    if st.probes:
        plan.append(("replay", st.probe_steps * len(_replay_kinds(st))))
        plan.append(("loader_alone", 0))
    return plan


def _replay_kinds(st: _State) -> tuple[str, ...]:
    # Interleaved, not one after another: a spell of load from other jobs then hits all alike.
    if st.ddp and st.world_size > 1:
        return ("step_alone", "comm_off", "comm_bf16", "autocast")
    return ("step_alone", "autocast")


def _advance(st: _State) -> None:
    plan = _phase_plan(st)
    names = [p for p, _ in plan]
    while st.phase in names:
        i = names.index(st.phase)
        if st.phase_step < plan[i][1]:
            return
        _leave_phase(st)
        st.phase = names[i + 1] if i + 1 < len(names) else "done"
        st.phase_step = 0
        _enter_phase(st)
        if st.phase == "loader_alone":
            return


def _enter_phase(st: _State) -> None:
    if st.phase == "measure":
        if st.seconds > 0:
            _steps_for_seconds(st)
        st.worker_cpu = {"start": _training_worker_cpu(st), "batches0": _training_batches(st)}
    if st.phase == "replay":
        _calibrate_link(st)


def _leave_phase(st: _State) -> None:
    st.comm_mode = "real"
    if st.phase == "measure" and st.worker_cpu:
        end = _training_worker_cpu(st)
        start = st.worker_cpu.get("start")
        st.worker_cpu.update(end=end, batches=_training_batches(st) - st.worker_cpu["batches0"],
                             cpu_s=None if start is None or end is None else max(0.0, end - start))


def _steps_for_seconds(st: _State) -> None:
    """--seconds: measure as many steps as fit, from the warm-up's step time; every rank agrees."""
    spans = [r["span_s"] for r in st.records["warmup"][1:]] or [r["span_s"] for r in st.records["warmup"]]
    per = statistics.median(spans) if spans else (time.perf_counter() - st.t_start) / max(1, st.steps_seen)
    n = max(3, math.ceil(st.seconds / max(per, 1e-6)))
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


def _training_batches(st: _State) -> int:
    return sum(d["batches"] for lid, d in st.loaders.items() if _is_training_loader(st, lid))


def _training_worker_cpu(st: _State) -> float | None:
    pids = [p for lid, d in st.loaders.items() if _is_training_loader(st, lid) for p in d["pids"]]
    if not pids:
        return None
    vals = [pid_cpu_s(p) for p in pids]
    vals = [v for v in vals if v is not None]
    return sum(vals) if vals else None


# ---------------------------------------------------------------- modules, backward, collectives

def _fwd_pre(mod, args):
    st = _ST
    if st is None or st.finished:
        return None
    if st.cdepth > 0:
        st.cdepth += 1
        return None
    key = id(mod)
    hp = st.has_params.get(key)
    if hp is None:
        import torch
        hp = any(True for _ in mod.parameters()) or isinstance(mod, torch.nn.modules.loss._Loss)
        st.has_params[key] = hp
    if not hp:
        return None
    import torch
    _enter()
    st.forwards += 1
    loss_module = isinstance(mod, torch.nn.modules.loss._Loss)
    if loss_module:
        return None
    train = mod.training and torch.is_grad_enabled()
    sp = st.span
    if train:
        st.train_forwards += 1
        if sp is not None:
            sp["train_fwd"] += 1
        if st.model_id is None:
            st.model_id = key
    elif sp is not None:
        sp["eval_fwd"] += 1
    if st.last_loader is not None:
        d = st.loaders.get(st.last_loader)
        if d is not None:
            d["train_votes" if train else "eval_votes"] += 1
        st.last_loader = None
    if key == st.model_id and train:
        if st.model_args is None and st.phase == "measure" and args and _has_tensor(args):
            st.model_args = args
            if not st.cached_bytes:
                st.cached_bytes = batch_nbytes(args)
        # Step alone for a loop without a DataLoader: the captured batch replayed (data is still made
        # by the loop; its time is outside compute and left out of the replayed step).
        if st.phase == "replay" and st.model_args is not None and st.span is not None and not st.span["loader"]:
            return st.model_args
    return None


def _fwd_post(mod, args, out):
    st = _ST
    if st is None or st.finished or st.cdepth <= 0:
        return None
    _exit()
    return None


def _patch_backward() -> None:
    import torch
    orig = torch.autograd.backward

    def backward(*args, **kwargs):
        st = _ST
        if st is None or st.finished:
            return orig(*args, **kwargs)
        st.backwards += 1
        _enter()
        try:
            return orig(*args, **kwargs)
        finally:
            _sync()
            _exit()

    backward.__wrapped__ = orig
    torch.autograd.backward = backward
    clip = torch.nn.utils.clip_grad_norm_

    def clip_grad_norm_(*args, **kwargs):
        if _ST is None or _ST.finished:
            return clip(*args, **kwargs)
        _enter()
        try:
            return clip(*args, **kwargs)
        finally:
            _exit()

    torch.nn.utils.clip_grad_norm_ = clip_grad_norm_


def _patch_collectives() -> None:
    import torch.distributed as dist
    if not dist.is_available():
        return
    for name in COLLECTIVES:
        orig = getattr(dist, name, None)
        if orig is None:
            continue

        def make(orig):
            def collective(*args, **kwargs):
                st = _ST
                if st is None or st.finished:
                    return orig(*args, **kwargs)
                t0 = time.perf_counter()
                _enter()
                try:
                    return orig(*args, **kwargs)
                finally:
                    _exit()
                    if st.span is not None:
                        st.span["comm_s"] += time.perf_counter() - t0
            collective.__wrapped__ = orig
            collective.__name__ = orig.__name__
            return collective
        setattr(dist, name, make(orig))


# ---------------------------------------------------------------- the DataLoader

def _loader_name(loader) -> str:
    ds = getattr(loader, "dataset", None)
    return f"DataLoader({type(ds).__name__}, batch_size={getattr(loader, 'batch_size', None)})"


def _wrapped_next(orig):
    def __next__(it):
        st = _ST
        lid = getattr(it, "_hasten_loader", None)
        if st is None or st.finished or lid is None:
            return orig(it)
        d = st.loaders[lid]
        training = _is_training_loader(st, lid)
        t0, c0, rq0 = time.perf_counter(), time.process_time(), runqueue_s()
        replaying = st.phase == "replay" and training and st.cached is not None
        if replaying:
            batch = st.cached
        elif training and st.pending_copies > 0:
            st.pending_copies -= 1
            batch = st.cached
        else:
            try:
                batch = orig(it)
            except StopIteration:  # the end of an epoch is no batch; a kept iterator starts afresh
                owner = getattr(it, "_hasten_owner", None)
                if owner is not None and owner.__dict__.get("_hasten_it") is it:
                    del owner.__dict__["_hasten_it"]
                raise
            if training or st.cached is None:
                st.cached = batch
                if not st.cached_bytes:
                    st.cached_bytes = batch_nbytes(batch)
            if training:
                st.train_iter = (it, orig)
                if st.apply.startswith("echo="):
                    from hasten.echo import echo_copies
                    st.pending_copies = echo_copies(float(st.apply[5:]), seed=0, epoch=0, index=st.fresh_index) - 1
                    st.fresh_index += 1
        _sync()
        t1 = time.perf_counter()
        d["batches"] += 1
        d["batches_in_span"] = d.get("batches_in_span", 0) + 1 if d.get("span") is st.span else 1
        d["span"] = st.span
        st.last_loader = lid
        sp = st.span
        if sp is not None:
            sp["loader"][lid] = sp["loader"].get(lid, 0.0) + (t1 - t0)
            sp["loader_cpu"][lid] = sp["loader_cpu"].get(lid, 0.0) + (time.process_time() - c0)
            sp["rq_loader"] += runqueue_s() - rq0
            if getattr(it, "_num_yielded", 2) == 1 and not replaying and d["workers"]:
                sp["epoch_start"] = True  # worker start-up is not steady state
        return batch
    return __next__


def _probe_loader(st: _State) -> None:
    """Pull batches from the training loader's iterator with no step between: the time to produce one."""
    if st.train_iter is None:
        return
    it, orig = st.train_iter
    workers = getattr(it, "_num_workers", 0)
    for _ in range(getattr(it, "_prefetch_factor", 0) * workers):  # prefetched batches would come for free
        try:
            orig(it)
        except StopIteration:
            return
    n = max(st.probe_steps, 2)
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
    w1 = [pid_cpu_s(p) for p in pids]
    if got:
        batch_s = statistics.median(times) if workers == 0 else wall / got
        wcpu = None
        if pids and None not in w0 and None not in w1:
            wcpu = (sum(w1) - sum(w0)) / got
        st.loader_probe = {"batches": got, "batch_s": batch_s, "main_cpu_s": cpu / got, "worker_cpu_s": wcpu,
                           "workers": workers}


class _Repeat:
    """A map-style dataset of one cached batch (module level: spawned workers must import it)."""

    def __init__(self, batch, n: int) -> None:
        self.batch, self.n = batch, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return self.batch


def _probe_handoff(st: _State) -> None:
    """Seconds the loop would pay per batch to receive it from a worker process (loops without workers)."""
    batch = st.cached if st.cached is not None else st.model_args
    if batch is None or (st.train_iter is not None and getattr(st.train_iter[0], "_num_workers", 0)):
        return
    try:
        from torch.utils.data import DataLoader
        n = max(st.probe_steps, 4)
        it = iter(DataLoader(_Repeat(batch, n + 4), batch_size=None, num_workers=1))
        for _ in range(3):
            next(it)
        times = []
        for _ in range(n):
            t = time.perf_counter()
            next(it)
            times.append(time.perf_counter() - t)
        st.loader_probe["handoff_s"] = statistics.median(times)
        del it
    except Exception as exc:  # a batch a worker cannot send (CUDA tensors, ...): no estimate
        st.loader_probe["handoff_error"] = repr(exc)


# ---------------------------------------------------------------- DDP

def _dispatch_hook(state, bucket):
    # No annotations: DDP inspects them.
    st = _ST
    if st.comm_mode == "noop":
        from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook
        return noop_hook(None, bucket)
    if st.apply == "comm=bf16" or st.comm_mode == "bf16":
        from hasten.distributed.hooks import allreduce_hook
        return allreduce_hook(st.bf16_state, bucket)
    if st.user_hook is not None:
        user_state, hook = st.user_hook
        return hook(user_state, bucket)
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    return allreduce_hook(state, bucket)


def _patch_ddp() -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    orig_init, orig_register = DDP.__init__, DDP.register_comm_hook

    def __init__(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        st = _ST
        if st is None or st.ddp:
            return
        st.ddp.append(self)
        st.grad_bytes = sum(p.numel() * p.element_size() for p in self.module.parameters() if p.requires_grad)
        from hasten.distributed.hooks import AllReduceHookState
        st.bf16_state = AllReduceHookState("native", self.process_group, compress="bf16")
        orig_register(self, self.process_group, _dispatch_hook)

    def register_comm_hook(self, state, hook):
        st = _ST
        if st is not None and st.ddp and self is st.ddp[0]:
            st.user_hook = (state, hook)
            return None
        return orig_register(self, state, hook)

    DDP.__init__ = __init__
    DDP.register_comm_hook = register_comm_hook


def _calibrate_link(st: _State) -> None:
    """Time all-reduces of a few sizes up to the gradient's: the cost model's data (every rank, same step)."""
    import torch
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()) or st.grad_bytes == 0:
        return
    ar = getattr(dist.all_reduce, "__wrapped__", dist.all_reduce)
    dev = "cuda" if st.device == "cuda" else "cpu"
    numel = st.grad_bytes // 4
    for dtype, out in ((torch.float32, st.allreduce_times), (torch.bfloat16, st.allreduce_bf16_times)):
        for frac in (1 / 8, 1 / 4, 1 / 2, 1):
            t = torch.ones(max(1, int(numel * frac)), device=dev, dtype=dtype)
            ar(t)
            best = math.inf
            for _ in range(3):
                _sync()
                t0 = time.perf_counter()
                ar(t)
                _sync()
                best = min(best, time.perf_counter() - t0)
            out.append((t.numel() * t.element_size(), best))
    full = torch.ones(max(1, numel), device=dev)
    st.bf16_cast_s = math.inf
    for _ in range(3):
        _sync()
        t0 = time.perf_counter()
        full.copy_(full.to(torch.bfloat16))
        _sync()
        st.bf16_cast_s = min(st.bf16_cast_s, time.perf_counter() - t0)


# ---------------------------------------------------------------- output

def _loaders_report(st: _State) -> list[dict]:
    return [{"name": d["name"], "batches": d["batches"], "training": _is_training_loader(st, lid),
             "workers": d["workers"], "iterators": d["iters"], "train_votes": d["train_votes"],
             "eval_votes": d["eval_votes"]} for lid, d in st.loaders.items()]


def _report(st: _State, complete: bool) -> dict:
    train = [d for lid, d in st.loaders.items() if _is_training_loader(st, lid)]
    first = train[0] if train else None
    return {"rank": st.rank, "world_size": st.world_size, "complete": complete,
            "pid": os.getpid(), "device": st.device, "num_workers": first["workers"] if first else 0,
            "loader_driven": bool(train), "batch_size": first["batch_size"] if first else None,
            "dataset_len": first["dataset_len"] if first else None, "batch_bytes": st.cached_bytes,
            "cpu_count": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "warmup": st.warmup, "steps": st.steps, "steps_seen": st.steps_seen, "phase": st.phase,
            "apply": st.apply, "records": st.records, "loaders": _loaders_report(st),
            "loader_probe": st.loader_probe, "worker_cpu": {k: v for k, v in st.worker_cpu.items()
                                                            if k in ("cpu_s", "batches")},
            "ddp": bool(st.ddp), "grad_bytes": st.grad_bytes,
            "allreduce_times": st.allreduce_times, "allreduce_bf16_times": st.allreduce_bf16_times,
            "bf16_cast_s": st.bf16_cast_s, "user_comm_hook": st.user_hook is not None,
            "model_found": st.model_id is not None, "forwards": st.forwards, "train_forwards": st.train_forwards,
            "backwards": st.backwards, "loadavg": os.getloadavg(), "elapsed_s": time.perf_counter() - st.t_start,
            "where": status(st)["where"],
            "where_data": [{"at": k, "share": v / max(1, st.n_data_samples)}
                           for k, v in sorted(st.data_samples.items(), key=lambda kv: -kv[1])[:3]]}


def _write_json(path: str, payload: dict) -> None:
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    with open(tmp, "w") as f:
        json.dump(payload, f)
    os.replace(tmp, path)


def _write(st: _State, complete: bool) -> None:
    _write_json(os.path.join(st.dir, f"rank{st.rank}.json"), _report(st, complete))


def status(st: _State) -> dict:
    """What this process has seen so far: for the launcher's messages while the command runs."""
    top = sorted(st.samples.items(), key=lambda kv: -kv[1])[:3]
    return {"rank": st.rank, "pid": os.getpid(), "ranked": "RANK" in os.environ, "elapsed_s": time.perf_counter() - st.t_start,
            "steps": st.steps_seen, "phase": st.phase, "forwards": st.forwards, "train_forwards": st.train_forwards,
            "backwards": st.backwards, "model_found": st.model_id is not None,
            "loaders": [{"name": d["name"], "batches": d["batches"], "training": _is_training_loader(st, lid)}
                        for lid, d in list(st.loaders.items())],
            "where": [{"at": k, "share": v / max(1, st.n_samples)} for k, v in top], "error": st.error}


_SKIP = ("/torch/", "/hasten/profile/", "/threading.py", "/selectors.py", "/queue.py", "/multiprocessing/",
         "/site-packages/", "/lib/python3", "<frozen")


def _where(frame) -> str:
    """The innermost frame of the user's own code (not torch, not the standard library)."""
    innermost = None
    f = frame
    while f is not None:
        name = f.f_code.co_filename
        if innermost is None:
            innermost = f
        if not any(s in name for s in _SKIP):
            return f"{os.path.basename(name)}:{f.f_code.co_name}"
        f = f.f_back
    return f"{os.path.basename(innermost.f_code.co_filename)}:{innermost.f_code.co_name}" if innermost else "?"


def _watch(st: _State, main_ident: int) -> None:
    path = os.path.join(st.dir, f"status-{os.getpid()}.json")
    last_write = 0.0
    while not st.finished:
        # 10 samples a second: each takes the GIL from the loop for a few microseconds, and on a
        # loaded machine a sampler descheduled while holding it stalls the loop; fewer wake-ups, fewer stalls.
        time.sleep(0.1)
        frame = sys._current_frames().get(main_ident)
        if frame is not None:
            key = _where(frame)
            st.samples[key] = st.samples.get(key, 0) + 1
            st.n_samples += 1
            if st.cdepth == 0 and st.span is not None:
                st.data_samples[key] = st.data_samples.get(key, 0) + 1
                st.n_data_samples += 1
        del frame
        now = time.perf_counter()
        if now - last_write >= 1.0:
            last_write = now
            try:
                _write_json(path, status(st))
            except Exception:
                pass


def _finish(st: _State) -> None:
    st.finished = True
    _write(st, complete=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _at_exit() -> None:
    st = _ST
    if st is None or st.finished:
        return
    st.finished = True
    try:
        _write_json(os.path.join(st.dir, f"status-{os.getpid()}.json"), status(st))
        if st.steps_seen:
            _write(st, complete=False)
    except Exception:
        pass


def _excepthook(orig):
    def hook(exc_type, exc, tb):
        st = _ST
        if st is not None and exc_type is not KeyboardInterrupt:
            import traceback
            where = ""
            frames = traceback.extract_tb(tb)
            if frames:
                f = frames[-1]
                where = f" (at {os.path.basename(f.filename)}:{f.lineno})"
            st.error = f"{exc_type.__name__}: {exc}".splitlines()[0][:300] + where
            _at_exit()
        orig(exc_type, exc, tb)
    return hook


# ---------------------------------------------------------------- install

def install() -> None:
    """Patch optimizers, modules, backward, DataLoader iterators, DDP and collectives (idempotent)."""
    global _ST
    if _ST is not None or ENV_DIR not in os.environ:
        return
    import torch
    from torch.utils.data import DataLoader
    from torch.utils.data import dataloader as dl

    _ST = _State()
    st = _ST

    orig_iter_init = dl._BaseDataLoaderIter.__init__

    def iter_init(it, loader):
        orig_iter_init(it, loader)
        if _ST is None or _ST.finished or isinstance(getattr(loader, "dataset", None), _Repeat):
            return  # our own hand-off probe is no loader of the command
        lid = id(loader)
        it._hasten_loader = lid
        it._hasten_owner = loader
        d = st.loaders.get(lid)
        if d is None:
            try:
                n = len(loader.dataset)
            except TypeError:
                n = None
            d = st.loaders[lid] = {"name": _loader_name(loader), "batches": 0, "train_votes": 0, "eval_votes": 0,
                                   "workers": loader.num_workers, "batch_size": loader.batch_size,
                                   "dataset_len": n, "pids": [], "iters": 0}
        d["iters"] += 1
        d["pids"] = ([p for p in d["pids"] if pid_cpu_s(p) is not None]
                     + [w.pid for w in getattr(it, "_workers", [])])

    dl._BaseDataLoaderIter.__init__ = iter_init
    dl._BaseDataLoaderIter.__next__ = _wrapped_next(dl._BaseDataLoaderIter.__next__)

    if st.apply.startswith("workers="):
        _override_workers(DataLoader, int(st.apply[8:].split(",")[0]))
    if "keep_iter" in st.apply.split(","):
        _keep_one_iterator(DataLoader)

    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    register_optimizer_step_pre_hook(_opt_pre)
    register_optimizer_step_post_hook(_opt_post)
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
    register_module_forward_pre_hook(_fwd_pre)
    register_module_forward_hook(_fwd_post)
    _patch_backward()
    _patch_collectives()
    _patch_ddp()
    if torch.cuda.is_available():
        st.device = "cuda"
    atexit.register(_at_exit)
    sys.excepthook = _excepthook(sys.excepthook)
    threading.Thread(target=_watch, args=(st, threading.main_thread().ident), daemon=True,
                     name="hasten-profile-status").start()


def _keep_one_iterator(loader_cls) -> None:
    """``iter(loader)`` hands back the loader's live iterator: ``next(iter(loader))`` per step draws
    from one pass (and one set of workers) instead of starting a new one each step."""
    orig_iter = loader_cls.__iter__

    def __iter__(self):
        it = self.__dict__.get("_hasten_it")
        if it is None:
            it = orig_iter(self)
            self.__dict__["_hasten_it"] = it
        return it

    loader_cls.__iter__ = __iter__


def _override_workers(loader_cls, workers: int) -> None:
    """Build every DataLoader with ``workers`` worker processes."""
    import inspect
    orig_init = loader_cls.__init__
    sig = inspect.signature(orig_init)

    def __init__(self, *args, **kwargs):
        bound = sig.bind(self, *args, **kwargs)
        bound.arguments["num_workers"] = workers
        if workers == 0:
            bound.arguments.pop("prefetch_factor", None)
        elif "persistent_workers" in sig.parameters:
            bound.arguments["persistent_workers"] = True
        orig_init(*bound.args, **bound.kwargs)

    loader_cls.__init__ = __init__
