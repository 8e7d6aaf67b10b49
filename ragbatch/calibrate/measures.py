"""Agreement measures between a judge's scores and human labels, with bootstrap intervals.

Every measure takes two float64 vectors of equal length (``judge``, ``human``) and
returns a :class:`Measure`: the value, a percentile-bootstrap interval over resampled
rows (or pairs), and, when the value is undefined, ``None`` with a reason (never NaN).

- binary labels (0/1) against the judge's verdict ``judge >= threshold``: accuracy,
  precision, recall, F1 and Cohen's kappa (Cohen 1960), with the positive class 1;
- binary labels against the judge's continuous score: ROC AUC (the Mann-Whitney
  statistic: the chance that a random positive outscores a random negative, ties half);
- binary labels against the judge's probability of 1 (a metric with ``score:
  probability``, :mod:`ragbatch.judge.confidence`): the Brier score, the mean of
  ``(p - label)^2``, and the expected calibration error (:func:`ece`) over
  :data:`ECE_BINS` equal-width bins; for hard verdicts both are undefined, with a reason;
- graded labels: Spearman's rho and Kendall's tau-b (``scipy.stats``);
- pairs (a label-1 and a label-0 answer to one question): the share of pairs whose
  label-1 member the judge scores higher, ties counted half (:func:`pairwise_agreement`).

Intervals: rows are resampled with replacement ``resamples`` times from
``numpy.random.default_rng(seed)``; the interval is the ``(1 - confidence) / 2`` and
``(1 + confidence) / 2`` quantiles of the resampled values for which the measure is
defined (a resample with one class has no kappa). When fewer than half of the resamples
give a defined value the interval is null, with a reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, cast

import numpy as np
from scipy import stats

from ragbatch.analysis.intervals import _check_confidence, _check_n_resamples

#: Measures for binary labels, in the order tables list them.
BINARY_MEASURES = ("accuracy", "precision", "recall", "f1", "kappa", "roc_auc", "brier", "ece")
#: Equal-width bins of [0, 1] for the expected calibration error and the reliability
#: diagram.
ECE_BINS = 10
#: Why Brier and ECE are undefined for a metric scored by its hard verdicts.
NOT_PROBABILITIES = "the judge's scores are hard verdicts; set `score: probability` on the metric"
#: Measures for graded labels.
GRADED_MEASURES = ("spearman", "kendall")
#: Rows drawn per bootstrap chunk (bounds memory: chunk rows x n indices).
CHUNK_ELEMENTS = 4_000_000


@dataclass(frozen=True)
class Measure:
    """One agreement measure.

    Attributes
    ----------
    name : str
        ``accuracy``, ``precision``, ``recall``, ``f1``, ``kappa``, ``roc_auc``,
        ``spearman``, ``kendall`` or ``pairwise_agreement``.
    n : int
        Rows (or pairs) the value is computed on.
    value, ci_low, ci_high : float or None
        The estimate and its bootstrap interval; ``None`` when undefined.
    reason : str or None
        Why ``value`` (or the interval) is ``None``; else ``None``.
    """

    name: str
    n: int
    value: float | None
    ci_low: float | None
    ci_high: float | None
    reason: str | None = None


@dataclass(frozen=True)
class Bootstrap:
    """Resampling settings: ``resamples`` >= 1, ``seed``, ``confidence`` in (0, 1)."""

    resamples: int = 1000
    seed: int = 0
    confidence: float = 0.95

    def __post_init__(self) -> None:
        _check_n_resamples(self.resamples)
        _check_confidence(self.confidence)


# ------------------------------------------------------------------ point values
# Each returns (value or None, reason or None) for one sample.


def _counts(verdict: np.ndarray, human: np.ndarray) -> tuple[int, int, int, int]:
    """``(tn, fp, fn, tp)`` of 0/1 vectors."""
    tp = int(np.sum((verdict == 1) & (human == 1)))
    fp = int(np.sum((verdict == 1) & (human == 0)))
    fn = int(np.sum((verdict == 0) & (human == 1)))
    tn = int(np.sum((verdict == 0) & (human == 0)))
    return tn, fp, fn, tp


def _ratio(num: float, den: float, why: str) -> tuple[float | None, str | None]:
    return (num / den, None) if den > 0 else (None, why)


def accuracy(verdict: np.ndarray, human: np.ndarray) -> tuple[float | None, str | None]:
    """Share of rows where the 0/1 ``verdict`` equals the 0/1 ``human`` label."""
    return _ratio(float(np.sum(verdict == human)), human.size, "no rows")


def precision(verdict: np.ndarray, human: np.ndarray) -> tuple[float | None, str | None]:
    """tp / (tp + fp): undefined when the judge never says 1."""
    tn, fp, fn, tp = _counts(verdict, human)
    return _ratio(tp, tp + fp, "the judge never said 1 (no predicted positives)")


def recall(verdict: np.ndarray, human: np.ndarray) -> tuple[float | None, str | None]:
    """tp / (tp + fn): undefined when no human label is 1."""
    tn, fp, fn, tp = _counts(verdict, human)
    return _ratio(tp, tp + fn, "no human label is 1 (no positives)")


def f1(verdict: np.ndarray, human: np.ndarray) -> tuple[float | None, str | None]:
    """2 tp / (2 tp + fp + fn): undefined when neither judge nor humans say 1."""
    tn, fp, fn, tp = _counts(verdict, human)
    return _ratio(2 * tp, 2 * tp + fp + fn, "neither the judge nor the humans said 1")


def kappa(verdict: np.ndarray, human: np.ndarray) -> tuple[float | None, str | None]:
    """Cohen's kappa ``(p_o - p_e) / (1 - p_e)``; undefined when ``p_e`` is 1 (judge and
    humans each gave one and the same class to every row)."""
    n = human.size
    if n == 0:
        return None, "no rows"
    tn, fp, fn, tp = _counts(verdict, human)
    p_o = (tp + tn) / n
    p_e = ((tp + fp) * (tp + fn) + (tn + fn) * (tn + fp)) / (n * n)
    if p_e >= 1.0:
        return None, "judge and humans each used one class only (chance agreement is 1)"
    return (p_o - p_e) / (1.0 - p_e), None


def roc_auc(score: np.ndarray, human: np.ndarray) -> tuple[float | None, str | None]:
    """Area under the ROC curve of the continuous ``score`` for the 0/1 ``human`` label
    (ties count half); undefined when the labels hold one class only."""
    pos = int(np.sum(human == 1))
    neg = human.size - pos
    if pos == 0 or neg == 0:
        return None, "the human labels hold one class only"
    ranks = stats.rankdata(score)
    u = float(np.sum(ranks[human == 1])) - pos * (pos + 1) / 2.0
    return u / (pos * neg), None


def brier(p: np.ndarray, human: np.ndarray) -> tuple[float | None, str | None]:
    """Brier score: the mean of ``(p - human)^2`` (0 is perfect; lower is better)."""
    if human.size == 0:
        return None, "no rows"
    return float(np.mean((p - human) ** 2)), None


def _bin_index(p: np.ndarray, bins: int) -> np.ndarray:
    """Bin of each probability: bin ``b`` holds ``b/bins < p <= (b+1)/bins``, the first
    also ``p = 0`` (scikit-learn's ``calibration_curve`` with uniform bins bins alike)."""
    # p is an array, so the result is one (numpy's stubs say a scalar)
    return cast(np.ndarray, np.searchsorted(np.linspace(0.0, 1.0, bins + 1)[1:-1], p, side="left"))


def ece(p: np.ndarray, human: np.ndarray, bins: int = ECE_BINS) -> tuple[float | None, str | None]:
    """Expected calibration error of probabilities ``p`` of label 1.

    The rows are put in ``bins`` equal-width bins of ``p`` (bin ``b`` holds
    ``b/bins < p <= (b+1)/bins``, the first also ``p = 0``); ECE is the sum over non-empty
    bins of ``n_b / n * |mean(human in b) - mean(p in b)|``: 0 for a judge whose stated
    probabilities match how often it is right.
    """
    if human.size == 0:
        return None, "no rows"
    index = _bin_index(p, bins)
    total = 0.0
    for b in np.unique(index):
        inside = index == b
        total += (
            inside.sum() / human.size * abs(float(human[inside].mean()) - float(p[inside].mean()))
        )
    return float(total), None


def reliability_bins(
    p: np.ndarray, human: np.ndarray, bins: int = ECE_BINS
) -> list[dict[str, float]]:
    """The reliability diagram's points: per non-empty bin of :func:`ece`, ``bin_low``,
    ``bin_high``, ``n``, ``mean_p`` (mean probability) and ``observed`` (share of
    label 1).

    Parameters
    ----------
    p, human : numpy.ndarray of float64, shape (n,)
        Probabilities of label 1 in [0, 1], and 0/1 labels.
    bins : int
    """
    p, human = _pair_vectors(p, human)
    index = _bin_index(p, bins)
    return [
        {
            "bin_low": b / bins,
            "bin_high": (b + 1) / bins,
            "n": int((index == b).sum()),
            "mean_p": float(p[index == b].mean()),
            "observed": float(human[index == b].mean()),
        }
        for b in np.unique(index)
    ]


def _constant(x: np.ndarray) -> bool:
    return x.size == 0 or bool(np.all(x == x[0]))


def _rank_problem(score: np.ndarray, human: np.ndarray) -> str | None:
    """Why a rank correlation of ``score`` and ``human`` is undefined, or None."""
    if score.size < 2:
        return "fewer than 2 rows"
    if _constant(score):
        return "the judge gave every row the same score"
    if _constant(human):
        return "every human label is the same"
    return None


def spearman(score: np.ndarray, human: np.ndarray) -> tuple[float | None, str | None]:
    """Spearman's rank correlation; undefined for fewer than 2 rows or a constant side."""
    problem = _rank_problem(score, human)
    if problem:
        return None, problem
    return float(stats.spearmanr(score, human).statistic), None


def kendall(score: np.ndarray, human: np.ndarray) -> tuple[float | None, str | None]:
    """Kendall's tau-b; undefined for fewer than 2 rows or a constant side."""
    problem = _rank_problem(score, human)
    if problem:
        return None, problem
    return float(stats.kendalltau(score, human, variant="b").statistic), None


def pairwise_value(better: np.ndarray, worse: np.ndarray) -> tuple[float | None, str | None]:
    """Share of pairs with ``better > worse`` (ties count half)."""
    if better.size == 0:
        return None, "no pair has both answers scored ok"
    wins = np.sum(better > worse) + 0.5 * np.sum(better == worse)
    return float(wins / better.size), None


# ------------------------------------------------------------------ with intervals


def _with_interval(
    name: str,
    fn: Callable[[np.ndarray, np.ndarray], tuple[float | None, str | None]],
    a: np.ndarray,
    b: np.ndarray,
    boot: Bootstrap,
) -> Measure:
    """``fn(a, b)`` with its percentile-bootstrap interval over resampled positions."""
    n = a.size
    value, reason = fn(a, b) if n else (None, "no rows with both an ok score and a label")
    if value is None:
        return Measure(name, n, None, None, None, reason)
    rng = np.random.default_rng(boot.seed)
    draws = []
    rows = max(1, CHUNK_ELEMENTS // n)
    for start in range(0, boot.resamples, rows):
        index = rng.integers(0, n, size=(min(rows, boot.resamples - start), n))
        for idx in index:
            v, _ = fn(a[idx], b[idx])
            if v is not None:
                draws.append(v)
    if len(draws) * 2 < boot.resamples:
        return Measure(
            name,
            n,
            float(value),
            None,
            None,
            f"undefined in {boot.resamples - len(draws)} of {boot.resamples} resamples",
        )
    tail = (1.0 - boot.confidence) / 2.0
    # two quantiles asked for: an array of two (numpy's stubs say a scalar)
    low, high = cast(np.ndarray, np.quantile(np.asarray(draws), [tail, 1.0 - tail]))
    return Measure(name, n, float(value), float(low), float(high))


def binary_measures(
    score: np.ndarray,
    human: np.ndarray,
    threshold: float,
    boot: Bootstrap,
    probabilities: bool = False,
) -> list[Measure]:
    """Every binary-label measure with its interval.

    Parameters
    ----------
    score : numpy.ndarray of float64, shape (n,)
        The judge's scores (finite), in the metric's units.
    human : numpy.ndarray of float64, shape (n,)
        Human labels, each 0.0 or 1.0.
    threshold : float
        The judge's verdict is 1 when ``score >= threshold``.
    boot : Bootstrap
    probabilities : bool
        ``score`` is the judge's probability of 1, in [0, 1] (``score: probability``):
        Brier and ECE are computed; otherwise they are None with
        :data:`NOT_PROBABILITIES`.

    Returns
    -------
    list of Measure
        In the order of :data:`BINARY_MEASURES`.

    Raises
    ------
    ValueError
        The vectors differ in length, a label is not 0 or 1, or (``probabilities``) a
        score lies outside [0, 1].
    """
    score, human = _pair_vectors(score, human)
    if not np.isin(human, (0.0, 1.0)).all():
        raise ValueError(
            "binary measures need human labels of 0 or 1; map them with `values` "
            "or `threshold` in the calibration config"
        )
    if probabilities and not ((score >= 0.0) & (score <= 1.0)).all():
        raise ValueError("probabilities must lie in [0, 1]")
    verdict = (score >= threshold).astype(np.float64)
    out = [
        _with_interval(name, fn, verdict, human, boot)
        for name, fn in (
            ("accuracy", accuracy),
            ("precision", precision),
            ("recall", recall),
            ("f1", f1),
            ("kappa", kappa),
        )
    ]
    out.append(_with_interval("roc_auc", roc_auc, score, human, boot))
    for name, fn in (("brier", brier), ("ece", ece)):
        if probabilities:
            out.append(_with_interval(name, fn, score, human, boot))
        else:
            out.append(Measure(name, score.size, None, None, None, NOT_PROBABILITIES))
    return out


#: The value function of each binary measure and whether it reads the verdict
#: (``score >= threshold``) rather than the score itself.
BINARY_FUNCTIONS: dict[str, tuple[Callable[..., tuple[float | None, str | None]], bool]] = {
    "accuracy": (accuracy, True),
    "precision": (precision, True),
    "recall": (recall, True),
    "f1": (f1, True),
    "kappa": (kappa, True),
    "roc_auc": (roc_auc, False),
    "brier": (brier, False),
    "ece": (ece, False),
}


def paired_difference(
    name: str,
    before: np.ndarray,
    after: np.ndarray,
    human: np.ndarray,
    threshold: float,
    boot: Bootstrap,
) -> Measure:
    """The change of a binary measure from one judge's scores to another's on the same
    rows: ``m(after) - m(before)``, with a paired percentile-bootstrap interval (each
    resample draws rows, and both scores of a row go with it).

    Parameters
    ----------
    name : str
        One of :data:`BINARY_MEASURES`.
    before, after, human : numpy.ndarray of float64, shape (n,)
        Both judges' scores of the same rows, in the same order, and the 0/1 labels.
    threshold : float
        The verdict is 1 when a score is ``>= threshold``.
    boot : Bootstrap

    Returns
    -------
    Measure
        Named ``name``; ``value`` None (with the reason) when the measure is undefined
        for either side; an interval as :func:`binary_measures` gives one.

    Raises
    ------
    KeyError
        ``name`` is not a binary measure.
    ValueError
        The vectors differ in length or are not finite.
    """
    fn, verdicts = BINARY_FUNCTIONS[name]
    before, human = _pair_vectors(before, human)
    after, _ = _pair_vectors(after, human)
    if verdicts:
        before = (before >= threshold).astype(np.float64)
        after = (after >= threshold).astype(np.float64)

    def change(rows: np.ndarray, labels: np.ndarray) -> tuple[float | None, str | None]:
        idx: np.ndarray = rows.astype(np.int64)
        first, why_first = fn(before[idx], labels)
        second, why_second = fn(after[idx], labels)
        if first is None or second is None:
            return None, why_first or why_second
        return second - first, None

    return _with_interval(name, change, np.arange(human.size, dtype=np.float64), human, boot)


def graded_measures(score: np.ndarray, human: np.ndarray, boot: Bootstrap) -> list[Measure]:
    """Spearman and Kendall (tau-b) correlations with their intervals.

    Parameters
    ----------
    score, human : numpy.ndarray of float64, shape (n,)
        The judge's scores and the graded human labels (any ordered numbers).
    boot : Bootstrap

    Returns
    -------
    list of Measure
        In the order of :data:`GRADED_MEASURES`.
    """
    score, human = _pair_vectors(score, human)
    return [
        _with_interval("spearman", spearman, score, human, boot),
        _with_interval("kendall", kendall, score, human, boot),
    ]


def pairwise_agreement(better: np.ndarray, worse: np.ndarray, boot: Bootstrap) -> Measure:
    """Pairwise agreement (Es et al. 2023, RAGAS, section 5): the share of pairs in which
    the judge scores the answer humans prefer higher than the other; ties count half.

    Parameters
    ----------
    better, worse : numpy.ndarray of float64, shape (n_pairs,)
        The judge's score of the preferred (label 1) and the other (label 0) answer of
        each pair; pairs resample together.
    boot : Bootstrap
    """
    better, worse = _pair_vectors(better, worse)
    return _with_interval("pairwise_agreement", pairwise_value, better, worse, boot)


def confusion(score: np.ndarray, human: np.ndarray, threshold: float) -> dict[str, int]:
    """``{"tn", "fp", "fn", "tp"}`` counts of the verdict ``score >= threshold`` against
    0/1 human labels."""
    score, human = _pair_vectors(score, human)
    tn, fp, fn, tp = _counts((score >= threshold).astype(np.float64), human)
    return {"tn": tn, "fp": fp, "fn": fn, "tp": tp}


def _pair_vectors(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(
            f"score and label vectors must be 1-D of equal length, got {a.shape} and {b.shape}"
        )
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError(
            "scores and labels must be finite; drop rows that are not ok or unlabelled"
        )
    return a, b
