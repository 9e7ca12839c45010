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
    ranking as 3 would; 1 round runs each re-run once and verifies nothing (too few for an interval:
    a note says so), for a test that reads only what a re-run applied or saw."""
    from hasten.profile import verify
    monkeypatch.setattr(verify, "RERUNS", rounds)


def verify_only(monkeypatch, *applies: str) -> None:
    """``--verify`` re-runs only the fixes whose ``apply`` starts with one of ``applies`` (and the
    baseline, in as many rounds): for a test of those fixes' re-runs, the other fixes' re-runs (a
    few seconds each, every round) are other tests' (the device-resident loader's:
    tests/test_profile_verify.py; workers and echo: the launcher's workers-fix test). The others
    are set aside while it runs, then put back, unverified, after the fixes it ranked (no test that
    uses this reads the order)."""
    from hasten.profile import verify
    real = verify.verify

    def elsewhere(apply) -> bool:
        return bool(apply) and not apply.startswith(applies)

    def only(config, analysis, log, run_instrumented):
        hidden = [r for r in analysis.recommendations if elsewhere(r.apply)]
        hidden_rejected = [r for r in analysis.rejected if elsewhere(r.get("apply"))]
        analysis.recommendations = [r for r in analysis.recommendations if not elsewhere(r.apply)]
        analysis.rejected = [r for r in analysis.rejected if not elsewhere(r.get("apply"))]
        try:
            real(config, analysis, log, run_instrumented)
        finally:
            analysis.recommendations += hidden
            analysis.rejected += hidden_rejected

    monkeypatch.setattr(verify, "verify", only)
