"""Callbacks used by the binary-metric tests (importable as ``binary_callbacks``)."""

from __future__ import annotations

import polars as pl


def answer_has_digit(batch: pl.DataFrame) -> pl.Series:
    return batch["answer"].str.contains(r"[0-9]")


def wrong_length(batch: pl.DataFrame) -> list:
    return [True]


def raises(batch: pl.DataFrame) -> pl.Series:
    raise ValueError("boom")


def row_has_reference(row: dict):
    if row["answer"] is None:
        return None
    if row["answer"] == "raise":
        raise KeyError("bad row")
    if row["answer"] == "int":
        return 1
    return row["reference"] is not None


def sees_canonical_columns(batch: pl.DataFrame) -> pl.Series:
    expected = ["row_id", "question", "contexts", "answer", "reference", "latency_s"]
    return pl.Series([batch.columns == expected] * batch.height)


def slow_digit(batch: pl.DataFrame) -> pl.Series:
    """Whether the answer holds a digit, after a pause per batch: stands in for an
    expensive metric so that a test can kill a run while it scores."""
    import time

    time.sleep(0.6)
    return batch["answer"].str.contains(r"[0-9]")
