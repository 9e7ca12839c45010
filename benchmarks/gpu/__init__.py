"""The sections of ``benchmarks/gpu_suite.py``: one module per claim measured, each
a function ``section(ctx) -> dict`` (``ctx``: ``gpu.context.Context``)."""
