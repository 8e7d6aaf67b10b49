"""Decide whether a Python ``re`` pattern can run on Polars' regex engine.

The ``regex`` metric is defined by Python's ``re`` module. Polars evaluates
patterns with the Rust ``regex`` crate, which is much faster on large columns
but disagrees with ``re`` on a number of details (what ``\\w``, ``\\s`` and
case folding cover, ``$`` before a trailing newline, empty-match iteration,
set syntax inside ``[...]``, look-around, ...).

This module rebuilds a pattern from Python's own parse tree so that syntax
quirks are settled by Python. Every single-character matcher is replaced by an
explicit list of the code points Python accepts for it, found by running
Python itself over every code point. Constructs whose meaning cannot be
reproduced exactly make the translation give up, and the caller then uses
Python ``re``.
"""

from __future__ import annotations

import functools
import re
import warnings
from dataclasses import dataclass

import polars as pl

try:
    from re import _constants as C  # type: ignore[attr-defined]  # not in typeshed
    from re import _parser as P  # type: ignore[attr-defined]
except ImportError:  # Python 3.10 keeps the parser under its old names.
    import sre_constants as C
    import sre_parse as P

__all__ = ["Translation", "translate"]

_SURROGATE_LO = 0xD800
_SURROGATE_HI = 0xDFFF
_SURROGATE_COUNT = _SURROGATE_HI - _SURROGATE_LO + 1
_MAX_CODE_POINT = 0x10FFFF

# A class with no members that Rust accepts: the complement of everything.
_EMPTY_CLASS = r"[^\x{0}-\x{10FFFF}]"

# Flags that change what a one-character matcher accepts.
_CHAR_FLAGS = re.IGNORECASE | re.ASCII

# Flags that choose between ASCII and Unicode character categories.
_TYPE_FLAGS = re.ASCII | re.UNICODE | re.LOCALE

_CATEGORY_ESCAPES = {
    C.CATEGORY_DIGIT: r"\d",
    C.CATEGORY_NOT_DIGIT: r"\D",
    C.CATEGORY_SPACE: r"\s",
    C.CATEGORY_NOT_SPACE: r"\S",
    C.CATEGORY_WORD: r"\w",
    C.CATEGORY_NOT_WORD: r"\W",
}

_ENGINE = "Polars' regex engine"

_UNSUPPORTED_NODE_NAMES = {
    "GROUPREF": "backreferences (\\1, (?P=name))",
    "GROUPREF_EXISTS": "conditionals (?(group)yes|no)",
    "ATOMIC_GROUP": "atomic groups (?>...)",
    "POSSESSIVE_REPEAT": "possessive quantifiers (*+, ++, ?+, {m,n}+)",
}
# Atomic groups and possessive quantifiers only exist from Python 3.11 on.
_UNSUPPORTED_NODES = {
    getattr(C, name): f"{what} are not supported by {_ENGINE}"
    for name, what in _UNSUPPORTED_NODE_NAMES.items()
    if hasattr(C, name)
}

_LOOKAROUND_NAMES = {
    (C.ASSERT, 1): "look-ahead (?=...)",
    (C.ASSERT, -1): "look-behind (?<=...)",
    (C.ASSERT_NOT, 1): "negative look-ahead (?!...)",
    (C.ASSERT_NOT, -1): "negative look-behind (?<!...)",
}

_BOUNDARY_REASON = (
    "word boundaries (\\b, \\B) depend on each engine's own \\w, and Rust's "
    "\\w differs from Python's (e.g. combining marks)"
)
_DOLLAR_REASON = (
    "'$' without MULTILINE also matches just before a final newline in Python but not in " + _ENGINE
)
_SCOPED_TYPE_REASON = (
    "a scoped (?a:...) or (?u:...) group: Python checks the first character "
    "of a match partly under the pattern's global flags, so such a group's "
    "meaning depends on where it stands"
)
_TOO_DEEP_REASON = "pattern nests too deeply to translate"
_LOCALE_REASON = "the LOCALE flag has no equivalent in " + _ENGINE
_EMPTY_MATCH_REASON = (
    "pattern can match the empty string; Python and Polars iterate over "
    "empty matches differently, so match counts can differ"
)
_EMPTY_LOOP_REASON = (
    "a repeated part can match the empty string; Python and Polars prefer "
    "different match ends there, so match counts can differ"
)


@dataclass(frozen=True)
class Translation:
    """Outcome of translating one Python pattern for Polars.

    Attributes
    ----------
    python_pattern : str
        The pattern as given (Python ``re`` syntax).
    rust_pattern : str or None
        A pattern for Polars with exactly the same meaning, or ``None`` when
        no such pattern could be produced.
    reason : str or None
        Why ``rust_pattern`` is ``None``; ``None`` when it is set.
    """

    python_pattern: str
    rust_pattern: str | None
    reason: str | None


