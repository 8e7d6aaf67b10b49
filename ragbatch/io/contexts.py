"""Normalize the mapped contexts column to ``list<string>``.

:func:`normalize_contexts` is the contexts step of :func:`ragbatch.io.schema.normalize`.

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

import json
from collections.abc import Sequence
from typing import Any, Callable, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from ragbatch.config.job import InputSection
from ragbatch.core import columns as C
from ragbatch.io.issues import LIST_OF_STRINGS, Issues, is_list, is_text, kind, mask

#: Object keys tried, in order, for a context's text when ``input.contexts_field`` is unset.
CONTEXT_TEXT_FIELDS: tuple[str, ...] = (
    "text",
    "content",
    "page_content",
    "excerpt",
    "chunk",
    "document",
)

#: The type of the contexts in ``normalize(..., views=True)``.
CONTEXTS_VIEW_TYPE = pa.list_(pa.string_view())


def text_fields(names: list[str], configured: str | None) -> list[str]:
    """The keys an object's text may come from, in order of preference (empty: none).

    ``configured`` is ``input.contexts_field``: when set, only that key (if present);
    otherwise those of :data:`CONTEXT_TEXT_FIELDS` present in ``names``."""
    if configured is not None:
        return [configured] if configured in names else []
    return [k for k in CONTEXT_TEXT_FIELDS if k in names]


def normalize_contexts(
    source: pa.Array, marked: set[int], cfg: InputSection, issues: Issues, views: bool = False
) -> pa.Array:
    n = len(source)
    t = source.type
    if pa.types.is_null(t):
        return pa.nulls(n, LIST_OF_STRINGS)
    if is_list(t):
        if views and pa.types.is_list(t) and pa.types.is_string_view(t.value_type):
            return source  # a list of strings, as views (normalize's ``views``)
        return _contexts_from_lists(source, cfg, issues)
    if is_text(t):
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
                f"{kind(value)} ({issues.preview(value)})",
            )
    return pa.nulls(n, LIST_OF_STRINGS)


def _distinct_contexts(
    source: pa.Array, marked: set[int], cfg: InputSection, issues: Issues, views: bool
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
    notes = Issues(len(distinct), issues.quote_values)
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
    return taken.to_arrow(compat_level=pl.CompatLevel.newest()).cast(CONTEXTS_VIEW_TYPE)


def _contexts_from_lists(source: pa.Array, cfg: InputSection, issues: Issues) -> pa.Array:
    item = source.type.value_type
    if is_text(item) or pa.types.is_null(item):
        try:
            return pc.cast(source, LIST_OF_STRINGS)
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
    fields = text_fields(keys, cfg.contexts_field)
    if not fields or not all(is_text(item.field(f).type) for f in fields):
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
    strings: pa.Array, marked: set[int], cfg: InputSection, issues: Issues
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
    parse = pc.and_(parse, pc.invert(mask(n, marked))) if marked else parse
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
    strings: pa.Array, rows: list[int], cfg: InputSection, issues: Issues
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
        return pa.array([], LIST_OF_STRINGS)
    lines = pc.binary_join_element_wise('{"c":', values, "}\n", "")
    if lines.null_count or not pa.types.is_string(lines.type):
        return None
    buffer = _concatenated(lines)
    longest = pc.max(pc.binary_length(lines)).as_py() or 0
    schema = pa.schema([("c", LIST_OF_STRINGS)])
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
#: How a note shows an input value: :meth:`Issues.preview` of the batch.
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
    return None, f"contexts: expected a JSON list of strings, got {kind(value)} ({preview(value)})"


def _special_context(text: str, nonstring: bool, cfg: InputSection, preview: Preview) -> Row:
    if nonstring:  # JSON input: ``text`` is the JSON text of a list, number, object, ...
        value = json.loads(text)
        if isinstance(value, list):
            return _items(value, cfg, preview)
        return None, f"contexts: expected a list or a string, got {kind(value)} ({preview(value)})"
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
                f"contexts: item {index} is {kind(item)} ({preview(item)}); expected "
                "a string or an object with a text field"
            )
    return texts, None


def _object_text(
    item: dict, index: int, configured: str | None, preview: Preview
) -> tuple[str | None, str | None]:
    """An object item's text: the first candidate key with a non-null value."""
    fields = text_fields(list(item), configured)
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
        f"contexts: item {index} field {field!r} is {kind(value)} ({preview(value)}), "
        "expected a string"
    )


def _to_arrow(
    rows: Sequence[Row | None], issues: Issues, positions: list[int] | None = None
) -> pa.Array:
    """list<string> array from per-row results, recording each row's issue."""
    values: list[list | None] = []
    for k, row in enumerate(rows):
        texts, problem = row if row is not None else (None, None)
        if problem:
            issues.add(C.CONTEXTS, positions[k] if positions else k, problem)
        values.append(texts)
    try:
        return pa.array(values, LIST_OF_STRINGS)
    except (pa.ArrowException, UnicodeError):
        return _drop_bad_unicode(values, issues, positions)


def _drop_bad_unicode(
    values: list[list | None], issues: Issues, positions: list[int] | None
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
    return pa.array(cleaned, LIST_OF_STRINGS)
