"""The data-echoing recipes (Choi et al., 2019, arXiv:1907.05550), one module each:

- ``network``: the echo recipes' network (``SmallNet``) and input statistics;
- ``eval_set``: the run's test images, decoded once (``EvalSet``);
- ``loop_hooks``: what both training runs below add to the training loop they share (the
  clock of waiting and stepping, the repeat-value measurements, the evaluations' pause);
- ``run``: one run to a target accuracy through the streaming pipeline (``EchoRunConfig``,
  ``train_to_target``); its names (and those of ``network`` and ``eval_set``) are handed on
  here, so ``from hasten.recipes.echo import train_to_target`` works;
- ``report``: statistics, tables, goals and plots of the sweep and the comparison;
- ``compare``: ``hasten echo``'s comparison, no echoing against one echo setting;
- ``config``: what the paper-regime sweep runs (``SweepConfig``, ``RunSpec``);
- ``data``: the sweep's data, slow source and input pipeline;
- ``budget``: one training run of the sweep (``train_budget``);
- ``loader_search``, ``tune``, ``journal``: the sweep's slow source at each R, its tuning,
  and the journal a stopped sweep resumes from;
- ``sweep``: the sweep itself (``hasten echo --sweep``, ``benchmarks/echo_sweep.py``);
- ``target``, ``value``: the sweep to a target over modelled clocks, and the calibration of
  AutoEcho's repeat values, on the sweep's runs.

Each imports none of those listed below it, so there is no import cycle and any of them
can be imported first.
"""

from hasten.recipes.echo.run import (
    GPU_PRESET,
    MEAN,
    STD,
    EchoRunConfig,
    EvalSet,
    SmallNet,
    fast_formats,
    make_model,
    measure_step_time,
    parse_echo,
    shuffle_size,
    train_to_target,
)

__all__ = ["GPU_PRESET", "MEAN", "STD", "EchoRunConfig", "EvalSet", "SmallNet", "fast_formats", "make_model",
           "measure_step_time", "parse_echo", "shuffle_size", "train_to_target"]
