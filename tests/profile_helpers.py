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


def verify_only(monkeypatch, *applies: str) -> None:
    """``--verify`` re-runs only the fixes whose ``apply`` starts with one of ``applies`` (and the
    baseline, in as many rounds): for a test of those fixes' re-runs, the other fixes' re-runs (a
    few seconds each, every round) are other tests' (the device-resident loader's:
    tests/test_profile_resident.py; workers and echo: the launcher's workers-fix test). The others
    stay in the analysis as they were, unverified, and the fixes are ranked again with them."""
    from hasten.profile import verify
    from hasten.profile.ranking import rerank
    real = verify.verify

    def only(config, analysis, log, run_instrumented):
        kept = [(r, r.apply) for r in analysis.recommendations if r.apply and not r.apply.startswith(applies)]
        kept_rejected = [(r, r["apply"]) for r in analysis.rejected if r.get("apply") and not r["apply"].startswith(applies)]
        for r, _ in kept:
            r.apply = None
        for r, _ in kept_rejected:
            r["apply"] = None
        try:
            real(config, analysis, log, run_instrumented)
        finally:
            for r, apply in kept:
                r.apply = apply
            for r, apply in kept_rejected:
                r["apply"] = apply
        rerank(analysis)  # the order as if their fixes had been applicable all along

    monkeypatch.setattr(verify, "verify", only)
