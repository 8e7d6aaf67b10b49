"""Pairwise verdict statistics (:mod:`ragbatch.analysis.pairwise`) on hand-worked cases and
on scripted judges (named as such: verdict rules written here, no model): one that
always prefers the first position, one that prefers the longer answer, one that always
ties."""

from __future__ import annotations

import itertools
import math

import numpy as np
import polars as pl
import pytest

from ragbatch.analysis.pairwise import (
    VERDICT_SCHEMA,
    bradley_terry,
    elo_ratings,
    pairwise_statistics,
)


def test_bradley_terry_two_systems_by_hand():
    # A beat B 3 times, B beat A once: the MLE has p_A / (p_A + p_B) = 3/4, so p_A/p_B = 3
    p = bradley_terry(np.array([[0, 3], [1, 0]]), prior_ties=0.0)
    assert p[0] / p[1] == pytest.approx(3.0)
    assert math.prod(p) == pytest.approx(1.0)  # geometric mean 1
    # Elo: 400 log10(3) = 190.85 apart, centred on 1000
    assert elo_ratings(p) == pytest.approx([1000 + 200 * math.log10(3), 1000 - 200 * math.log10(3)])
    # the prior adds a quarter win each way: 3.25 / 1.25
    q = bradley_terry(np.array([[0, 3], [1, 0]]))
    assert q[0] / q[1] == pytest.approx(3.25 / 1.25)
    # a system that never wins stays finite with the prior and is refused without it
    assert np.isfinite(bradley_terry(np.array([[0, 5], [0, 0]]))).all()
    with pytest.raises(ValueError):
        bradley_terry(np.array([[0, 5], [0, 0]]), prior_ties=0.0)
    with pytest.raises(ValueError):
        bradley_terry(np.array([[0, -1], [1, 0]]))


def test_bradley_terry_satisfies_its_likelihood_equations():
    # The MLE's score equations: for every i, sum_j n_ij p_i / (p_i + p_j) = W_i.
    wins = np.array([[0, 7, 2, 5], [3, 0, 6, 1], [8, 4, 0, 2.5], [5, 9, 2.5, 0]])
    p = bradley_terry(wins, prior_ties=0.0)
    games = wins + wins.T
    expected = (games * p[:, None] / (p[:, None] + p[None, :])).sum(axis=1)
    assert expected == pytest.approx(wins.sum(axis=1), rel=1e-8)


SYSTEMS = {"a": 40, "bb": 120, "北京": 80, "e\u0301": 10}  # answer lengths in characters


def _verdicts(rule, questions: int = 12) -> pl.DataFrame:
    """Every pair of SYSTEMS on every question, judged in both orders by ``rule(first,
    second) -> verdict``."""
    rows = []
    for q in range(questions):
        for x, y in itertools.combinations(sorted(SYSTEMS), 2):
            for first, second in ((x, y), (y, x)):
                rows.append(
                    {
                        "question": f"q{q}",
                        "pair_id": f"q{q}:{x}|{y}",
                        "first": first,
                        "second": second,
                        "verdict": rule(first, second),
                        "first_chars": SYSTEMS[first],
                        "second_chars": SYSTEMS[second],
                    }
                )
    return pl.DataFrame(rows, schema=VERDICT_SCHEMA)


def test_a_judge_that_always_prefers_the_first_position_is_flagged():
    result = pairwise_statistics(_verdicts(lambda f, s: "first"), n_resamples=200)
    assert result.consistency.value == 0.0 and result.consistency.n == 6 * 12
    assert result.position.value == 1.0 and result.position.low > 0.5
    assert result.flags == ["position_bound"]
    # every system won exactly the half of its verdicts it was shown first in
    assert result.ratings["win_rate"].to_list() == pytest.approx([0.5] * 4)
    assert result.ratings["rating"].to_list() == pytest.approx([1000.0] * 4)


def test_a_judge_that_prefers_the_longer_answer_orders_systems_by_length():
    result = pairwise_statistics(
        _verdicts(lambda f, s: "first" if SYSTEMS[f] > SYSTEMS[s] else "second"),
        n_resamples=200,
    )
    assert result.consistency.value == 1.0 and result.flags == []
    assert result.length.value == 1.0 and result.length.n == 12 * 12
    assert result.position.value == 0.5
    assert result.ratings["system"].to_list() == sorted(SYSTEMS, key=SYSTEMS.get, reverse=True)
    # bb beats everyone in every verdict: win rate 1; e\u0301 loses every one: 0
    rates = dict(zip(result.ratings["system"], result.ratings["win_rate"]))
    assert (rates["bb"], rates["北京"], rates["a"], rates["e\u0301"]) == (1.0, 2 / 3, 1 / 3, 0.0)
    head = result.head_to_head.filter(pl.col("system") == "bb", pl.col("opponent") == "a")
    assert head.select("wins", "losses", "ties").row(0) == (24, 0, 0)
    for row in result.ratings.iter_rows(named=True):
        assert row["rating_ci_low"] <= row["rating"] <= row["rating_ci_high"]


def test_ties_failures_and_bad_input():
    table = _verdicts(lambda f, s: "tie")
    # two verdicts fail (null): they count nowhere but in n_failed
    table = table.with_columns(
        pl.when(pl.int_range(pl.len()) < 2).then(None).otherwise(pl.col("verdict")).alias("verdict")
    )
    result = pairwise_statistics(table, n_resamples=50)
    assert result.n_failed == 2
    assert result.consistency.value == 1.0 and result.consistency.n == 6 * 12 - 1
    assert result.position.n == 0 and result.position.value is None
    assert result.ratings["rating"].to_list() == pytest.approx([1000.0] * 4)
    with pytest.raises(ValueError, match="not one of"):
        pairwise_statistics(table.with_columns(pl.lit("A").alias("verdict")))
    with pytest.raises(ValueError, match="lacks columns"):
        pairwise_statistics(table.drop("pair_id"))
    with pytest.raises(ValueError, match="two systems"):
        pairwise_statistics(table.filter(pl.col("first") == "x"))
