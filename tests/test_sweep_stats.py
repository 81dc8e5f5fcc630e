"""nanolime/sweep_stats.py: t intervals, paired t and sign tests, Holm's adjustment, slopes and the slope a test
detects, against numbers computed by hand or by numpy."""
import math

import pytest

from conftest import REPO  # noqa: F401  (the repo on sys.path)
from nanolime import sweep_stats


def test_t_intervals_by_hand():
    mean_ci, verdict = sweep_stats.mean_ci, sweep_stats.verdict
    # 1, 2, 3: mean 2, sd 1, n 3 -> 4.303 / sqrt(3)
    m, h = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and h == pytest.approx(4.303 / math.sqrt(3))
    m, h = mean_ci([1.5])
    assert m == 1.5 and math.isnan(h)
    assert mean_ci([0.0, 2.0])[1] == pytest.approx(12.706)  # sd sqrt(2), / sqrt(2): t with 1 df
    assert mean_ci([0.0, 1.0] * 16)[1] / math.sqrt(8 / 31 / 32) == pytest.approx(2.040, abs=0.003)  # t, 31 df
    # paired differences 0.1, 0.05, 0.1 -> mean 1/12, variance 1/1200, sd / sqrt(3) = 1/60: 4.303 / 60
    d, h = mean_ci([0.1, 0.05, 0.1])
    assert d == pytest.approx(1 / 12) and h == pytest.approx(4.303 / 60)
    assert verdict(d, h) == 'worse' and verdict(-d, h) == 'better'  # 0.0116 .. 0.1550: a higher loss
    assert verdict(d, h, lower_is_better=False) == 'better'  # an accuracy
    assert verdict(0.01, 0.02) == 'inside seed noise' and verdict(0.0, 0.0) == 'inside seed noise'
    assert verdict(0.01, float('nan')) == 'no interval (one seed)'


def diffs_with_t(t, n):
    """n differences whose paired t statistic is exactly t: deviations n - 1, -1, ..., -1 (sum 0, sum of squares
    n (n - 1): sd / sqrt(n) = 1) around a mean of t."""
    return [t + n - 1] + [t - 1] * (n - 1)


def test_paired_t_test_p_by_hand():
    t_test_p = sweep_stats.t_test_p
    # 1 degree of freedom (Cauchy): P(|T| >= t) = 1 - 2 atan(t) / pi; 1, 3: mean 2, sd sqrt(2), / sqrt(2): t = 2
    assert t_test_p([1.0, 3.0]) == pytest.approx(1 - 2 * math.atan(2) / math.pi)  # 0.2952
    # 2: 1 - t / sqrt(2 + t^2); 1, 2, 3: mean 2, sd 1, / sqrt(3): t = 2 sqrt(3)
    assert t_test_p([1.0, 2.0, 3.0]) == pytest.approx(1 - 2 * math.sqrt(3) / math.sqrt(14))  # 0.0742
    # 3: 1 - 2 (theta + sin cos) / pi, tan(theta) = t / sqrt(3); t = 1: theta = pi / 6
    assert t_test_p([4.0, 0.0, 0.0, 0.0]) == pytest.approx(1 - 2 / math.pi * (math.pi / 6 + 0.5 * math.sqrt(3) / 2))
    # 4: 1 - sin (1 + cos^2 / 2); t = 2: theta = pi / 4
    assert t_test_p(diffs_with_t(-2.0, 5)) == pytest.approx(1 - math.sqrt(0.5) * 1.25)  # 0.1161, either sign
    # at the tabulated 95% quantile of every degrees of freedom the interval's edge touches 0: p = 0.05
    for n in range(2, 32):
        p = t_test_p(diffs_with_t(sweep_stats.t95(n - 1), n))
        assert p == pytest.approx(0.05, abs=2e-4), n
        assert t_test_p(diffs_with_t(sweep_stats.t95(n - 1) * 0.95, n)) > 0.05  # inside the interval
        assert t_test_p(diffs_with_t(sweep_stats.t95(n - 1) * 1.05, n)) < 0.05
    assert t_test_p(diffs_with_t(1.96, 1000)) == pytest.approx(0.05, abs=1e-3)  # many seeds: the normal's 1.96
    assert t_test_p(diffs_with_t(1.96, 1001)) == pytest.approx(0.05, abs=1e-3)
    assert math.isnan(t_test_p([0.1]))  # one seed: no test
    assert t_test_p([0.1, 0.1, 0.1]) == 0.0 and t_test_p([0.0, 0.0]) == 1.0  # no spread


# two-sided 95% quantiles of Student's t for 1..30 degrees of freedom, as a printed t table gives them
T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
       2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def test_the_95_quantiles_are_a_t_table_s():
    """t95 is the table every interval of this repository was made with (3 decimals), and P(|T| >= t_0.975)
    = 0.05 at each of its quantiles (to their rounding)."""
    assert [sweep_stats.t95(nu) for nu in range(1, 31)] == T95
    for nu, t in enumerate(T95, 1):
        assert sweep_stats.t_p(t * 0.5, 0.5, nu) == pytest.approx(0.05, abs=2e-4)
    assert sweep_stats.t95(2000) == 1.961  # the normal's 1.960, nearly


