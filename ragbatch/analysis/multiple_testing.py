"""P-values of paired changes and false-discovery-rate control across the lines of a
comparison.

A comparison tests many lines at once (metrics x slice values). Flagging every line
whose 95 % interval excludes zero flags about 5 % of the lines that did not change, so
a comparison of dozens of lines almost always raises an alarm. Each line therefore gets
a p-value from a paired test of "no mean change", and the p-values of one comparison
are adjusted together with the Benjamini-Hochberg step-up procedure (Benjamini &
Hochberg 1995, "Controlling the false discovery rate", JRSS B 57), which keeps the
expected share of false alarms among the flagged lines at or below ``q``. When nothing
changed at all, that also bounds the chance that any line is flagged by ``q``.

The paired tests:

- ``mcnemar_exact`` when both runs' scores are all 0 or 1: McNemar's test in its exact
  form (McNemar 1947, Psychometrika 12), a two-sided binomial test with p = 1/2 on the
  discordant pairs (``0 -> 1`` against ``1 -> 0``);
- ``paired_t`` otherwise: Student's one-sample t-test of the paired differences
  ``candidate - baseline`` against zero (two-sided).

Both come from SciPy (``scipy.stats.binomtest``, ``scipy.stats.ttest_1samp``); the
adjustment is ``scipy.stats.false_discovery_control(method="bh")``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: Default false discovery rate of ``ragbatch compare`` (``--fdr``).
DEFAULT_FDR: float = 0.05

#: Name of the adjustment, as the JSON and the text say it.
FDR_METHOD = "benjamini-hochberg"

MCNEMAR, PAIRED_T = "mcnemar_exact", "paired_t"


def paired_test(baseline: np.ndarray, candidate: np.ndarray) -> tuple[float | None, str | None]:
    """Two-sided p-value of "the mean paired difference is zero", and the test's name.

    Parameters
    ----------
    baseline, candidate : numpy.ndarray
        float64 arrays of the same length: the scores of the pairs ``ok`` in both runs.

    Returns
    -------
    (float or None, str or None)
        The p-value in [0, 1] and :data:`MCNEMAR` or :data:`PAIRED_T`; ``(None, None)``
        for fewer than two pairs. Differences that are all zero give 1.0; differences
        that are all the same nonzero value give 0.0 (no spread: the t statistic is
        infinite).
    """
    from scipy import stats

    n = baseline.size
    if n < 2:
        return None, None
    diff = candidate - baseline
    if np.isin(baseline, (0.0, 1.0)).all() and np.isin(candidate, (0.0, 1.0)).all():
        up, down = int((diff > 0).sum()), int((diff < 0).sum())
        if up + down == 0:
            return 1.0, MCNEMAR
        return float(stats.binomtest(up, up + down, 0.5).pvalue), MCNEMAR
    if np.ptp(diff) == 0.0:
        return (1.0 if diff[0] == 0.0 else 0.0), PAIRED_T
    return float(stats.ttest_1samp(diff, 0.0).pvalue), PAIRED_T


def bh_adjust(p_values: Sequence[float | None]) -> list[float | None]:
    """Benjamini-Hochberg adjusted p-values of one family of tests.

    Parameters
    ----------
    p_values : sequence of float or None
        One p-value in [0, 1] per line; None for a line without a test (it is left out
        of the family and stays None).

    Returns
    -------
    list of float or None
        Same length and order: the smallest ``q`` at which each line would be flagged
        (``min over j >= rank of p_(j) * m / j``, capped at 1), with ``m`` the number of
        lines that have a p-value.
    """
    from scipy import stats

    present = [i for i, p in enumerate(p_values) if p is not None]
    out: list[float | None] = [None] * len(p_values)
    if not present:
        return out
    adjusted = stats.false_discovery_control(
        np.array([p_values[i] for i in present], dtype=np.float64), method="bh"
    )
    for i, q in zip(present, adjusted):
        out[i] = float(q)
    return out
