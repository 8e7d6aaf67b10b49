"""``contains_text``: every given string occurs in the answer."""

from __future__ import annotations

import polars as pl
from pydantic import Field, field_validator

from ragbatch.metrics._cells import frame_cells, missing
from ragbatch.metrics.base import Example, ExpressionMetric, StrictParams
from ragbatch.registry import register


class ContainsTextParams(StrictParams):
    text: str | list[str] = Field(description="a string or a list of strings that must all occur")
    case_sensitive: bool = Field(False, description="when false, lowercase both sides first")

    @field_validator("text")
    @classmethod
    def _non_empty(cls, value: str | list[str]) -> str | list[str]:
        needles = [value] if isinstance(value, str) else value
        if not needles:
            raise ValueError("give at least one string to look for")
        for i, needle in enumerate(needles):
            if needle == "":
                where = "text" if isinstance(value, str) else f"text[{i}]"
                raise ValueError(f"{where} is empty; an empty string occurs in every answer")
        return value

    @property
    def needles(self) -> list[str]:
        return [self.text] if isinstance(self.text, str) else list(self.text)


@register
class ContainsText(ExpressionMetric):
    """1.0 when every string in ``text`` occurs in the answer (substring test), else 0.0.

    Follows Tonic Validate's ``ContainsTextMetric`` (Python ``needle in answer``;
    case-insensitive by default with both sides lowercased). The reason of a 0.0 lists
    the strings that are missing. Cost: one substring or case-pattern search per string;
    case-insensitive, answers holding a non-ASCII character are also lowercased once.
    """

    name = "contains_text"
    inputs = ("answer",)
    Params = ContainsTextParams
    summary = "every given string occurs in the answer"
    source = "Tonic Validate ContainsTextMetric"
    policy = (("answer null", "missing_input"), ("answer empty", "scored: 0.0"))
    examples = (
        Example({"answer": "Use Delta Lake on Databricks"}, 1.0,
                params={"text": ["delta lake", "DATABRICKS"]}),
        Example({"answer": "Use Delta Lake"}, 0.0, params={"text": ["delta", "spark"]}),
        Example({"answer": "Use Delta Lake"}, 0.0, params={"text": "delta", "case_sensitive": True}),
        Example({"answer": "価格は🚀です"}, 1.0, params={"text": "🚀"}),
        Example({"answer": ""}, 0.0, params={"text": "a"}),
        Example({}, None, "missing_input", params={"text": "a"}),
    )

    def expression(self) -> pl.Expr:
        return frame_cells([missing("answer")], ["answer"], self._score)

    def _score(self, frame: pl.DataFrame) -> pl.DataFrame:
        """Score and reason of a batch. Each search runs once and its result is kept as
        a column: written as one expression, Polars would repeat the searches (and the
        lowercasing) for the score and again for the reason."""
        answer = frame.get_column("answer")
        needles = self.params.needles
        if self.params.case_sensitive:
            hits = [answer.str.contains(needle, literal=True) for needle in needles]
        else:
            hits = _found_ignoring_case(answer, needles)
        names = [f"found_{i}" for i in range(len(needles))]
        found = pl.DataFrame([h.alias(n) for h, n in zip(hits, names)])
        missing_list = pl.concat_str(
            [pl.when(~pl.col(n)).then(pl.lit(repr(needle))) for n, needle in zip(names, needles)],
            separator=", ",
            ignore_nulls=True,
        )
        all_found = pl.all_horizontal(names)
        return found.select(
            score=all_found,
            reason=pl.when(~all_found).then(pl.format("not found: {}", missing_list)),
            details=pl.lit(None, pl.String),
        )


def _found_ignoring_case(answer: pl.Series, needles: list[str]) -> list[pl.Series]:
    """Per needle, whether ``lowercase(needle)`` occurs in ``lowercase(answer)``.

    Lowercasing is the costly part (Unicode case mapping, character by character), so
    it is done once per batch and only for answers holding a non-ASCII character. An
    ASCII answer lowercases to ASCII, so it can hold the lowercased needle only when that
    is ASCII too, and then exactly where a pattern matching each letter in either case
    (``[dD][aA]...``) matches: the same answer, without building its lowercase.
    """
    ascii_text = answer.str.len_bytes() == answer.str.len_chars()
    lowered = pl.select(
        pl.when(pl.lit(ascii_text)).then(pl.lit("")).otherwise(pl.lit(answer)).str.to_lowercase()
    ).to_series()
    found = []
    for needle in needles:
        low = _lower(needle)
        in_lowered = lowered.str.contains(low, literal=True)
        if low.isascii():
            in_ascii = answer.str.contains("".join(_either_case(c) for c in low))
        else:
            in_ascii = pl.repeat(False, answer.len(), eager=True)
        found.append(pl.select(
            pl.when(pl.lit(ascii_text)).then(pl.lit(in_ascii)).otherwise(pl.lit(in_lowered))
        ).to_series())
    return found


def _either_case(c: str) -> str:
    """A Rust regex atom matching the ASCII character ``c`` in either case."""
    if c.isalpha():
        return f"[{c.lower()}{c.upper()}]"
    return f"\\x{{{ord(c):X}}}"


def _lower(text: str) -> str:
    """Lowercase with Polars so that needles and answers use one mapping."""
    return pl.Series([text]).str.to_lowercase()[0]
