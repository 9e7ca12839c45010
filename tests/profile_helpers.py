"""What the profile tests share."""


def measured_steps(a) -> int:
    """The steps of ``a`` (a ``hasten.profile`` Analysis) that were measured: those it kept
    and those it left out as stalls, whose compute took several times the median step's
    (other jobs holding the cores, which a loaded test machine has): a test that asks for
    N steps gets N measured, not always N kept."""
    return a.steps + sum(e["steps"] for e in a.excluded if e["reason"].startswith("a stall"))
