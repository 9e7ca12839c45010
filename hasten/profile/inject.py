"""The start-up module ``hasten profile`` injects into every process of a profiled command.

The launcher puts a ``sitecustomize.py`` on ``PYTHONPATH`` that calls
:func:`install` when ``HASTEN_PROFILE_DIR`` is set. From then on, in each
process of the user's unmodified command (every torchrun worker included):

- ``DataLoader`` iterators are timed: one batch is one step, and a step is the
  span from one batch request to the next. The time blocked in ``__next__`` is
  the data wait; the rest is the step's own work (forward, backward, optimizer,
  communication). Only the first ``DataLoader`` that is iterated is followed
  (the training loader, as a rule; an evaluation loader is ignored), and the
  first batch of each epoch is kept apart (worker start-up is not steady state);
- DDP models get one dispatching communication hook, so that the probes can swap
  in ``noop_hook`` and the verification runs a bf16-compressing hook; a hook the
  user registers later is kept and called through it.

Phases, counted in steps, identical on every rank so that collectives line up:
``warmup`` (discarded), ``measure`` (the real run), ``replay`` (the counterfactual
probes, short controlled runs in the same process, interleaved step by step so
that a spell of load hits them alike: ``step_alone``, one cached batch replayed,
the pure step time; ``comm_off``, the same with DDP's ``noop_hook``, whose
difference is the exposed communication; ``comm_bf16``, the same with hasten's
bf16-compressing hook; ``autocast``, the same under bf16 autocast), then ``loader_alone`` (batches pulled from the real iterator with no
step between: the time to produce one). Then the rank writes ``rank<N>.json`` and
leaves with ``os._exit(0)``; every rank leaves at the same step, outside any
collective, so no peer is left waiting.

``HASTEN_PROFILE_APPLY`` applies one fix for the verification runs: ``echo=E``
(batch echoing, via :func:`hasten.echo.echo_copies`), ``workers=N`` (every
DataLoader built with N worker processes), ``comm=bf16`` (hasten's bf16
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
import time

ENV_DIR = "HASTEN_PROFILE_DIR"
RECORDS = ("warmup", "measure", "step_alone", "comm_off", "comm_bf16", "autocast")


class _State:
    def __init__(self) -> None:
        env = os.environ
        self.dir = env[ENV_DIR]
        self.rank = int(env.get("RANK", "0"))
        self.world_size = int(env.get("WORLD_SIZE", "1"))
        self.warmup = int(env.get("HASTEN_PROFILE_WARMUP", "5"))
        self.steps = int(env.get("HASTEN_PROFILE_STEPS", "20"))
        self.probe_steps = int(env.get("HASTEN_PROFILE_PROBE_STEPS", "8"))
        self.probes = env.get("HASTEN_PROFILE_PROBES", "1") == "1"
        self.apply = env.get("HASTEN_PROFILE_APPLY", "")
        self.loader_id: int | None = None  # the followed DataLoader
        self.num_workers = 0
        self.batch_size: int | None = None
        self.dataset_len: int | None = None
        self.phase = "warmup"
        self.phase_step = 0  # steps completed in the current phase
        self.steps_seen = 0
        self.batches_seen = 0  # batches handed to the loop, probes and epoch starts included
        self.records: dict[str, list[dict]] = {p: [] for p in RECORDS}
        self.step_kind = "warmup"  # which record the current step goes to
        self.epoch_first: list[float] = []  # data wait of each epoch's first batch
        self.t_request: float | None = None
        self.t_return: float | None = None
        self.cpu_return: float | None = None
        self.rq_return = 0.0
        self.rq_request = 0.0
        self.cached = None
        self.cached_bytes = 0
        self.pending_copies = 0  # echo: copies of the last batch still to hand out
        self.fresh_index = 0
        self.autocast_ctx = None
        self.ddp = []  # [model] with our dispatching hook
        self.user_hook = None  # (state, hook) the user registered
        self.bf16_state = None  # hasten's bf16 hook state, when that fix is applied
        self.comm_mode = "real"
        self.grad_bytes = 0
        self.allreduce_times: list[tuple[float, float]] = []  # (bytes, seconds), float32
        self.allreduce_bf16_times: list[tuple[float, float]] = []  # (bytes, seconds), bfloat16
        self.bf16_cast_s = 0.0
        self.loader_probe: dict = {}
        self.device = "cpu"
        self.finished = False


_ST: _State | None = None


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
    """Move to the next phase once the current one has its steps."""
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
    if st.phase == "replay":
        _calibrate_link(st)


def _leave_phase(st: _State) -> None:
    st.comm_mode = "real"


# ---------------------------------------------------------------- the DataLoader patch

def _is_followed(st: _State, it) -> bool:
    lid = getattr(it, "_hasten_loader", None)
    if st.loader_id is None and lid is not None:
        st.loader_id = lid
    return lid is not None and lid == st.loader_id


def runqueue_s() -> float:
    """Seconds this thread has waited on a run queue: runnable, but another job held the core.

    Wall time less this is the time a span would take on an otherwise idle machine;
    the probes report it, so that R does not move with other jobs' load (Linux
    /proc schedstat; 0 elsewhere)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


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


