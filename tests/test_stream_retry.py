"""Retries with bounded exponential backoff: how many tries, how long the sleeps, what is not retried."""

import pytest

from hasten.stream.retry import RetriesExhausted, RetryPolicy, call


class Flaky:
    """Fails with ``errors`` in turn, then returns "ok"."""

    def __init__(self, *errors):
        self.errors, self.tries = list(errors), 0

    def __call__(self):
        self.tries += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def transient(e):
    return None if isinstance(e, FileNotFoundError) else type(e).__name__


def test_transient_errors_are_retried_with_sleeps_that_double_up_to_the_cap():
    policy = RetryPolicy(retries=6, first_s=0.5, max_s=3.0)
    sleeps, seen = [], []
    request = Flaky(*[ConnectionResetError()] * 5)
    assert call(request, policy=policy, transient=transient, sleep=sleeps.append,
                on_retry=lambda k, why: seen.append((k, why))) == "ok"
    assert request.tries == 6 and seen == [(k, "ConnectionResetError") for k in range(5)]
    ceilings = [0.5, 1.0, 2.0, 3.0, 3.0]
    assert [policy.ceiling(k) for k in range(5)] == ceilings
    for s, top in zip(sleeps, ceilings):
        assert top / 2 <= s <= top  # jittered, never below half: a restarting store gets its time
    assert sum(sleeps) <= policy.total_s()[1]


def test_errors_a_retry_cannot_fix_are_raised_at_once():
    sleeps = []
    request = Flaky(FileNotFoundError("no such key"))
    with pytest.raises(FileNotFoundError):
        call(request, policy=RetryPolicy(), transient=transient, sleep=sleeps.append)
    assert request.tries == 1 and sleeps == []


def test_after_the_last_retry_the_last_error_is_kept():
    request = Flaky(TimeoutError("first"), ConnectionResetError("second"), ConnectionResetError("last"))
    with pytest.raises(RetriesExhausted) as e:
        call(request, policy=RetryPolicy(retries=2, first_s=0.0, max_s=0.0), transient=transient,
             sleep=lambda s: None)
    assert request.tries == 3 and e.value.tries == 3 and str(e.value.last) == "last"
    assert e.value.reason == "ConnectionResetError"


def test_no_retries_means_one_try():
    request = Flaky(TimeoutError())
    with pytest.raises(RetriesExhausted):
        call(request, policy=RetryPolicy(retries=0), transient=transient, sleep=lambda s: None)
    assert request.tries == 1


def test_the_default_gives_a_restarting_store_at_least_half_a_minute():
    least, most = RetryPolicy().total_s()
    assert 30 <= least and most <= 90


@pytest.mark.parametrize("kwargs", [dict(retries=-1), dict(retries=1.5), dict(retries=True), dict(first_s=-1),
                                    dict(max_s=float("inf")), dict(first_s=2.0, max_s=1.0)])
def test_bad_policies_are_refused(kwargs):
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)


def test_the_outage_line_names_the_retries_option_only_of_a_command_that_has_one():
    """Issue 46: `hasten echo` (no --retries) was told to use --retries; `hasten train` has it."""
    from hasten.stream.retry import Outage

    for flag, end in ((None, "(36-72 s)"), ("--retries", "(36-72 s; --retries)")):
        said = []
        Outage("store s3://b/p/", RetryPolicy(retries=8, flag=flag), say=said.append, every_s=30).retrying(
            "train/shard-000001.tar", "HTTP 503")
        assert len(said) == 1 and said[0].endswith(end), said


def test_an_outage_is_said_at_its_start_every_interval_and_at_its_end_and_no_more():
    from hasten.stream.retry import Outage

    now, said = [100.0], []
    outage = Outage("store s3://b/p/", RetryPolicy(retries=8), say=said.append, clock=lambda: now[0], every_s=30)
    outage.answered()  # all is well: nothing to say
    assert said == []
    outage.retrying("train/shard-000001.tar", "HTTP 503")
    assert said == ["store s3://b/p/: train/shard-000001.tar: HTTP 503; retrying, up to 8 times per request "
                    "(36-72 s)"]  # no option named where the command has none (hasten echo, a program)
    for t in (105.0, 120.0, 131.0, 140.0):  # one more line once 30 s have passed since the last
        now[0] = t
        outage.retrying("train/shard-000001.tar", "connection refused")
    assert len(said) == 2 and said[1].endswith("4 retries in 31 s") and "connection refused" in said[1]
    now[0] = 150.0
    outage.answered()
    outage.answered()
    assert said[2:] == ["store s3://b/p/: answers again after 50 s (5 retries)"]
    # Throttling that fails and answers by turns within the interval: said once, not at every request.
    for t in (151.0, 152.0, 153.0):
        now[0] = t
        outage.retrying("train/shard-000002.tar", "HTTP 503")
        outage.answered()
    assert len(said) == 3
