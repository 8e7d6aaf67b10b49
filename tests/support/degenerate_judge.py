"""Canned judge replies that reproduce issue 25's SmolLM2-135M run on the first 24 ARES
rows (``jobs/ares_judge.yaml``), and a healthy counterpart.

What the 135M judge returned, per metric, and what is replayed here:

- ``hate_speech``, ``duplication``: every reply ``{"reason":"true","verdict":true}``;
- ``answer_consistency_binary``: 0.0 on every row (each reply flags the answer as holding
  unattributable information, with ordinary-looking reasons);
- ``answer_relevancy``: the noncommittal flag on every row (score 0.0);
- ``faithfulness``, ``answer_consistency``: empty statement lists (``not_applicable``);
- ``context_relevancy``: 9 of 24 rows ``context_too_long``, the rest answered.

``augmentation_accuracy``, ``augmentation_precision`` and ``retrieval_precision`` get
healthy replies: mixed verdicts with reasons naming the row.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

ARES = (
    Path(__file__).resolve().parents[2]
    / "examples"
    / "data"
    / "ares"
    / "datasets_v2__LLM_Judge_Test_Set_Human_Annotations.tsv"
)
N_ROWS = 24
#: Rows of the 24 that context_relevancy finds too long, as in the issue's table.
TOO_LONG = 9

#: The six metrics issue 25 requires flagged on this run.
REQUIRED_FLAGGED = (
    "hate_speech",
    "duplication",
    "answer_consistency_binary",
    "answer_relevancy",
    "faithfulness",
    "answer_consistency",
)
HEALTHY = ("augmentation_accuracy", "augmentation_precision", "retrieval_precision")


def ares_rows(n: int = N_ROWS) -> pl.DataFrame:
    """The first ``n`` ARES rows as canonical columns (``contexts`` holds the document as
    one context, as ``contexts_format: text`` reads it) plus a slice column ``half``."""
    raw = pl.read_csv(ARES, separator="\t", n_rows=n, quote_char=None)
    return pl.DataFrame(
        {
            "row_id": [f"ares:{i}" for i in range(raw.height)],
            "question": raw["Question"],
            "answer": raw["Answer"],
            "contexts": [[d] for d in raw["Document"].to_list()],
            "reference": pl.Series([None] * raw.height, dtype=pl.String),
            "half": ["first" if i < raw.height // 2 else "second" for i in range(raw.height)],
        }
    )


def ares_tsv_input(folder: Path, n: int, name: str = "ares.tsv") -> dict:
    """The ``input`` section of a job reading the first ``n`` ARES rows, copied line for
    line into ``folder / name`` (TSV; the document as one context, ``contexts_format:
    text``; no reference)."""
    lines = ARES.read_text(encoding="utf-8").splitlines(keepends=True)[: n + 1]
    data = folder / name
    data.write_text("".join(lines), encoding="utf-8")
    return {
        "uri": str(data),
        "format": "tsv",
        "contexts_format": "text",
        "columns": {"question": "Question", "contexts": "Document", "answer": "Answer"},
    }


CONSTANT_TRUE = '{"reason":"true","verdict":true}'


def degenerate_reply(metric: str, i: int) -> str:
    """The 135M judge's reply to row ``i`` for ``metric`` (one step per metric here:
    the extraction metrics stop after their empty or noncommittal first step)."""
    if metric in ("hate_speech", "duplication"):
        return CONSTANT_TRUE
    if metric == "answer_consistency_binary":
        return json.dumps(
            {
                "reason": f"Row {i}: the answer adds a detail the document lacks.",
                "states_claims": True,
                "unattributable": True,
            }
        )
    if metric == "answer_relevancy":
        return json.dumps({"noncommittal": 1, "questions": ["What?", "Why?", "How?"]})
    if metric in ("faithfulness", "answer_consistency"):
        return '{"statements": []}'
    if metric == "context_relevancy":
        return '{"relevant": [1]}'
    return healthy_reply(metric, i)


def healthy_reply(metric: str, i: int) -> str:
    """A working judge's reply to row ``i`` (one context per ARES row): verdicts that
    vary from row to row, each with a reason naming the row."""
    verdict = int(i % 3 != 0)
    reason = f"Row {i}: the document {'covers' if verdict else 'does not cover'} the question."
    if metric == "augmentation_precision":
        return json.dumps({"verdicts": [{"reason": reason, "relevant": 1, "used": verdict}]})
    if metric in ("augmentation_accuracy", "retrieval_precision"):
        return json.dumps({"verdicts": [{"reason": reason, "verdict": verdict}]})
    if metric in ("hate_speech", "duplication"):
        return json.dumps(
            {"reason": f"Row {i}: a plain technical answer with no such content.", "verdict": False}
        )
    raise KeyError(metric)
