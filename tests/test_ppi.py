"""The prediction-powered mean (ragbatch.analysis.ppi): a case worked by hand, coverage
and width by seeded simulation, and the edge cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ragbatch.analysis.ppi import Moments, PairMoments, ppi_from_moments, ppi_mean

Z95 = 1.959963984540054  # normal quantile of 0.975

# The hand-worked case. Unlabelled judge scores f~ = [1, 0, 1, 1]: N = 4, mean 0.75,
# squared deviations 3 * 0.25^2 + 0.75^2 = 0.75, var = 0.75 / 3 = 0.25.
# Labelled: judge f = [1, 1, 0], labels y = [1, 0, 0]: n = 3.
#   mean f = 2/3, mean y = 1/3; var f = (1/9 + 1/9 + 4/9) / 2 = 1/3; var y = 1/3;
#   cov(f, y) = ((1/3)(2/3) + (1/3)(-1/3) + (-2/3)(-1/3)) / 2 = (3/9) / 2 = 1/6.
U, F, Y = [1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0]


def test_ppi_hand_worked() -> None:
    # PPI (lambda 1): rectifier y - f = [0, -1, 0], mean -1/3, var (1/9 + 4/9 + 1/9) / 2 = 1/3.
    # theta = 0.75 - 1/3 = 5/12; se^2 = 0.25 / 4 + (1/3) / 3 = 25/144, se = 5/12.
    r = ppi_mean(U, F, Y, estimator="ppi")
    assert (r.n_labelled, r.n_unlabelled, r.ppi_lambda) == (3, 4, 1.0)
    assert r.ppi_mean == pytest.approx(5 / 12)
    assert r.ppi_ci_low == pytest.approx(5 / 12 - Z95 * 5 / 12)
    assert r.ppi_ci_high == pytest.approx(5 / 12 + Z95 * 5 / 12)
    # labels only: 1/3 +- z * sqrt((1/3) / 3) = 1/3 +- z / 3
    assert r.labels_mean == pytest.approx(1 / 3)
    assert (r.labels_ci_low, r.labels_ci_high) == pytest.approx((1 / 3 - Z95 / 3, 1 / 3 + Z95 / 3))
    assert r.reason is None


def test_ppi_plus_plus_hand_worked() -> None:
    # lambda = (cov / n) / (var f~ / N + var f / n) = (1/18) / (25/144) = 8/25 = 0.32
    # theta = 0.32 * 0.75 + 1/3 - 0.32 * 2/3 = 0.24 + 0.12 = 0.36
    # var(y - 0.32 f) = 1/3 - 2 * 0.32 / 6 + 0.32^2 / 3 = 0.2608
    # se^2 = 0.32^2 * 0.25 / 4 + 0.2608 / 3 = 0.0064 + 0.086933... = 0.093333...
    r = ppi_mean(U, F, Y, estimator="ppi++")
    assert r.ppi_lambda == pytest.approx(0.32)
    assert r.ppi_mean == pytest.approx(0.36)
    half = Z95 * math.sqrt(0.0064 + 0.2608 / 3)
    assert (r.ppi_ci_low, r.ppi_ci_high) == pytest.approx((0.36 - half, 0.36 + half))


def test_bounds_clip_estimate_and_interval() -> None:
    # the same case within [0, 1]: 5/12 - z * 5/12 < 0 and 5/12 + z * 5/12 > 1
    r = ppi_mean(U, F, Y, estimator="ppi", bounds=(0.0, 1.0))
    assert (r.ppi_ci_low, r.ppi_mean, r.ppi_ci_high) == pytest.approx((0.0, 5 / 12, 1.0))
    assert r.labels_ci_low == 0.0


def test_moments_merged_by_chunks_equal_whole() -> None:
    rng = np.random.default_rng(3)
    f, y = rng.random(1000), rng.random(1000)
    whole, parts = PairMoments(), PairMoments()
    whole.add(f, y)
    for lo in range(0, 1000, 137):
        parts.add(f[lo : lo + 137], y[lo : lo + 137])
    assert parts.n == 1000
    assert parts.f.var() == pytest.approx(np.var(f, ddof=1), rel=1e-12)
    assert parts.y.mean == pytest.approx(y.mean(), rel=1e-12)
    assert parts.cov() == pytest.approx(np.cov(f, y)[0, 1], rel=1e-12)
    assert whole.cov() == pytest.approx(parts.cov(), rel=1e-12)


def _simulate(
    estimator: str,
    accuracy: float | None,
    reps: int = 2000,
    n: int = 100,
    big_n: int = 1000,
    p: float = 0.3,
) -> tuple[float, float, float, float]:
    """Coverage of the true mean ``p`` and mean width, PPI and labels-only, over ``reps``
    seeded replications. Labels are Bernoulli(p); the judge agrees with the label with
    probability ``accuracy`` (None: the judge is a coin flip, independent of the label)."""
    rng = np.random.default_rng(20250601)
    covered = covered_labels = width = width_labels = 0.0
    for _ in range(reps):
        y = (rng.random(n + big_n) < p).astype(float)
        if accuracy is None:
            f = (rng.random(n + big_n) < 0.5).astype(float)
        else:
            f = np.where(rng.random(n + big_n) < accuracy, y, 1 - y)
        r = ppi_mean(f[n:], f[:n], y[:n], estimator=estimator, bounds=(0, 1))
        covered += r.ppi_ci_low <= p <= r.ppi_ci_high
        covered_labels += r.labels_ci_low <= p <= r.labels_ci_high
        width += r.ppi_ci_high - r.ppi_ci_low
        width_labels += r.labels_ci_high - r.labels_ci_low
    return covered / reps, covered_labels / reps, width / reps, width_labels / reps


# 2000 replications at a true coverage of 0.95: standard error sqrt(0.95 * 0.05 / 2000) =
# 0.0049; 3 standard errors (0.015) either side.
TOLERANCE = 3 * math.sqrt(0.95 * 0.05 / 2000)


@pytest.mark.parametrize("estimator", ["ppi", "ppi++"])
def test_informative_judge_covers_and_is_narrower(estimator: str) -> None:
    coverage, coverage_labels, width, width_labels = _simulate(estimator, accuracy=0.9)
    assert abs(coverage - 0.95) <= TOLERANCE
    assert abs(coverage_labels - 0.95) <= TOLERANCE
    assert width < 0.9 * width_labels


def test_uninformative_judge_ppi_plus_plus_not_much_wider() -> None:
    coverage, _, width, width_labels = _simulate("ppi++", accuracy=None)
    assert abs(coverage - 0.95) <= TOLERANCE
    assert width <= 1.02 * width_labels
    # plain PPI pays for the noise of a useless judge: var(f~)/N + var(y - f)/n
    _, _, width_ppi, _ = _simulate("ppi", accuracy=None, reps=200)
    assert width_ppi > 1.3 * width_labels


def test_no_labelled_rows() -> None:
    u = Moments()
    u.add(np.array([0.0, 1.0]))
    r = ppi_from_moments(u, PairMoments())
    assert r.ppi_mean is None and r.labels_mean is None
    assert r.reason == "no labelled row has an ok score"


def test_one_labelled_row_has_estimates_but_no_interval() -> None:
    r = ppi_mean([1.0, 0.0, 1.0, 1.0], [1.0], [0.0])
    # lambda 1: 0.75 + (0 - 1) = -0.25; labels-only 0
    assert r.ppi_mean == pytest.approx(-0.25) and r.labels_mean == 0.0
    assert r.ppi_ci_low is None and r.labels_ci_low is None
    assert "an interval needs at least 2" in r.reason


def test_every_row_labelled_gives_the_labels_mean() -> None:
    r = ppi_mean([], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0])
    assert r.ppi_lambda == 0.0
    assert (r.ppi_mean, r.ppi_ci_low, r.ppi_ci_high) == (
        r.labels_mean,
        r.labels_ci_low,
        r.labels_ci_high,
    )
    assert "labels-only mean" in r.reason


def test_constant_judge_gets_lambda_zero() -> None:
    r = ppi_mean([1.0] * 5, [1.0, 1.0, 1.0], [1.0, 0.0, 0.0])
    assert r.ppi_lambda == 0.0 and r.ppi_mean == pytest.approx(1 / 3)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="labels has 2"):
        ppi_mean([1.0], [1.0, 0.0, 1.0], [1.0, 0.0])
    with pytest.raises(ValueError, match="NaN"):
        ppi_mean([1.0], [1.0, 0.0], [1.0, float("nan")])
    with pytest.raises(ValueError, match="estimator"):
        ppi_mean([1.0], [1.0, 0.0], [1.0, 0.0], estimator="ppi+")
