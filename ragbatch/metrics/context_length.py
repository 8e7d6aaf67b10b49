"""``context_length``: every retrieved context's length lies within bounds."""

from __future__ import annotations

import polars as pl

from ragbatch.metrics._bounds import LengthBounds
from ragbatch.scoring.cells import Guard, details_json, frame_cells, missing
from ragbatch.scoring.base import Example, ExpressionMetric
from ragbatch.scoring.registry import register
from ragbatch.core.status import MISSING_INPUT, NOT_APPLICABLE


@register
class ContextLength(ExpressionMetric):
    """1.0 when every context has ``min_chars <= len(context) <= max_chars``, else 0.0.

    Follows Tonic Validate's ``ContextLengthMetric`` (all contexts must pass), with 0 a
    real bound. Lengths count Unicode code points. ``details`` holds
    ``{"lengths": [...]}``; the reason of a 0.0 lists the offending contexts by index.
    """

    name = "context_length"
    inputs = ("contexts",)
    Params = LengthBounds
    summary = "every context's length in characters within [min_chars, max_chars]"
    source = "Tonic Validate ContextLengthMetric"
    policy = (
        ("contexts null or unparseable", "missing_input"),
        ("contexts empty list", "not_applicable (nothing was retrieved; Tonic would pass it)"),
        ("a null item in contexts", "missing_input, naming the index"),
    )
    examples = (
        Example({"contexts": ["ab", "abc"]}, 1.0, params={"min_chars": 2, "max_chars": 3}),
        Example({"contexts": ["ab", "abcd"]}, 0.0, params={"min_chars": 2, "max_chars": 3}),
        Example({"contexts": [""]}, 1.0, params={"max_chars": 0}),
        Example({"contexts": []}, None, "not_applicable", params={"max_chars": 3}),
        Example({"contexts": ["ab", None]}, None, "missing_input", params={"max_chars": 3}),
        Example({}, None, "missing_input", params={"max_chars": 3}),
    )

    def expression(self) -> pl.Expr:
        contexts = pl.col("contexts")
        first_null = contexts.list.eval(pl.element().is_null()).list.arg_max()
        guards = [
            missing("contexts"),
            Guard(contexts.list.len() == 0, NOT_APPLICABLE, pl.lit("contexts is an empty list")),
            Guard(
                contexts.list.eval(pl.element().is_null()).list.any(),
                MISSING_INPUT,
                pl.format("contexts[{}] is null", first_null),
            ),
        ]
        return frame_cells(guards, ["contexts"], self._score)

    def _score(self, frame: pl.DataFrame) -> pl.DataFrame:
        """Score, reason and details of a batch, from one count of every context's length."""
        lengths = frame.select(pl.col("contexts").list.eval(pl.element().str.len_chars()))
        lengths = lengths.to_series().alias("lengths")
        passed = pl.select(
            pl.lit(lengths).list.eval(self.params.admits(pl.element())).list.all()
        ).to_series()
        offenders = _offenders(lengths, self.params)
        return pl.DataFrame({"lengths": lengths, "passed": passed, "offenders": offenders}).select(
            score=pl.col("passed"),
            reason=pl.format("{} outside {}", pl.col("offenders"), pl.lit(self.params.label())),
            details=details_json(lengths=pl.col("lengths")),
        )


def _offenders(lengths: pl.Series, bounds: LengthBounds) -> pl.Series:
    """Per row, the contexts outside ``bounds`` as ``"#index (n chars), ..."``; null where
    every context passes (or there are none).

    Built on the flattened lengths: formatting inside ``list.eval`` runs list by list,
    about eight times slower on 100,000 rows. Only the offending contexts get a row and
    an index, found from their flat position by a binary search over the lists' ends.
    """
    counts = lengths.list.len().fill_null(0)
    flat = lengths.explode(empty_as_null=False, keep_nulls=False)
    at = pl.select(~bounds.admits(pl.lit(flat))).to_series().arg_true()
    ends = counts.cum_sum()
    row = ends.search_sorted(at, side="right").cast(pl.UInt32)
    starts = (ends - counts).gather(row)
    bad = pl.DataFrame(
        {
            "row": row,
            "index": at.cast(pl.Int64) - starts.cast(pl.Int64),
            "length": flat.gather(at),
        }
    )
    row_col = pl.col("row")
    bad = bad.select(
        "row",
        text=pl.format("#{} ({} chars)", "index", "length"),
        # rows come in order, so a row with several offenders has them side by side
        shared=((row_col == row_col.shift(1)) | (row_col == row_col.shift(-1))).fill_null(False),
    )
    # Most failing rows have one offender: only the others need a (costly) string join.
    single = bad.filter(~pl.col("shared"))
    several = (
        bad.filter("shared").group_by("row", maintain_order=True).agg(pl.col("text").str.join(", "))
    )
    reasons = pl.repeat(None, lengths.len(), dtype=pl.String, eager=True)
    reasons = reasons.scatter(single.get_column("row"), single.get_column("text"))
    return reasons.scatter(several.get_column("row"), several.get_column("text"))
