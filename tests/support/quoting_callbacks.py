"""Callbacks of tests/test_pii_run_quotes.py (importable as ``support.quoting_callbacks``): each
puts the input it got into what comes back, as careless user code does."""

from __future__ import annotations

import polars as pl


def echo_or_raise(row: dict):
    """Row mode: returns a JSON answer itself (not a bool), raises with the answer in its
    message for any other text; None for a null answer."""
    answer = row["answer"]
    if answer is None:
        return None
    if answer.startswith("{"):
        return answer
    raise ValueError(f"cannot score {answer}")


def raise_with_first_answer(batch: pl.DataFrame) -> pl.Series:
    """Batch mode: raises with the batch's answers in its message."""
    raise ValueError(f"cannot score {batch['answer'].to_list()}")