def test_slope_and_its_interval_against_the_normal_equations():
    """Paired differences at 8, 16, 32 and 64 layers against log2(depth); the slope and its standard error from
    the normal equations in numpy: (X'X)^-1 X'y and sqrt(s^2 (X'X)^-1[1, 1]), s^2 = residuals^2 / (n - 2)."""
    import numpy as np
    xs = [3.0, 3.0, 3.0, 4.0, 4.0, 4.0, 5.0, 5.0, 6.0, 6.0]
    ys = [0.01, -0.02, 0.00, -0.01, -0.03, 0.02, -0.04, -0.02, -0.05, -0.03]
    X = np.stack([np.ones(len(xs)), xs], 1)
    beta = np.linalg.solve(X.T @ X, X.T @ np.array(ys))
    s2 = float(((np.array(ys) - X @ beta) ** 2).sum()) / (len(xs) - 2)
    se = math.sqrt(s2 * np.linalg.inv(X.T @ X)[1, 1])
    slope, half, p = sweep_stats.slope_ci(xs, ys)
    assert slope == pytest.approx(beta[1]) and half == pytest.approx(2.306 * se)  # t, 8 df
    assert p == pytest.approx(sweep_stats.t_p(beta[1], se, 8)) and 0 < p < 0.05 < sweep_stats.t_p(beta[1], se * 2, 8)
    assert sweep_stats.slope_ci([1.0, 2.0], [0.0, 1.0])[0] == 1.0 and math.isnan(sweep_stats.slope_ci([1.0, 2.0], [0.0, 1.0])[1])


def test_sign_test_by_hand():
    sign = sweep_stats.sign_test_p
    assert sign([0.1, 0.2, 0.3, 0.1, 0.2]) == 0.0625  # 5 of 5: 2 * (1/2)^5
    assert sign([-0.1, -0.2, -0.3, -0.1, -0.2]) == 0.0625  # two-sided
    assert sign([0.1, 0.2, -0.3, 0.1, 0.2]) == 0.375  # 4 of 5: 2 * (1 + 5) / 32
    assert sign([0.0, 0.1, 0.2, 0.3, 0.0, 0.1, 0.2]) == 0.0625  # ties dropped: 5 of 5
    assert sign([0.0, 0.1, 0.2, -0.3, 0.0, 0.1, 0.2]) == 0.375
    assert sign([0.1] * 9 + [-0.1]) == 2 * (1 + 10) / 1024  # 9 of 10
    assert sign([0.1, -0.1]) == 1.0 and sign([0.1, -0.1, 0.2]) == 1.0  # capped: the split is as even as it gets
    assert sign([0.0, 0.0]) == 1.0 and sign([]) == 1.0  # nothing left


def test_holm_by_hand():
    holm = sweep_stats.holm
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04 -> the last raised to 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.01, 0.02, 0.03]) == pytest.approx([0.03, 0.04, 0.04])  # 0.03 * 1 < 0.02 * 2: monotone
    assert holm([0.6, 0.7, 0.3]) == pytest.approx([1.0, 1.0, 0.9])  # 0.6 * 2 capped at 1
    nan = float('nan')
    out = holm([0.01, nan, 0.04])  # no test: not counted, stays nan
    assert out[0] == pytest.approx(0.02) and math.isnan(out[1]) and out[2] == pytest.approx(0.04)
    assert holm([0.2]) == [0.2] and holm([]) == []


def test_the_detectable_slope_by_hand():
    """The slope of the normal-equations test above, 8 degrees of freedom: a two-sided test at 0.05 detects, at 80 %
    power, (t_0.975,8 + t_0.8,8) x SE = (2.306 + 0.889) x SE."""
    xs = [3.0, 3.0, 3.0, 4.0, 4.0, 4.0, 5.0, 5.0, 6.0, 6.0]
    ys = [0.01, -0.02, 0.00, -0.01, -0.03, 0.02, -0.04, -0.02, -0.05, -0.03]
    mx, my = sum(xs) / 10, sum(ys) / 10
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    se = math.sqrt(sum((y - my - b * (x - mx)) ** 2 for x, y in zip(xs, ys)) / 8 / sxx)
    assert sweep_stats.slope_fit(xs, ys) == pytest.approx((b, se, 8))
    assert sweep_stats.detectable(se, 8) == pytest.approx((2.306 + 0.889) * se, rel=5e-4)
    assert sweep_stats.detectable(se, 8, power=0.5) == pytest.approx(2.306 * se, rel=5e-4)  # t_0.5 = 0
    for nu, t80 in {1: 1.376, 2: 1.061, 4: 0.941, 16: 0.865, 30: 0.854, 2000: 0.842}.items():  # a t table's
        assert sweep_stats.detectable(1.0, nu) == pytest.approx(sweep_stats.t95(nu) + t80, abs=1e-3), nu
    assert math.isnan(sweep_stats.detectable(math.nan, 0)) and math.isnan(sweep_stats.slope_fit([1.0, 2.0], [0, 1])[1])
