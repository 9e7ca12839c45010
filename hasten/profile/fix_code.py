"""The code of a fix as the report prints it and as ``--verify`` names it (``HASTEN_PROFILE_APPLY``).

One text for both sides: the analysis prints the call (:mod:`hasten.profile.input_fixes`) and
the verification run makes the same call (:func:`hasten.profile.inject.fixes.echoed`). Below
both, so that neither imports the other. Standard library only: every instrumented process
imports it.

Batch echoing (Choi et al., 2019, "Faster Neural Network Training with Data Echoing"):
``echo=E`` or ``echo=E,group=K``, the training loader's batches handed out as
``hasten.echo.echo_batches(loader, E, group=K)`` hands them out; under gradient accumulation
over K micro-batches a step's K batches are echoed together and stay distinct.

Changes the training math: no (text only); the echo fix it names does (each batch is trained on E times).
"""

from __future__ import annotations

from functools import lru_cache


def echo_apply(factor: float, group: int) -> str:
    """The ``HASTEN_PROFILE_APPLY`` value of batch echoing at ``factor``, ``group`` batches per
    optimizer step (gradient accumulation; 1 without)."""
    return f"echo={factor:g}" + (f",group={group}" if group > 1 else "")


@lru_cache(maxsize=8)
def echo_arguments(apply: str) -> tuple[float, int] | None:
    """(factor, group) of an ``echo=`` value, the arguments of ``echo_batches``; None for another fix."""
    if not apply.startswith("echo="):
        return None
    parts = dict(p.split("=", 1) for p in apply.split(","))
    return float(parts["echo"]), int(parts.get("group", 1))


def echo_code(apply: str) -> str:
    """The echo fix as the report prints it (two lines, the second indented as the report
    indents fixes): the call a verification run makes."""
    factor, group = echo_arguments(apply)
    call = f"echo_batches(loader, {factor:g}" + (f", group={group})" if group > 1 else ")")
    why = f"   # a step's {group} micro-batches are echoed together" if group > 1 else ""
    return f"from hasten.echo import echo_batches\n     for batch in {call}: ...{why}"
