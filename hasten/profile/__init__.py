"""Say why training is slower than the hardware, prescribe the fix, and prove it.

- ``hasten profile -- <command>`` (``hasten.profile.launcher``): zero-code mode; the
  profiler is attached to the command's processes (``hasten.profile.attach``) and
  injected once they import torch (``hasten.profile.inject``);
- ``Profiler``: library mode, a ``wrap(loader)`` and a ``step()`` mark in your loop;
- ``hasten.profile.verdict``: the verdict, from the ranks' reports; the fixes' predictions in
  ``input_fixes``, ``comm_fixes`` and ``compute_fixes``, held to their bounds and ranked in ``ranking``;
- ``hasten.profile.report``: the terminal report, the timeline PNG and the JSON.

Changes the training math: no (measurement only; see each fix for its own answer).
"""

import importlib

# Imported on first use: every Python that `hasten profile` attaches to imports this package
# at start-up (hasten.profile.attach), and the names below would import torch there.
_HOMES = {"Profiler": "profiler", "format_report": "report", "plot_timeline": "report", "Analysis": "records",
          "Recommendation": "records", "analyse": "verdict", "classify": "verdict"}

__all__ = sorted(_HOMES)


def __getattr__(name):
    if name in _HOMES:
        return getattr(importlib.import_module(f"hasten.profile.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'hasten.profile' has no attribute {name!r}")