def _sync() -> None:
    # GPU work is asynchronous: without this a step would look as long as its launches.
    import torch
    if _ST is not None and _ST.device == "cuda" and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _close_step(st: _State, now: float, cpu: float, host_end: float) -> None:
    """A batch was requested: the step that began at the previous batch ends now."""
    if st.autocast_ctx is not None:
        st.autocast_ctx.__exit__(None, None, None)
        st.autocast_ctx = None
    if st.t_return is None:
        return
    rec = {"wait_s": st.t_return - st.t_request, "work_s": now - st.t_return,
           "cpu_s": cpu - st.cpu_return, "host_s": host_end - st.t_return,
           "own_s": now - st.t_return - (runqueue_s() - st.rq_return),
           "own_wait_s": st.t_return - st.t_request - (st.rq_return - st.rq_request)}
    if st.step_kind in RECORDS:
        st.records[st.step_kind].append(rec)
        st.phase_step += 1
        st.steps_seen += 1


def _wrapped_next(orig):
    def __next__(it):
        st = _ST
        if st is None or st.finished or not _is_followed(st, it):
            return orig(it)
        host_end = time.perf_counter()  # the host has queued the whole step
        _sync()
        now, cpu = time.perf_counter(), time.process_time()
        _close_step(st, now, cpu, host_end)
        _advance(st)
        if st.phase == "loader_alone":
            _probe_loader(st, it, orig)
            _probe_handoff(st)
            _finish(st)
        if st.phase == "done":
            _finish(st)
        st.t_request, st.rq_request = time.perf_counter(), runqueue_s()
        first = False
        if st.phase == "replay" and st.cached is not None:
            batch = st.cached
        elif st.pending_copies > 0:
            st.pending_copies -= 1
            batch = st.cached
        else:
            try:
                batch = orig(it)
            except StopIteration:
                st.t_return = None  # the time until the next epoch's first request is no step
                raise
            first = getattr(it, "_num_yielded", 2) == 1
            st.cached = batch
            if not st.cached_bytes:
                st.cached_bytes = batch_nbytes(batch)
            if st.apply.startswith("echo="):
                from hasten.echo import echo_copies
                st.pending_copies = echo_copies(float(st.apply[5:]), seed=0, epoch=0, index=st.fresh_index) - 1
                st.fresh_index += 1
        _sync()
        st.batches_seen += 1
        st.t_return, st.cpu_return, st.rq_return = time.perf_counter(), time.process_time(), runqueue_s()
        if first:  # the first batch of an epoch waits for worker start-up: not steady state
            st.epoch_first.append(st.t_return - st.t_request)
            st.t_return = None
        st.step_kind = st.phase
        if st.phase == "replay":
            kinds = _replay_kinds(st)
            st.step_kind = kinds[st.phase_step % len(kinds)]
            st.comm_mode = {"comm_off": "noop", "comm_bf16": "bf16"}.get(st.step_kind, "real")
        if st.step_kind == "autocast" or st.apply == "autocast":
            import torch
            st.autocast_ctx = torch.autocast(device_type=st.device, dtype=torch.bfloat16)
            st.autocast_ctx.__enter__()
        return batch
    return __next__


