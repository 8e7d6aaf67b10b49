"""Normalize the ranking columns: ``context_ids``, ``relevant_ids`` and ``relevance``.

:func:`ragbatch.io.schema.normalize` calls these for a job that maps one of them
(:func:`ragbatch.core.columns.ranking_mapped`). As everywhere in normalization, no row is
dropped and nothing is cast silently: a value that cannot be used becomes null and the
row's ``_issues`` field for that column says why (``"<column>: <what was wrong>"``); the
ranking metrics then report ``missing_input`` with that reason.

Accepted input
--------------
``context_ids``, ``relevant_ids`` (Arrow type ``list<string>`` after normalization):

* a list column of strings or integers (any width); integers become their decimal text,
  so ``7`` and ``"7"`` are the same id;
* a string column holding a JSON list of strings and integers (``'["d1", 7]'``), as a
  CSV cell or a mixed JSON-lines column gives.

Null items stay null items (in a ranking they take their rank and are never relevant).
Items of any other kind (floats, booleans, objects, nested lists) make the whole value
null with an issue naming the item: ``1.0`` is not taken for the id ``"1"``.

``relevance`` (Arrow type :data:`ragbatch.core.columns.RELEVANCE_TYPE`,
``list<struct<id: string, grade: float64>>``, a list because Polars handles lists of
structs natively and has no map type):

* a map column ``map<string | integer, number>``;
* a list column of structs with fields ``id`` (string or integer) and ``grade`` (number);
* a struct column whose field names are the ids (a Parquet struct); a null field
  counts as an id not judged;
* a string column holding a JSON object ``{"d1": 2, "d7": 1}`` or a JSON list of
  ``{"id": ..., "grade": ...}`` objects. JSON (lines) input keeps the objects of this
  column as such text (:func:`ragbatch.io.read.objects_as_text`): as a struct, every
  row would hold a field for every id of the file.

A value with an id given twice, a null id, or a grade that is null, not a number (a
boolean, a string) or not finite becomes null with an issue.

``context_ids`` and ``contexts`` are aligned (item ``i`` of one is item ``i`` of the
other) when both are mapped: a row where both are lists of different lengths gets null
``context_ids`` with an issue saying both lengths.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ragbatch.core import columns as C
from ragbatch.io.issues import is_number, is_text

_IDS_TYPE = pa.list_(pa.string())

#: What a value of each ranking column may be, for messages.
_EXPECTED = {
    C.CONTEXT_IDS: "a list of string or integer ids, or a JSON list in a string column",
    C.RELEVANT_IDS: "a list of string or integer ids, or a JSON list in a string column",
    C.RELEVANCE: (
        "a map id -> grade, a list of {id, grade} structs, or a JSON object "
        '({"d1": 2}) in a string column'
    ),
}


def _list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _id_type(t: pa.DataType) -> bool:
    return is_text(t) or pa.types.is_integer(t) or pa.types.is_null(t)


def _grade_type(t: pa.DataType) -> bool:
    return is_number(t) or pa.types.is_null(t)


def type_problem(canonical: str, t: pa.DataType) -> str | None:
    """Why a column of Arrow type ``t`` cannot feed the ranking column ``canonical``
    (one of :data:`ragbatch.core.columns.RANKING`), or None when it can.

    The message starts after "column 'x' " and ends with the fix, as
    :func:`ragbatch.io.schema.check_columns` prints it.
    """
    if pa.types.is_null(t) or is_text(t):
        return None
    if canonical == C.RELEVANCE:
        if pa.types.is_map(t) and _id_type(t.key_type) and _grade_type(t.item_type):
            return None
        if _list(t) and _usable_entries(t.value_type):
            return None
        if pa.types.is_struct(t) and all(_grade_type(t.field(i).type) for i in range(t.num_fields)):
            return None
    elif _list(t) and _id_type(t.value_type):
        return None
    return (
        f"has type {t}; {canonical} needs {_EXPECTED[canonical]}: map a column of that "
        "kind or convert this one"
    )


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    names = {
        float: "a float",
        list: "a list",
        dict: "an object",
        str: "a string",
        int: "an integer",
    }
    return names.get(type(value), type(value).__name__)


# --------------------------------------------------------------------------- ids


def ids(column: str, source: pa.Array, marked: set[int], issues: Any) -> pa.Array:
    """``list<string>`` ids for ``context_ids`` or ``relevant_ids`` (see the module doc).

    ``marked``: rows of a JSON-lines string column whose value was not a JSON string
    (:data:`ragbatch.io.read.NONSTRING_COLUMN`); their text is JSON either way.
    """
    del marked  # a string value is parsed as JSON whether it was marked or not
    n, t = len(source), source.type
    if pa.types.is_null(t):
        return pa.nulls(n, _IDS_TYPE)
    if _list(t) and _id_type(t.value_type):
        return pc.cast(source, _IDS_TYPE)
    if is_text(t):
        values = pc.cast(source, pa.string()).to_pylist()
        rows = [None if v is None else _parse_ids(column, v, issues.preview) for v in values]
    else:
        rows = [
            None if v is None else _check_ids(column, v, issues.preview) for v in source.to_pylist()
        ]
    out: list[list[str | None] | None] = []
    for row, result in enumerate(rows):
        got, problem = result if result is not None else (None, None)
        if problem:
            issues.add(column, row, problem)
        out.append(got)
    return pa.array(out, _IDS_TYPE)


Parsed = tuple[Any, str | None]


def _parse_ids(column: str, text: str, preview: Any) -> Parsed:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # ValueError: also integers of > 4300 digits
        return None, f"{column}: not a JSON list of ids: {preview(text)}"
    if not isinstance(value, list):
        return None, f"{column}: expected a JSON list of ids, got {_kind(value)} ({preview(value)})"
    return _check_ids(column, value, preview)


def _check_ids(column: str, values: Any, preview: Any) -> Parsed:
    if not isinstance(values, list):
        return None, f"{column}: expected a list of ids, got {_kind(values)} ({preview(values)})"
    out: list[str | None] = []
    for index, item in enumerate(values):
        if item is None or isinstance(item, str):
            out.append(item)
        elif isinstance(item, int) and not isinstance(item, bool):
            out.append(str(item))
        else:
            return None, (
                f"{column}: item {index} is {_kind(item)} ({preview(item)}); ids must be "
                "strings or integers"
            )
    return out, None


def align(context_ids: pa.Array, contexts: pa.Array, issues: Any) -> pa.Array:
    """``context_ids`` with null where it and ``contexts`` are both lists of different
    lengths, each such row noted in ``issues``."""
    if len(context_ids) == 0:
        return context_ids
    n_ids = pc.list_value_length(context_ids)
    n_contexts = pc.list_value_length(contexts)
    bad = pc.fill_null(pc.not_equal(n_ids, n_contexts), False)
    if not pc.any(bad).as_py():
        return context_ids
    rows = pc.indices_nonzero(bad).to_pylist()
    for row in rows:
        issues.add(
            C.CONTEXT_IDS,
            row,
            f"context_ids: {n_ids[row].as_py()} ids for {n_contexts[row].as_py()} contexts; "
            "they must align, one id per context in the same order",
        )
    return pc.if_else(bad, pa.scalar(None, _IDS_TYPE), context_ids)


# --------------------------------------------------------------------------- relevance


def relevance(source: pa.Array, marked: set[int], issues: Any) -> pa.Array:
    """:data:`ragbatch.core.columns.RELEVANCE_TYPE` grades (see the module doc)."""
    del marked  # a string value is parsed as JSON whether it was marked or not
    n, t = len(source), source.type
    if pa.types.is_null(t):
        return pa.nulls(n, C.RELEVANCE_TYPE)
    fast = _relevance_arrow(source)
    if fast is not None:
        return _reject_bad_entries(fast, issues)
    if is_text(t):
        values = pc.cast(source, pa.string()).to_pylist()
        rows = [None if v is None else _parse_relevance(v, issues.preview) for v in values]
    else:  # a struct column whose fields are ids, or a type validate refuses
        rows = [None if v is None else _pairs(v, issues.preview) for v in source.to_pylist()]
    out: list[list[dict[str, Any]] | None] = []
    for row, result in enumerate(rows):
        got, problem = result if result is not None else (None, None)
        if problem:
            issues.add(C.RELEVANCE, row, problem)
        out.append(got)
    return _reject_bad_entries(pa.array(out, C.RELEVANCE_TYPE), issues)


def _usable_entries(t: pa.DataType) -> bool:
    """Whether ``t`` is a struct with an ``id`` of an id type and a ``grade`` of a number
    type (others go through :func:`_pairs`, which names what is wrong)."""
    if not pa.types.is_struct(t) or t.get_field_index("id") < 0 or t.get_field_index("grade") < 0:
        return False
    return _id_type(t.field("id").type) and _grade_type(t.field("grade").type)


def _relevance_arrow(source: pa.Array) -> pa.Array | None:
    """A map or list<struct<id, grade>> column as :data:`RELEVANCE_TYPE` without Python;
    None for any other type."""
    t = source.type
    if pa.types.is_map(t) and _id_type(t.key_type) and _grade_type(t.item_type):
        source = pa.concat_arrays([source])
        keys = pc.cast(source.keys, pa.string())
        grades = pc.cast(source.items, pa.float64())
    elif _list(t) and _usable_entries(t.value_type):
        try:
            source = pa.concat_arrays([pc.cast(source, pa.list_(t.value_type))])
            keys = pc.cast(pc.struct_field(source.values, "id"), pa.string())
            grades = pc.cast(pc.struct_field(source.values, "grade"), pa.float64())
        except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
    else:
        return None
    entries = pa.StructArray.from_arrays([keys, grades], fields=list(C.RELEVANCE_TYPE.value_type))
    return pa.ListArray.from_arrays(source.offsets, entries, mask=source.is_null())


def _parse_relevance(text: str, preview: Any) -> Parsed:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # ValueError: also integers of > 4300 digits
        return None, f"relevance: not a JSON object of id -> grade: {preview(text)}"
    return _pairs(value, preview)


def _pairs(value: Any, preview: Any) -> Parsed:
    """``{id: grade}`` or ``[{"id": .., "grade": ..}, ...]`` as a list of entries."""
    if isinstance(value, dict):
        # a struct column's null fields are ids the row does not judge
        items = [(k, v) for k, v in value.items() if v is not None]
    elif isinstance(value, list):
        items = []
        for index, entry in enumerate(value):
            if not isinstance(entry, dict) or "id" not in entry or "grade" not in entry:
                return None, (
                    f"relevance: item {index} is {preview(entry)}; list items must be "
                    'objects {"id": ..., "grade": ...}'
                )
            items.append((entry["id"], entry["grade"]))
    else:
        return None, (
            f"relevance: expected an object of id -> grade, got {_kind(value)} ({preview(value)})"
        )
    out = []
    for key, grade in items:
        if isinstance(key, int) and not isinstance(key, bool):
            key = str(key)
        if key is not None and not isinstance(key, str):
            return (
                None,
                f"relevance: id {preview(key)} is {_kind(key)}; ids must be strings or integers",
            )
        if grade is not None and (isinstance(grade, bool) or not isinstance(grade, (int, float))):
            return None, (
                f"relevance: the grade of {preview(key)} is {_kind(grade)} ({preview(grade)}); "
                "grades must be numbers"
            )
        # a null id or grade is left for _reject_bad_entries, as in the other forms
        out.append({"id": key, "grade": None if grade is None else _float(grade)})
    return out, None


def _float(grade: int | float) -> float:
    """``grade`` as a float; an integer past the float64 range (JSON allows any number
    of digits) becomes infinite, which :func:`_reject_bad_entries` refuses."""
    try:
        return float(grade)
    except OverflowError:
        return math.inf if grade > 0 else -math.inf


def _reject_bad_entries(values: pa.Array, issues: Any) -> pa.Array:
    """``values`` with null where an entry has a null id, a null or non-finite grade, or
    an id given twice; each such row noted in ``issues``."""
    import polars as pl  # imported here: reading the input needs it only for this column

    frame = pl.DataFrame({"r": pl.from_arrow(values)})
    entries = pl.col("r").list
    checks = frame.select(
        null_id=entries.eval(pl.element().struct.field("id").is_null()).list.any(),
        bad_grade=entries.eval(
            ~pl.element().struct.field("grade").is_finite().fill_null(False)
        ).list.any(),
        repeated=entries.eval(pl.element().struct.field("id")).list.n_unique() != entries.len(),
    )
    problems = {
        "null_id": "relevance: an entry has a null id",
        "bad_grade": "relevance: a grade is null, NaN or infinite; grades must be finite numbers",
        "repeated": "relevance: an id is given more than once",
    }
    bad: np.ndarray = np.zeros(len(values), dtype=bool)
    for name, message in problems.items():
        flags = checks.get_column(name).fill_null(False).to_numpy()
        for row in np.flatnonzero(flags & ~bad):
            issues.add(C.RELEVANCE, int(row), _with_example(message, values[int(row)], issues))
        bad |= flags
    if not bad.any():
        return values
    return pc.if_else(pa.array(bad), pa.scalar(None, C.RELEVANCE_TYPE), values)


def _with_example(message: str, value: pa.Scalar, issues: Any) -> str:
    entries = value.as_py() or []
    shown = {e["id"]: e["grade"] for e in entries[:5]}
    shown_text = json.dumps(shown, ensure_ascii=False)
    return f"{message} ({issues.preview(shown_text)})"
