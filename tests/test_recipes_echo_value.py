"""The repeat-value calibration's arithmetic (hasten.recipes.echo.value): the model,
the per-factor summary, the crossing of the goal and the least-squares fit."""

import math

import pytest

from hasten.recipes.echo.value import fit, multiplier_needed, repeat_weight, steps_multiplier, value_for


def test_the_model_counts_the_first_repeat_and_later_ones_at_their_values():
    assert repeat_weight(1, 0.5, 0.9) == 0.0
    assert repeat_weight(2, 0.5, 0.9) == 0.5  # one repeat: the first
    assert repeat_weight(4, 0.5, 0.9) == pytest.approx(0.5 + 0.9 + 0.9)
    assert repeat_weight(4, 0.5, 0.9, decay=10.0) == pytest.approx(0.5 + 0.9 + 0.9 * math.exp(-1 / 10))
    assert steps_multiplier(1, 0.5, 0.5) == 1.0  # no echoing: the baseline's steps
    assert steps_multiplier(3, 1.0, 1.0) == 1.0  # repeats as good as fresh: no extra steps
    assert steps_multiplier(4, 0.0, 0.0) == 4.0  # worthless repeats: e times the steps
    assert steps_multiplier(4, 0.66, 0.86) == pytest.approx(4 / 3.38)


@pytest.mark.parametrize("e, v", [(2, 0.6), (4, 0.78), (8, 0.3)])
def test_value_for_inverts_the_one_value_model(e, v):
    assert value_for(e, steps_multiplier(e, v, v)) == pytest.approx(v)


def test_value_for_clips_and_rejects():
    assert value_for(2, 0.5) == 1.0  # fewer steps than the baseline: capped at a fresh example
    assert value_for(2, 3.0) == 0.0
    with pytest.raises(ValueError, match="echo factor >= 2"):
        value_for(1, 1.2)
    with pytest.raises(ValueError, match="multiplier must be > 0"):
        value_for(2, 0.0)


def test_multiplier_needed_interpolates_extrapolates_and_gives_up():
    pts = [(1.0, 0.50), (1.25, 0.54), (1.5, 0.56)]
    assert multiplier_needed(pts, 0.52) == pytest.approx(1.125)
    assert multiplier_needed(list(reversed(pts)), 0.55) == pytest.approx(1.375)  # order does not matter
    assert multiplier_needed(pts, 0.49) == 1.0  # reached at the smallest budget already
    assert multiplier_needed(pts, 0.58) == pytest.approx(1.75)  # beyond: the last two points' line
    assert multiplier_needed([(1.0, 0.5), (1.5, 0.49)], 0.6) == math.inf  # falling: never
    assert multiplier_needed([(1.0, 0.5)], 0.6) == math.inf
    with pytest.raises(ValueError):
        multiplier_needed([], 0.5)


def test_the_fit_recovers_the_values_that_made_the_data():
    needed = {e: steps_multiplier(e, 0.62, 0.9) for e in (2, 4, 8)}
    got = fit(needed)
    assert got["first_repeat_value"] == pytest.approx(0.62) and got["later_repeat_value"] == pytest.approx(0.9)
    assert got["squared_error"] < 1e-9
    assert got["steps_multiplier"][4] == pytest.approx(needed[4])
    # The same step multiplier at every factor (what the calibration measured) needs a first
    # repeat worth less than later ones; an infinite multiplier (never reached) is left out.
    flat = fit({2: 1.2, 4: 1.2, 8: 1.2, 16: math.inf})
    assert flat["first_repeat_value"] < flat["later_repeat_value"]
    assert all(m == pytest.approx(1.2, abs=0.02) for m in flat["steps_multiplier"].values())
    with pytest.raises(ValueError):
        fit({2: math.inf})
