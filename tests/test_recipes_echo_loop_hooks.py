"""The repeat-value probe the echo runs add to their loop (hasten.recipes.echo.loop_hooks.RepeatValue):
when it measures (issue 44: on steps that wait for their input, where it costs no time)."""

import torch
import torch.nn.functional as F

from hasten.echo.auto import AutoEcho
from hasten.recipes.echo import loop_hooks
from hasten.recipes.echo.loop_hooks import RepeatValue


def _probe_at(monkeypatch, waits, cost_s=0.05):
    """The steps (1-based) on which RepeatValue measured, each step having waited ``waits[i]``
    seconds for its batch (None: not told), every measurement taking ``cost_s``."""
    measured = []
    monkeypatch.setattr(loop_hooks, "gradient_dots", lambda *a, **k: measured.append(step) or (0.6, 1.0))
    auto = AutoEcho(value_every=4)
    auto.factor = auto.base = 2.0  # (as observe would set them: echoing, so measurements fall due)
    value = RepeatValue(auto, "example-before", torch.nn.Linear(3, 2), F.cross_entropy, seed=0)
    x, y, copies = torch.randn(8, 3), torch.zeros(8, dtype=torch.long), torch.tensor([0, 1] * 4)
    for step, waited in enumerate(waits, 1):
        value.cost_s = cost_s  # (the monkeypatched measurement takes no time; a real one about 0.4 of a step)
        value.probe(x, y, copies, waited)
    assert auto.value.taken == len(measured)
    return measured


def test_a_due_measurement_goes_to_a_step_that_waited_as_long_as_a_measurement_takes(monkeypatch):
    # Step 4 is due but waited 10 ms (< 50 ms: the measurement would lengthen the step); step 6
    # waited 60 ms: measured there. Then due at 10; no step waits long enough: measured at 14,
    # two intervals on.
    waits = [0.01] * 16
    waits[5] = 0.06
    assert _probe_at(monkeypatch, waits) == [6, 14]


def test_an_input_bound_loop_or_one_that_does_not_say_measures_on_the_interval(monkeypatch):
    assert _probe_at(monkeypatch, [0.2] * 16) == [4, 8, 12, 16]
    assert _probe_at(monkeypatch, [None] * 16) == [4, 8, 12, 16]  # train_to_target's probe: as before


def test_without_autoecho_or_with_batch_echoing_the_probe_measures_nothing(monkeypatch):
    monkeypatch.setattr(loop_hooks, "gradient_dots", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
    for auto, variant in ((None, "example-before"), (AutoEcho(value_every=1), "batch")):
        if auto is not None:
            auto.factor = 2.0
        value = RepeatValue(auto, variant, torch.nn.Linear(3, 2), F.cross_entropy, seed=0)
        for _ in range(4):
            value.probe(torch.randn(4, 3), torch.zeros(4, dtype=torch.long), torch.tensor([0, 1, 0, 1]), 1.0)
