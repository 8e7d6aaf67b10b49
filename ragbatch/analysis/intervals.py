"""Confidence intervals for means, paired mean differences and proportions.

Three estimators, each returning ``(estimate, low, high)`` as Python floats:

- :func:`bootstrap_mean_ci`: percentile bootstrap of the mean (Efron 1979; Efron &
  Tibshirani 1993, "An Introduction to the Bootstrap", ch. 13).
- :func:`paired_bootstrap_diff_ci`: the same on paired differences ``candidate - baseline``
  (pairs are resampled together, so the correlation between the two series is kept).
- :func:`wilson_interval`: Wilson score interval of a binomial proportion (Wilson 1927,
  "Probable inference, the law of succession, and statistical inference", JASA 22).

Conventions shared by all three:

- ``confidence`` is the two-sided coverage in the open interval (0, 1); default
  :data:`CONFIDENCE` (0.95).
- Empty input has no estimate: the result is ``(None, None, None)``.
- Bootstrap intervals are reproducible: the resamples are drawn from
  ``numpy.random.default_rng(seed)`` with seed :data:`SEED` unless told otherwise, and the
  same data, ``n_resamples`` and seed always give the same interval.
- A single value (or values that are all equal) gives the degenerate interval
  ``(x, x, x)``: every resample has the same mean. Zero width then says that the data
  cannot show any spread, not that the estimate is certain.

:func:`mean_ci` is the estimator run summaries use: the percentile bootstrap, computed
exactly but cheaply for large samples of few distinct values, and replaced by its normal
approximation only for large samples of many distinct values (see its docstring).
:class:`MeanCIStream` computes the same over values that arrive in chunks, in bounded
memory (the run summary feeds it each group's sorted scores batch by batch).

Only numpy and the standard library are used, so the module runs wherever ragbatch does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import cast

import numpy as np

#: Default two-sided confidence level of every interval.
CONFIDENCE: float = 0.95

#: Default number of bootstrap resamples. With 2000 resamples the Monte Carlo error of a
#: 2.5 % / 97.5 % percentile is small next to the interval's width for the sample sizes of
#: a summary (Efron & Tibshirani 1993, section 19.3, suggest at least 1000 for percentile
#: intervals).
N_RESAMPLES: int = 2000

#: Default seed of the bootstrap's random generator (``numpy.random.default_rng(SEED)``).
SEED: int = 20240611

#: :func:`mean_ci` resamples the counts of distinct values (multinomial) for samples of
#: more values than this with at most this many distinct values.
MAX_DISTINCT: int = 256

#: :func:`mean_ci` resamples indices for other samples of at most this many values, and
#: uses the normal approximation of the bootstrap distribution above it.
BOOTSTRAP_MAX_N: int = 5_000

#: Names of the methods :func:`mean_ci` reports.
BOOTSTRAP, NORMAL = "bootstrap", "normal"

#: Upper bound on the number of resample indices held in memory at once (int64 indices
#: plus the gathered float64 values: about 16 bytes each, so about 64 MiB). Resamples are
#: drawn in chunks of ``max(1, CHUNK_ELEMENTS // n)`` rows.
CHUNK_ELEMENTS: int = 1 << 22

Interval = tuple[float | None, float | None, float | None]


def bootstrap_mean_ci(
    values: Sequence[float] | np.ndarray,
    *,
    confidence: float = CONFIDENCE,
    n_resamples: int = N_RESAMPLES,
    seed: int = SEED,
) -> Interval:
    """Mean of ``values`` with a percentile bootstrap confidence interval.

    Draws ``n_resamples`` resamples of size ``n`` with replacement from ``values``, takes
    the mean of each, and returns the ``(1 - confidence) / 2`` and
    ``(1 + confidence) / 2`` quantiles of those means (numpy's default linear
    interpolation between order statistics). This is the percentile interval of Efron &
    Tibshirani (1993, ch. 13), the same definition as
    ``scipy.stats.bootstrap(..., method="percentile")``: with the same seed and all
    resamples in one batch, scipy draws the same index matrix.

    Parameters
    ----------
    values
        One-dimensional sequence of finite numbers (any real dtype; read as float64).
    confidence
        Two-sided coverage, strictly between 0 and 1.
    n_resamples
        Number of bootstrap resamples, at least 1.
    seed
        Seed of ``numpy.random.default_rng``.

    Returns
    -------
    tuple of (float | None, float | None, float | None)
        ``(mean, low, high)``. ``(None, None, None)`` when ``values`` is empty;
        ``(x, x, x)`` for a single value ``x``. For small skewed samples the percentile
        interval can exclude the sample mean; that is a property of the method.

    Raises
    ------
    ValueError
        If ``values`` is not one-dimensional or holds NaN or infinity, or if
        ``confidence`` or ``n_resamples`` is out of range.

    Notes
    -----
    Cost: ``n_resamples * n`` random integers and gathers, done in chunks of at most
    :data:`CHUNK_ELEMENTS` indices, so memory stays bounded for any ``n``.
    """
    _check_confidence(confidence)
    _check_n_resamples(n_resamples)
    x = _finite_vector(values, "values")
    if x.size == 0:
        return (None, None, None)
    means = _bootstrap_means(x, n_resamples, np.random.default_rng(seed))
    return _percentile_interval(float(x.mean()), means, confidence)


def mean_ci(
    values: Sequence[float] | np.ndarray,
    *,
    confidence: float = CONFIDENCE,
    n_resamples: int = N_RESAMPLES,
    seed: int = SEED,
    max_resample_n: int = BOOTSTRAP_MAX_N,
    max_distinct: int = MAX_DISTINCT,
) -> tuple[float | None, float | None, float | None, str | None]:
    """Mean with a percentile bootstrap interval whose cost stays bounded for large samples.

    Three cases, by the sample size ``n`` and the number ``k`` of distinct values, tried
    in this order:

    - ``k <= max_distinct < n``: the percentile bootstrap of :func:`bootstrap_mean_ci`,
      drawn as multinomial counts of the distinct values. A resample of ``n`` rows takes
      the rows Multinomial(n, 1/n, ..., 1/n) times each, so the ``f_j`` rows holding
      distinct value ``j`` are taken Multinomial(n, f/n) times in all: the bootstrap
      distribution of the mean is the same (the draws differ), at
      ``O(n_resamples * k)`` cost instead of ``O(n_resamples * n)``. Boolean scores and
      scores on a small grid (0-5 ratings, fractions with small denominators) take this
      path whatever their number.
    - ``n <= max_resample_n``: exactly :func:`bootstrap_mean_ci` (the same draws).
    - otherwise (more than ``max_resample_n`` values, more than ``max_distinct`` of them
      distinct): the normal approximation of the bootstrap distribution,
      ``mean ± z * s / sqrt(n)`` with ``s`` the standard deviation with divisor ``n``
      (the exact standard deviation of the bootstrap distribution of the mean) and ``z``
      the ``(1 + confidence) / 2`` normal quantile. By the Cornish-Fisher expansion of
      the bootstrap distribution (Hall 1992, "The Bootstrap and Edgeworth Expansion",
      ch. 3) the percentile interval's ends differ from these by about
      ``s * g * (z² - 1) / (6 n)``, ``g`` the sample skewness: at ``n`` = 5,000 and
      ``z`` = 1.96 that is 0.007 ``g`` standard errors, while the Monte Carlo error of a
      2.5 % quantile of 2000 resamples is about 0.06 standard errors.

    Cost: at most ``n_resamples * max(max_resample_n, max_distinct)`` random draws per
    call (about 0.15 s with the defaults), plus sorting ``values`` once.

    Parameters
    ----------
    values
        One-dimensional sequence of finite numbers. The bootstrap draws depend on their
        order; sort them first for a result that does not depend on row order.
    confidence, n_resamples, seed
        As in :func:`bootstrap_mean_ci`.
    max_resample_n, max_distinct
        The thresholds above (positive integers).

    Returns
    -------
    tuple
        ``(mean, low, high, method)`` with ``method`` :data:`BOOTSTRAP` or
        :data:`NORMAL`; ``(None, None, None, None)`` for an empty sample.

    Raises
    ------
    ValueError
        As :func:`bootstrap_mean_ci`.
    """
    _check_confidence(confidence)
    _check_n_resamples(n_resamples)
    stream = MeanCIStream(max_resample_n=max_resample_n, max_distinct=max_distinct)
    stream.add(_finite_vector(values, "values"))
    return stream.result(confidence=confidence, n_resamples=n_resamples, seed=seed)


class MeanCIStream:
    """:func:`mean_ci` over values that arrive in chunks, in memory bounded by the
    thresholds instead of the sample size.

    Keeps the count, the mean and the sum of squared deviations (combined across chunks
    as in Chan, Golub & LeVeque 1979, "Updating formulae and a pairwise algorithm for
    computing sample variances"), the distinct values with their counts while there are
    at most ``max_distinct`` of them, and the values themselves while there are at most
    ``max_resample_n``. For one chunk, :meth:`result` equals ``mean_ci`` of that chunk;
    for several, it equals ``mean_ci`` of their concatenation up to rounding in the mean
    and standard deviation (the bootstrap draws are the same).

    Parameters
    ----------
    max_resample_n, max_distinct
        As in :func:`mean_ci`.
    """

    def __init__(
        self, *, max_resample_n: int = BOOTSTRAP_MAX_N, max_distinct: int = MAX_DISTINCT
    ) -> None:
        self.max_resample_n = max_resample_n
        self.max_distinct = max_distinct
        self.n = 0
        self.mean = 0.0
        self.m2 = 0.0
        self._counts: dict[float, int] | None = {}
        self._values: list[np.ndarray] | None = []

    def add(self, chunk: np.ndarray) -> None:
        """Add a one-dimensional float64 array of finite values (the caller checks
        finiteness; :func:`mean_ci` does)."""
        k = int(chunk.size)
        if k == 0:
            return
        chunk_mean = float(chunk.mean())
        self._add_moments(k, chunk_mean, float(((chunk - chunk_mean) ** 2).sum()))
        if self._counts is not None:
            self._add_distinct(*np.unique(chunk, return_counts=True))
        if self._values is not None:
            self._values = self._values + [chunk] if self.n <= self.max_resample_n else None

    def add_counts(self, values: np.ndarray, counts: np.ndarray) -> None:
        """Add ``counts[i]`` copies of each ``values[i]``: the same as :meth:`add` of
        ``numpy.repeat(values, counts)``, up to rounding in the mean and the sum of squared
        deviations, without building that array.

        ``values`` is a one-dimensional float64 array of finite, distinct values in
        ascending order; ``counts`` the positive integer count of each.
        """
        k = int(counts.sum())
        if k == 0:
            return
        weights: np.ndarray = counts.astype(np.float64)
        chunk_mean = float(weights @ values) / k
        self._add_moments(k, chunk_mean, float(weights @ ((values - chunk_mean) ** 2)))
        if self._counts is not None:
            self._add_distinct(values, counts)
        if self._values is not None:
            keep = self.n <= self.max_resample_n
            self._values = self._values + [np.repeat(values, counts)] if keep else None

    def _add_moments(self, k: int, chunk_mean: float, chunk_m2: float) -> None:
        """Combine a chunk's count, mean and sum of squared deviations into the stream's
        (Chan, Golub & LeVeque 1979)."""
        total = self.n + k
        if self.n == 0:
            self.mean, self.m2 = chunk_mean, chunk_m2
        else:
            delta = chunk_mean - self.mean
            self.mean += delta * k / total
            self.m2 += chunk_m2 + delta * delta * self.n * k / total
        self.n = total

    def _add_distinct(self, values: np.ndarray, counts: np.ndarray) -> None:
        """Add a chunk's distinct values and their counts, or stop counting them once
        there are more than ``max_distinct``."""
        if self._counts is None or values.size > self.max_distinct:
            self._counts = None
            return
        for value, count in zip(values.tolist(), counts.tolist()):
            self._counts[value] = self._counts.get(value, 0) + int(count)
        if len(self._counts) > self.max_distinct:
            self._counts = None

    def result(
        self, *, confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES, seed: int = SEED
    ) -> tuple[float | None, float | None, float | None, str | None]:
        """``(mean, low, high, method)`` as :func:`mean_ci` returns them."""
        n, mean = self.n, self.mean
        if n == 0:
            return (None, None, None, None)
        if self._counts is not None and len(self._counts) <= self.max_distinct < n:
            distinct = np.array(sorted(self._counts), dtype=np.float64)
            counts = np.array([self._counts[v] for v in distinct], dtype=np.float64)
            draws = np.random.default_rng(seed).multinomial(n, counts / n, size=n_resamples)
            return (*_percentile_interval(mean, draws @ distinct / n, confidence), BOOTSTRAP)
        if n <= self.max_resample_n:
            x = np.concatenate(self._values)
            means = _bootstrap_means(x, n_resamples, np.random.default_rng(seed))
            return (*_percentile_interval(mean, means, confidence), BOOTSTRAP)
        z = NormalDist().inv_cdf((1.0 + confidence) / 2.0)
        half = z * math.sqrt(self.m2 / n) / math.sqrt(n)
        return (mean, mean - half, mean + half, NORMAL)


def paired_bootstrap_diff_ci(
    baseline: Sequence[float] | np.ndarray,
    candidate: Sequence[float] | np.ndarray,
    *,
    confidence: float = CONFIDENCE,
    n_resamples: int = N_RESAMPLES,
    seed: int = SEED,
) -> Interval:
    """Mean paired difference ``candidate - baseline`` with a percentile bootstrap interval.

    ``baseline[i]`` and ``candidate[i]`` must be the two measurements of the same unit
    (the same input row scored by two runs or two models). The pairs are resampled
    together, which is the paired bootstrap of Efron & Tibshirani (1993, ch. 16):
    equivalent to :func:`bootstrap_mean_ci` on the differences, and it is computed that
    way, with the same seed and conventions.

    Parameters
    ----------
    baseline, candidate
        One-dimensional sequences of finite numbers of the same length.
    confidence, n_resamples, seed
        As in :func:`bootstrap_mean_ci`.

    Returns
    -------
    tuple of (float | None, float | None, float | None)
        ``(mean_diff, low, high)``; positive values mean the candidate scores higher.
        ``(None, None, None)`` when there are no pairs.

    Raises
    ------
    ValueError
        If the lengths differ, a value is NaN or infinite, or a parameter is out of range.
    """
    a = _finite_vector(baseline, "baseline")
    b = _finite_vector(candidate, "candidate")
    if a.shape != b.shape:
        raise ValueError(
            f"baseline has {a.size} values and candidate has {b.size}: a paired interval "
            "needs one candidate value per baseline value, aligned by row"
        )
    return bootstrap_mean_ci(b - a, confidence=confidence, n_resamples=n_resamples, seed=seed)


def wilson_interval(successes: int, n: int, confidence: float = CONFIDENCE) -> Interval:
    """Observed proportion ``successes / n`` with the Wilson score interval.

    The interval is the set of proportions ``p`` whose score test does not reject at level
    ``1 - confidence`` (Wilson 1927): with ``z`` the ``(1 + confidence) / 2`` quantile of
    the standard normal and ``r = successes / n``,

    ``(r + z²/(2n) ± z·sqrt(r(1-r)/n + z²/(4n²))) / (1 + z²/n)``.

    Unlike the normal (Wald) interval it stays inside [0, 1] and has non-zero width at
    ``r = 0`` and ``r = 1``. It is what
    ``scipy.stats.binomtest(k, n).proportion_ci(method="wilson")`` computes.

    Parameters
    ----------
    successes
        Number of successes, an integer in ``[0, n]``.
    n
        Number of trials, an integer ``>= 0``.
    confidence
        Two-sided coverage, strictly between 0 and 1.

    Returns
    -------
    tuple of (float | None, float | None, float | None)
        ``(rate, low, high)`` with ``rate = successes / n`` (the observed proportion, not
        the interval's centre) and ``0 <= low <= rate <= high <= 1``.
        ``(None, None, None)`` when ``n == 0``.

    Raises
    ------
    ValueError
        If ``successes`` or ``n`` is not an integer, ``n < 0``, ``successes`` is outside
        ``[0, n]``, or ``confidence`` is out of range.
    """
    _check_confidence(confidence)
    for name, value in (("successes", successes), ("n", n)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{name} must be an integer count, got {value!r}")
    successes, n = int(successes), int(n)
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return (None, None, None)
    z = NormalDist().inv_cdf((1.0 + confidence) / 2.0)
    rate = successes / n
    z2n = z * z / n
    centre = (rate + z2n / 2.0) / (1.0 + z2n)
    half = z / (1.0 + z2n) * math.sqrt(rate * (1.0 - rate) / n + z2n / (4.0 * n))
    low = min(max(centre - half, 0.0), rate)
    high = max(min(centre + half, 1.0), rate)
    return (rate, low, high)


def _bootstrap_means(x: np.ndarray, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Means of ``n_resamples`` resamples of ``x`` (float64 array of length n_resamples)."""
    n = x.size
    rows = max(1, CHUNK_ELEMENTS // n)
    means: np.ndarray = np.empty(n_resamples, dtype=np.float64)
    for start in range(0, n_resamples, rows):
        stop = min(n_resamples, start + rows)
        index = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = x[index].mean(axis=1)
    return means


def _percentile_interval(estimate: float, draws: np.ndarray, confidence: float) -> Interval:
    """``(estimate, low, high)`` from the tail quantiles of a bootstrap distribution."""
    tail = (1.0 - confidence) / 2.0
    # two quantiles asked for: an array of two (numpy's stubs say a scalar)
    low, high = cast(np.ndarray, np.quantile(draws, [tail, 1.0 - tail]))
    return (estimate, float(low), float(high))


def _finite_vector(values: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    """``values`` as a 1-D float64 array; raises ValueError on other shapes or non-finite values."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {x.shape}")
    bad = ~np.isfinite(x)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{name}[{first}] is {x[first]}: intervals need finite numbers; drop null or "
            "NaN values (rows whose status is not ok) before estimating"
        )
    return x


def _check_confidence(confidence: float) -> None:
    if not (isinstance(confidence, (float, int)) and 0.0 < confidence < 1.0):
        raise ValueError(
            f"confidence must be a number strictly between 0 and 1 (e.g. 0.95), got {confidence!r}"
        )


def _check_n_resamples(n_resamples: int) -> None:
    if (
        isinstance(n_resamples, bool)
        or not isinstance(n_resamples, (int, np.integer))
        or n_resamples < 1
    ):
        raise ValueError(f"n_resamples must be a positive integer, got {n_resamples!r}")
