"""Map raw input columns onto the canonical schema.

:func:`normalize` turns one raw table from :func:`ragbatch.io.read.read_task` into
:data:`ragbatch.core.columns.CANONICAL_SCHEMA` followed by the slice columns. It never drops or
reorders rows and never casts silently: a value of the wrong kind becomes null and the
row's ``_issues`` struct says why, in the form ``"<column>: <what was wrong>"``.

Contexts formats (``input.contexts_format``)
--------------------------------------------
=========  ==============================================================================
``list``   an Arrow list column of strings, or of objects (take ``input.contexts_field``)
``json``   each value is a JSON-encoded list; string items are kept, object items give
           their text field; a JSON string gives a one-element list
``text``   the whole value is one context: ``[value]``
``delimited``  the value split on ``input.contexts_delimiter`` (kept as written, not
           stripped); empty pieces (an empty value, a leading, trailing or doubled
           delimiter) are dropped, so ``""`` gives ``[]``
``auto``   a list column is ``list``; a string whose stripped text starts with ``[`` and
           parses as a JSON list is ``json``; any other string is ``text``
=========  ==============================================================================

In every format a null value gives null contexts (no issue), ``"[]"`` gives an empty list,
and null items inside a list stay null items. Object items use ``input.contexts_field``,
or when it is unset the first of :data:`CONTEXT_TEXT_FIELDS` that the object has with a
non-null value (an object whose candidate keys are all null gives a null item; one with
none of them is an issue). An Arrow list column is used as a list whatever the format says.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Sequence
from typing import Any, Callable, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from ragbatch.core import columns as C
from ragbatch.io import ranking
from ragbatch.config.job import InputSection
from ragbatch.core.errors import InputError
from ragbatch.core.reasons import quote
from ragbatch.io.names import unusable_names
from ragbatch.io.read import NONSTRING_COLUMN, ReadTask

#: Object keys tried, in order, for a context's text when ``input.contexts_field`` is unset.
CONTEXT_TEXT_FIELDS: tuple[str, ...] = (
    "text",
    "content",
    "page_content",
    "excerpt",
    "chunk",
    "document",
)

_TEXT_COLUMNS = (C.QUESTION, C.ANSWER, C.REFERENCE)
_LIST_OF_STRINGS = pa.list_(pa.string())
_NUMBER = r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$"


# --------------------------------------------------------------------------- type helpers


def _is_text(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        return _is_text(t.value_type)
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _is_list(t: pa.DataType) -> bool:
    return (
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
        or pa.types.is_list_view(t)
        or pa.types.is_large_list_view(t)
    )


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    names = {int: "int", float: "float", str: "string", list: "list", dict: "object"}
    return names.get(type(value), type(value).__name__)


def _text_fields(names: list[str], configured: str | None) -> list[str]:
    """The keys an object's text may come from, in order of preference (empty: none)."""
    if configured is not None:
        return [configured] if configured in names else []
    return [k for k in CONTEXT_TEXT_FIELDS if k in names]


# --------------------------------------------------------------------------- config checks


def check_columns(cfg: InputSection, schema: pa.Schema) -> list[str]:
    """Problems between the column mapping and the input schema.

    Parameters
    ----------
    cfg : InputSection
    schema : pyarrow.Schema
        Usually :func:`ragbatch.io.read.peek_schema`.

    Returns
    -------
    list of str
        One message per problem, ``"input.<field>: ..."``, empty when fine: a mapped or
        ``slice_columns`` column that does not exist (the message lists the columns that
        do, with a near-miss suggestion), or a mapped column whose type can never give a
        value (text mapped to numbers, contexts to numbers or to objects without a text
        field, latency to booleans, row ids to nested values, ``contexts_format: list``
        on a string column), or a used column whose name is empty, only whitespace or
        given twice (:func:`ragbatch.io.names.unusable_names`).
    """
    names = [n for n in schema.names if n != NONSTRING_COLUMN]
    if not names:
        return [
            f"input.uri: {cfg.uri} has no columns at all (an empty file: 0 bytes, or no "
            "header line); check that it is the file you meant and that it was written completely"
        ]
    problems: list[str] = []
    for canonical in C.CANONICAL:
        column = getattr(cfg.columns, canonical)
        if column is None:
            continue
        if column not in names:
            problems.append(f"input.columns.{canonical}: {_missing(column, names)}")
            continue
        if names.count(column) > 1:
            continue  # ambiguous: unusable_names says so below
        why = _type_problem(canonical, schema.field(column).type, cfg)
        if why:
            problems.append(f"input.columns.{canonical}: column {column!r} {why}")
    for column in cfg.slice_columns or []:
        if column not in names:
            problems.append(f"input.slice_columns: {_missing(column, names)}")
    mapped = [getattr(cfg.columns, c) for c in C.CANONICAL if getattr(cfg.columns, c) is not None]
    used = mapped + [source for source, _ in slice_columns(cfg, schema)]
    return problems + unusable_names(names, used)


def _missing(column: str, names: list[str]) -> str:
    close = difflib.get_close_matches(column, names, n=3, cutoff=0.6)
    hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
    listed = ", ".join(repr(n) for n in names) or "none"
    return f"column {column!r} does not exist in the input{hint}; the input has: {listed}"


