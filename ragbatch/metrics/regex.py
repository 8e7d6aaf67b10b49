"""``regex``: the answer matches a regular expression (Python ``re`` semantics)."""

from __future__ import annotations

import re
from functools import cached_property
from typing import Any

import polars as pl
from pydantic import Field, field_validator

from ragbatch.scoring.cells import PyCell, cell, details_json, missing, python_cells
from ragbatch.scoring.base import Example, ExpressionMetric, StrictParams
from ragbatch.core.regex_compat import Translation, translate
from ragbatch.scoring.registry import register
from ragbatch.core.status import ERROR, TIMEOUT
from ragbatch.core.time_limit import TIMED_OUT, Failed, map_with_time_limit


class RegexParams(StrictParams):
    pattern: str = Field(description="a Python `re` pattern")
    expected_count: int | None = Field(
        None,
        ge=0,
        description="when set, pass iff the number of non-overlapping matches equals it; "
        "when null, pass iff there is any match",
    )
    timeout_s: float = Field(
        2.0,
        gt=0,
        description="time limit in seconds for matching one answer when the pattern runs on "
        "Python re (a pattern that backtracks catastrophically gives `timeout` on that row); "
        "the Rust engine never backtracks and needs none",
    )

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"invalid regular expression {value!r}: {exc}") from None
        return value


@register
class Regex(ExpressionMetric):
    """Regular-expression check on the answer, with Python ``re`` as the reference.

    With ``expected_count`` (Tonic Validate ``RegexMetric``): 1.0 when
    ``len(re.findall(pattern, answer)) == expected_count``, and ``details`` holds
    ``{"count": n}``. Without it (Vellum "Regex Match"): 1.0 when
    ``re.search(pattern, answer)`` finds a match.

    Notes
    -----
    The pattern runs on Polars' Rust engine when :func:`ragbatch.core.regex_compat.translate`
    can express it with exactly the same meaning; otherwise (look-around,
    backreferences, ``$`` before a final newline, ``\\b``, zero-width matches when
    counting, ...) it runs with Python ``re`` row by row. The run manifest records which
    engine ran and why.
    """

    name = "regex"
    inputs = ("answer",)
    Params = RegexParams
    summary = "answer matches `pattern` (any match, or exactly `expected_count` matches)"
    source = "Tonic Validate RegexMetric (count) / Vellum Regex Match (search)"
    policy = (
        ("answer null", "missing_input"),
        ("answer empty", "scored like any string"),
        ("Python re runs past timeout_s on an answer", "timeout"),
    )
    examples = (
        Example({"answer": "Databricks and databricks"}, 1.0, params={"pattern": "(?i)databricks"}),
        Example(
            {"answer": "Databricks and databricks"},
            1.0,
            params={"pattern": "(?i)databricks", "expected_count": 2},
        ),
        Example(
            {"answer": "Databricks"}, 0.0, params={"pattern": "(?i)databricks", "expected_count": 2}
        ),
        Example(
            {"answer": "abc"},
            1.0,
            params={"pattern": "(?<=a)b", "expected_count": 1},
            note="look-behind runs on Python re",
        ),
        Example(
            {"answer": "x\u0301y"},
            1.0,
            params={"pattern": r"\w+", "expected_count": 2},
            note="Python \\w does not match combining marks",
        ),
        Example({"answer": ""}, 0.0, params={"pattern": "a"}),
        Example({}, None, "missing_input", params={"pattern": "a"}),
    )

    @property
    def counting(self) -> bool:
        return self.params.expected_count is not None

    @cached_property
    def translation(self) -> Translation:
        return translate(self.params.pattern, count=self.counting)

    @property
    def regex_engine(self) -> str:
        """``"polars"`` when the pattern translates to Polars' regex dialect, else
        ``"python-re"`` (:mod:`ragbatch.core.regex_compat`)."""
        return "polars" if self.translation.rust_pattern is not None else "python-re"

    def manifest_info(self) -> dict[str, Any]:
        info = super().manifest_info()
        info["regex_engine"] = self.regex_engine
        if self.translation.rust_pattern is None:
            info["regex_fallback_reason"] = self.translation.reason
        return info

    def validate_notes(self) -> list[str]:
        """``["regex runs on polars"]``, or ``["regex runs on python-re (<why the pattern
        does not translate>)"]``."""
        reason = self.translation.reason if self.translation.rust_pattern is None else None
        return [f"regex runs on {self.regex_engine}" + (f" ({reason})" if reason else "")]

    def expression(self) -> pl.Expr:
        rust = self.translation.rust_pattern
        if rust is None:
            return self._python_expression()
        answer = pl.col("answer")
        if not self.counting:
            found = answer.str.contains(rust)
            return cell([missing("answer")], found, reason=pl.when(~found).then(pl.lit("no match")))
        count = answer.str.count_matches(rust)
        passed = count == self.params.expected_count
        reason = pl.format(
            "{} matches, expected {}",
            pl.when(~passed).then(count),
            pl.lit(self.params.expected_count),
        )
        return cell([missing("answer")], passed, reason=reason, details=details_json(count=count))

    def _python_expression(self) -> pl.Expr:
        compiled = re.compile(self.params.pattern)
        expected = self.params.expected_count
        limit = self.params.timeout_s

        def match(answer: str) -> int:
            if expected is None:
                return int(compiled.search(answer) is not None)
            return sum(1 for _ in compiled.finditer(answer))

        def score_rows(rows: list[dict[str, Any]]) -> list[PyCell]:
            found = map_with_time_limit(match, [r["answer"] for r in rows], limit)
            return [_python_cell(n, expected, limit) for n in found]

        return python_cells([missing("answer")], ["answer"], score_rows)


def _python_cell(found: Any, expected: int | None, limit: float) -> PyCell:
    """The cell of one answer matched on Python re: ``found`` is whether it matched (or
    the match count when counting), :data:`TIMED_OUT`, or :class:`Failed`."""
    if found is TIMED_OUT:
        return PyCell(
            None,
            TIMEOUT,
            f"Python re ran past timeout_s={limit:g} s on this answer "
            "(catastrophic backtracking?); rewrite the pattern or raise timeout_s",
        )
    if isinstance(found, Failed):
        return PyCell(None, ERROR, f"Python re failed: {found.message}")
    if expected is None:
        return PyCell(float(found), reason=None if found else "no match")
    return PyCell(
        float(found == expected),
        details={"count": found},
        reason=None if found == expected else f"{found} matches, expected {expected}",
    )
