"""False discovery rate control across the lines of a comparison.

The paired tests and the Benjamini-Hochberg adjustment are checked against values worked
out by hand; then A/A comparisons (both runs drawn afresh from one distribution, so
nothing changed) show that at most the nominal share of comparisons raise any flag,
while a change planted in one slice is still found.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from ragbatch.analysis.compare import compare_scores
from ragbatch.analysis.compare_text import format_comparison
from ragbatch.analysis.multiple_testing import bh_adjust, paired_test
from ragbatch.analysis.pairing import pair_by_row_id, Pairing
from ragbatch.core.errors import InputError


def test_benjamini_hochberg_by_hand():
    # m = 4 tests (None is not one): sorted 0.005, 0.01, 0.03, 0.04 scaled by 4/i give
    # 0.02, 0.02, 0.04, 0.04; running minima from the top leave them as they are.
    assert bh_adjust([0.01, 0.04, 0.03, 0.005, None]) == pytest.approx(
        [0.02, 0.04, 0.04, 0.02, None]
    )
    # a large p-value first in sort order cannot lower a smaller one's: 0.5 * 2/2 = 0.5,
    # 0.049 * 2/1 = 0.098
    assert bh_adjust([0.5, 0.049]) == pytest.approx([0.5, 0.098])
    # running minimum: 0.04 * 3/2 = 0.06 > 0.045 * 3/3 = 0.045, so both become 0.045
    assert bh_adjust([0.045, 0.04, 0.001]) == pytest.approx([0.045, 0.045, 0.003])
    assert bh_adjust([None, None]) == [None, None] and bh_adjust([]) == []


def test_paired_tests_by_hand():
    # McNemar exact: 1 pair went 0 -> 1, 7 went 1 -> 0, 2 stayed: two-sided binomial
    # tail 2 * P(X <= 1 | n=8, 1/2) = 2 * (1 + 8) / 256
    b = np.array([1, 1, 1, 1, 1, 1, 1, 0, 0, 1], dtype=float)
    c = np.array([0, 0, 0, 0, 0, 0, 0, 1, 0, 1], dtype=float)
    p, test = paired_test(b, c)
    assert test == "mcnemar_exact" and p == pytest.approx(18 / 256)
    # paired t: differences 0.1, 0.2, 0.3 -> t = 0.2 / (0.1 / sqrt 3), 2 degrees of
    # freedom, whose CDF is 1/2 + t / (2 sqrt(2 + t^2))
    t = 0.2 / (0.1 / math.sqrt(3))
    expected = 2 * (0.5 - t / (2 * math.sqrt(2 + t * t)))
    p, test = paired_test(np.array([0.2, 0.4, 0.5]), np.array([0.3, 0.6, 0.8]))
    assert test == "paired_t" and p == pytest.approx(expected, rel=1e-9)
    # degenerate: nothing moved; everything moved by the same amount; too few pairs
    assert paired_test(np.array([0.5, 0.5]), np.array([0.5, 0.5])) == (1.0, "paired_t")
    assert paired_test(np.array([0.5, 0.25]), np.array([0.75, 0.5])) == (0.0, "paired_t")
    assert paired_test(np.array([0.0, 1.0]), np.array([0.0, 1.0])) == (1.0, "mcnemar_exact")
    assert paired_test(np.array([0.5]), np.array([0.75])) == (None, None)
    assert paired_test(np.array([]), np.array([])) == (None, None)


N_QUESTIONS, SLICES = 600, ("北京", "😀", "e\u0301", "d", "e")


def _night(rng: np.random.Generator, truth: dict, shift: float = 0.0) -> pl.DataFrame:
    """One run's long scores: every question's answer drawn afresh around the question's
    own level (so the two runs' scores are paired but independent given the question).
    ``shift`` is added to ``cont_a`` in the first slice (a planted change)."""
    rows = []
    slices = truth["slice"]
    for metric in ("bin_a", "bin_b"):
        scores = (rng.random(N_QUESTIONS) < truth[metric]).astype(float)
        rows.append((metric, scores))
    for metric in ("cont_a", "cont_b"):
        scores = truth[metric] + rng.normal(0.0, 0.15, N_QUESTIONS)
        if metric == "cont_a":
            scores = scores + shift * (slices == SLICES[0])
        rows.append((metric, scores))
    frames = [
        pl.DataFrame(
            {
                "row_id": [f"q{i}" for i in range(N_QUESTIONS)],
                "metric": metric,
                "score": scores,
                "status": "ok",
                "reason": None,
                "app": slices,
            },
            schema_overrides={"reason": pl.String},
        )
        for metric, scores in rows
    ]
    return pl.concat(frames)


def _truth(rng: np.random.Generator) -> dict:
    return {
        "slice": np.array([SLICES[i % len(SLICES)] for i in range(N_QUESTIONS)]),
        "bin_a": rng.uniform(0.2, 0.9, N_QUESTIONS),
        "bin_b": rng.uniform(0.0, 1.0, N_QUESTIONS),
        "cont_a": rng.uniform(0.0, 1.0, N_QUESTIONS),
        "cont_b": rng.uniform(0.3, 0.7, N_QUESTIONS),
    }


def _compare(baseline: pl.DataFrame, candidate: pl.DataFrame, fdr: float | None):
    ids = [f"q{i}" for i in range(N_QUESTIONS)]
    pairs, left_b, left_c = pair_by_row_id(ids, ids)
    return compare_scores(
        baseline,
        candidate,
        Pairing(pairs, left_b, left_c),
        {},
        by=["app"],
        n_resamples=400,
        fdr=fdr,
    )


def test_a_a_comparisons_raise_no_more_alarms_than_the_nominal_rate():
    """120 A/A comparisons of 24 lines each (4 metrics x (all rows + 5 slices)). With
    nothing changed, Benjamini-Hochberg at q = 0.05 bounds the chance that a comparison
    flags anything by 0.05: 6 expected; 14 or more has probability below 0.003 under
    that rate. Without the control, most comparisons flag something."""
    seeds = range(120)
    with_control = without = 0
    for seed in seeds:
        rng = np.random.default_rng(seed)
        truth = _truth(rng)
        baseline, candidate = _night(rng, truth), _night(rng, truth)
        controlled = _compare(baseline, candidate, 0.05)
        assert controlled.metrics.height == 24
        assert controlled.metrics["p_adjusted"].null_count() == 0
        with_control += bool(controlled.metrics["significant"].any())
        without += bool(_compare(baseline, candidate, None).metrics["significant"].any())
    assert with_control <= 13, f"{with_control} of {len(seeds)} A/A comparisons flagged"
    assert without >= 0.4 * len(seeds), without  # the problem the control solves


def test_a_planted_change_in_one_slice_is_still_found():
    """+0.3 on one continuous metric in one slice of 120 questions: found in every one of
    20 comparisons, and the lines flagged besides it (nothing else changed; the metric's
    all-rows line moved by 0.06 and may be flagged too) are a small share of the flagged
    lines on average, as the false discovery rate promises (0.05 expected)."""
    planted, overall = ("cont_a", SLICES[0]), ("cont_a", None)
    false_shares = []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        truth = _truth(rng)
        result = _compare(_night(rng, truth), _night(rng, truth, shift=0.3), 0.05)
        flagged = result.metrics.filter(pl.col("significant"))
        lines = set(zip(flagged["metric"], flagged["slice_value"]))
        assert planted in lines, seed
        line = flagged.filter(pl.col("metric") == "cont_a", pl.col("slice_value") == SLICES[0])
        assert line["change"].to_list() == ["better"]
        assert line["mean_diff"][0] == pytest.approx(0.3, abs=0.05)
        false_shares.append(len(lines - {planted, overall}) / len(lines))
    assert np.mean(false_shares) <= 0.15, false_shares
    text = format_comparison(result)
    assert "Benjamini-Hochberg" in text and "at most 0.05" in text
    assert result.to_dict()["fdr"] == 0.05


def test_fdr_out_of_range_is_refused():
    import argparse

    from ragbatch.cli.common import _fdr

    assert (_fdr("off"), _fdr("OFF"), _fdr("0.1")) == (None, None, 0.1)
    for text in ("0", "1", "1.5", "-0.1", "five", "nan"):
        with pytest.raises(argparse.ArgumentTypeError, match="between 0 and 1"):
            _fdr(text)
    rng = np.random.default_rng(1)
    truth = _truth(rng)
    night = _night(rng, truth)
    for bad in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(InputError, match="--fdr"):
            _compare(night, night, bad)
