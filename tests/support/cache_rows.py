"""Rows and replies shared by the judgment-cache tests: one city question per row, the
one statement and the supported verdict faithfulness asks for, and a stored reply."""

from __future__ import annotations

import polars as pl

from ragbatch.core.status import OK
from ragbatch.judge.protocol import Completion

STATEMENTS = '{"statements": ["Paris is in France."]}'
YES = '{"verdicts": [{"reason": "stated", "verdict": 1}]}'
SCHEMA = {
    "row_id": pl.String,
    "question": pl.String,
    "contexts": pl.List(pl.String),
    "answer": pl.String,
    "reference": pl.String,
}


def city_rows(n: int, start: int = 0) -> pl.DataFrame:
    """``n`` rows ``r<start>`` ..., each asking where city i is, with one context."""
    rows = [
        {
            "row_id": f"r{i}",
            "question": f"Where is city {i}?",
            "contexts": [f"City {i} is Paris, in France."],
            "answer": "Paris is in France.",
            "reference": None,
        }
        for i in range(start, start + n)
    ]
    return pl.DataFrame(rows, schema=SCHEMA)


def ok_reply(text: str) -> Completion:
    """A stored judge reply of ``text`` (status ok, 5 prompt and 2 completion tokens)."""
    return Completion(OK, text=text, finish_reason="stop", prompt_tokens=5, completion_tokens=2)
