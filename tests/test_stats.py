"""hasten.stats: the exact Student-t quantile against published tables and closed forms,
the 95% interval of a mean, and the paired differences and ratios the benchmarks report."""

import math

import pytest

from hasten.stats import describe, mean, mean_ci, paired, paired_differences, paired_ratios, sample_std, t_quantile

# Two-sided 95% (p = 0.975) and 99% (p = 0.995) quantiles of Student's t by degrees of freedom
# (n - 1): the tables' 12.7062, 4.3027, 2.7764, 2.2281, 2.0423, 1.9842 and 63.6567, 3.1693,
# 2.7500, here to six decimals (40-digit arithmetic, mpmath's incomplete beta).
T975 = {1: 12.706205, 2: 4.302653, 4: 2.776445, 10: 2.228139, 30: 2.042272, 99: 1.984217}
T995 = {1: 63.656741, 10: 3.169273, 30: 2.749996}


@pytest.mark.parametrize("df", sorted(T975))
def test_t_quantile_matches_the_published_95_percent_values(df):
    assert t_quantile(0.975, df) == pytest.approx(T975[df], abs=1e-6)


@pytest.mark.parametrize("df", sorted(T995))
def test_t_quantile_matches_the_published_99_percent_values(df):
    assert t_quantile(0.995, df) == pytest.approx(T995[df], abs=1e-6)


@pytest.mark.parametrize("p", [0.001, 0.3, 0.6, 0.9, 0.975, 0.9995])
def test_t_quantile_is_exact_where_closed_forms_exist(p):
    # df = 1 is the Cauchy distribution; df = 2 has F(t) = 1/2 + t / (2 sqrt(t^2 + 2)).
    assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-10)
    assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-10)


def test_t_quantile_has_no_cut_off_and_tends_to_the_normal():
    # A table that ends at some df and returns 1.96 beyond is 12% narrow at df = 10 and still
    # 1.2% narrow at df = 99; the exact quantile decreases with df all the way to the normal's.
    dfs = [10, 31, 99, 500, 999.9, 1000, 1000.1, 5000, 1e6, 1e9]
    qs = [t_quantile(0.975, df) for df in dfs]
    assert all(a > b for a, b in zip(qs, qs[1:]))
    assert t_quantile(0.975, math.inf) == pytest.approx(1.959963984540054, abs=1e-12)
    assert t_quantile(0.975, 1e9) == pytest.approx(1.959963984540054, abs=1e-8)
    # df = 1000 (1.962339 to six decimals), where the method changes: both sides agree.
    assert t_quantile(0.975, 1000) == pytest.approx(1.962339, abs=1e-6)
    assert t_quantile(0.975, 1000 * (1 + 1e-12)) == pytest.approx(t_quantile(0.975, 1000), abs=1e-10)
    # Not only integers: df = 2.5 lies between df = 2 and df = 3.
    assert t_quantile(0.975, 2) > t_quantile(0.975, 2.5) > t_quantile(0.975, 3)


def test_t_quantile_is_symmetric_and_checks_its_arguments():
    assert t_quantile(0.025, 4) == pytest.approx(-T975[4], abs=1e-6)
    assert t_quantile(0.5, 3) == 0.0
    for p in (0.0, 1.0, -0.1, math.nan):
        with pytest.raises(ValueError, match="p must be in"):
            t_quantile(p, 3)
    for df in (0, -1, math.nan):
        with pytest.raises(ValueError, match="degrees of freedom"):
            t_quantile(0.975, df)


def test_mean_and_sample_std_skip_none_and_have_no_spread_below_two_values():
    assert mean([1.0, None, 2.0, 6.0]) == 3.0
    assert sample_std([1.0, None, 2.0, 6.0]) == pytest.approx(math.sqrt(7.0))  # (4 + 1 + 9) / 2
    assert mean([]) is None and mean([None]) is None
    assert sample_std([5.0]) is None and sample_std([]) is None
    assert sample_std([3.0, 3.0]) == 0.0


def test_mean_ci_on_a_known_input():
    ci = mean_ci([2.0, 4.0, None, 6.0, 8.0, 10.0])
    # std of 2..10 step 2 is sqrt(10); half-width t(0.975, 4) sqrt(10) / sqrt(5) = 2.776445 sqrt(2)
    assert ci == {"n": 5, "mean": 6.0, "std": pytest.approx(math.sqrt(10.0)),
                  "ci95": pytest.approx(2.776445 * math.sqrt(2.0), abs=1e-6), "values": [2.0, 4.0, 6.0, 8.0, 10.0]}


def test_mean_ci_at_eleven_values_uses_t_not_the_normal():
    values = [float(i) for i in range(11)]  # std sqrt(11)
    ci = mean_ci(values)
    assert ci["ci95"] == pytest.approx(T975[10], abs=1e-6)  # t(0.975, 10) sqrt(11) / sqrt(11); 1.96 was wrong


def test_mean_ci_below_two_values_has_no_interval():
    assert mean_ci([None, 5.0]) == {"n": 1, "mean": 5.0, "std": None, "ci95": None, "values": [5.0]}
    assert mean_ci([]) == {"n": 0, "mean": None, "std": None, "ci95": None, "values": []}


def test_describe_is_the_short_form():
    assert describe([1.0, 2.0, 3.0, None]) == {"mean": 2.0, "std": 1.0, "n": 3}
    assert describe([5.0]) == {"mean": 5.0, "std": None, "n": 1}
    assert describe([None]) == {"mean": None, "std": None, "n": 0}


def test_paired_matches_by_key_in_the_first_ones_order_or_by_position():
    a = {"seed 2": 6.0, "seed 0": 4.0, "seed 1": 9.0}
    b = {"seed 0": 2.0, "seed 2": 3.0, "seed 3": 1.0}  # seed 1 only in a, seed 3 only in b
    assert paired(a, b) == [(6.0, 3.0), (4.0, 2.0)]
    assert paired_differences(a, b) == [3.0, 2.0]
    assert paired_ratios(a, b) == [2.0, 2.0]
    assert paired_differences([5.0, 1.0], [2.0, 4.0]) == [3.0, -3.0]
    assert paired_ratios([5.0, 1.0], [2.0, 4.0]) == [2.5, 0.25]


def test_paired_refuses_what_cannot_be_matched():
    with pytest.raises(ValueError, match="equally long"):
        paired([1.0, 2.0], [1.0])
    with pytest.raises(TypeError, match="two mappings"):
        paired({0: 1.0}, [1.0])
