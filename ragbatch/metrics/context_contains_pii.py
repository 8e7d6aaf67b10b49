"""``context_contains_pii``: a retrieved context holds PII of the selected types."""

from __future__ import annotations

from collections import Counter
from typing import Any, ClassVar

import polars as pl

from ragbatch.core.columns import CONTEXTS
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
class ContextContainsPii(PiiMetric):
    """1.0 when at least one retrieved context holds an entity of ``pii_types``, else 0.0.

    Each context is analyzed on its own (an entity never spans two contexts). The
    cell's ``reason`` lists the types found with counts and the indices of the contexts
    that held them (``"EMAIL_ADDRESS x2 in contexts 0, 3"``, ``"URL x1 in context 2"``); ``details`` is
    ``{"types": {type: count}, "contexts": [{"index": i, "types": {type: count}}, ...]}``
    for the contexts with PII. The text found is never recorded.

    Notes
    -----
    Source: Tonic Validate's ``ContainsPiiMetric`` applied to the retrieved contexts
    (remote API there; local Presidio here). Lower is better.
    """

    name: ClassVar[str] = "context_contains_pii"
    inputs: ClassVar[tuple[str, ...]] = (CONTEXTS,)
    summary: ClassVar[str] = (
        "some retrieved context holds PII of the given types (found locally with Presidio); "
        "records which contexts"
    )
    source: ClassVar[str] = (
        "Tonic Validate ContainsPiiMetric (contexts), detected locally with Presidio's analyzer"
    )
    policy: ClassVar[tuple[tuple[str, str], ...]] = (
        (
            "contexts is null or unparseable",
            "missing_input; reason is the normalizer's note, which quotes no value in a run with PII metrics",
        ),
        (
            "contexts is an empty list",
            "score 0.0 (nothing retrieved, nothing to leak); reason says so",
        ),
        (
            "a context is null, empty or only whitespace",
            "skipped; details.skipped lists its index; the others decide the score",
        ),
        (
            "every context is null, empty or only whitespace",
            "score 0.0; reason 'every context is empty: nothing to check'",
        ),
        (
            "detector raises on a context",
            "score 1.0 if another context holds PII, else error; the reason names the context "
            "index and the exception type only",
        ),
    )
    examples: ClassVar[tuple[Example, ...]] = (
        Example(
            {CONTEXTS: ["No PII here.", "Server at 192.168.10.20 is down."]},
            1.0,
            params={"pii_types": ["IP_ADDRESS"]},
        ),
        Example({CONTEXTS: ["No PII here."]}, 0.0, params={"pii_types": ["IP_ADDRESS"]}),
        Example({CONTEXTS: []}, 0.0, note="empty context list"),
        Example({}, None, "missing_input", note="null contexts"),
    )

    def texts(self, frame: pl.DataFrame) -> list[str]:
        """The non-blank contexts of ``frame`` (what the stage must analyze)."""
        chunks = frame.get_column(CONTEXTS).explode().drop_nulls().to_list()
        return [c for c in chunks if c.strip()]

    @staticmethod
    def _cell(model: PiiResults, contexts: list[str | None], wanted: list[str] | None) -> PyCell:
        if not contexts:
            return PyCell(
                0.0,
                reason="contexts is an empty list: nothing to check",
                details={"types": {}, "contexts": []},
            )
        total: Counter = Counter()
        per_context, skipped, failed = [], [], []
        for i, text in enumerate(contexts):
            if text is None or not text.strip():
                skipped.append(i)
                continue
            found = model.get(text)
            if isinstance(found, str):
                failed.append((i, found))
                continue
            counts = count_types(found, wanted)
            if counts:
                total.update(counts)
                per_context.append({"index": i, "types": dict(sorted(counts.items()))})
        details: dict[str, Any] = {"types": dict(sorted(total.items())), "contexts": per_context}
        if skipped:
            details["skipped"] = skipped
        if failed:
            details["failed"] = [i for i, _ in failed]
            if not total:
                i, error = failed[0]
                return PyCell(None, ERROR, f"context {i}: {detector_failure(error)}")
        if not total:
            if len(skipped) == len(contexts):
                return PyCell(
                    0.0, reason="every context is empty: nothing to check", details=details
                )
            return PyCell(0.0, reason="no PII found", details=details)
        where = ", ".join(str(c["index"]) for c in per_context)
        noun = "contexts" if len(per_context) > 1 else "context"
        return PyCell(1.0, reason=f"{describe_counts(total)} in {noun} {where}", details=details)