def _type_problem(canonical: str, t: pa.DataType, cfg: InputSection) -> str | None:
    if canonical in C.RANKING:
        return ranking.type_problem(canonical, t)
    if canonical == C.ROW_ID:
        if pa.types.is_nested(t) or pa.types.is_null(t):
            return f"has type {t}; row ids need strings or integers"
        return None
    if canonical in _TEXT_COLUMNS:
        if _is_text(t) or pa.types.is_null(t):
            return None
        return f"has type {t}, so every {canonical} would be null; map a column of strings"
    if canonical == C.LATENCY_S:
        if _is_number(t) or _is_text(t) or pa.types.is_null(t) or pa.types.is_duration(t):
            return None
        return f"has type {t}; latency needs numbers (or numeric strings)"
    return _contexts_type_problem(t, cfg)


def _contexts_type_problem(t: pa.DataType, cfg: InputSection) -> str | None:
    if pa.types.is_null(t):
        return None
    if _is_text(t):
        if cfg.contexts_format == "list":
            return (
                f"has type {t} but input.contexts_format is 'list'; use 'auto', 'json' "
                "(JSON-encoded lists) or 'text' (one context per value)"
            )
        return None
    if not _is_list(t):
        return f"has type {t}; contexts need a list of strings, a JSON-encoded list or a string"
    item = t.value_type
    if _is_text(item) or pa.types.is_null(item):
        return None
    if pa.types.is_struct(item):
        keys = [item.field(i).name for i in range(item.num_fields)]
        fields = _text_fields(keys, cfg.contexts_field)
        if not fields:
            wanted = (
                repr(cfg.contexts_field)
                if cfg.contexts_field
                else "any of " + ", ".join(CONTEXT_TEXT_FIELDS)
            )
            return (
                f"holds objects without {wanted} (their fields: {', '.join(keys)}); set "
                "input.contexts_field to the field holding the text"
            )
        for field in fields:
            field_type = item.field(field).type
            if not (_is_text(field_type) or pa.types.is_null(field_type)):
                return f"holds objects whose {field!r} has type {field_type}, not string"
        return None
    return f"has type {t}; contexts need a list of strings or of objects with a text field"


def slice_columns(
    cfg: InputSection, schema: pa.Schema, extra: Sequence[str] = ()
) -> list[tuple[str, str]]:
    """The input columns that pass through, with their output names.

    Parameters
    ----------
    cfg : InputSection
    schema : pyarrow.Schema
    extra : sequence of str
        Columns that pass through even when ``cfg.slice_columns`` leaves them out (the
        label columns of config ``labels``), after those it names.

    Returns
    -------
    list of (str, str)
        ``(input name, output name)`` in schema order: ``cfg.slice_columns`` when set
        (in its order), else every column not used by ``cfg.columns``. A name in
        :data:`ragbatch.core.columns.RESERVED`, or one that an earlier column of the
        list already takes, gets :data:`ragbatch.core.columns.SLICE_RENAME_PREFIX`
        (repeated until it clashes with nothing), e.g. ``metric`` -> ``input_metric``.
        Names are compared as DuckDB compares them
        (:func:`ragbatch.core.columns.identifier_key`): ``Score`` -> ``input_Score``, and
        of ``region`` and ``Region`` the second becomes ``input_Region``, so every column
        of the scores table is one column to DuckDB's SQL.
    """
    if cfg.slice_columns is not None:
        chosen = list(dict.fromkeys([*cfg.slice_columns, *extra]))
    else:
        mapped = {getattr(cfg.columns, c) for c in C.CANONICAL} - {None}
        chosen = [n for n in schema.names if n not in mapped and n != NONSTRING_COLUMN]
    key = C.identifier_key
    reserved = {key(n) for n in _reserved_names(cfg)}
    keeps: dict[str, str] = {}  # key -> the name that keeps it
    for name in chosen:
        if key(name) not in reserved:
            keeps.setdefault(key(name), name)
    taken = set(keeps)
    result = []
    for name in chosen:
        out = name
        if keeps.get(key(name)) != name:
            out = C.SLICE_RENAME_PREFIX + name
            while key(out) in reserved or key(out) in taken:
                out = C.SLICE_RENAME_PREFIX + out
            taken.add(key(out))
        result.append((name, out))
    return result


def _reserved_names(cfg: InputSection) -> frozenset[str]:
    """:data:`ragbatch.core.columns.RESERVED`, plus the ranking columns in a job that maps
    one of them (they are canonical columns of its table then)."""
    if _ranking(cfg):
        return C.RESERVED | frozenset(C.RANKING)
    return C.RESERVED


def _ranking(cfg: InputSection) -> bool:
    """Whether ``cfg`` maps a ranking column (:func:`ragbatch.core.columns.ranking_mapped`)."""
    return C.ranking_mapped({c for c in C.RANKING if getattr(cfg.columns, c) is not None})


# --------------------------------------------------------------------------- normalize


class _Issues:
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


