"""What a process hands the launcher: ``rank<N>.json`` at the end, ``status-<pid>.json`` while it runs.

Once its probes are done, a rank writes its report and leaves with ``os._exit(0)``
(:func:`finish`); every rank leaves at the same step, outside any collective, so that no
peer is left waiting. A process that ends before that writes what it has at exit, and an
uncaught exception's line goes into its status file (:func:`excepthook`), so that the
launcher can say which rank failed and where, under ``--quiet`` too.

Changes the training math: no.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from hasten.profile.inject import loader, state
from hasten.profile.inject.state import State


def _loaders_report(st: State) -> list[dict]:
    return [{"name": d["name"], "batches": d["batches"], "training": loader.is_training_loader(st, lid),
             "workers": d["workers"], "iterators": d["iters"], "train_votes": d["train_votes"],
             "eval_votes": d["eval_votes"]} for lid, d in st.loaders.items()]


def report(st: State, complete: bool) -> dict:
    train = [d for lid, d in st.loaders.items() if loader.is_training_loader(st, lid)]
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


def status(st: State) -> dict:
    """What this process has seen so far: for the launcher's messages while the command runs."""
    top = sorted(st.samples.items(), key=lambda kv: -kv[1])[:3]
    return {"rank": st.rank, "pid": os.getpid(), "ranked": "RANK" in os.environ,
            "elapsed_s": time.perf_counter() - st.t_start,
            "steps": st.steps_seen, "phase": st.phase, "forwards": st.forwards, "train_forwards": st.train_forwards,
            "backwards": st.backwards, "model_found": st.model_id is not None,
            "loaders": [{"name": d["name"], "batches": d["batches"], "training": loader.is_training_loader(st, lid)}
                        for lid, d in list(st.loaders.items())],
            "where": [{"at": k, "share": v / max(1, st.n_samples)} for k, v in top], "error": st.error}


def write_json(path: str, payload: dict) -> None:
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    with open(tmp, "w") as f:
        json.dump(payload, f)
    os.replace(tmp, path)


def _write(st: State, complete: bool) -> None:
    write_json(os.path.join(st.dir, f"rank{st.rank}.json"), report(st, complete))


def finish(st: State) -> None:
    """The probes are done: write the report and leave, as every rank does at this same step."""
    st.finished = True
    _write(st, complete=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def at_exit() -> None:
    st = state.current
    if st is None or st.finished:
        return
    st.finished = True
    try:
        write_json(os.path.join(st.dir, f"status-{os.getpid()}.json"), status(st))
        if st.steps_seen:
            _write(st, complete=False)
    except Exception:
        pass


def excepthook(orig):
    def hook(exc_type, exc, tb):
        st = state.current
        if st is not None and exc_type is not KeyboardInterrupt:
            import traceback
            where = ""
            frames = traceback.extract_tb(tb)
            if frames:
                f = frames[-1]
                where = f" (at {os.path.basename(f.filename)}:{f.lineno})"
            st.error = f"{exc_type.__name__}: {exc}".splitlines()[0][:300] + where
            at_exit()
        orig(exc_type, exc, tb)
    return hook
