"""Inter-judge agreement of a judge panel (docs/panels.md, "Agreement").

For each panel metric, over its members' ``ok`` cells (the rows are the units, the
judges the coders):

- Krippendorff's alpha, nominal for a metric scored 0/1 and interval otherwise, from the
  coincidence matrix as Krippendorff (2011), "Computing Krippendorff's
  Alpha-Reliability", defines it: ``alpha = 1 - (n - 1) * sum_ck o_ck d2_ck /
  sum_ck n_c n_k d2_ck`` over the pairable values (units with two or more values), with
  ``d2 = [c != k]`` (nominal) or ``(c - k)^2`` (interval). It is computed from each
  unit's sufficient statistics (:func:`unit_statistics`), so memory and time grow with
  the rows, not with the number of distinct scores; ``tests/test_panel_agreement.py``
  checks it against the ``krippendorff`` package and a hand-worked example;
- a percentile bootstrap interval of alpha over units (resampled with replacement,
  seeded; units with the same statistics are pooled and drawn with multinomial weights);
- per pair of judges, over the rows both scored: the share of equal scores (0/1
  metrics) or the mean absolute difference (continuous), with the row count;
- per judge, the mean of its ``ok`` scores and their count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import numpy as np

#: Most bootstrap weight vectors drawn at once (resamples x distinct unit patterns).
_DRAW_CELLS = 4_000_000


@dataclass
class PanelAgreement:
    """The agreement of one panel's judges (JSON-ready through :meth:`to_dict`)."""

    metric: str
    judges: list[str]
    level: str
    n_units: int
    alpha: float | None
    alpha_ci_low: float | None
    alpha_ci_high: float | None
    pairwise: list[dict[str, Any]] = field(default_factory=list)
    judge_means: dict[str, dict[str, Any]] = field(default_factory=dict)
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "judges": list(self.judges),
            "alpha_level": self.level,
            "n_units": self.n_units,
            "alpha": self.alpha,
            "alpha_ci_low": self.alpha_ci_low,
            "alpha_ci_high": self.alpha_ci_high,
            "pairwise": list(self.pairwise),
            "judge_means": dict(self.judge_means),
            "note": self.note,
        }


def unit_statistics(matrix: np.ndarray, level: str) -> np.ndarray:
    """Per unit (row of ``matrix``), what alpha needs of it.

    Parameters
    ----------
    matrix : ndarray of float64, shape (units, judges)
        Scores, NaN where a judge gave none.
    level : {"nominal", "interval"}

    Returns
    -------
    ndarray of float64, shape (pairable units, k)
        Only units with two or more values. Columns: ``m`` (values), the observed
        disagreement ``sum_{i != j} d2(x_i, x_j) / (m - 1)``, then for ``interval``
        ``sum x`` and ``sum x^2``, for ``nominal`` the count of each distinct value of
        the whole matrix (sorted).
    """
    present = ~np.isnan(matrix)
    m = present.sum(axis=1)
    keep = m >= 2
    x, present, m = matrix[keep], present[keep], m[keep].astype(float)
    filled = np.where(present, x, 0.0)
    if level == "interval":
        s1 = filled.sum(axis=1)
        s2 = (filled**2).sum(axis=1)
        # sum over ordered pairs i != j of (x_i - x_j)^2 = 2 (m s2 - s1^2)
        observed = 2.0 * (m * s2 - s1**2) / (m - 1.0)
        return np.column_stack([m, observed, s1, s2])
    values = np.unique(matrix[~np.isnan(matrix)])
    counts = np.column_stack([((x == v) & present).sum(axis=1) for v in values]).astype(float)
    observed = (m**2 - (counts**2).sum(axis=1)) / (m - 1.0)
    return np.column_stack([m, observed, counts])


def alpha_from_statistics(stats: np.ndarray, weights: np.ndarray, level: str) -> np.ndarray:
    """Krippendorff's alpha of units pooled with ``weights``.

    Parameters
    ----------
    stats : ndarray, shape (patterns, k)
        :func:`unit_statistics` rows.
    weights : ndarray, shape (patterns,) or (draws, patterns)
        How many times each row counts.

    Returns
    -------
    ndarray of float64, shape () or (draws,)
        Alpha; NaN where the expected disagreement is 0 (every value the same) or fewer
        than two pairable values.
    """
    w = np.atleast_2d(weights).astype(float)
    n = w @ stats[:, 0]
    observed = w @ stats[:, 1]
    if level == "interval":
        s1, s2 = w @ stats[:, 2], w @ stats[:, 3]
        expected = 2.0 * (n * s2 - s1**2)
    else:
        nc = w @ stats[:, 2:]
        expected = n**2 - (nc**2).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        alpha = np.where((expected > 0) & (n > 1), 1.0 - (n - 1.0) * observed / expected, np.nan)
    return alpha if np.ndim(weights) == 2 else alpha[0]