def normalize(
    raw: pa.Table,
    cfg: InputSection,
    task: ReadTask,
    slices: list[tuple[str, str]] | None = None,
    *,
    quote_values: bool = True,
    views: bool = False,
) -> pa.Table:
    """Canonical columns plus slice columns for one raw task table.

    Parameters
    ----------
    raw : pyarrow.Table
        Output of :func:`ragbatch.io.read.read_task` for ``task``, unchanged.
    cfg : InputSection
        ``columns``, ``contexts_format``, ``contexts_field``, ``slice_columns`` and
        ``latency_unit`` are used.
    task : ReadTask
        Supplies ``file_key`` and ``row_offset`` for generated row ids.
    slices : list of (str, str), optional
        Slice columns as from :func:`slice_columns`; default: computed from
        ``raw.schema``. Pass the list computed once from :func:`peek_schema` so every
        task yields the same columns; one missing from ``raw`` becomes an all-null column
        of Arrow type ``null``.
    quote_values : bool
        Whether a note in ``_issues`` may quote the value it is about (cut to
        :data:`ragbatch.core.reasons.QUOTE_MAX_CHARS`). False in runs with PII metrics
        (:attr:`ragbatch.pipeline.plan.Plan.quote_values`): the note says what was wrong and
        shows :data:`ragbatch.core.reasons.NOT_QUOTED` instead of the value.
    views : bool
        Give ``question``, ``answer`` and ``reference`` as ``string_view`` and
        ``contexts`` as ``list<string_view>`` (:data:`VIEW_TYPES`): the same values,
        taken from string views of ``raw`` without copying their strings (from
        :func:`ragbatch.io.read.read_task` with ``views``), and the contexts that rows
        share built once. For the expression stage, which reads them as Polars' string
        views anyway (the in-process executor, :mod:`ragbatch.pipeline.in_process`).

    Returns
    -------
    pyarrow.Table
        ``raw.num_rows`` rows in ``raw``'s order; fields ``row_id: string`` (never null),
        ``question: string``, ``contexts: list<string>``, ``answer: string``,
        ``reference: string``, ``latency_s: float64``, ``_issues: struct<question,
        contexts, answer, reference, latency_s: string>`` (the struct is never null; a
        field is non-null where that value was turned into null), then the slice columns
        unchanged. Unmapped canonical columns are all null without an issue. When
        ``cfg`` maps a ranking column, ``_issues`` has a field for each ranking column
        too and :data:`ragbatch.core.columns.RANKING_SCHEMA` follows it, before the
        slice columns (:mod:`ragbatch.io.ranking`).

    Raises
    ------
    InputError
        A mapped column is missing from a non-empty ``raw``; the mapped ``row_id`` column
        is null or repeats a value within the task, or has a type that cannot be a string.

    Notes
    -----
    Vectorized with pyarrow except where a value needs Python: non-string values in text
    columns, JSON contexts that hold objects or fail the strict batch decode, and the
    cells flagged by :data:`ragbatch.io.read.NONSTRING_COLUMN`. String contexts that
    repeat (at most half the values distinct) are normalized once per distinct value
    (:func:`_distinct_contexts`).
    """
    n = raw.num_rows
    with_ranking = _ranking(cfg)
    issues = _Issues(n, quote_values, with_ranking=with_ranking)
    marks = _nonstring_rows(raw)
    out: dict[str, pa.Array] = {C.ROW_ID: _row_ids(raw, cfg, task)}
    for canonical in _TEXT_COLUMNS:
        source = _source(raw, cfg, canonical, task, views)
        out[canonical] = (
            pa.nulls(n, pa.string())
            if source is None
            else _text(
                canonical,
                source,
                marks.get(getattr(cfg.columns, canonical), set()),
                issues,
                views=views,
            )
        )
    source = _source(raw, cfg, C.CONTEXTS, task, views)
    out[C.CONTEXTS] = (
        pa.nulls(n, _LIST_OF_STRINGS)
        if source is None
        # a source only when the column is named: not None
        else _contexts(
            source, marks.get(cast(str, cfg.columns.contexts), set()), cfg, issues, views=views
        )
    )
    source = _source(raw, cfg, C.LATENCY_S, task)
    out[C.LATENCY_S] = (
        pa.nulls(n, pa.float64())
        if source is None
        # a source only when the column is named: not None
        else _latency(source, marks.get(cast(str, cfg.columns.latency_s), set()), cfg, issues)
    )
    if with_ranking:
        out.update(_ranking_columns(raw, cfg, task, out[C.CONTEXTS], marks, issues))
    out[C.ISSUES] = issues.to_array()
    chosen = slices if slices is not None else slice_columns(cfg, raw.schema)
    return _assemble(raw, out, chosen, views=views)


