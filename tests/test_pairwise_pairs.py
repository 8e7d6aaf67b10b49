"""Pairing for ``ragbatch pairwise`` (:func:`ragbatch.ops.pairwise.build_pairs`): which
rows become pairs, in which orders, and what is counted when rows are left out. The
expected pairs are listed by hand from the rows."""

from __future__ import annotations

import polars as pl
import pytest

from ragbatch.core.errors import InputError
from ragbatch.ops.pairwise import build_pairs


def _answers(rows: list[tuple[str | None, str, str | None]]) -> pl.DataFrame:
    """Rows of (question, system, answer) as :func:`read_answers` gives them, keyed by
    the question text itself (the key's hashing is tested with compare's pairing)."""
    return pl.DataFrame(
        {
            "system": [r[1] for r in rows],
            "question": [r[0] for r in rows],
            "answer": [r[2] for r in rows],
            "question_key": [r[0] for r in rows],
            "null_key": [r[0] is None for r in rows],
        },
        schema={
            "system": pl.String,
            "question": pl.String,
            "answer": pl.String,
            "question_key": pl.String,
            "null_key": pl.Boolean,
        },
    )


ROWS = [
    ("q1", "b", "b1"),
    ("q1", "a", "a1"),
    ("q1", "c", "c1"),
    ("q1", "a", "a1 again"),  # a repeats q1: the first answer is kept
    ("q2", "a", "a2"),
    ("q2", "b", None),  # null answer: left out
    ("q2", "c", "c2 ü"),
    ("q3", "a", "a3"),  # only a answered q3: no pair
    (None, "b", "b?"),  # no question to match on: left out
]


def test_pairs_both_orders_and_counts():
    pairs = build_pairs(_answers(ROWS))
    got = pairs.frame.select("question", "order", "first", "second", "first_answer").rows()
    assert got == [
        ("q1", 1, "a", "b", "a1"),
        ("q1", 2, "b", "a", "b1"),
        ("q1", 1, "a", "c", "a1"),
        ("q1", 2, "c", "a", "c1"),
        ("q1", 1, "b", "c", "b1"),
        ("q1", 2, "c", "b", "c1"),
        ("q2", 1, "a", "c", "a2"),
        ("q2", 2, "c", "a", "c2 ü"),
    ]
    assert pairs.frame["pair_id"].to_list() == [
        "q1:a|b", "q1:a|b", "q1:a|c", "q1:a|c", "q1:b|c", "q1:b|c", "q2:a|c", "q2:a|c"
    ]  # fmt: skip
    # c shown first: "c1" twice on q1, "c2 ü" (4 code points, 5 bytes) on q2
    assert pairs.frame.filter(pl.col("first") == "c")["first_chars"].to_list() == [2, 2, 4]
    assert pairs.systems == ["a", "b", "c"]
    assert pairs.counts == {
        "rows": 9,
        "null_answers": 1,
        "null_keys": 1,
        "duplicates": 1,
        "unmatched_questions": 1,
        "questions": 2,
        "pairs": 4,
    }


def test_a_subset_of_systems_and_max_questions():
    pairs = build_pairs(_answers(ROWS), systems=["c", "a"], max_questions=1)
    assert pairs.frame.select("first", "second").rows() == [("a", "c"), ("c", "a")]
    assert pairs.systems == ["a", "c"]
    assert pairs.counts["questions"] == 1


def test_unknown_systems_and_too_few_are_input_errors():
    with pytest.raises(InputError, match=r"\['z'\] are not systems of the input"):
        build_pairs(_answers(ROWS), systems=["a", "z"])
    with pytest.raises(InputError, match="at least two systems; the input has 1"):
        build_pairs(_answers([r for r in ROWS if r[1] == "a"]))
    with pytest.raises(InputError, match="no question was answered by two"):
        build_pairs(_answers([("q1", "a", "x"), ("q2", "b", "y")]))


def _cfg(**extra):
    from ragbatch.ops.pairwise_config import pairwise_from_dict

    data = {
        "pairwise": {"engine": "judge"},
        "engines": {"judge": {"type": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}},
        "output": {"uri": "out"},
        **extra,
    }
    return pairwise_from_dict(data)


def test_answers_come_from_an_input_or_from_runs_not_both():
    from ragbatch.core.errors import ConfigError

    runs = [{"output": "o", "run_id": "r1"}, {"output": "o", "run_id": "r2", "system": "b"}]
    assert [r.name for r in _cfg(runs=runs).runs] == ["r1", "b"]
    with pytest.raises(ConfigError, match="either as `input`"):
        _cfg()
    with pytest.raises(ConfigError, match="either as `input`"):
        _cfg(runs=runs, input={"uri": "x.parquet"})
    with pytest.raises(ConfigError, match="same system name"):
        _cfg(runs=[{"output": "o", "run_id": "r1"}, {"output": "p", "run_id": "r1"}])
    with pytest.raises(ConfigError, match=r"runs\[0\]\.run_id"):
        _cfg(runs=[{"output": "o", "run_id": "../up"}, {"output": "o", "run_id": "r2"}])


def test_the_report_escapes_system_names_and_shows_the_flag():
    from ragbatch.analysis.pairwise import pairwise_statistics
    from ragbatch.ops.pairwise_output import report_html

    # one question, one pair, the first position wins in both orders
    verdicts = pl.DataFrame(
        {
            "question": ["q", "q"],
            "pair_id": ["p", "p"],
            "first": ["<script>x</script>", "b"],
            "second": ["b", "<script>x</script>"],
            "verdict": ["first", "first"],
            "first_chars": [3, 4],
            "second_chars": [4, 3],
        }
    )
    result = pairwise_statistics(verdicts, n_resamples=20)
    share = {"value": 0.0, "ci_low": 0.0, "ci_high": 0.79, "n": 1}
    summary = {
        "run_id": "r",
        "run_date": "2026-12-04",
        "name": "n",
        "judge": {"engine": "j", "models": ["m"]},
        "counts": {"questions": 1, "pairs": 1, "verdicts": 2, "failed": 0, "null_answers": 0},
        "judge_calls": 2,
        "cache_hits": 0,
        "flag_notes": {"inconsistent": "near chance"},
        "confidence": 0.95,
        "position_consistency": share,
        "position_bias": share,
        "length_bias": share,
    }
    html = report_html(result, summary)
    assert "<script>x</script>" not in html
    assert "&lt;script&gt;x&lt;/script&gt;" in html
    assert "Judge flagged inconsistent</strong>: near chance." in html
