"""What a process says while it runs: one-line messages, error lines, its status file, hasten's own failure.

- :func:`say`: one line on the command's stderr (naming the rank when there are several);
- :func:`error_line`: an exception as ``Type: message (at file.py:line)``, the line in the
  user's own code where there is one;
- :func:`status`, written every second to ``status-<pid>.json`` (by the sampler's thread):
  what the process has seen so far, for the launcher's stall and failure messages;
- :func:`hasten_failed`: hasten's own code raised in a hook: profiling is off in the
  process, the command's step goes on, and the launcher reports it as hasten's failure,
  never as the command's.

The rank's report at the end, and how the process exits, are in
:mod:`hasten.profile.inject.report`.

Changes the training math: no.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from hasten.profile.inject.state import State, is_training_loader
from hasten.profile.inject.user_code import is_users


def say(st: State, message: str) -> None:
    """One line on the command's stderr, naming the rank when there are several."""
    who = f"rank {st.rank}: " if st.world_size > 1 else ""
    sys.stderr.write(f"hasten profile: {who}{message}\n")
    sys.stderr.flush()


def error_line(exc: BaseException, tb=None) -> str:
    """``Type: first line of the message (at file.py:line)``, the line in the user's own code where there is one."""
    import traceback
    text = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    frames = traceback.extract_tb(tb if tb is not None else exc.__traceback__)
    if not frames:
        return text
    # torch's and hasten's wrappers sit between the user's line and the error: name the user's line
    f = next((f for f in reversed(frames) if is_users(f.filename)), frames[-1])
    return f"{text} (at {os.path.basename(f.filename)}:{f.lineno})"


def raised_in_hasten(tb) -> bool:
    import traceback
    frames = traceback.extract_tb(tb)
    return bool(frames) and "/hasten/profile/" in frames[-1].filename.replace(os.sep, "/")


def hasten_failed(st: State | None, where: str, exc: BaseException) -> None:
    """hasten's own code raised in a hook: profiling is off in this process, the command's step goes on."""
    if st is None or st.finished:
        return
    st.finished = True
    st.hasten_error = f"{where}: {error_line(exc)}"
    try:
        undo_probe_effects(st)
        say(st, f"hasten's own {where} failed ({error_line(exc)}); profiling is off in process {os.getpid()}")
        try:
            payload = status(st)
        except Exception:  # the state itself may be what broke: the launcher needs only this much
            payload = {"rank": st.rank, "pid": os.getpid(), "ranked": "RANK" in os.environ,
                       "hasten_error": st.hasten_error}
        write_json(os.path.join(st.dir, f"status-{os.getpid()}.json"), payload)
    except Exception:
        pass


def undo_probe_effects(st: State) -> None:
    st.comm_mode = "real"
    if st.autocast_ctx is not None:
        st.autocast_ctx.__exit__(None, None, None)
        st.autocast_ctx = None


def status(st: State) -> dict:
    """What this process has seen so far: for the launcher's messages while the command runs."""
    top = sorted(st.samples.items(), key=lambda kv: -kv[1])[:3]
    return {"rank": st.rank, "pid": os.getpid(), "ranked": "RANK" in os.environ,
            "elapsed_s": time.perf_counter() - st.t_start,
            "steps": st.steps_seen, "phase": st.phase, "forwards": st.forwards, "train_forwards": st.train_forwards,
            "backwards": st.backwards, "model_found": st.model_id is not None, "pace": st.pace,
            "optimizers_built": st.optimizers_built,
            "loaders": [{"name": d["name"], "batches": d["batches"], "training": is_training_loader(st, lid)}
                        for lid, d in list(st.loaders.items())],
            "where": [{"at": k, "share": v / max(1, st.n_samples)} for k, v in top], "error": st.error,
            "hasten_error": st.hasten_error}


def write_json(path: str, payload: dict) -> None:
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    with open(tmp, "w") as f:
        json.dump(payload, f)
    os.replace(tmp, path)


def write_status(st: State) -> None:
    write_json(os.path.join(st.dir, f"status-{os.getpid()}.json"), status(st))