def _ranking_columns(
    raw: pa.Table,
    cfg: InputSection,
    task: ReadTask,
    contexts: pa.Array,
    marks: dict[str, set[int]],
    issues: _Issues,
) -> dict[str, pa.Array]:
    """The three ranking columns of :data:`ragbatch.core.columns.RANKING_SCHEMA` (all null
    where unmapped), normalized by :mod:`ragbatch.io.ranking`."""
    n = raw.num_rows
    out: dict[str, pa.Array] = {}
    for canonical in (C.CONTEXT_IDS, C.RELEVANT_IDS):
        source = _source(raw, cfg, canonical, task)
        marked = marks.get(getattr(cfg.columns, canonical), set())
        out[canonical] = (
            pa.nulls(n, C.RANKING_SCHEMA.field(canonical).type)
            if source is None
            else ranking.ids(canonical, source, marked, issues)
        )
    if cfg.columns.contexts is not None:
        out[C.CONTEXT_IDS] = ranking.align(out[C.CONTEXT_IDS], contexts, issues)
    source = _source(raw, cfg, C.RELEVANCE, task)
    out[C.RELEVANCE] = (
        pa.nulls(n, C.RELEVANCE_TYPE)
        if source is None
        else ranking.relevance(source, marks.get(cast(str, cfg.columns.relevance), set()), issues)
    )
    return out


#: The types of the text columns and the contexts in ``normalize(..., views=True)``.
VIEW_TYPES: dict[str, pa.DataType] = {
    **{column: pa.string_view() for column in _TEXT_COLUMNS},
    C.CONTEXTS: pa.list_(pa.string_view()),
}


def _assemble(
    raw: pa.Table, out: dict[str, pa.Array], slices: list[tuple[str, str]], views: bool = False
) -> pa.Table:
    fields = list(C.CANONICAL_SCHEMA)
    if C.RELEVANCE in out:
        issues_at = C.CANONICAL_SCHEMA.get_field_index(C.ISSUES)
        fields[issues_at] = pa.field(C.ISSUES, C.RANKING_ISSUES_TYPE)
        fields += list(C.RANKING_SCHEMA)
    if views:
        fields = [f.with_type(VIEW_TYPES[f.name]) if f.name in VIEW_TYPES else f for f in fields]
        out = {
            name: array.cast(VIEW_TYPES[name])
            if name in VIEW_TYPES and array.type != VIEW_TYPES[name]
            else array
            for name, array in out.items()
        }
    arrays: list[pa.ChunkedArray] = [pa.chunked_array([out[f.name]], f.type) for f in fields]
    for source, name in slices:
        column = (
            raw.column(source)
            if source in raw.column_names
            else pa.chunked_array([pa.nulls(raw.num_rows)])
        )
        fields.append(pa.field(name, column.type))
        arrays.append(column)
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _nonstring_rows(raw: pa.Table) -> dict[str, set[int]]:
    if NONSTRING_COLUMN not in raw.column_names:
        return {}
    marks: dict[str, set[int]] = {}
    for row, names in enumerate(raw.column(NONSTRING_COLUMN).to_pylist()):
        for name in names or ():
            marks.setdefault(name, set()).add(row)
    return marks


def _source(
    raw: pa.Table, cfg: InputSection, canonical: str, task: ReadTask, views: bool = False
) -> pa.Array | None:
    """The column of ``raw`` mapped to ``canonical`` as one array, or None when unmapped
    (or missing from an empty ``raw``). With ``views``, a string column in several chunks
    (a CSV file's blocks) is joined as string views, without copying its strings."""
    name = getattr(cfg.columns, canonical)
    if name is None:
        return None
    if name not in raw.column_names:
        if raw.num_rows == 0:
            return None
        columns = ", ".join(repr(c) for c in raw.column_names if c != NONSTRING_COLUMN)
        raise InputError(
            f"{task.file_key}: column {name!r} (input.columns.{canonical}) is missing from this "
            f"file; it has: {columns or 'no columns'}"
        )
    column = raw.column(name)
    # One chunk (a Parquet task of one row group, any text file): use it as it is;
    # combine_chunks would copy it.
    if column.num_chunks == 1:
        return column.chunk(0)
    if views and (_is_text(column.type) and not pa.types.is_dictionary(column.type)):
        return pa.concat_arrays([chunk.cast(pa.string_view()) for chunk in column.chunks])
    return column.combine_chunks()


def _mask(n: int, rows: set[int]) -> pa.Array:
    return pa.array([i in rows for i in range(n)], pa.bool_())


def _blank_rows(array: pa.Array, rows: set[int]) -> pa.Array:
    if not rows:
        return array
    return pc.if_else(_mask(len(array), rows), pa.scalar(None, array.type), array)


# ----- row_id


def check_row_ids(raw: pa.Table, cfg: InputSection, task: ReadTask) -> None:
    """Raise the error :func:`normalize` raises for the row ids of ``raw`` (the mapped
    ``row_id`` column missing, null, repeated within ``raw`` or of a type that cannot be
    a string); nothing when ``row_id`` is unmapped (ids are generated) or they are fine.

    For a task normalized in slices (:mod:`ragbatch.pipeline.in_process`): a value
    repeated in two slices of one task is refused, with the same message, as it is when
    the task is normalized whole.

    Raises
    ------
    InputError
    """
    if cfg.columns.row_id is not None:
        _row_ids(raw, cfg, task)