class _Unsupported(Exception):
    """Raised while walking the tree when a construct cannot be translated."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def translate(pattern: str, *, count: bool) -> Translation:
    """Translate a Python ``re`` pattern into an equivalent Polars pattern.

    The reference semantics are Python's ``re`` module. With ``count=True``
    the translation must reproduce ``len(re.findall(pattern, s))`` through
    ``Series.str.count_matches``; with ``count=False`` it must reproduce
    ``re.search(pattern, s) is not None`` through ``Series.str.contains``,
    for every string ``s``.

    Parameters
    ----------
    pattern : str
        A pattern in Python ``re`` syntax (inline flags allowed).
    count : bool
        ``True`` when matches will be counted, ``False`` when only the
        presence of a match matters.

    Returns
    -------
    Translation
        ``rust_pattern`` holds the Polars pattern when one with exactly the
        same meaning exists. Otherwise it is ``None`` and ``reason`` says
        why; the caller should then evaluate the pattern with Python ``re``.
        Fallback happens for look-around, backreferences, conditionals,
        atomic groups, possessive quantifiers, ``\\b``/``\\B``, ``$``
        without MULTILINE, the LOCALE flag, and scoped ``(?a:...)`` or
        ``(?u:...)`` groups that switch between ASCII and Unicode classes.
        When ``count`` is true it also happens for patterns that can match
        the empty string and for patterns that repeat a part which can
        match the empty string. Finally it happens when Polars refuses the
        translated pattern (for example its compiled-size limit).

    Raises
    ------
    re.error
        If Python cannot compile ``pattern``.

    Notes
    -----
    Each distinct single-character matcher (literal under IGNORECASE,
    ``[...]``, ``.``, ``\\d``, ``\\w``, ...) is resolved by running Python's
    matcher over all ~1.1 million code points and listing the accepted ones
    as ranges. That costs a few tens of milliseconds per distinct matcher and
    flag combination, plus about 0.2 s once to build the string of all code
    points; results are cached for the life of the process.
    """
    re.compile(pattern)
    tree = _parse(pattern)
    try:
        rust = _emit_sequence(tree, tree.state.flags, count)
    except _Unsupported as exc:
        return Translation(pattern, None, exc.reason)
    except RecursionError:
        return Translation(pattern, None, _TOO_DEEP_REASON)
    if count and tree.getwidth()[0] == 0:
        return Translation(pattern, None, _EMPTY_MATCH_REASON)
    problem = _polars_problem(rust, count)
    if problem is not None:
        return Translation(pattern, None, problem)
    return Translation(pattern, rust, None)


def _parse(pattern: str) -> P.SubPattern:
    # re.compile above already showed any warnings to the user; parsing the
    # same text again would only repeat them.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return P.parse(pattern)


def _polars_problem(rust: str, count: bool) -> str | None:
    """Return why Polars refuses ``rust`` for the given mode, or None."""
    probe = pl.Series([""], dtype=pl.String).str
    try:
        if count:
            probe.count_matches(rust)
        else:
            probe.contains(rust)
    except (Exception, pl.exceptions.PanicException) as exc:
        text = " ".join(str(exc).split("This error occurred")[0].split())
        return f"Polars rejected the translated pattern: {text}"
    return None


# ---------------------------------------------------------------------------
# Walking the parse tree


def _emit_sequence(items, flags: int, count: bool) -> str:
    return "".join(_emit_node(op, av, flags, count) for op, av in items)


def _emit_node(op, av, flags: int, count: bool) -> str:
    if op in (C.LITERAL, C.NOT_LITERAL, C.ANY, C.IN, C.CATEGORY):
        return _emit_char(op, av, flags)
    if op is C.SUBPATTERN:
        return _emit_group(av, flags, count)
    if op is C.BRANCH:
        branches = (_emit_sequence(b, flags, count) for b in av[1])
        return "(?:" + "|".join(branches) + ")"
    if op in (C.MAX_REPEAT, C.MIN_REPEAT):
        return _emit_repeat(op, av, flags, count)
    if op is C.AT:
        return _emit_anchor(av, flags)
    if op in (C.ASSERT, C.ASSERT_NOT):
        name = _LOOKAROUND_NAMES[(op, av[0])]
        raise _Unsupported(f"{name} is not supported by {_ENGINE}")
    if op in _UNSUPPORTED_NODES:
        raise _Unsupported(_UNSUPPORTED_NODES[op])
    raise _Unsupported(f"the construct {op} is not handled by the translator")


def _emit_group(av, flags: int, count: bool) -> str:
    _group, add_flags, del_flags, body = av
    if add_flags & re.LOCALE:
        raise _Unsupported(_LOCALE_REASON)
    scoped_type = add_flags & _TYPE_FLAGS
    if scoped_type and scoped_type != flags & _TYPE_FLAGS:
        raise _Unsupported(_SCOPED_TYPE_REASON)
    inner = (flags | add_flags) & ~del_flags
    # Capturing or not makes no difference to counting or searching.
    return "(?:" + _emit_sequence(body, inner, count) + ")"


def _emit_repeat(op, av, flags: int, count: bool) -> str:
    low, high, body = av
    if count and high > 1 and body.getwidth()[0] == 0:
        raise _Unsupported(_EMPTY_LOOP_REASON)
    quantifier = _quantifier(low, high)
    if op is C.MIN_REPEAT:
        quantifier += "?"
    return "(?:" + _emit_sequence(body, flags, count) + ")" + quantifier


def _quantifier(low: int, high: int) -> str:
    if high == C.MAXREPEAT:
        return {0: "*", 1: "+"}.get(low, "{%d,}" % low)
    if (low, high) == (0, 1):
        return "?"
    if low == high:
        return "{%d}" % low
    return "{%d,%d}" % (low, high)


def _emit_anchor(code, flags: int) -> str:
    multiline = bool(flags & re.MULTILINE)
    if code is C.AT_BEGINNING_STRING:
        return r"\A"
    if code is C.AT_END_STRING:
        return r"\z"
    if code is C.AT_BEGINNING:
        return "(?m:^)" if multiline else "^"
    if code is C.AT_END:
        if multiline:
            return "(?m:$)"
        raise _Unsupported(_DOLLAR_REASON)
    if code in (C.AT_BOUNDARY, C.AT_NON_BOUNDARY):
        raise _Unsupported(_BOUNDARY_REASON)
    raise _Unsupported(f"the anchor {code} is not handled by the translator")


# ---------------------------------------------------------------------------
# Single-character matchers


def _emit_char(op, av, flags: int) -> str:
    if flags & re.LOCALE:
        raise _Unsupported(_LOCALE_REASON)
    ignore_case = bool(flags & re.IGNORECASE)
    if op is C.LITERAL and not ignore_case:
        return _rust_char(av)
    if op is C.ANY:
        # Only DOTALL changes what '.' accepts.
        key_flags = flags & re.DOTALL
    else:
        key_flags = flags & _CHAR_FLAGS
    ranges = _code_point_ranges(_python_char_pattern(op, av), key_flags)
    return _rust_class(ranges)


def _python_char_pattern(op, av) -> str:
    """Write one parsed single-character matcher back as Python syntax."""
    if op is C.LITERAL:
        return _python_char(av)
    if op is C.NOT_LITERAL:
        return "[^" + _python_char(av) + "]"
    if op is C.ANY:
        return "."
    if op is C.CATEGORY:
        return _CATEGORY_ESCAPES[av]
    return "[" + "".join(_python_set_item(kind, value) for kind, value in av) + "]"


def _python_set_item(kind, value) -> str:
    if kind is C.NEGATE:
        return "^"
    if kind is C.LITERAL:
        return _python_char(value)
    if kind is C.RANGE:
        return _python_char(value[0]) + "-" + _python_char(value[1])
    if kind is C.CATEGORY:
        return _CATEGORY_ESCAPES[value]
    raise _Unsupported(f"the class item {kind} is not handled by the translator")


def _python_char(code_point: int) -> str:
    return "\\U%08x" % code_point


def _rust_char(code_point: int) -> str:
    return "\\x{%X}" % code_point


def _rust_class(ranges: tuple[tuple[int, int], ...]) -> str:
    if not ranges:
        return _EMPTY_CLASS
    parts = []
    for low, high in ranges:
        parts.append(_rust_char(low))
        if high != low:
            parts.append("-" + _rust_char(high))
    return "[" + "".join(parts) + "]"


@functools.lru_cache(maxsize=None)
def _code_point_ranges(python_pattern: str, flags: int) -> tuple[tuple[int, int], ...]:
    """Code point ranges that Python's one-character ``python_pattern`` accepts.

    The universe string lists every code point in order, so a maximal run of
    accepted characters is a contiguous range of code points, except where
    the run crosses the removed surrogate block.
    """
    runs = re.compile("(?:" + python_pattern + ")+", flags)
    ranges = []
    for match in runs.finditer(_universe()):
        ranges.extend(_positions_to_ranges(match.start(), match.end()))
    return tuple(ranges)


def _positions_to_ranges(start: int, end: int) -> list[tuple[int, int]]:
    """Turn a run ``[start, end)`` of universe positions into code point ranges."""
    pieces = [(start, end)]
    if start < _SURROGATE_LO < end:
        pieces = [(start, _SURROGATE_LO), (_SURROGATE_LO, end)]
    return [(_code_point_at(s), _code_point_at(e - 1)) for s, e in pieces]


def _code_point_at(position: int) -> int:
    if position < _SURROGATE_LO:
        return position
    return position + _SURROGATE_COUNT


@functools.lru_cache(maxsize=1)
def _universe() -> str:
    """One string holding every code point except surrogates, in order."""
    below = range(_SURROGATE_LO)
    above = range(_SURROGATE_HI + 1, _MAX_CODE_POINT + 1)
    return "".join(map(chr, below)) + "".join(map(chr, above))
