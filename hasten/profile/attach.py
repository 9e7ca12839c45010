"""Attach ``hasten profile`` to this Python: report in at start-up, instrument once torch is imported.

Every Python process of a profiled command calls :func:`attach` before its script runs,
in one of two ways:

- ``_hasten_profile.pth``, which installing hasten puts into site-packages (``setup.py``).
  Every Python of that environment reads it, also when the command replaces ``PYTHONPATH``
  (``env PYTHONPATH=... python train.py``) or runs ``python -E`` or ``-I``; only ``-S``
  skips it.
- the ``sitecustomize.py`` that the launcher puts first on ``PYTHONPATH``, with hasten's
  own folder last: for a Python of another environment, where hasten is not installed.

:func:`attach` at once writes ``attached-<pid>.json`` into ``HASTEN_PROFILE_DIR`` (and
again in each child this process forks), so that the launcher can tell within seconds
which Python did not attach and why (:mod:`hasten.profile.attach_check`). It then waits
for ``import torch`` to complete before it calls :func:`hasten.profile.inject.install`: a
Python that never imports torch (a ``python -c 'print(1)'`` in a Makefile, a helper of
another environment) is profiled at no cost and cannot fail for want of torch.

The standard library only, and no torch: this runs in every Python the command starts.

Changes the training math: no.
"""

from __future__ import annotations

import json
import os
import sys

ENV_DIR = "HASTEN_PROFILE_DIR"
PTH_NAME = "_hasten_profile.pth"  # written by setup.py

_via: str | None = None  # how this process attached ("pth" or "sitecustomize"); set once


def attach(via: str) -> None:
    """Report in and instrument at ``import torch``; once per process, only under ``hasten profile``.

    A .pth can be read twice at start-up (CPython 3.11 in a venv does), and both ways may
    run in one process: the first call wins."""
    global _via
    if _via is not None or not os.environ.get(ENV_DIR):
        return
    _via = via
    report_in()
    os.register_at_fork(after_in_child=report_in)  # DataLoader workers are forks: attached already
    if "torch" in sys.modules:
        _instrument()
    else:
        sys.meta_path.insert(0, _AfterTorch())


def report_in() -> None:
    """``attached-<pid>.json``: this process runs hasten; the launcher waits for nothing more."""
    out = os.environ.get(ENV_DIR)
    if not out:
        return
    path = os.path.join(out, f"attached-{os.getpid()}.json")
    try:
        with open(f"{path}.tmp", "w") as f:
            json.dump({"pid": os.getpid(), "via": _via, "executable": sys.executable, "argv": sys.argv}, f)
        os.replace(f"{path}.tmp", path)
    except OSError as exc:
        sys.stderr.write(f"hasten profile: process {os.getpid()} cannot report to {out}: {exc}\n")


class _AfterTorch:
    """A meta path finder: lets the other finders find torch, and instruments when its import completes.

    It stays on ``sys.meta_path`` until then: a library that only asks whether torch is
    installed (``importlib.util.find_spec("torch")``) gets a spec it never executes."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            exec_module = spec.loader.exec_module

            def exec_then_instrument(module):
                exec_module(module)
                _instrument()

            spec.loader.exec_module = exec_then_instrument
        return spec


def _instrument() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AfterTorch)]
    try:
        from hasten.profile import inject
        inject.install()
    except Exception as exc:  # never break the user's command
        sys.stderr.write(f"hasten profile: could not instrument process {os.getpid()}: {exc}\n")
