"""Retrying a request to remote storage: a bounded number of tries, exponential backoff.

Object stores and web servers fail now and then in ways that the next try fixes:
a connection reset, a timeout, a 5xx answer, throttling (S3's ``503 SlowDown``,
``429 Too Many Requests``), a body cut short. ``call`` runs a request until it
succeeds, sleeping between tries ``first_s``, then twice that, and so on up to
``max_s``, each sleep drawn between half and all of that (the jitter keeps many
readers that failed together from retrying together); an error that a retry
cannot fix (not found, access denied) is raised at once, and after ``retries``
retries the last error is raised inside ``RetriesExhausted``. The defaults (8
retries) sleep between 36 and 72 s in all before giving up: long enough for a
store process to restart.

``Outage`` says so while it happens: a line when requests start failing (what, why,
how long the retries may last), one every ``HASTEN_PROGRESS_INTERVAL`` seconds while
they go on, and one when the store answers again, so that a run waiting on its
store never looks like a run that became slow.

Based on: Brooker, "Exponential Backoff And Jitter" (AWS Architecture Blog, 2015),
its "equal jitter"; AWS's guidance to retry 503 SlowDown with backoff.

Changes the training math: no (a retried read returns the same bytes).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

DEFAULT_RETRIES = 8


@dataclass(frozen=True)
class RetryPolicy:
    """``retries`` tries after the first; sleeps of ``first_s`` doubling up to ``max_s`` (jittered).
    ``flag``: the command's option that sets ``retries``, named in the line an outage says
    (None: no command has one, as for ``hasten echo`` or a program)."""

    retries: int = DEFAULT_RETRIES
    first_s: float = 0.5
    max_s: float = 20.0
    flag: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or not 0 <= self.retries <= 1000:
            raise ValueError(f"retries must be an integer in 0..1000; got {self.retries!r}")
        for name in ("first_s", "max_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                raise ValueError(f"{name} must be a finite number of seconds >= 0; got {value!r}")
        if self.max_s < self.first_s:
            raise ValueError(f"max_s ({self.max_s}) must be at least first_s ({self.first_s})")

    def ceiling(self, retry: int) -> float:
        """The longest sleep before retry number ``retry`` (0 = the first retry)."""
        return min(self.max_s, self.first_s * 2.0 ** min(retry, 64))

    def delay(self, retry: int, rng: random.Random | None = None) -> float:
        """The sleep before retry number ``retry``: between half and all of ``ceiling(retry)``."""
        top = self.ceiling(retry)
        return top / 2 + (rng or random).uniform(0, top / 2)

    def total_s(self) -> tuple[float, float]:
        """(least, most) seconds slept in all before giving up."""
        most = sum(self.ceiling(k) for k in range(self.retries))
        return most / 2, most


class RetriesExhausted(Exception):
    """Every try failed: ``last`` is the last error, ``reason`` what made it worth retrying."""

    def __init__(self, tries: int, last: BaseException, reason: str):
        super().__init__(f"{tries} tries failed; last: {reason}")
        self.tries, self.last, self.reason = tries, last, reason


def call(request: Callable[[], T], *, policy: RetryPolicy, transient: Callable[[BaseException], str | None],
         on_retry: Callable[[int, str], None] | None = None, sleep: Callable[[float], None] = time.sleep) -> T:
    """``request()`` until it returns. ``transient(error)``: a short reason when a retry may fix
    the error, None when not (the error is raised as it is). ``on_retry(retry, reason)`` is
    called before each sleep (counting, logging)."""
    for retry in range(policy.retries + 1):
        try:
            return request()
        except Exception as e:  # noqa: BLE001 - sorted by ``transient``; the rest re-raised
            reason = transient(e)
            if reason is None:
                raise
            if retry == policy.retries:
                raise RetriesExhausted(retry + 1, e, reason) from e
            if on_retry is not None:
                on_retry(retry, reason)
            sleep(policy.delay(retry))
    raise AssertionError("unreachable")


class Outage:
    """Lines about a store that stopped answering (module docstring): ``retrying(name,
    reason)`` at each retry, ``answered()`` after each success (free while all is well).
    ``say``: where lines go (``hasten.progress.status``); ``clock``: seconds, monotonic."""

    def __init__(self, what: str, policy: RetryPolicy, *, say: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, every_s: float | None = None):
        from hasten.progress import progress_interval, status

        self.what, self.policy = what, policy
        self.say, self.clock = say or status, clock
        self.every_s = progress_interval() if every_s is None else every_s
        self.since: float | None = None  # when the current outage began (None: the store answers)
        self.retries = 0  # in the current outage
        self._said = -float("inf")  # when a line was last said
        self._announced = False  # whether the current outage was said
        self._lock = threading.Lock()

    def retrying(self, name: str, reason: str, policy: RetryPolicy | None = None) -> None:
        with self._lock:
            now = self.clock()
            if self.since is None:
                self.since, self.retries = now, 0
            self.retries += 1
            # At most one line per interval: a throttled store that fails and answers by turns says
            # so once, not at every request.
            if now - self._said < self.every_s:
                return
            self._said = now
            if not self._announced:
                self._announced = True
                policy = policy or self.policy
                least, most = policy.total_s()
                times = "1 time" if policy.retries == 1 else f"{policy.retries} times"
                self.say(f"{self.what}: {name}: {reason}; retrying, up to {times} per request "
                         f"({least:.0f}-{most:.0f} s{'; ' + policy.flag if policy.flag else ''})")
            else:
                self.say(f"{self.what}: still retrying ({name}: {reason}); {self.retries} retries in "
                         f"{now - self.since:.0f} s")

    def answered(self) -> None:
        if self.since is None:  # (read without the lock: the common case costs nothing)
            return
        with self._lock:
            if self.since is None:
                return
            if self._announced:
                self.say(f"{self.what}: answers again after {self.clock() - self.since:.0f} s "
                         f"({self.retries} {'retry' if self.retries == 1 else 'retries'})")
            self.since, self.retries, self._announced = None, 0, False
