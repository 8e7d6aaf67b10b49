"""``answer_contains_pii``: the answer holds PII of the selected types, found locally."""

from __future__ import annotations

from typing import ClassVar

import polars as pl

from ragbatch.core.columns import ANSWER
from ragbatch.scoring.cells import PyCell
from ragbatch.metrics.pii_base import (
    PiiMetric,
    PiiResults,
    count_types,
    describe_counts,
    detector_failure,
)
from ragbatch.scoring.base import Example
from ragbatch.scoring.registry import register
from ragbatch.core.status import ERROR


@register
class AnswerContainsPii(PiiMetric):
    """1.0 when the answer holds at least one entity of ``pii_types``, else 0.0.

    Detection runs in the job with Presidio's analyzer (pattern and checksum recognizers;
    a NER model too when the engine names one), so no text leaves the machine. The cell's
    ``reason`` lists the types found with counts (``"EMAIL_ADDRESS x2"``) and ``details``
    is ``{"types": {type: count}}``; neither ever holds the text that was found.

    Notes
    -----
    Source: Tonic Validate's ``ContainsPiiMetric`` on the answer (which sends the text to
    a remote redaction API); entity names follow Presidio's vocabulary. Lower is better.
    """

    name: ClassVar[str] = "answer_contains_pii"
    inputs: ClassVar[tuple[str, ...]] = (ANSWER,)
    summary: ClassVar[str] = "the answer holds PII of the given types (found locally with Presidio)"
    source: ClassVar[str] = (
        "Tonic Validate ContainsPiiMetric (answer), detected locally with Presidio's analyzer"
    )
    policy: ClassVar[tuple[tuple[str, str], ...]] = (
        (
            "answer is null or not text",
            "missing_input; reason is 'answer is null' or the normalizer's note, which quotes "
            "no value in a run with PII metrics",
        ),
        (
            "answer is empty or only whitespace",
            "score 0.0 (nothing to leak); reason 'answer is empty'",
        ),
        (
            "detector raises on the answer",
            "error; reason names the exception type only (the message may quote the text)",
        ),
    )
    examples: ClassVar[tuple[Example, ...]] = (
        Example(
            {ANSWER: "Write to ana@example.org for a refund."},
            1.0,
            params={"pii_types": ["EMAIL_ADDRESS"]},
        ),
        Example(
            {ANSWER: "Card 4111 1111 1111 1112 was declined."},
            0.0,
            params={"pii_types": ["CREDIT_CARD"]},
            note="fails the Luhn check",
        ),
        Example({ANSWER: "  "}, 0.0, note="empty answer"),
        Example({}, None, "missing_input", note="null answer"),
    )

    def texts(self, frame: pl.DataFrame) -> list[str]:
        """The non-blank answers of ``frame`` (what the stage must analyze)."""
        return [t for t in frame.get_column(ANSWER).drop_nulls().to_list() if t.strip()]

    @staticmethod
    def _cell(model: PiiResults, text: str, wanted: list[str] | None) -> PyCell:
        if not text.strip():
            return PyCell(0.0, reason="answer is empty", details={"types": {}})
        found = model.get(text)
        if isinstance(found, str):
            return PyCell(None, ERROR, detector_failure(found))
        counts = count_types(found, wanted)
        return PyCell(
            1.0 if counts else 0.0,
            reason=describe_counts(counts),
            details={"types": dict(sorted(counts.items()))},
        )
