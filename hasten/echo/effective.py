"""The training budget in effective examples: what each emitted copy is worth, counted as
the loop takes it (``EffectiveExamples``, the base of ``hasten.echo.auto.AutoEcho``).

With a budget fixed in steps, echoing at e feeds 1/e of the fresh data. Here the echo stage
records the value of each item it emits (a fresh example 1, a repeat less), the loop says
how many items each step took (``count``), and runs its schedule and its end on
``progress(budget)`` instead of the step count: an echoed run takes the extra steps its
repeats need, at no wall time while e <= R. e = 1 gives exactly the baseline's schedule.

hasten's own (docs/echo.md, "AutoEcho's budget in effective examples").

Changes the training math: yes, the schedule runs on effective examples, not steps.
"""

from __future__ import annotations

import math
from collections import deque


class EffectiveExamples:
    """Values of emitted copies and their sum over the items the loop took.

    ``repeat_value``: the first repeat's worth next to a fresh example; ``later_repeat_value``
    each later one's, times exp(-(k - 2) / ``repeat_decay``); ``value_ratio`` (<= 1) scales
    every repeat (AutoEcho sets it from the loss on repeats)."""

    def __init__(self, repeat_value: float, later_repeat_value: float, repeat_decay: float):
        self.repeat_value = float(repeat_value)
        self.later_repeat_value = float(later_repeat_value)
        self.repeat_decay = float(repeat_decay)
        self.value_ratio = 1.0
        self.effective_examples = 0.0  # fresh items plus repeats at their value (count)
        # [value, items] runs of emitted items not yet counted: without echoing one run of
        # 1.0, so that the bookkeeping costs O(1) per batch, not per item.
        self._values: deque[list] = deque()

    def copy_value(self, copy: int) -> float:
        """What copy number ``copy`` of an example (0: the first) is worth next to a
        fresh example: ``repeat_value`` for copy 1, ``later_repeat_value x exp(-(copy - 2)
        / repeat_decay)`` after, times the ranks' agreed loss ratio of repeats to first
        copies while that is below 1. Wall time per unit of progress at factor e is
        max(e x step, upstream time) / (the e copies' values): any positive value keeps e
        at about R, so these values set the steps an echoed run takes, not e."""
        if copy <= 0:
            return 1.0
        if copy == 1:
            return self.repeat_value * self.value_ratio
        return self.later_repeat_value * math.exp(-(copy - 2) / self.repeat_decay) * self.value_ratio

    def emitted(self, copy: int) -> None:
        """The echo stage's record of one emitted item, copy number ``copy``."""
        self._push(self.copy_value(copy), 1)

    def emitted_copies(self, copies: int, items: int = 1) -> None:
        """The echo stage's record of ``copies`` copies of one example (numbers 0 to
        copies - 1), in the order it emits them; of a run of ``items`` batches echoed
        together (``echo_batches(..., group=items)``), each copy ``items`` long."""
        self._push(1.0, items)
        for k in range(1, copies):
            self._push(self.copy_value(k), items)

    def _push(self, value: float, items: int) -> None:
        values = self._values
        if values and values[-1][0] == value:
            values[-1][1] += items
        else:
            values.append([value, items])

    def count(self, items: int) -> float:
        """The training loop took ``items`` more items (examples; batches for batch
        echoing): add the value of as many emitted items, oldest first, to
        ``effective_examples`` and return it. Items no stage recorded count as fresh."""
        values = self._values
        total = 0.0
        while items > 0 and values:
            run = values[0]
            take = min(items, run[1])
            total += run[0] * take
            items -= take
            run[1] -= take
            if run[1] == 0:
                values.popleft()
        self.effective_examples += total + items  # items left over: none recorded, fresh
        return self.effective_examples

    def progress(self, budget_examples: float) -> float:
        """The share of a budget of ``budget_examples`` (the baseline's steps x batch)
        used so far, in effective examples: run the schedule on it, stop at 1."""
        if not budget_examples > 0:
            raise ValueError(f"budget_examples must be > 0; got {budget_examples!r}")
        return self.effective_examples / budget_examples
