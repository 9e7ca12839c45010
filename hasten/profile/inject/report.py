"""What a rank hands the launcher at the end: ``rank<N>.json``, and how its process leaves.

Once its probes are done, a rank writes its report and leaves with ``os._exit(0)``
(:func:`finish`); every rank leaves at the same step, outside any collective, so that no
peer is left waiting. A process that ends before that writes what it has at exit, and an
uncaught exception's line goes into its status file (:func:`excepthook`), so that the
launcher can say which rank failed and where, under ``--quiet`` too.

A command that ends on its own inside the measured window (a short script) writes the
steps measured so far, the window's CPU accounting closed at exit (:func:`at_exit`): the
launcher reports from them when the command exited 0.

Whose failure it was is kept apart: an exception that escapes a replayed step (a probe
in flight, after the measured window) drops that probe, marked ``raised``, and the report
of the measured steps is written all the same (:func:`probe_failed`), but the command
failed under the profile and the launcher fails the profile with it (exit code 70, the
probe named), never a report as if all was well; hasten's own failure is
:func:`hasten.profile.inject.messages.hasten_failed`'s. A command that ends on its own
(exit 0) while it waits for a pass of its loader that the replayed steps fit in has its
measured steps reported as complete, the replay skipped.

Changes the training math: no.
"""

from __future__ import annotations

import os
import sys
import time

from hasten.cores import affinity_cores
from hasten.profile.inject import augmentation, phases, probes, state
from hasten.profile.inject.messages import (error_line, raised_in_hasten, say, status, undo_probe_effects,
                                            write_json, write_status)
from hasten.profile.inject.state import State, is_training_loader


def _loaders_report(st: State) -> list[dict]:
    return [{"name": d["name"], "batches": d["batches"], "training": is_training_loader(st, lid),
             "workers": d["workers"], "iterators": d["iters"], "train_votes": d["train_votes"],
             "eval_votes": d["eval_votes"], "worker_duplicates": d.get("worker_duplicates"),
             "iterable": d.get("iterable", False)}
            for lid, d in st.loaders.items()]


def report(st: State, complete: bool) -> dict:
    train = [d for lid, d in st.loaders.items() if is_training_loader(st, lid)]
    first = train[0] if train else None
    return {"rank": st.rank, "world_size": st.world_size, "complete": complete,
            "pid": os.getpid(), "device": st.device, "num_workers": first["workers"] if first else 0,
            "loader_driven": bool(train), "batch_size": first["batch_size"] if first else None,
            "dataset_len": first["dataset_len"] if first else None, "batch_bytes": st.cached_bytes,
            "batch_layout": st.batch_layout, "batch_fn": st.batch_fn_shape,
            "cpu_count": affinity_cores(),
            "warmup": st.warmup, "steps": st.steps, "steps_seen": st.steps_seen, "phase": st.phase,
            "extended": st.extended,
            "apply": st.apply, "apply_error": st.apply_error, "records": st.records, "loaders": _loaders_report(st),
            "loader_probe": st.loader_probe, "worker_cpu": {k: v for k, v in st.worker_cpu.items()
                                                            if k in ("cpu_s", "batches", "in_flight")},
            "ddp": bool(st.ddp), "grad_bytes": st.grad_bytes,
            "allreduce_times": st.allreduce_times, "allreduce_bf16_times": st.allreduce_bf16_times,
            "bf16_cast_s": st.bf16_cast_s, "user_comm_hook": st.user_hook is not None,
            "model_found": st.model_id is not None, "forwards": st.forwards, "train_forwards": st.train_forwards,
            "backwards": st.backwards, "loadavg": os.getloadavg(), "elapsed_s": time.perf_counter() - st.t_start,
            "where": status(st)["where"], "probes": sorted(st.probes), "dropped": st.dropped, "pace": st.pace,
            "where_data": [{"at": k, "share": v / max(1, st.n_data_samples)}
                           for k, v in sorted(st.data_samples.items(), key=lambda kv: -kv[1])[:3]],
            "outside": _outside_report(st), "threads": st.threads, "cpu_window": st.cpu_window,
            "bf16": st.bf16, **augmentation.facts(st)}


