"""Interval estimators against scipy, hand-worked cases and a seeded coverage simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from ragbatch.analysis import intervals
from ragbatch.analysis.intervals import (
    N_RESAMPLES,
    SEED,
    MeanCIStream,
    bootstrap_mean_ci,
    mean_ci,
    paired_bootstrap_diff_ci,
    wilson_interval,
)


def _scipy_percentile(
    data, statistic, *, seed, n_resamples=N_RESAMPLES, confidence=0.95, paired=False
):
    result = stats.bootstrap(
        data,
        statistic,
        paired=paired,
        vectorized=True,
        method="percentile",
        confidence_level=confidence,
        n_resamples=n_resamples,
        random_state=np.random.default_rng(seed),
    )
    return result.confidence_interval.low, result.confidence_interval.high


# ---------------------------------------------------------------- bootstrap of a mean


@pytest.mark.parametrize("confidence", [0.8, 0.95, 0.99])
def test_bootstrap_matches_scipy_with_the_same_generator(confidence):
    # scipy draws its index matrix with Generator.integers(0, n, (B, n)) like we do, so
    # the same seed gives the same resamples; only summation order can differ.
    x = np.random.default_rng(1).exponential(size=37)
    mean, low, high = bootstrap_mean_ci(x, confidence=confidence)
    ref_low, ref_high = _scipy_percentile((x,), np.mean, seed=SEED, confidence=confidence)
    assert mean == pytest.approx(float(np.mean(x)), rel=1e-12)
    assert low == pytest.approx(ref_low, rel=1e-9)
    assert high == pytest.approx(ref_high, rel=1e-9)


def test_bootstrap_agrees_with_scipy_under_another_seed():
    # Independent resamples: the bounds agree within Monte Carlo error, here taken as 10 %
    # of the interval's width (the 2.5 % quantile of 2000 means has a standard error of
    # roughly 3 % of the width for this sample).
    x = np.random.default_rng(7).normal(3.0, 2.0, size=60)
    _, low, high = bootstrap_mean_ci(x)
    ref_low, ref_high = _scipy_percentile((x,), np.mean, seed=12345)
    width = ref_high - ref_low
    assert abs(low - ref_low) < 0.1 * width
    assert abs(high - ref_high) < 0.1 * width


def test_bootstrap_two_values_hand_worked():
    # Resample means of [0, 1] are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4: the 2.5 %
    # and 97.5 % quantiles of 2000 such draws are 0 and 1 (fewer than 50 zeros among 2000
    # draws at p = 1/4 has negligible probability).
    assert bootstrap_mean_ci([0.0, 1.0]) == (0.5, 0.0, 1.0)


def test_bootstrap_is_reproducible_and_seeded():
    x = np.random.default_rng(2).random(30)
    assert bootstrap_mean_ci(x) == bootstrap_mean_ci(list(x))
    assert bootstrap_mean_ci(x, seed=1) != bootstrap_mean_ci(x, seed=2)


def test_bootstrap_chunking_does_not_change_the_draws(monkeypatch):
    x = np.random.default_rng(4).random(50)
    whole = bootstrap_mean_ci(x, n_resamples=300)
    monkeypatch.setattr(intervals, "CHUNK_ELEMENTS", 7 * 50 + 3)  # chunks of 7 resamples
    assert bootstrap_mean_ci(x, n_resamples=300) == whole


def test_bootstrap_empty_single_and_constant():
    assert bootstrap_mean_ci([]) == (None, None, None)
    assert bootstrap_mean_ci(np.array([], dtype=np.float64)) == (None, None, None)
    assert bootstrap_mean_ci([0.25]) == (0.25, 0.25, 0.25)
    assert bootstrap_mean_ci([0.0, 0.0, 0.0]) == (0.0, 0.0, 0.0)
    assert bootstrap_mean_ci([2, 2]) == (2.0, 2.0, 2.0)  # integers read as float64


def test_bootstrap_duplicates_count_as_separate_rows():
    # [1, 1, 1, 0]: mean 0.75; the interval is that of a 4-row sample, narrower than the
    # [0, 1] hand case and wholly above 0.
    mean, low, high = bootstrap_mean_ci([1.0, 1.0, 1.0, 0.0])
    assert mean == 0.75
    assert 0.0 < low < mean <= high == 1.0


@pytest.mark.parametrize(
    "values, match",
    [
        ([1.0, float("nan")], r"values\[1\] is nan"),
        ([float("inf")], r"values\[0\] is inf"),
        ([1.0, None], r"values\[1\] is nan"),
        ([[1.0, 2.0]], "one-dimensional"),
    ],
)
def test_bootstrap_rejects_non_finite_and_bad_shapes(values, match):
    with pytest.raises(ValueError, match=match):
        bootstrap_mean_ci(values)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"confidence": 0.0},
        {"confidence": 1.0},
        {"confidence": 95},
        {"n_resamples": 0},
        {"n_resamples": 2.5},
    ],
)
def test_bootstrap_rejects_bad_parameters(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        bootstrap_mean_ci([1.0, 2.0], **kwargs)


def test_bootstrap_coverage_in_seeded_simulation():
    # 400 normal samples of 40 with true mean 1: the 95 % percentile interval should cover
    # in about 95 % of them (the percentile bootstrap runs slightly short at small n). With
    # 400 trials the binomial standard error is 1.1 points; accept 91 %..98 %.
    rng = np.random.default_rng(11)
    trials = 400
    covered = 0
    for trial in range(trials):
        sample = rng.normal(1.0, 1.0, size=40)
        _, low, high = bootstrap_mean_ci(sample, n_resamples=500, seed=trial)
        covered += low <= 1.0 <= high
    assert 0.91 <= covered / trials <= 0.98


# ---------------------------------------------------------------- paired difference


def test_paired_diff_matches_scipy_paired_bootstrap():
    rng = np.random.default_rng(3)
    baseline = rng.random(25)
    candidate = baseline + rng.normal(0.1, 0.05, size=25)
    diff, low, high = paired_bootstrap_diff_ci(baseline, candidate)
    ref_low, ref_high = _scipy_percentile(
        (baseline, candidate),
        lambda a, b, axis: np.mean(b - a, axis=axis),
        seed=SEED,
        paired=True,
    )
    assert diff == pytest.approx(float(np.mean(candidate - baseline)), rel=1e-12)
    assert low == pytest.approx(ref_low, rel=1e-9)
    assert high == pytest.approx(ref_high, rel=1e-9)


def test_paired_diff_hand_worked_and_sign():
    # A constant shift of +1 has every resampled difference equal to 1.
    assert paired_bootstrap_diff_ci([0.0, 0.5, 1.0], [1.0, 1.5, 2.0]) == (1.0, 1.0, 1.0)
    # Candidate lower: negative difference.
    assert paired_bootstrap_diff_ci([1.0, 1.0], [0.0, 1.0]) == (-0.5, -1.0, 0.0)


def test_paired_diff_is_narrower_than_unpaired_for_correlated_pairs():
    rng = np.random.default_rng(5)
    shared = rng.normal(0.0, 1.0, size=80)
    baseline = shared + rng.normal(0.0, 0.1, size=80)
    candidate = shared + 0.2 + rng.normal(0.0, 0.1, size=80)
    _, low, high = paired_bootstrap_diff_ci(baseline, candidate)
    # Unpaired: independent resamples of each arm (scipy, two-sample statistic).
    ref_low, ref_high = _scipy_percentile(
        (baseline, candidate),
        lambda a, b, axis: np.mean(b, axis=axis) - np.mean(a, axis=axis),
        seed=SEED,
    )
    assert 0.0 < low < 0.2 < high
    assert (high - low) < 0.5 * (ref_high - ref_low)


def test_paired_diff_empty_and_errors():
    assert paired_bootstrap_diff_ci([], []) == (None, None, None)
    with pytest.raises(ValueError, match="baseline has 2 values and candidate has 3"):
        paired_bootstrap_diff_ci([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"candidate\[0\] is nan"):
        paired_bootstrap_diff_ci([1.0], [float("nan")])


# ---------------------------------------------------------------- Wilson interval


def test_wilson_hand_worked_five_of_ten():
    # z = 1.959964, z² = 3.841459; centre = 0.5; half-width
    # = z / (1 + z²/10) * sqrt(0.25/10 + z²/400) = 1.416010 * 0.186021 = 0.263407.
    rate, low, high = wilson_interval(5, 10)
    assert rate == 0.5
    assert low == pytest.approx(0.236593, abs=1e-6)
    assert high == pytest.approx(0.763407, abs=1e-6)


@pytest.mark.parametrize("n", [1, 2, 10, 57, 1000])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_wilson_matches_scipy(n, confidence):
    for k in sorted({0, 1, n // 3, n // 2, n - 1, n}):
        if not 0 <= k <= n:
            continue
        rate, low, high = wilson_interval(k, n, confidence)
        ref = stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
        assert rate == k / n
        assert low == pytest.approx(ref.low, abs=1e-12)
        assert high == pytest.approx(ref.high, abs=1e-12)
        assert 0.0 <= low <= rate <= high <= 1.0


def test_wilson_bounds_at_zero_and_all():
    assert wilson_interval(0, 4)[:2] == (0.0, 0.0)
    assert wilson_interval(4, 4)[0] == wilson_interval(4, 4)[2] == 1.0
    # Non-zero width at the edges, unlike the Wald interval.
    assert wilson_interval(0, 4)[2] > 0.0
    assert wilson_interval(4, 4)[1] < 1.0


def test_wilson_empty_and_errors():
    assert wilson_interval(0, 0) == (None, None, None)
    with pytest.raises(ValueError, match="0 <= successes <= n"):
        wilson_interval(3, 2)
    with pytest.raises(ValueError, match="0 <= successes <= n"):
        wilson_interval(-1, 2)
    with pytest.raises(ValueError, match="successes must be an integer"):
        wilson_interval(1.5, 2)
    with pytest.raises(ValueError, match="n must be an integer"):
        wilson_interval(1, True)
    with pytest.raises(ValueError, match="confidence"):
        wilson_interval(1, 2, confidence=1.5)
    assert wilson_interval(np.int64(2), np.int64(4))[0] == 0.5


def test_wilson_coverage_in_seeded_simulation():
    # 4000 binomial draws at p = 0.3, n = 50: Wilson's coverage is close to nominal here
    # (Brown, Cai & DasGupta 2001, fig. 4). Standard error 0.35 points; accept 93 %..97 %.
    rng = np.random.default_rng(13)
    counts = rng.binomial(50, 0.3, size=4000)
    covered = 0
    for k in counts:
        _, low, high = wilson_interval(int(k), 50)
        covered += low <= 0.3 <= high
    assert 0.93 <= covered / counts.size <= 0.97
    assert math.isclose(wilson_interval(15, 50)[0], 0.3)


# ---------------------------------------------------------------- mean_ci (summaries)


def test_mean_ci_is_bootstrap_mean_ci_for_small_samples():
    continuous = np.sort(np.random.default_rng(21).random(1200))  # > MAX_DISTINCT distinct
    few = np.sort(np.random.default_rng(22).integers(0, 3, size=200) / 2)  # n <= MAX_DISTINCT
    for x in (continuous, few, np.array([0.5])):
        assert intervals.mean_ci(x) == (*bootstrap_mean_ci(x), intervals.BOOTSTRAP)
    assert intervals.mean_ci([]) == (None, None, None, None)


def test_mean_ci_multinomial_path_matches_scipy_percentile():
    # 3000 scores on the 0-5 grid scaled to [0, 1]: 6 distinct values, so the bootstrap is
    # drawn as multinomial counts; scipy resamples rows. Same distribution, other draws:
    # agree within 10 % of the width.
    x = np.sort(np.random.default_rng(23).integers(0, 6, size=3000) / 5)
    mean, low, high, method = intervals.mean_ci(x)
    ref_low, ref_high = _scipy_percentile((x,), np.mean, seed=99)
    assert method == intervals.BOOTSTRAP
    assert mean == pytest.approx(float(x.mean()), rel=1e-12)
    width = ref_high - ref_low
    assert abs(low - ref_low) < 0.1 * width and abs(high - ref_high) < 0.1 * width


def test_mean_ci_normal_path_hand_formula_and_scipy():
    # 6000 skewed continuous values: above BOOTSTRAP_MAX_N with more than MAX_DISTINCT
    # distinct values -> mean ± 1.959964 * std(ddof=0) / sqrt(n).
    x = np.random.default_rng(24).exponential(2.0, size=6000)
    mean, low, high, method = intervals.mean_ci(x)
    half = 1.959963984540054 * np.std(x) / math.sqrt(6000)
    assert method == intervals.NORMAL
    assert (low, high) == (
        pytest.approx(x.mean() - half, rel=1e-12),
        pytest.approx(x.mean() + half, rel=1e-12),
    )
    ref_low, ref_high = _scipy_percentile((x,), np.mean, seed=5)
    width = ref_high - ref_low
    assert abs(low - ref_low) < 0.1 * width and abs(high - ref_high) < 0.1 * width


@pytest.mark.parametrize("kind", ["multinomial", "normal"])
def test_mean_ci_large_sample_paths_cover_at_nominal_rate(kind):
    # 300 seeded samples per path; accept 91 %..98 % (binomial standard error 1.3 points).
    rng = np.random.default_rng(31)
    covered = 0
    for trial in range(300):
        if kind == "multinomial":
            x, truth = (rng.random(600) < 0.3).astype(float), 0.3
            _, low, high, method = intervals.mean_ci(x, seed=trial, n_resamples=500)
            assert method == intervals.BOOTSTRAP
        else:
            x, truth = rng.exponential(1.0, size=6000), 1.0
            _, low, high, method = intervals.mean_ci(x)
            assert method == intervals.NORMAL
        covered += low <= truth <= high
    assert 0.91 <= covered / 300 <= 0.98


@pytest.mark.parametrize(
    "values, counts, thresholds",
    [
        # 7 values, max_distinct 2: index bootstrap over the rebuilt values
        ([0.0, 0.5, 1.0], [2, 4, 1], {"max_resample_n": 50, "max_distinct": 2}),
        # 300 values on 3 distinct: multinomial
        ([0.0, 0.5, 1.0], [100, 150, 50], {"max_resample_n": 50, "max_distinct": 4}),
        # 80 values on 20 distinct, above both thresholds: normal (uses the m2)
        (list(np.linspace(-1.0, 2.0, 20)), [4] * 20, {"max_resample_n": 50, "max_distinct": 8}),
    ],
)
def test_stream_add_counts_is_add_of_the_repeated_values(values, counts, thresholds):
    # One call (as the run summary makes per group) must give mean_ci of the repeated
    # values, worked out by mean_ci itself over numpy.repeat; counts given in two uneven
    # parts must still combine to the same count, mean and sum of squared deviations.
    values, counts = np.array(values), np.array(counts, dtype=np.int64)
    repeated = np.repeat(values, counts)
    stream = MeanCIStream(**thresholds)
    stream.add_counts(values, counts)
    expected = mean_ci(repeated, n_resamples=400, **thresholds)
    got = stream.result(n_resamples=400)
    assert got[3] == expected[3]
    assert got[:3] == pytest.approx(expected[:3], rel=1e-12, abs=1e-12)
    first = counts // 3
    split = MeanCIStream(**thresholds)
    split.add_counts(values, first)
    split.add_counts(values[counts > first], (counts - first)[counts > first])
    m2 = float(((repeated - repeated.mean()) ** 2).sum())
    assert (split.n, split.mean, split.m2) == (
        repeated.size,
        pytest.approx(repeated.mean(), rel=1e-12),
        pytest.approx(m2, rel=1e-12),
    )
