"""The per-row issue notes that normalization writes to ``_issues``, and the Arrow type
tests and value kinds those notes and :mod:`ragbatch.io.schema` use.

:class:`Issues` collects the notes of one table; :func:`kind` names a Python value's JSON
kind in a note ("string", "int", "object", ...).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ragbatch.core import columns as C
from ragbatch.core.reasons import quote

#: ``list<string>``, the type of normalized contexts.
LIST_OF_STRINGS = pa.list_(pa.string())


def is_text(t: pa.DataType) -> bool:
    """Whether ``t`` is a string type (``string``, ``large_string``, ``string_view``, or a
    dictionary of one)."""
    if pa.types.is_dictionary(t):
        return is_text(t.value_type)
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def is_list(t: pa.DataType) -> bool:
    """Whether ``t`` is any Arrow list type (list, large, fixed-size, or a list view)."""
    return (
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
        or pa.types.is_list_view(t)
        or pa.types.is_large_list_view(t)
    )


def is_number(t: pa.DataType) -> bool:
    """Whether ``t`` is an integer, floating-point or decimal type."""
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def kind(value: Any) -> str:
    """The JSON kind of a decoded value as a note names it: ``"bool"``, ``"int"``,
    ``"float"``, ``"string"``, ``"list"``, ``"object"``, else the Python type's name."""
    if isinstance(value, bool):
        return "bool"
    names = {int: "int", float: "float", str: "string", list: "list", dict: "object"}
    return names.get(type(value), type(value).__name__)


class Issues:
    """Per-row issue notes for the nullable canonical columns, built lazily.

    ``quote_values`` false (runs with PII metrics): a note never shows the value it is
    about (:func:`ragbatch.core.reasons.quote`).
    """

    def __init__(self, n: int, quote_values: bool = True, with_ranking: bool = False):
        self.n = n
        self.quote_values = quote_values
        self.notes: dict[str, list[str | None]] = {}
        self.type = C.RANKING_ISSUES_TYPE if with_ranking else C.ISSUES_TYPE

    def preview(self, value: Any) -> str:
        """``value`` as a note may show it (see the class docstring)."""
        return quote(value, self.quote_values)

    def add(self, column: str, row: int, message: str) -> None:
        self.notes.setdefault(column, [None] * self.n)[row] = message

    def to_array(self) -> pa.StructArray:
        arrays = [
            pa.array(self.notes[name], pa.string())
            if name in self.notes
            else pa.nulls(self.n, pa.string())
            for name in (f.name for f in self.type)
        ]
        return pa.StructArray.from_arrays(arrays, fields=list(self.type))


def mask(n: int, rows: set[int]) -> pa.Array:
    """A ``bool`` array of length ``n``, true at the positions in ``rows``."""
    return pa.array([i in rows for i in range(n)], pa.bool_())


def blank_rows(array: pa.Array, rows: set[int]) -> pa.Array:
    """``array`` with the positions in ``rows`` set to null (same type and length)."""
    if not rows:
        return array
    return pc.if_else(mask(len(array), rows), pa.scalar(None, array.type), array)