def _worker_cpu_s(it) -> float | None:
    """CPU seconds of a multi-process iterator's workers (Linux /proc), else None."""
    total = 0.0
    try:
        tick = os.sysconf("SC_CLK_TCK")
        for w in getattr(it, "_workers", []):
            with open(f"/proc/{w.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    except (OSError, ValueError, IndexError):
        return None
    return total


def _probe_loader(st: _State, it, orig) -> None:
    """Pull batches with no step between them: the time to produce one batch."""
    # Batches already prefetched by workers would come for free: take them first, untimed.
    for _ in range(getattr(it, "_prefetch_factor", 0) * st.num_workers):
        try:
            orig(it)
        except StopIteration:
            break
    n = max(st.probe_steps, 2)
    times = []
    w0 = _worker_cpu_s(it) if st.num_workers else None
    t0, c0 = time.perf_counter(), time.process_time()
    while len(times) < n:
        t, rq = time.perf_counter(), runqueue_s()
        try:
            orig(it)
        except StopIteration:
            break
        times.append(time.perf_counter() - t - (runqueue_s() - rq))
    wall, cpu, got = time.perf_counter() - t0, time.process_time() - c0, len(times)
    w1 = _worker_cpu_s(it) if st.num_workers else None
    if got:
        # In the loop's own process each batch is made on demand: the median of the times
        # less run-queue waits is steady under load. Workers hand batches over in bursts:
        # only the mean means anything there.
        batch_s = statistics.median(times) if st.num_workers == 0 else wall / got
        st.loader_probe = {"batches": got, "batch_s": batch_s, "main_cpu_s": cpu / got,
                           "worker_cpu_s": (w1 - w0) / got if w0 is not None and w1 is not None else None}
    st.phase = "done"


class _Repeat:
    """A map-style dataset of one cached batch (module level: spawned workers must import it)."""

    def __init__(self, batch, n: int) -> None:
        self.batch, self.n = batch, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return self.batch


def _probe_handoff(st: _State) -> None:
    """Seconds the loop would pay per batch to receive it from a worker process.

    Only for a loop without workers (the fix "more workers" adds this cost): one
    cached batch, already collated, sent through a one-worker DataLoader."""
    if st.num_workers or st.cached is None:
        return
    try:
        from torch.utils.data import DataLoader
        n = max(st.probe_steps, 4)
        it = iter(DataLoader(_Repeat(st.cached, n + 4), batch_size=None, num_workers=1))
        for _ in range(3):  # start-up and the prefetched batches
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
            st.user_hook = (state, hook)  # called through the dispatcher
            return None
        return orig_register(self, state, hook)

    DDP.__init__ = __init__
    DDP.register_comm_hook = register_comm_hook


def _calibrate_link(st: _State) -> None:
    """Time all-reduces of a few sizes up to the gradient's: the cost model's data.

    Every rank enters here at the same step, so the collectives line up."""
    import torch
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()) or st.grad_bytes == 0:
        return
    dev = "cuda" if st.device == "cuda" else "cpu"
    numel = st.grad_bytes // 4
    for dtype, out in ((torch.float32, st.allreduce_times), (torch.bfloat16, st.allreduce_bf16_times)):
        for frac in (1 / 8, 1 / 4, 1 / 2, 1):
            t = torch.ones(max(1, int(numel * frac)), device=dev, dtype=dtype)
            dist.all_reduce(t)  # warm
            best = math.inf
            for _ in range(3):  # the least of three: other jobs only ever add time
                _sync()
                t0 = time.perf_counter()
                dist.all_reduce(t)
                _sync()
                best = min(best, time.perf_counter() - t0)
            out.append((t.numel() * t.element_size(), best))
    # What a compressing hook adds: the casts to bf16 and back.
    full = torch.ones(max(1, numel), device=dev)
    st.bf16_cast_s = math.inf
    for _ in range(3):
        _sync()
        t0 = time.perf_counter()
        full.copy_(full.to(torch.bfloat16))
        _sync()
        st.bf16_cast_s = min(st.bf16_cast_s, time.perf_counter() - t0)


# ---------------------------------------------------------------- output

def _report(st: _State, complete: bool) -> dict:
    return {"rank": st.rank, "world_size": st.world_size, "complete": complete,
            "pid": os.getpid(), "device": st.device, "num_workers": st.num_workers,
            "batch_size": st.batch_size, "dataset_len": st.dataset_len, "batch_bytes": st.cached_bytes,
            "cpu_count": os.cpu_count(), "warmup": st.warmup, "steps": st.steps,
            "steps_seen": st.steps_seen, "batches_seen": st.batches_seen, "phase": st.phase, "apply": st.apply,
            "records": st.records, "epoch_first_wait_s": st.epoch_first,
            "loader_probe": st.loader_probe, "ddp": bool(st.ddp), "grad_bytes": st.grad_bytes,
            "allreduce_times": st.allreduce_times, "allreduce_bf16_times": st.allreduce_bf16_times,
            "bf16_cast_s": st.bf16_cast_s, "user_comm_hook": st.user_hook is not None,
            "loadavg": os.getloadavg()}


def _write(st: _State, complete: bool) -> None:
    path = os.path.join(st.dir, f"rank{st.rank}.json")
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(_report(st, complete), f)
    os.replace(tmp, path)


def _finish(st: _State) -> None:
    st.finished = True
    _write(st, complete=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _at_exit() -> None:
    # The command ended on its own before profiling was done: say how far it got.
    st = _ST
    if st is not None and not st.finished and st.loader_id is not None:
        _write(st, complete=False)


# ---------------------------------------------------------------- install

def install() -> None:
    """Patch DataLoader iterators and DDP in this process (idempotent)."""
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
        it._hasten_loader = id(loader)
        if st.loader_id is None or st.loader_id == id(loader):
            st.num_workers = loader.num_workers
            st.batch_size = loader.batch_size
            try:
                st.dataset_len = len(loader.dataset)
            except TypeError:
                st.dataset_len = None

    dl._BaseDataLoaderIter.__init__ = iter_init
    dl._BaseDataLoaderIter.__next__ = _wrapped_next(dl._BaseDataLoaderIter.__next__)

    if st.apply.startswith("workers="):
        _override_workers(DataLoader, int(st.apply[8:]))

    _patch_ddp()
    if torch.cuda.is_available():
        st.device = "cuda"
    atexit.register(_at_exit)


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
        orig_init(*bound.args, **bound.kwargs)

    loader_cls.__init__ = __init__
