"""Callbacks used by the binary-metric tests (importable as ``support.binary_callbacks``)."""

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


def sleepy_digit(batch: pl.DataFrame) -> pl.Series:
    """Whether the answer holds a digit, after 6 s per batch: a stage that moves no
    block for longer than a test sets Ray Data's no-progress watchdog to."""
    import time

    time.sleep(6)
    return batch["answer"].str.contains(r"[0-9]")


#: File (in the folder a row's ``reference`` names) whose presence makes
#: :func:`flaky_digit` fail its ``flaky`` rows: a fault that goes away between attempts.
FIRST_ATTEMPT_MARKER = "first-attempt"
#: File in that folder where :func:`flaky_digit` appends the question of every row it scores.
CALLS_LOG = "calls.log"


def flaky_digit(row: dict):
    """Row mode: whether the answer holds a digit. ``row["reference"]`` names a folder:
    the row's question is appended to its :data:`CALLS_LOG`, and while its
    :data:`FIRST_ATTEMPT_MARKER` exists a row whose question starts with ``flaky``
    raises (status ``error``), as a transient fault (a rate limit, a flaky service)
    would on a first attempt only."""
    from pathlib import Path

    folder = Path(row["reference"])
    with open(folder / CALLS_LOG, "a", encoding="utf-8") as fh:
        fh.write(row["question"] + "\n")
    if row["question"].startswith("flaky") and (folder / FIRST_ATTEMPT_MARKER).exists():
        raise ConnectionError("transient fault on the first attempt")
    return any(ch.isdigit() for ch in row["answer"])