def krippendorff_alpha(matrix: np.ndarray, level: str) -> float | None:
    """Alpha of ``matrix`` (units x judges, NaN: no value); None when undefined."""
    stats = unit_statistics(matrix, level)
    if not len(stats):
        return None
    value = float(alpha_from_statistics(stats, np.ones(len(stats)), level))
    return None if np.isnan(value) else value


def alpha_interval(
    matrix: np.ndarray, level: str, confidence: float, n_resamples: int, seed: int
) -> tuple[float | None, float | None]:
    """Percentile bootstrap interval of alpha over the pairable units (resampled with
    replacement; identical units pooled and drawn with multinomial weights, which is the
    same distribution). (None, None) when alpha is undefined or fewer than 2 units."""
    stats = unit_statistics(matrix, level)
    if len(stats) < 2:
        return None, None
    patterns, counts = np.unique(stats, axis=0, return_counts=True)
    rng = np.random.default_rng(seed)
    p = counts / counts.sum()
    draws: list[np.ndarray] = []
    step = max(1, _DRAW_CELLS // len(patterns))
    for start in range(0, n_resamples, step):
        size = min(step, n_resamples - start)
        weights = rng.multinomial(int(counts.sum()), p, size=size)
        draws.append(alpha_from_statistics(patterns, weights, level))
    values = np.concatenate(draws)
    values = values[~np.isnan(values)]
    if not len(values):
        return None, None
    tail = (1.0 - confidence) / 2.0 * 100.0
    bounds = np.asarray(np.percentile(values, [tail, 100.0 - tail]), dtype=float)
    return float(bounds[0]), float(bounds[1])


def panel_agreement(
    metric: str,
    judges: list[str],
    matrix: np.ndarray,
    boolean: bool,
    confidence: float,
    n_resamples: int,
    seed: int,
) -> PanelAgreement:
    """The agreement of one panel from its score matrix.

    Parameters
    ----------
    metric : str
        The panel's metric id.
    judges : list of str
        The judges, in the matrix's column order.
    matrix : ndarray of float64, shape (rows, judges)
        Each row's ``ok`` score per judge, NaN where the judge's cell is not ``ok``.
    boolean : bool
        Scores are 0/1: nominal alpha and percent agreement; else interval alpha and mean
        absolute difference.
    confidence, n_resamples, seed
        Of the bootstrap interval of alpha.
    """
    level = "nominal" if boolean else "interval"
    alpha = krippendorff_alpha(matrix, level)
    low, high = alpha_interval(matrix, level, confidence, n_resamples, seed)
    n_units = int(((~np.isnan(matrix)).sum(axis=1) >= 2).sum()) if matrix.size else 0
    pairwise = []
    for (i, a), (j, b) in combinations(enumerate(judges), 2):
        both = ~np.isnan(matrix[:, i]) & ~np.isnan(matrix[:, j])
        x, y = matrix[both, i], matrix[both, j]
        entry: dict[str, Any] = {"judges": [a, b], "n": int(both.sum())}
        if boolean:
            entry["agreement"] = float(np.mean(x == y)) if len(x) else None
        else:
            entry["mean_abs_diff"] = float(np.mean(np.abs(x - y))) if len(x) else None
        pairwise.append(entry)
    means = {}
    for i, judge in enumerate(judges):
        scored = matrix[~np.isnan(matrix[:, i]), i]
        means[judge] = {"mean": float(scored.mean()) if len(scored) else None, "n_ok": len(scored)}
    note = None
    if alpha is None:
        note = (
            "alpha is undefined: fewer than two rows scored by two judges, or every score "
            "the same (no disagreement can be expected)"
        )
    return PanelAgreement(
        metric, list(judges), level, n_units, alpha, low, high, pairwise, means, note
    )
