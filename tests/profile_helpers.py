"""What the profile tests share."""


def measured_steps(a) -> int:
    """The steps of ``a`` (a ``hasten.profile`` Analysis) that were measured: those it kept
    and those it left out as stalls, whose compute took several times the median step's
    (other jobs holding the cores, which a loaded test machine has): a test that asks for
    N steps gets N measured, not always N kept."""
    return a.steps + sum(e["steps"] for e in a.excluded if e["reason"].startswith("a stall"))


def verify_rounds(monkeypatch, rounds: int) -> None:
    """``--verify`` re-runs the baseline and each fix ``rounds`` times instead of
    ``hasten.profile.verify.RERUNS``: for a test of what a fix's re-run applies or finds, not of
    the verification's statistics (those are tests/test_profile_verify.py's and the launcher's
    workers-fix test's). A round is a run of the command per fix and one of the baseline, seconds
    each; 2 rounds still give a verified speed-up with an interval, which may move the fix in the
    ranking as 3 would."""
    from hasten.profile import verify
    monkeypatch.setattr(verify, "RERUNS", rounds)
