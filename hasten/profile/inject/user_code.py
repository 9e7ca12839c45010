"""Which frames are the user's own code, and which are torch's compute.

The user's own code is not torch, not hasten's profile, not Lightning, not an installed package, not the
standard library. Error lines name the user's line, the stack sampler names where the user's
code was (the innermost of its frames: a helper in a second file of the user's, not the
top-level line that led there, which in a Lightning script is ``LightningCLI(``), and
:mod:`hasten.profile.inject.batch_source` starts from the user's frame that called the model.

**Compute by the stack** (:func:`is_compute`): hasten's hooks time a module with parameters, a
loss module, ``backward``, the optimizer's step; a sample outside them whose stack is in
torch's forward, autograd or optimizer code is compute all the same: a loss computed with a
plain function (``F.cross_entropy``), a module without parameters, ``zero_grad``, a gradient
scaler's ``step``, Lightning's ``optimizer_step`` around torch's. A learning-rate scheduler's
step is not (issue 43 named ``loss = nn.functional.cross_entropy(model(x), y)`` and
``optimizer.step()`` as "neither data, compute nor communication").

Changes the training math: no.
"""

from __future__ import annotations

import os

# Frames that are not the user's own code: torch, hasten's profile, Lightning, installed packages, the
# standard library. (hasten's recipes, run as a script, are the code profiled.)
_SKIP = ("/torch/", "/hasten/profile/", "/lightning/", "/pytorch_lightning/", "/lightning_fabric/", "/threading.py", "/selectors.py",
         "/queue.py", "/multiprocessing/", "/site-packages/", "/dist-packages/", "/lib/python3", "<frozen")


def is_users(filename: str) -> bool:
    return not any(s in filename for s in _SKIP)


# torch's forward (modules, functional losses and ops), autograd and optimizer code ...
_COMPUTE = ("/torch/nn/", "/torch/functional.py", "/torch/autograd/", "/torch/_tensor.py", "/torch/optim/",
            "/torch/amp/grad_scaler.py", "/torch/cuda/amp/grad_scaler.py")
# ... but not the learning-rate schedules in torch/optim
_NOT_COMPUTE = ("/torch/optim/lr_scheduler.py", "/torch/optim/swa_utils.py")
# the optimizer steps of trainers that wrap torch's (Lightning's hooks and strategies, its LightningOptimizer,
# accelerate's AcceleratedOptimizer)
_STEP_NAMES = ("optimizer_step", "_optimizer_step")


def is_compute(frame) -> bool:
    """Whether a frame is in torch's forward, autograd or optimizer code, or a trainer's optimizer step."""
    name = frame.f_code.co_filename.replace(os.sep, "/")
    if any(s in name for s in _COMPUTE):
        return not any(s in name for s in _NOT_COMPUTE)
    code = frame.f_code.co_name
    return code in _STEP_NAMES or (code == "step" and name.endswith("/optimizer.py"))


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