def _row_ids(raw: pa.Table, cfg: InputSection, task: ReadTask) -> pa.Array:
    name = cfg.columns.row_id
    n = raw.num_rows
    if name is None:
        prefix = f"{task.file_key}:"
        return pa.array([f"{prefix}{task.row_offset + i}" for i in range(n)], pa.string())
    source = _source(raw, cfg, C.ROW_ID, task)
    if source is None:
        return pa.array([], pa.string())
    try:
        ids = pc.cast(source, pa.string())
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        raise InputError(
            f"{task.file_key}: the row_id column {name!r} has type {source.type}, which cannot "
            "be used as an id; map input.columns.row_id to a string or integer column"
        ) from None
    _check_ids(ids, name, task)
    return ids


def _check_ids(ids: pa.Array, name: str, task: ReadTask) -> None:
    if ids.null_count:
        first = pc.index(pc.is_null(ids), True).as_py()
        raise InputError(
            f"{task.file_key}: the row_id column {name!r} is null in {ids.null_count} row(s) "
            f"(first at row {task.row_offset + first}); every row needs an id, or leave "
            "input.columns.row_id unset to use '<file>:<row>' ids"
        )
    counts = pc.value_counts(ids)
    repeated = counts.filter(pc.greater(counts.field("counts"), 1))
    if len(repeated):
        examples = ", ".join(repr(v) for v in repeated.field("values")[:3].to_pylist())
        raise InputError(
            f"{task.file_key}: the row_id column {name!r} repeats {len(repeated)} value(s) "
            f"(e.g. {examples}); ids must be unique, or leave input.columns.row_id unset"
        )


# ----- question / answer / reference


def _text(
    column: str, source: pa.Array, marked: set[int], issues: _Issues, views: bool = False
) -> pa.Array:
    n = len(source)
    if pa.types.is_null(source.type):
        return pa.nulls(n, pa.string())
    if views and pa.types.is_string_view(source.type) and not marked:
        return source  # the same strings, as views (normalize's ``views``)
    if _is_text(source.type):
        strings = pc.cast(source, pa.string())
        for row in sorted(marked):
            value = json.loads(strings[row].as_py())
            issues.add(
                column,
                row,
                f"{column}: expected a string, got {_kind(value)} ({issues.preview(value)})",
            )
        return _blank_rows(strings, marked)
    for row, value in enumerate(source.to_pylist()):
        if value is not None:
            issues.add(
                column,
                row,
                f"{column}: expected a string, got {_kind(value)} ({issues.preview(value)})",
            )
    return pa.nulls(n, pa.string())


# ----- latency_s

#: Units per second. Values are divided by these (7100 ms / 1000 is 7.1 exactly as a
#: float; 7100 * 0.001 is 7.1000000000000005, which fails a 7.1 s target).
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def _latency(source: pa.Array, marked: set[int], cfg: InputSection, issues: _Issues) -> pa.Array:
    n = len(source)
    t = source.type
    per_second = _PER_SECOND[cfg.latency_unit]
    if pa.types.is_null(t):
        return pa.nulls(n, pa.float64())
    if _is_number(t):
        seconds = pc.cast(source, pa.float64())
    elif pa.types.is_duration(t):
        seconds = pc.cast(pc.cast(source, pa.int64()), pa.float64())
        per_second = _PER_SECOND[t.unit]
    elif _is_text(t):
        seconds = _parse_numbers(pc.cast(source, pa.string()), marked, issues)
    else:
        for row, value in enumerate(source.to_pylist()):
            if value is not None:
                issues.add(
                    C.LATENCY_S,
                    row,
                    f"latency_s: expected a number, got {_kind(value)} ({issues.preview(value)})",
                )
        return pa.nulls(n, pa.float64())
    if per_second != 1:
        seconds = pc.divide(seconds, float(per_second))
    return _drop_impossible(seconds, issues)


def _parse_numbers(strings: pa.Array, marked: set[int], issues: _Issues) -> pa.Array:
    rejected: set[int] = set()
    for row in sorted(marked):  # JSON text of a non-string value: numbers are fine
        value = json.loads(strings[row].as_py())
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            issues.add(
                C.LATENCY_S,
                row,
                f"latency_s: expected a number, got {_kind(value)} ({issues.preview(value)})",
            )
            rejected.add(row)
    strings = _blank_rows(strings, rejected)
    trimmed = pc.utf8_trim_whitespace(strings)
    numeric = pc.match_substring_regex(trimmed, _NUMBER)
    bad = pc.fill_null(pc.invert(numeric), False)
    for row in pc.indices_nonzero(bad).to_pylist():
        issues.add(
            C.LATENCY_S, row, f"latency_s: {issues.preview(strings[row].as_py())} is not a number"
        )
    return pc.cast(pc.if_else(bad, pa.scalar(None, pa.string()), trimmed), pa.float64())


def _drop_impossible(seconds: pa.Array, issues: _Issues) -> pa.Array:
    """Null out (with an issue) latencies that are NaN, infinite or negative."""
    bad = pc.fill_null(pc.or_(pc.invert(pc.is_finite(seconds)), pc.less(seconds, 0.0)), False)
    if not pc.any(bad).as_py():
        return seconds
    for row in pc.indices_nonzero(bad).to_pylist():
        value = seconds[row].as_py()
        why = "is not a finite number" if not math.isfinite(value) else "is negative"
        issues.add(C.LATENCY_S, row, f"latency_s: {value!r} {why}")
    return pc.if_else(bad, pa.scalar(None, pa.float64()), seconds)


