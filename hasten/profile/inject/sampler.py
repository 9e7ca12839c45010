"""Where the loop's main thread is, sampled ten times a second by a daemon thread.

The samples say where the time went when no step comes (``rank<N>.status.json``, read by
the launcher's stall messages), and, in the measured window (twenty times a second), where
a step's time outside compute went: into a DataLoader (``loader``), into the lines that
make the batch (``batch``: :mod:`hasten.profile.inject.batch_source`), or elsewhere
(``other``: a sleep, logging, ``loss.item()``, a checkpoint write), each by file and line
(the innermost of the user's frames). Of ``other``, those whose stack is in torch's forward,
autograd or optimizer code (:func:`hasten.profile.inject.user_code.is_compute`) are counted
again as ``compute``, their lines kept apart (``lines["compute"]``): never named as the rest.
The same thread writes the status file every second.

Changes the training math: no.
"""

from __future__ import annotations

import linecache
import os
import random
import sys
import threading
import time

from hasten.profile.inject import batch_shape, messages
from hasten.profile.inject.state import State
from hasten.profile.inject.user_code import is_compute, is_users, named, where

# The sampler's own random numbers: drawing from the module's global generator would change the
# script's random sequence (its shuffles and augmentations) under the profile.
_JITTER = random.Random()


def in_hooks(frame) -> bool:
    """Whether hasten's own hook code is running: the innermost frames are hasten's, and one of them is the
    profile's (a hook's call into ``hasten/cpu_time.py`` reading ``/proc`` is the hook's time, not a line of the
    loop's; ``hasten/echo`` called from the loop is the loop's)."""
    f = frame
    while f is not None and "/hasten/" in f.f_code.co_filename.replace(os.sep, "/"):
        if "/hasten/profile/" in f.f_code.co_filename.replace(os.sep, "/"):
            return True
        f = f.f_back
    return False


def attribute(st: State, frame) -> None:
    """Count a sample outside compute inside a measured step: in the loader, making the batch, or other
    (``hasten`` when hasten's own hook code is running: its time is no line of the user's)."""
    if in_hooks(frame):
        st.outside_counts["hasten"] = st.outside_counts.get("hasten", 0) + 1
        return
    kind, user, inside, compute = "other", None, False, False
    f = frame
    while f is not None:
        name = f.f_code.co_filename
        if "/torch/utils/data/" in name.replace(os.sep, "/"):
            kind = "loader"
            break
        if user is None and is_users(name):
            user = f
        inside = inside or f.f_code is st.batch_fn_code
        compute = compute or is_compute(f)
        lines = st.batch_lines.get(f.f_code) if st.batch_lines else None
        if lines and f.f_lineno in lines:
            kind = "batch"
            break
        f = f.f_back
    st.outside_counts[kind] = st.outside_counts.get(kind, 0) + 1
    if inside and kind == "batch":  # in the batch function, whose calls are timed: counted apart
        st.outside_counts["in_batch_fn"] = st.outside_counts.get("in_batch_fn", 0) + 1
    if compute and kind == "other":
        # In torch's forward, autograd or optimizer code outside hasten's timed intervals: compute, counted
        # apart within "other" (as in_batch_fn within "batch"), its lines never named as the rest of the step
        st.outside_counts["compute"] = st.outside_counts.get("compute", 0) + 1
        kind = "compute"
    if user is None or kind == "loader":
        return
    at = f"{os.path.basename(user.f_code.co_filename)}:{user.f_lineno}"
    if at not in st.line_info:
        code = linecache.getline(user.f_code.co_filename, user.f_lineno).strip()
        try:  # what the line does, for the fixes to fit it (a comprehension's frame: the function around it)
            shape = batch_shape.line_shape(user) if kind == "batch" else {}
        except Exception:  # an unreadable source is no reason to stop sampling
            shape = {}
        st.line_info[at] = {"function": named(user).f_code.co_name, "code": code[:80], **shape}
    counts = st.line_samples.setdefault(kind, {})
    counts[at] = counts.get(at, 0) + 1


def start(st: State) -> None:
    threading.Thread(target=_watch, args=(st, threading.main_thread().ident), daemon=True,
                     name="hasten-profile-status").start()


def _watch(st: State, main_ident: int) -> None:
    path = os.path.join(st.dir, f"status-{os.getpid()}.json")
    last_write = 0.0
    while not st.finished:
        # 10 samples a second: each takes the GIL from the loop for a few microseconds, and on a
        # loaded machine a sampler descheduled while holding it stalls the loop; fewer wake-ups, fewer stalls.
        measuring = st.phase == "measure"
        # In the window, at random intervals (20 a second on average): a loop whose step lasts a
        # multiple of a fixed interval would be sampled at the same point of its step every time.
        time.sleep(_JITTER.uniform(0.025, 0.075) if measuring else 0.1)
        if st.finished:  # the report is written or being written: a sample now is hasten's exit (a probe's fork)
            break
        frame = sys._current_frames().get(main_ident)
        if frame is not None:
            key = where(frame)
            st.samples[key] = st.samples.get(key, 0) + 1
            st.n_samples += 1
            if st.cdepth == 0 and st.span is not None:
                st.data_samples[key] = st.data_samples.get(key, 0) + 1
                st.n_data_samples += 1
                if measuring and st.phase == "measure":
                    attribute(st, frame)
        del frame
        now = time.perf_counter()
        if now - last_write >= 1.0:
            last_write = now
            try:
                messages.write_json(path, messages.status(st))
            except Exception:
                pass
