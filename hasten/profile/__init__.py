"""Say why training is slower than the hardware, prescribe the fix, and prove it.

- ``hasten profile -- <command>`` (``hasten.profile.launcher``): zero-code mode; the
  profiler is injected into the command's processes (``hasten.profile.inject``);
- ``Profiler``: library mode, a ``wrap(loader)`` and a ``step()`` mark in your loop;
- ``hasten.profile.verdict``: thresholds, verdict, ranked fixes and their predicted speedups;
- ``hasten.profile.report``: the terminal report, the timeline PNG and the JSON.

Changes the training math: no (measurement only; see each fix for its own answer).
"""

from hasten.profile.profiler import Profiler
from hasten.profile.report import format_report, plot_timeline
from hasten.profile.verdict import Analysis, Recommendation, analyse, classify

__all__ = ["Analysis", "Profiler", "Recommendation", "analyse", "classify", "format_report", "plot_timeline"]