# ----- contexts


def _contexts(
    source: pa.Array, marked: set[int], cfg: InputSection, issues: _Issues, views: bool = False
) -> pa.Array:
    n = len(source)
    t = source.type
    if pa.types.is_null(t):
        return pa.nulls(n, _LIST_OF_STRINGS)
    if _is_list(t):
        if views and pa.types.is_list(t) and pa.types.is_string_view(t.value_type):
            return source  # a list of strings, as views (normalize's ``views``)
        return _contexts_from_lists(source, cfg, issues)
    if _is_text(t):
        shared = _distinct_contexts(source, marked, cfg, issues, views)
        if shared is not None:
            return shared
        return _contexts_from_strings(pc.cast(source, pa.string()), marked, cfg, issues)
    for row, value in enumerate(source.to_pylist()):
        if value is not None:
            issues.add(
                C.CONTEXTS,
                row,
                f"contexts: expected a list or a string, got "
                f"{_kind(value)} ({issues.preview(value)})",
            )
    return pa.nulls(n, _LIST_OF_STRINGS)


def _distinct_contexts(
    source: pa.Array, marked: set[int], cfg: InputSection, issues: _Issues, views: bool
) -> pa.Array | None:
    """:func:`_contexts_from_strings` of a string column computed once per distinct value
    and given to every row holding it, or None when at most half the values repeat (or
    JSON input marked some rows): then every value is normalized in turn.

    A row's contexts and its issue depend on its value alone, so this gives the same
    array and notes. Many rows share a value when a corpus repeats the same retrieved
    passages (a JSON list of five 1,300-character chunks, say): decoding each once saves
    the decoding, and with ``views`` the rows' lists point at the same strings
    (:func:`_repeat_lists`) instead of copying them.
    """
    if marked or len(source) < 2:
        return None
    encoded = pc.dictionary_encode(source)
    if 2 * len(encoded.dictionary) > len(source):
        return None
    distinct = pc.cast(encoded.dictionary, pa.string())
    notes = _Issues(len(distinct), issues.quote_values)
    lists = _contexts_from_strings(distinct, set(), cfg, notes)
    indices = encoded.indices
    if C.CONTEXTS in notes.notes:
        per_row = pa.array(notes.notes[C.CONTEXTS], pa.string()).take(indices)
        for row in pc.indices_nonzero(pc.is_valid(per_row)).to_pylist():
            issues.add(C.CONTEXTS, row, per_row[row].as_py())
    return _repeat_lists(lists, indices, views)


def _repeat_lists(lists: pa.Array, indices: pa.Array, views: bool) -> pa.Array:
    """``lists.take(indices)`` (null where an index is null); with ``views`` as
    ``list<string_view>`` whose items point at the strings of ``lists`` (taken in Polars,
    which copies the views, not the strings; pyarrow has no take for string views)."""
    if not views:
        return lists.take(indices)
    import polars as pl

    taken = pl.Series(lists).gather(pl.Series(indices))
    return taken.to_arrow(compat_level=pl.CompatLevel.newest()).cast(VIEW_TYPES[C.CONTEXTS])


def _contexts_from_lists(source: pa.Array, cfg: InputSection, issues: _Issues) -> pa.Array:
    item = source.type.value_type
    if _is_text(item) or pa.types.is_null(item):
        try:
            return pc.cast(source, _LIST_OF_STRINGS)
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
            pass  # not castable as a whole: convert item by item below, with per-row notes
    elif pa.types.is_struct(item):
        fast = _struct_items(source, cfg)
        if fast is not None:
            return fast
    rows = [None if v is None else _items(v, cfg, issues.preview) for v in source.to_pylist()]
    return _to_arrow(rows, issues)


def _struct_items(source: pa.Array, cfg: InputSection) -> pa.Array | None:
    """Vectorized ``item[field]`` for a list<struct> column whose field is a string."""
    item = source.type.value_type
    keys = [item.field(i).name for i in range(item.num_fields)]
    fields = _text_fields(keys, cfg.contexts_field)
    if not fields or not all(_is_text(item.field(f).type) for f in fields):
        return None
    try:
        lists = pc.cast(source, pa.list_(item))
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        return None  # the caller falls back to the item-by-item path
    lists = pa.concat_arrays([lists])  # offset 0, as from_arrays with a mask needs
    candidates = [
        pc.cast(pc.struct_field(lists.values, [keys.index(f)]), pa.string()) for f in fields
    ]
    values = candidates[0] if len(candidates) == 1 else pc.coalesce(*candidates)
    return pa.ListArray.from_arrays(lists.offsets, values, mask=lists.is_null())


