"""``contains_text``: every given string occurs in the answer."""

from __future__ import annotations

from functools import lru_cache

import polars as pl
from pydantic import Field, field_validator

from ragbatch.scoring.cells import frame_cells, missing
from ragbatch.scoring.base import Example, ExpressionMetric, StrictParams
from ragbatch.scoring.registry import register


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
    case-insensitive, when a string holds ``i``, U+0307, ``σ`` or ``ς``, the rare answers
    holding a character whose lowercase is longer or context-dependent (``İ``, ``Σ``) are
    also lowercased once.
    """

    name = "contains_text"
    inputs = ("answer",)
    Params = ContainsTextParams
    summary = "every given string occurs in the answer"
    source = "Tonic Validate ContainsTextMetric"
    policy = (("answer null", "missing_input"), ("answer empty", "scored: 0.0"))
    examples = (
        Example(
            {"answer": "Use Delta Lake on Databricks"},
            1.0,
            params={"text": ["delta lake", "DATABRICKS"]},
        ),
        Example({"answer": "Use Delta Lake"}, 0.0, params={"text": ["delta", "spark"]}),
        Example(
            {"answer": "Use Delta Lake"}, 0.0, params={"text": "delta", "case_sensitive": True}
        ),
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

    Lowercasing every answer is the costly part (Unicode case mapping, character by
    character), so it is avoided: outside a few characters
    (``_CaseTable.special_pattern``), an answer's lowercase is the concatenation of its
    characters' one-character lowercases,
    so the lowered needle ``l1 l2 ...`` occurs in it exactly where the answer matches the
    pattern ``[all x with lower(x) == l1][all x with lower(x) == l2]...``. Only the
    answers holding a special character (a character with a longer lowercase, or a
    capital sigma, whose lowercase depends on its neighbours) are lowercased and searched
    as before. Both paths use Polars' own case mapping, so they agree on every answer.

    A needle none of whose characters can come out of lowercasing a special character
    (``_CaseTable.special_output``: ``i`` and the combining dot above from ``İ``, ``σ``
    and ``ς`` from ``Σ``) cannot overlap what a special character turns into, so the
    patterns alone are exact for it; when every needle is such, the answers are not
    even scanned for special characters.
    """
    table = _case_table()
    lows = [_lower(needle) for needle in needles]
    lowered = None
    special = None
    # long needles search every answer lowercased (below) and never need this
    if any(table.touches_special(low) for low in lows if len(low) <= MAX_PATTERN_CHARS):
        special = answer.str.contains(table.special_pattern)
    if special is not None and special.any():
        lowered = pl.select(
            pl.when(pl.lit(special)).then(pl.lit(answer)).otherwise(pl.lit("")).str.to_lowercase()
        ).to_series()
    found = []
    all_lowered = None  # every answer lowercased, made once for the long needles
    for low in lows:
        if len(low) > MAX_PATTERN_CHARS:
            # a class per character: Rust's regex size limit is reached near 50,000
            if all_lowered is None:
                all_lowered = answer.str.to_lowercase()
            found.append(all_lowered.str.contains(low, literal=True))
            continue
        hits = answer.str.contains(table.pattern(low))
        if lowered is not None and table.touches_special(low):
            hits = pl.select(
                pl.when(pl.lit(special))
                .then(pl.lit(lowered.str.contains(low, literal=True)))
                .otherwise(pl.lit(hits))
            ).to_series()
        found.append(hits)
    return found


#: Needles longer than this (after lowercasing) are searched in lowercased answers.
MAX_PATTERN_CHARS = 1_000

#: Case mappings are looked up in Unicode planes 0 and 1, where every cased script is;
#: the planes above hold CJK ideographs, tags and private use, none of them cased.
_CASED_PLANES_END = 0x20000


class _CaseTable:
    """The inverse of Polars' lowercase mapping, built once per process (about 0.05 s).

    ``preimages[y]``: every character whose lowercase is the single character ``y``
    (other than ``y`` itself); ``special_pattern``: a regex matching any character whose
    lowercase is not one character or depends on its context (final sigma);
    ``special_output``: every character those lowercases can hold.
    """

    def __init__(self) -> None:
        chars = pl.Series([chr(i) for i in range(_CASED_PLANES_END) if not 0xD800 <= i <= 0xDFFF])
        pairs = pl.DataFrame({"x": chars, "y": chars.str.to_lowercase()}).filter(
            pl.col("x") != pl.col("y")
        )
        self.preimages: dict[str, list[str]] = {}
        special = [_atom("\u03a3")]  # capital sigma: its lowercase depends on its neighbours
        for x, y in pairs.iter_rows():
            if len(y) == 1:
                self.preimages.setdefault(y, []).append(x)
            else:
                special.append(_atom(x))
        self.changed = set(pairs.get_column("x").to_list())
        self.special_pattern = "[" + "".join(special) + "]"
        # every character a special character's lowercase can hold (Σ gives σ or ς)
        self.special_output = {"\u03c3", "\u03c2"}
        for x, y in pairs.iter_rows():
            if len(y) != 1:
                self.special_output.update(y)

    def touches_special(self, lowered: str) -> bool:
        """Whether ``lowered`` (a lowercased needle) holds a character that lowercasing a
        special character can produce; only such needles need the special answers
        lowercased."""
        return not self.special_output.isdisjoint(lowered)

    def pattern(self, lowered: str) -> str:
        """A Rust regex matching, in an answer without special characters, exactly where
        ``lowered`` (an already lowercased needle) occurs in the answer's lowercase."""
        atoms = []
        for y in lowered:
            members = [] if y in self.changed else [y]
            members += self.preimages.get(y, [])
            if not members:
                # no character lowercases to y alone: only special answers can hold it
                return _NEVER
            if len(members) == 1:
                atoms.append(_atom(members[0]))
            else:
                atoms.append("[" + "".join(_atom(m) for m in members) + "]")
        return "".join(atoms)


#: A Rust regex that matches nothing (the complement of every code point).
_NEVER = "[^\\x{0}-\\x{10FFFF}]"


@lru_cache(maxsize=1)
def _case_table() -> _CaseTable:
    return _CaseTable()


def _atom(c: str) -> str:
    """A Rust regex atom matching exactly the character ``c``."""
    return f"\\x{{{ord(c):X}}}"


def _lower(text: str) -> str:
    """Lowercase with Polars so that needles and answers use one mapping."""
    return pl.Series([text]).str.to_lowercase()[0]
