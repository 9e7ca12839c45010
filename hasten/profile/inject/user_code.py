"""Which frames are the user's own code: not torch, not hasten's profile, not the standard library.

Error lines name the user's line, the stack sampler names where the user's code was, and
:mod:`hasten.profile.inject.batch_source` starts from the user's frame that called the model.

Changes the training math: no.
"""

from __future__ import annotations

import os

# Frames that are not the user's own code: torch, hasten's profile, the standard library.
_SKIP = ("/torch/", "/hasten/profile/", "/threading.py", "/selectors.py", "/queue.py", "/multiprocessing/",
         "/site-packages/", "/lib/python3", "<frozen")


def is_users(filename: str) -> bool:
    return not any(s in filename for s in _SKIP)


# Code objects of their own that are no function the user named: a comprehension's (before Python
# 3.12 inlined them), a lambda's. A frame in one is named by the function around it.
UNNAMED = ("<listcomp>", "<genexpr>", "<dictcomp>", "<setcomp>", "<lambda>")


def named(frame):
    """The frame itself, or where it is a comprehension's or a lambda's, the function around it."""
    f = frame
    while f.f_code.co_name in UNNAMED and f.f_back is not None:
        f = f.f_back
    return f


def where(frame) -> str:
    """The innermost frame of the user's own code (not torch, not the standard library)."""
    innermost = None
    f = frame
    while f is not None:
        name = f.f_code.co_filename
        if innermost is None:
            innermost = f
        if is_users(name):
            return f"{os.path.basename(name)}:{named(f).f_code.co_name}"
        f = f.f_back
    return f"{os.path.basename(innermost.f_code.co_filename)}:{innermost.f_code.co_name}" if innermost else "?"
