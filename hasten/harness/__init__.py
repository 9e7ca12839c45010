"""Measurement harness for the all-reduce benchmarks: a local multi-process launcher
(``launch``), an emulated cluster of network namespaces with shaped links (``netns``),
and the per-rank timing and calibration of collectives (``collectives``).

These serve ``hasten.recipes.allreduce`` (and through it ``hasten allreduce`` and
``benchmarks/``); the algorithms themselves live in ``hasten.distributed``.
Import from the submodules.
"""
