"""Means corrected by human labels: prediction-powered inference (PPI and PPI++).

A metric scores every row of a run; humans labelled some of them. The judge's mean over
all rows is precise but biased by the judge's errors; the labels' mean is unbiased but,
over few labels, imprecise. Prediction-powered inference (Angelopoulos, Bates, Fannjiang,
Jordan & Zrnic 2023, "Prediction-powered inference", Science 382) combines the two: the
judge's mean over the unlabelled rows, corrected by the judge's mean error on the
labelled rows (the *rectifier*). ARES (Saad-Falcon et al. 2023) uses it to score RAG
systems from a few hundred labels.

With ``N`` unlabelled rows of judge scores ``f~``, ``n`` labelled rows of judge scores
``f`` and labels ``y``, and a weight ``lambda``::

    theta = lambda * mean(f~) + mean(y - lambda * f)
    se^2  = lambda^2 * var(f~) / N + var(y - lambda * f) / n
    interval: theta +- z * se,  z the normal quantile of (1 + confidence) / 2

(sample variances, ``ddof=1``). ``lambda = 1`` is the estimator of the PPI paper.
PPI++ (Angelopoulos, Duchi & Zrnic 2023, "PPI++: Efficient prediction-powered
inference", arXiv:2311.01453) picks the ``lambda`` that minimises ``se^2`` as estimated
from the data::

    lambda = (cov(f, y) / n) / (var(f~) / N + var(f) / n)

(with ``var(f~) = var(f)`` this is the paper's ``cov(f, y) / ((1 + n / N) var(f))``),
clipped to [0, 1]: ``lambda = 0`` is the labels-only mean, so an uninformative or
inverted judge costs little, and an informative one narrows the interval. Choosing
``lambda`` from the same data keeps the interval asymptotically valid (PPI++, Prop. 1).

Assumptions (docs/ppi.md says more):

- the labelled rows are a uniformly random sample of the rows scored (which rows got a
  label does not depend on their content or on the judge's score), so labelled and
  unlabelled rows come from the same distribution;
- the judge is fixed: the same model, prompt and params scored labelled and unlabelled
  rows (in one run this holds by construction);
- the interval is a central-limit interval: good for tens of labels or more, rough for
  fewer; with under 2 labelled rows there is none.

Every interval is clipped to the metric's score range (the mean lies in it, so clipping
loses no coverage); for a 0/1 metric that is [0, 1]. The estimate is clipped too.

All estimates are computed from moments (:class:`Moments`, :class:`PairMoments`), merged
chunk by chunk with the pairwise update of Chan, Golub & LeVeque (1979), so a summary
feeds them in batches in bounded memory; :func:`ppi_mean` is the same on arrays.
Only numpy and the standard library are used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

from ragbatch.analysis.intervals import CONFIDENCE

#: Estimator names: ``ppi`` (``lambda = 1``) and ``ppi++`` (``lambda`` tuned, clipped to [0, 1]).
ESTIMATORS: tuple[str, ...] = ("ppi", "ppi++")

#: Default estimator of run summaries.
DEFAULT_ESTIMATOR: str = "ppi++"


@dataclass
class Moments:
    """Count, mean and sum of squared deviations of one series, mergeable by chunks."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, x: np.ndarray) -> None:
        """Merge the float64 values ``x`` (shape ``(k,)``) into these moments."""
        k = int(x.size)
        if k == 0:
            return
        mean = float(x.mean())
        m2 = float(((x - mean) ** 2).sum())
        total = self.n + k
        delta = mean - self.mean
        self.m2 += m2 + delta * delta * self.n * k / total
        self.mean += delta * k / total
        self.n = total

    def var(self) -> float:
        """Sample variance (``ddof=1``); NaN for fewer than 2 values."""
        return self.m2 / (self.n - 1) if self.n > 1 else math.nan


@dataclass
class PairMoments:
    """Moments of paired series ``(f, y)``: both series' moments and their co-moment
    (sum of products of deviations), mergeable by chunks."""

    f: Moments = field(default_factory=Moments)
    y: Moments = field(default_factory=Moments)
    c: float = 0.0

    @property
    def n(self) -> int:
        """Number of pairs."""
        return self.f.n

    def add(self, f: np.ndarray, y: np.ndarray) -> None:
        """Merge pairs: ``f`` and ``y`` float64 arrays of the same shape ``(k,)``."""
        k = int(f.size)
        if k == 0:
            return
        mf, my = float(f.mean()), float(y.mean())
        c = float(((f - mf) * (y - my)).sum())
        n = self.n
        self.c += c + (mf - self.f.mean) * (my - self.y.mean) * n * k / (n + k)
        self.f.add(f)
        self.y.add(y)

    def cov(self) -> float:
        """Sample covariance (``ddof=1``); NaN for fewer than 2 pairs."""
        return self.c / (self.n - 1) if self.n > 1 else math.nan


@dataclass(frozen=True)
class PPIResult:
    """A corrected mean beside the labels-only mean.

    Attributes
    ----------
    n_labelled, n_unlabelled : int
        Rows with a judge score and a label; with a judge score only.
    labels_mean, labels_ci_low, labels_ci_high : float or None
        Mean of the labels and its central-limit interval.
    ppi_mean, ppi_ci_low, ppi_ci_high : float or None
        The prediction-powered estimate and its interval.
    ppi_lambda : float or None
        The weight of the judge (1: PPI; tuned: PPI++; 0: labels only).
    reason : str or None
        Why an estimate or interval is missing, or why ``lambda`` was forced; None when
        all are there.
    """

    n_labelled: int
    n_unlabelled: int
    labels_mean: float | None = None
    labels_ci_low: float | None = None
    labels_ci_high: float | None = None
    ppi_mean: float | None = None
    ppi_ci_low: float | None = None
    ppi_ci_high: float | None = None
    ppi_lambda: float | None = None
    reason: str | None = None