def _contexts_from_strings(
    strings: pa.Array, marked: set[int], cfg: InputSection, issues: _Issues
) -> pa.Array:
    fmt = cfg.contexts_format
    n = len(strings)
    valid = pc.is_valid(strings)
    if fmt == "json":
        parse = valid
    elif fmt == "auto":
        parse = pc.and_(valid, _starts_a_list(strings))
    else:  # "text" wraps, "delimited" splits, "list" rejects every plain string
        parse = pa.array([False] * n)
    parse = pc.and_(parse, pc.invert(_mask(n, marked))) if marked else parse
    parse_rows = pc.indices_nonzero(parse).to_pylist()
    parts: list[tuple[list[int], pa.Array]] = []
    if parse_rows:
        parts.append((parse_rows, _parse_json_contexts(strings, parse_rows, cfg, issues)))
    special = sorted(marked) + (pc.indices_nonzero(valid).to_pylist() if fmt == "list" else [])
    special = sorted(set(special))
    if special:
        rows = [
            _special_context(strings[r].as_py(), r in marked, cfg, issues.preview) for r in special
        ]
        parts.append((special, _to_arrow(rows, issues, special)))
    if len(parts) == 1 and len(parts[0][0]) == n:  # every row parsed, in order
        return parts[0][1]

    def base() -> pa.Array:
        if fmt == "delimited":
            # InputSection requires contexts_delimiter with "delimited"
            return _split(strings, cast(str, cfg.contexts_delimiter))
        return _wrap(strings)

    return _overlay(base(), parts)


def _starts_a_list(strings: pa.Array) -> pa.Array:
    """Per value, whether its text after leading whitespace starts with ``[`` (null for
    null). Whitespace is stripped, at a copy of the text, only from the values that do not
    start with ``[`` as they are: in a column of JSON lists, none."""
    direct = pc.starts_with(strings, "[")
    others = pc.fill_null(pc.invert(direct), False)
    if not pc.any(others).as_py():
        return direct
    later = pc.starts_with(pc.utf8_ltrim_whitespace(strings.filter(others)), "[")
    return pc.replace_with_mask(direct, others, later)


def _split(strings: pa.Array, delimiter: str) -> pa.Array:
    """Each value split on ``delimiter`` without its empty pieces; null for null."""
    pieces = pc.split_pattern(strings, pattern=delimiter)
    flat = pc.list_flatten(pieces)
    keep = pc.not_equal(pc.binary_length(flat), 0)
    parents = pc.list_parent_indices(pieces).filter(keep).to_numpy()
    counts = np.bincount(parents, minlength=len(strings))
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]), pa.int32())
    return pa.ListArray.from_arrays(offsets, flat.filter(keep), mask=strings.is_null())


def _wrap(strings: pa.Array) -> pa.Array:
    """``[value]`` per row, null for null."""
    offsets = pa.array(range(len(strings) + 1), pa.int32())
    strings = pa.concat_arrays([strings])
    return pa.ListArray.from_arrays(offsets, strings, mask=strings.is_null())


def _overlay(base: pa.Array, parts: list[tuple[list[int], pa.Array]]) -> pa.Array:
    """``base`` with the given rows replaced by the rows of each part, in order."""
    if not parts:
        return base
    if len(parts) == 1 and len(parts[0][0]) == len(base):  # every row replaced, in order
        return parts[0][1]
    indices = list(range(len(base)))
    start = len(base)
    for rows, values in parts:
        for k, row in enumerate(rows):
            indices[row] = start + k
        start += len(values)
    merged = pa.concat_arrays([base] + [values for _, values in parts])
    return merged.take(pa.array(indices, pa.int64()))


def _parse_json_contexts(
    strings: pa.Array, rows: list[int], cfg: InputSection, issues: _Issues
) -> pa.Array:
    subset = strings if len(rows) == len(strings) else strings.take(pa.array(rows, pa.int64()))
    fast = _strict_json_lists(subset)
    if fast is not None:
        return fast
    parsed = [_parse_one(value, cfg, issues.preview) for value in subset.to_pylist()]
    return _to_arrow(parsed, issues, rows)


def _strict_json_lists(values: pa.Array) -> pa.Array | None:
    """Decode JSON lists of strings/nulls in one pyarrow pass; None if any value is not one.

    Each value is wrapped as ``{"c": <value>}`` on its own line and read with an explicit
    ``list<string>`` schema, which rejects numbers, objects, nested lists, bad JSON and a
    value that spills into a neighbour (duplicate key or row count change). When no value
    holds a line break (JSON allows them between tokens only), the reader cuts the lines
    into blocks and decodes them on several threads; otherwise on one.
    """
    if len(values) == 0:
        return pa.array([], _LIST_OF_STRINGS)
    lines = pc.binary_join_element_wise('{"c":', values, "}\n", "")
    if lines.null_count or not pa.types.is_string(lines.type):
        return None
    buffer = _concatenated(lines)
    longest = pc.max(pc.binary_length(lines)).as_py() or 0
    schema = pa.schema([("c", _LIST_OF_STRINGS)])
    try:
        table = pajson.read_json(
            pa.BufferReader(buffer),
            # blocks parse in parallel; each must hold at least one whole line
            read_options=pajson.ReadOptions(
                block_size=min(max(4 << 20, 2 * longest + 64), 2**31 - 1)
            ),
            parse_options=pajson.ParseOptions(
                explicit_schema=schema,
                newlines_in_values=_has_line_breaks(values),
                unexpected_field_behavior="error",
            ),
        )
    except (pa.ArrowException, OverflowError):
        return None
    if table.num_rows != len(values) or table.column("c").null_count:
        return None
    return table.column("c").combine_chunks()


