"""Map raw input columns onto the canonical schema.

:func:`normalize` turns one raw table from :func:`ragbatch.io.read.read_task` into
:data:`ragbatch.core.columns.CANONICAL_SCHEMA` followed by the slice columns. It never drops or
reorders rows and never casts silently: a value of the wrong kind becomes null and the
row's ``_issues`` struct says why, in the form ``"<column>: <what was wrong>"``.

The contexts formats (``input.contexts_format``) and how each value is read are described
in :mod:`ragbatch.io.contexts`, which holds that step; :mod:`ragbatch.io.issues` holds the
issue notes and the Arrow type tests.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Sequence
from typing import cast

import pyarrow as pa
import pyarrow.compute as pc

from ragbatch.core import columns as C
from ragbatch.io import ranking
from ragbatch.config.job import InputSection
from ragbatch.core.errors import InputError
from ragbatch.io.names import unusable_names
from ragbatch.io.contexts import (
    CONTEXT_TEXT_FIELDS,
    CONTEXTS_VIEW_TYPE,
    normalize_contexts,
    text_fields,
)
from ragbatch.io.issues import (
    LIST_OF_STRINGS,
    Issues,
    blank_rows,
    is_list,
    is_number,
    is_text,
    kind,
)
from ragbatch.io.read import NONSTRING_COLUMN, ReadTask


_TEXT_COLUMNS = (C.QUESTION, C.ANSWER, C.REFERENCE)
_NUMBER = r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$"


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
        if is_text(t) or pa.types.is_null(t):
            return None
        return f"has type {t}, so every {canonical} would be null; map a column of strings"
    if canonical == C.LATENCY_S:
        if is_number(t) or is_text(t) or pa.types.is_null(t) or pa.types.is_duration(t):
            return None
        return f"has type {t}; latency needs numbers (or numeric strings)"
    return _contexts_type_problem(t, cfg)


def _contexts_type_problem(t: pa.DataType, cfg: InputSection) -> str | None:
    if pa.types.is_null(t):
        return None
    if is_text(t):
        if cfg.contexts_format == "list":
            return (
                f"has type {t} but input.contexts_format is 'list'; use 'auto', 'json' "
                "(JSON-encoded lists) or 'text' (one context per value)"
            )
        return None
    if not is_list(t):
        return f"has type {t}; contexts need a list of strings, a JSON-encoded list or a string"
    item = t.value_type
    if is_text(item) or pa.types.is_null(item):
        return None
    if pa.types.is_struct(item):
        keys = [item.field(i).name for i in range(item.num_fields)]
        fields = text_fields(keys, cfg.contexts_field)
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
            if not (is_text(field_type) or pa.types.is_null(field_type)):
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
    issues = Issues(n, quote_values, with_ranking=with_ranking)
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
        pa.nulls(n, LIST_OF_STRINGS)
        if source is None
        # a source only when the column is named: not None
        else normalize_contexts(
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
    issues: Issues,
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
    C.CONTEXTS: CONTEXTS_VIEW_TYPE,
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
    if views and (is_text(column.type) and not pa.types.is_dictionary(column.type)):
        return pa.concat_arrays([chunk.cast(pa.string_view()) for chunk in column.chunks])
    return column.combine_chunks()


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
    column: str, source: pa.Array, marked: set[int], issues: Issues, views: bool = False
) -> pa.Array:
    n = len(source)
    if pa.types.is_null(source.type):
        return pa.nulls(n, pa.string())
    if views and pa.types.is_string_view(source.type) and not marked:
        return source  # the same strings, as views (normalize's ``views``)
    if is_text(source.type):
        strings = pc.cast(source, pa.string())
        for row in sorted(marked):
            value = json.loads(strings[row].as_py())
            issues.add(
                column,
                row,
                f"{column}: expected a string, got {kind(value)} ({issues.preview(value)})",
            )
        return blank_rows(strings, marked)
    for row, value in enumerate(source.to_pylist()):
        if value is not None:
            issues.add(
                column,
                row,
                f"{column}: expected a string, got {kind(value)} ({issues.preview(value)})",
            )
    return pa.nulls(n, pa.string())


# ----- latency_s

#: Units per second. Values are divided by these (7100 ms / 1000 is 7.1 exactly as a
#: float; 7100 * 0.001 is 7.1000000000000005, which fails a 7.1 s target).
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def _latency(source: pa.Array, marked: set[int], cfg: InputSection, issues: Issues) -> pa.Array:
    n = len(source)
    t = source.type
    per_second = _PER_SECOND[cfg.latency_unit]
    if pa.types.is_null(t):
        return pa.nulls(n, pa.float64())
    if is_number(t):
        seconds = pc.cast(source, pa.float64())
    elif pa.types.is_duration(t):
        seconds = pc.cast(pc.cast(source, pa.int64()), pa.float64())
        per_second = _PER_SECOND[t.unit]
    elif is_text(t):
        seconds = _parse_numbers(pc.cast(source, pa.string()), marked, issues)
    else:
        for row, value in enumerate(source.to_pylist()):
            if value is not None:
                issues.add(
                    C.LATENCY_S,
                    row,
                    f"latency_s: expected a number, got {kind(value)} ({issues.preview(value)})",
                )
        return pa.nulls(n, pa.float64())
    if per_second != 1:
        seconds = pc.divide(seconds, float(per_second))
    return _drop_impossible(seconds, issues)


def _parse_numbers(strings: pa.Array, marked: set[int], issues: Issues) -> pa.Array:
    rejected: set[int] = set()
    for row in sorted(marked):  # JSON text of a non-string value: numbers are fine
        value = json.loads(strings[row].as_py())
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            issues.add(
                C.LATENCY_S,
                row,
                f"latency_s: expected a number, got {kind(value)} ({issues.preview(value)})",
            )
            rejected.add(row)
    strings = blank_rows(strings, rejected)
    trimmed = pc.utf8_trim_whitespace(strings)
    numeric = pc.match_substring_regex(trimmed, _NUMBER)
    bad = pc.fill_null(pc.invert(numeric), False)
    for row in pc.indices_nonzero(bad).to_pylist():
        issues.add(
            C.LATENCY_S, row, f"latency_s: {issues.preview(strings[row].as_py())} is not a number"
        )
    return pc.cast(pc.if_else(bad, pa.scalar(None, pa.string()), trimmed), pa.float64())


def _drop_impossible(seconds: pa.Array, issues: Issues) -> pa.Array:
    """Null out (with an issue) latencies that are NaN, infinite or negative."""
    bad = pc.fill_null(pc.or_(pc.invert(pc.is_finite(seconds)), pc.less(seconds, 0.0)), False)
    if not pc.any(bad).as_py():
        return seconds
    for row in pc.indices_nonzero(bad).to_pylist():
        value = seconds[row].as_py()
        why = "is not a finite number" if not math.isfinite(value) else "is negative"
        issues.add(C.LATENCY_S, row, f"latency_s: {value!r} {why}")
    return pc.if_else(bad, pa.scalar(None, pa.float64()), seconds)