def ppi_from_moments(
    unlabelled: Moments,
    labelled: PairMoments,
    *,
    estimator: str = DEFAULT_ESTIMATOR,
    confidence: float = CONFIDENCE,
    bounds: tuple[float, float] | None = None,
) -> PPIResult:
    """The PPI (or PPI++) mean and the labels-only mean from moments.

    Parameters
    ----------
    unlabelled
        Moments of the judge scores of the unlabelled rows.
    labelled
        Moments of (judge score, label) over the labelled rows.
    estimator
        ``"ppi"`` (``lambda = 1``) or ``"ppi++"`` (``lambda`` minimising the estimated
        variance, clipped to [0, 1]).
    confidence
        Two-sided level of both intervals, in (0, 1).
    bounds
        ``(low, high)`` range of the metric: estimates and intervals are clipped to it.

    Returns
    -------
    PPIResult
        With no labelled row every estimate is None; with one, the estimates have no
        interval (``lambda = 1``); with under 2 unlabelled rows ``lambda = 0``: the
        estimate is the labels-only mean. ``reason`` says which case applies.

    Raises
    ------
    ValueError
        An unknown ``estimator`` or a ``confidence`` outside (0, 1).
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    n, big_n = labelled.n, unlabelled.n
    if n == 0:
        return PPIResult(0, big_n, reason="no labelled row has an ok score")
    clip = _clipper(bounds)
    if n < 2:
        theta = labelled.y.mean + (unlabelled.mean - labelled.f.mean if big_n else 0.0)
        return PPIResult(
            n,
            big_n,
            labels_mean=clip(labelled.y.mean),
            ppi_mean=clip(theta),
            ppi_lambda=1.0 if big_n else 0.0,
            reason="1 labelled row has an ok score; an interval needs at least 2",
        )
    z = NormalDist().inv_cdf((1 + confidence) / 2)
    var_f, var_y, cov = labelled.f.var(), labelled.y.var(), labelled.cov()
    y_half = z * math.sqrt(var_y / n)
    reason = None
    if big_n < 2:
        lam = 0.0
        reason = (
            f"{big_n} unlabelled row(s) with an ok score; under 2 the estimate is the "
            "labels-only mean"
        )
    elif estimator == "ppi":
        lam = 1.0
    else:
        lam = _tuned_lambda(cov, var_f, unlabelled.var(), n, big_n)
    var_u = unlabelled.var() if big_n > 1 else 0.0
    theta = (
        lam * unlabelled.mean + labelled.y.mean - lam * labelled.f.mean
        if big_n
        else labelled.y.mean
    )
    var_rect = max(var_y - 2 * lam * cov + lam * lam * var_f, 0.0)
    half = z * math.sqrt(lam * lam * var_u / max(big_n, 1) + var_rect / n)
    return PPIResult(
        n,
        big_n,
        labels_mean=clip(labelled.y.mean),
        labels_ci_low=clip(labelled.y.mean - y_half),
        labels_ci_high=clip(labelled.y.mean + y_half),
        ppi_mean=clip(theta),
        ppi_ci_low=clip(theta - half),
        ppi_ci_high=clip(theta + half),
        ppi_lambda=lam,
        reason=reason,
    )


def ppi_mean(
    judge_unlabelled: np.ndarray,
    judge_labelled: np.ndarray,
    labels: np.ndarray,
    *,
    estimator: str = DEFAULT_ESTIMATOR,
    confidence: float = CONFIDENCE,
    bounds: tuple[float, float] | None = None,
) -> PPIResult:
    """:func:`ppi_from_moments` on arrays.

    Parameters
    ----------
    judge_unlabelled
        Judge scores of the unlabelled rows, shape ``(N,)``.
    judge_labelled, labels
        Judge scores and human labels of the labelled rows, each shape ``(n,)``.
    estimator, confidence, bounds
        As :func:`ppi_from_moments`.

    Raises
    ------
    ValueError
        ``judge_labelled`` and ``labels`` differ in length, or a value is not finite.
    """
    u = _finite(judge_unlabelled, "judge_unlabelled")
    f, y = _finite(judge_labelled, "judge_labelled"), _finite(labels, "labels")
    if f.shape != y.shape:
        raise ValueError(f"judge_labelled has {f.size} values but labels has {y.size}")
    unlabelled, labelled = Moments(), PairMoments()
    unlabelled.add(u)
    labelled.add(f, y)
    return ppi_from_moments(
        unlabelled, labelled, estimator=estimator, confidence=confidence, bounds=bounds
    )


def _tuned_lambda(cov: float, var_f: float, var_u: float, n: int, big_n: int) -> float:
    """PPI++'s variance-minimising weight, clipped to [0, 1] (0 when the judge's scores
    do not vary: it then carries no information)."""
    denominator = var_u / big_n + var_f / n
    if not denominator > 0:
        return 0.0
    return min(max((cov / n) / denominator, 0.0), 1.0)


def _clipper(bounds: tuple[float, float] | None):
    if bounds is None:
        return float
    low, high = float(bounds[0]), float(bounds[1])
    return lambda x: float(min(max(x, low), high))


def _finite(values: np.ndarray, name: str) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    if not np.isfinite(x).all():
        raise ValueError(f"{name} holds NaN or infinite values")
    return x