def _has_line_breaks(values: pa.Array) -> bool:
    """Whether any value of a string array holds a line feed or a carriage return (the
    search runs in Polars, over string views of the same bytes)."""
    import polars as pl

    series = pl.Series(values.cast(pa.string_view()))
    return bool(series.str.contains(r"[\n\r]").any())


def _concatenated(strings: pa.StringArray) -> pa.Buffer:
    """All values of a null-free string array back to back, without copying."""
    offsets = pa.Array.from_buffers(
        pa.int32(), len(strings) + 1, [None, strings.buffers()[1]], offset=strings.offset
    )
    start, end = offsets[0].as_py(), offsets[len(strings)].as_py()
    return strings.buffers()[2].slice(start, end - start)


Row = tuple[list | None, str | None]
#: How a note shows an input value: :meth:`_Issues.preview` of the batch.
Preview = Callable[[Any], str]


def _parse_one(text: str, cfg: InputSection, preview: Preview) -> Row:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:  # ValueError: also integers of > 4300 digits
        if cfg.contexts_format == "auto":
            return [text], None
        reason = getattr(exc, "msg", "too deeply nested")
        if not isinstance(exc, (json.JSONDecodeError, RecursionError)):
            reason = "an integer of more than 4300 digits, which Python does not read"
        return None, f"contexts: not valid JSON ({reason}): {preview(text)}"
    if isinstance(value, list):
        return _items(value, cfg, preview)
    if cfg.contexts_format == "auto":
        return [text], None
    if value is None:
        return None, None
    if isinstance(value, str):
        return [value], None
    return None, f"contexts: expected a JSON list of strings, got {_kind(value)} ({preview(value)})"


def _special_context(text: str, nonstring: bool, cfg: InputSection, preview: Preview) -> Row:
    if nonstring:  # JSON input: ``text`` is the JSON text of a list, number, object, ...
        value = json.loads(text)
        if isinstance(value, list):
            return _items(value, cfg, preview)
        return None, f"contexts: expected a list or a string, got {_kind(value)} ({preview(value)})"
    return None, (
        f"contexts: expected a list (input.contexts_format is 'list'), got a string "
        f"({preview(text)})"
    )


def _items(values: list, cfg: InputSection, preview: Preview) -> Row:
    texts: list[str | None] = []
    for index, item in enumerate(values):
        if item is None or isinstance(item, str):
            texts.append(item)
        elif isinstance(item, dict):
            text, problem = _object_text(item, index, cfg.contexts_field, preview)
            if problem:
                return None, problem
            texts.append(text)
        else:
            return None, (
                f"contexts: item {index} is {_kind(item)} ({preview(item)}); expected "
                "a string or an object with a text field"
            )
    return texts, None


def _object_text(
    item: dict, index: int, configured: str | None, preview: Preview
) -> tuple[str | None, str | None]:
    """An object item's text: the first candidate key with a non-null value."""
    fields = _text_fields(list(item), configured)
    if not fields:
        keys = preview(list(item))
        if configured is not None:
            return None, (
                f"contexts: item {index} is an object without the field {configured!r} "
                f"(input.contexts_field); its keys: {keys}"
            )
        return None, (
            f"contexts: item {index} is an object with none of the fields "
            f"{', '.join(CONTEXT_TEXT_FIELDS)} (its keys: {keys}); set "
            "input.contexts_field"
        )
    field = next((f for f in fields if item[f] is not None), fields[0])
    value = item[field]
    if value is None or isinstance(value, str):
        return value, None
    return None, (
        f"contexts: item {index} field {field!r} is {_kind(value)} ({preview(value)}), "
        "expected a string"
    )


def _to_arrow(
    rows: Sequence[Row | None], issues: _Issues, positions: list[int] | None = None
) -> pa.Array:
    """list<string> array from per-row results, recording each row's issue."""
    values: list[list | None] = []
    for k, row in enumerate(rows):
        texts, problem = row if row is not None else (None, None)
        if problem:
            issues.add(C.CONTEXTS, positions[k] if positions else k, problem)
        values.append(texts)
    try:
        return pa.array(values, _LIST_OF_STRINGS)
    except (pa.ArrowException, UnicodeError):
        return _drop_bad_unicode(values, issues, positions)


def _drop_bad_unicode(
    values: list[list | None], issues: _Issues, positions: list[int] | None
) -> pa.Array:
    cleaned: list[list | None] = []
    for k, texts in enumerate(values):
        try:
            for text in texts or ():
                (text or "").encode("utf-8")
            cleaned.append(texts)
        except UnicodeEncodeError:
            issues.add(
                C.CONTEXTS,
                positions[k] if positions else k,
                "contexts: an item holds an unpaired UTF-16 surrogate escape (e.g. \\ud800), "
                "which is not valid Unicode",
            )
            cleaned.append(None)
    return pa.array(cleaned, _LIST_OF_STRINGS)