def _outside_report(st: State) -> dict:
    """The measured window's samples outside compute: how many of each kind, and the top lines of each."""
    lines = {kind: [{"at": at, "samples": n, **st.line_info.get(at, {})}
                    for at, n in sorted(counts.items(), key=lambda kv: -kv[1])[:5]]
             for kind, counts in st.line_samples.items()}
    return {"counts": dict(st.outside_counts), "lines": lines, "batch_found": bool(st.batch_lines),
            "batch_call_only": st.batch_call_only}


def _write(st: State, complete: bool) -> None:
    write_json(os.path.join(st.dir, f"rank{st.rank}.json"), report(st, complete))


def finish(st: State) -> None:
    """The probes are done: write the report and leave, as every rank does at this same step."""
    st.finished = True
    probes.drop_unfinite(st)
    _write(st, complete=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def probe_failed(st: State, why: str, raised: bool = False) -> bool:
    """The process ends inside a replayed step: drop the probe in flight, and write the report of the
    measured steps as complete. False when no probe was in flight (the command's own failure).

    ``raised``: the loop raised in the replayed step, which the probe made it run: the command failed
    under the profile, and the launcher says so (exit code 70), never a report as if all was well."""
    probe = probes.in_flight(st)
    if probe is None:
        return False
    probes.drop(st, probe, why, ended_run=True, raised=raised)
    undo_probe_effects(st)
    st.finished = True
    probes.drop_unfinite(st)
    _write(st, complete=True)
    return True


def at_exit() -> None:
    st = state.current
    if st is None or st.finished:
        return
    try:
        if probe_failed(st, "the command exited during its replayed steps"):
            write_status(st)
            return
        if st.phase == "epoch_wait" and st.error is None:
            # the measured window is done; the command ended on its own (its last epoch) before a pass
            # in which the replayed steps fit: the report of the measured steps is complete without them
            probes.drop(st, "replay", "skipped: the command ended before its training loader began a pass with "
                                      "the batches the replayed steps take")
            st.finished = True
            probes.drop_unfinite(st)
            write_status(st)
            _write(st, complete=True)
            return
        st.finished = True
        write_status(st)
        if st.phase == "measure":  # the command ended on its own inside the window: its steps are reported
            try:
                phases.close_window(st)
            except Exception:  # workers already gone at exit: the steps are reported without their CPU
                pass
            # What receiving a batch from a worker would cost, which a fix moving the batches into workers
            # pays every batch: without it, a 0.2 ms step was told workers would make it x1.67 faster
            # (verified x0.16, issue 43). The command is done: the probe delays only its exit (not a failed one's).
            # And what handing out a kept batch costs, which a fixed set of batches pays every step.
            if st.error is None:
                probes.guarded(st, "loader", probes.handout)
                probes.guarded(st, "loader", probes.handoff)
        if st.steps_seen:
            _write(st, complete=False)
    except Exception:
        pass


def excepthook(orig):
    def hook(exc_type, exc, tb):
        st = state.current
        if st is not None and not st.finished and exc_type is not KeyboardInterrupt:
            try:
                line = st.error = error_line(exc, tb)
                if raised_in_hasten(tb):
                    st.hasten_error = f"uncaught: {line}"
                elif probe_failed(st, f"its replayed step raised {line}", raised=True):
                    write_status(st)
                    if st.world_size == 1:
                        # the traceback would be the probe's, not the command's: the drop's line says
                        # what it was, and the launcher fails the profile (exit code 70) with it
                        sys.stdout.flush()
                        os._exit(0)
                at_exit()
            except Exception:
                pass
        orig(exc_type, exc, tb)
    return hook
