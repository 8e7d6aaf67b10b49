"""Bytes, text, CSV/TSV and JSON: the text formats' side of reading one input file.

Each reader returns the raw table that :func:`ragbatch.io.read.read_task` hands on (its
module notes give the column types per format). Errors name the file and, where there is
one, the line or byte offset, and say what to change.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import json
import logging
import lzma
import zlib
from typing import Any, Iterator

import fsspec
import pyarrow as pa
import pyarrow.csv as pacsv

from ragbatch.core.columns import internal
from ragbatch.core.errors import InputError
from ragbatch.io.fs import describe_storage_error
from ragbatch.io.listing import display_path, split_extension
from ragbatch.io.names import refuse_internal_names

log = logging.getLogger(__name__)

#: Extra raw column (JSON input only) listing, per row, the columns whose value was not a
#: JSON string but is stored as JSON text in a string column. See the module notes of
#: :mod:`ragbatch.io.read`.
NONSTRING_COLUMN = internal("nonstring__")

#: How much of a JSON lines or delimited file :func:`peek_text` reads, in bytes.
PEEK_BYTES = 1 << 20
#: How many JSON records :func:`peek_text` parses at most.
PEEK_JSON_ROWS = 1000

#: Field delimiter per delimited format.
DELIMITERS = {"csv": ",", "tsv": "\t"}


def peek_text(
    fs: fsspec.AbstractFileSystem,
    path: str,
    fmt: str,
    encoding: str,
    objects_as_text: frozenset[str] = frozenset(),
) -> pa.Table:
    """The start of a text file as a table: CSV/TSV the header only (no rows, all
    ``string``); JSON the first :data:`PEEK_JSON_ROWS` records (a JSON array is read whole,
    JSON lines up to about :data:`PEEK_BYTES`), ``objects_as_text`` as :func:`read_json`.
    Errors as the readers'."""
    where = display_path(fs, path)
    if fmt in DELIMITERS:
        data = _read_bytes(fs, path, limit=PEEK_BYTES)
        text = _decode(data, encoding, where)
        names = _csv_header(text, DELIMITERS[fmt], where)
        if _has_index_column(names):
            log.warning(
                "%s: the first column has no name: a pandas index (DataFrame.to_csv() "
                "without index=False); it is not read",
                where,
            )
        return pa.table({n: pa.array([], pa.string()) for n in _named(names)})
    # A JSON array can only be parsed whole; JSON lines are cut after whole lines.
    data = _read_bytes(fs, path, limit=None if fmt == "json" else PEEK_BYTES)
    text = _decode(data, encoding, where)
    records, lines = _json_records(text, fmt, where, max_rows=PEEK_JSON_ROWS)
    return _records_to_table(records, lines, where, objects_as_text)


# ----- bytes and text


def _compression(path: str) -> str | None:
    from fsspec.compression import compr

    codec = split_extension(path)[1]
    if codec is not None and codec not in compr:
        package = {"zstd": "zstandard", "lz4": "lz4", "snappy": "python-snappy"}.get(codec, codec)
        raise InputError(
            f"{path}: reading {codec}-compressed files needs the package {package!r}; "
            f"run: pip install {package}"
        )
    return codec


def _read_bytes(fs: fsspec.AbstractFileSystem, path: str, limit: int | None = None) -> bytes:
    """The (decompressed) bytes of a file; with ``limit``, whole lines up to about it."""
    where = display_path(fs, path)
    codec = _compression(path)
    try:
        with fs.open(path, "rb", compression=codec) as handle:
            if limit is None:
                return handle.read()
            data = handle.read(limit)
            if len(data) < limit:
                return data
            cut = data.rfind(b"\n")
            return data[: cut + 1] if cut >= 0 else data + handle.read()
    except InputError:
        raise
    except Exception as exc:
        if codec is not None and _is_decompression_error(exc):
            raise InputError(
                f"{where}: cannot decompress as {codec} ({exc}); the file is truncated or not "
                "really compressed with that codec: check the file or its name"
            ) from exc
        raise describe_storage_error(where, exc) from exc


def _is_decompression_error(exc: Exception) -> bool:
    if isinstance(exc, (EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile)):
        return True
    text = str(exc).lower()
    return isinstance(exc, OSError) and ("data stream" in text or "compress" in text)


def _decode(data: bytes, encoding: str, where: str) -> str:
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise InputError(
            f"input.encoding: unknown encoding {encoding!r}; use a Python codec name such as "
            "'utf-8', 'utf-8-sig', 'latin-1' or 'cp1252'"
        ) from None
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(
            f"{where}: byte 0x{data[exc.start : exc.start + 1].hex()} at byte offset {exc.start} "
            f"(line {line}) is not valid {encoding} ({exc.reason}); the file uses another "
            "encoding: set input.encoding to it (for example 'latin-1' or 'cp1252')"
        ) from None
    return text[1:] if text.startswith("\ufeff") else text


def _utf8(data: bytes, text: str, encoding: str) -> bytes:
    if codecs.lookup(encoding).name == "utf-8" and not data.startswith(codecs.BOM_UTF8):
        return data
    return text.encode("utf-8")


def _lines(text: str) -> Iterator[str]:
    """Lines of ``text`` split on ``\\n`` only, each with its newline, lazily."""
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        if end < 0:
            yield text[start:]
            return
        yield text[start : end + 1]
        start = end + 1


# ----- CSV / TSV


def _csv_header(text: str, delimiter: str, where: str) -> list[str]:
    rows = csv.reader(_lines(text), delimiter=delimiter, quotechar='"', doublequote=True)
    names = next((row for row in rows if row), [])
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InputError(
            f"{where}: the header repeats column name(s) {duplicates}; give every column a "
            "distinct name"
        )
    refuse_internal_names(names, where)
    return names


def _has_index_column(names: list[str]) -> bool:
    """Whether the header starts with an empty name: what ``pandas.DataFrame.to_csv()``
    writes above its index. That column is skipped."""
    return bool(names) and names[0] == ""


def _named(names: list[str]) -> list[str]:
    """The header without a leading pandas index column."""
    return names[1:] if _has_index_column(names) else names


def read_delimited(fs: fsspec.AbstractFileSystem, path: str, fmt: str, encoding: str) -> pa.Table:
    """A CSV (``fmt="csv"``) or TSV (``"tsv"``) file: every column ``string``, ``""`` null.

    A first column whose header cell is empty (the index ``pandas.DataFrame.to_csv()``
    writes) is skipped. Raises ``InputError`` for bytes invalid in ``encoding``, a repeated
    header name, a name starting with :data:`ragbatch.core.columns.INTERNAL_PREFIX`, or a
    malformed row.
    """
    where = display_path(fs, path)
    data = _read_bytes(fs, path)
    text = _decode(data, encoding, where)
    header = _csv_header(text, DELIMITERS[fmt], where)
    names = _named(header)
    if not names:
        return pa.table({})
    try:
        table = pacsv.read_csv(
            io.BytesIO(_utf8(data, text, encoding)),
            parse_options=pacsv.ParseOptions(
                delimiter=DELIMITERS[fmt],
                quote_char='"',
                double_quote=True,
                newlines_in_values=True,
            ),
            convert_options=pacsv.ConvertOptions(
                include_columns=names,
                column_types={n: pa.string() for n in names},
                null_values=[""],
                strings_can_be_null=True,
                quoted_strings_can_be_null=True,
            ),
        )
    except pa.ArrowInvalid as exc:
        raise InputError(f"{where}: malformed {fmt.upper()}: {exc}") from None
    if table.column_names != names or any(t != pa.string() for t in table.schema.types):
        raise InputError(
            f"{where}: the header could not be read consistently (got {table.column_names}, "
            f"expected {names}); check the quoting of the first line"
        )
    return table


# ----- JSON lines / JSON array


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _unreadable(exc: ValueError | RecursionError) -> str:
    """Why ``json.loads`` refused valid JSON: Python reads no integer of more than 4300
    digits (``sys.get_int_max_str_digits``) and no nesting deeper than its recursion
    limit."""
    if isinstance(exc, RecursionError):
        return "lists or objects nested too deeply to read; fix or remove that value"
    return (
        "an integer of more than 4300 digits, which Python does not read; write it as a "
        "string or remove it"
    )


def _json_records(
    text: str, fmt: str, where: str, max_rows: int | None = None
) -> tuple[list[dict], list[int]]:
    """Parse JSON input into records and, per record, its 1-based line (0 for arrays)."""
    if fmt == "json" and text.lstrip()[:1] == "[":
        return _json_array(text, where, max_rows)
    records: list[dict] = []
    lines: list[int] = []
    hint = (
        " (a .json file must hold a JSON array of objects or one object per line)"
        if fmt == "json"
        else ""
    )
    for number, line in enumerate(_lines(text), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"{where}, line {number}: not valid JSON ({exc.msg} at column {exc.colno}); "
                f"fix or remove that line{hint}"
            ) from None
        except (ValueError, RecursionError) as exc:
            raise InputError(f"{where}, line {number}: {_unreadable(exc)}{hint}") from None
        if not isinstance(value, dict):
            raise InputError(
                f"{where}, line {number}: expected a JSON object (one record per line), got "
                f"{_json_kind(value)}{hint}"
            )
        records.append(value)
        lines.append(number)
        if max_rows is not None and len(records) >= max_rows:
            break
    return records, lines


def _json_array(text: str, where: str, max_rows: int | None) -> tuple[list[dict], list[int]]:
    try:
        values = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{where}: not valid JSON at line {exc.lineno}, column {exc.colno} ({exc.msg})"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{where}: {_unreadable(exc)}") from None
    for index, value in enumerate(values):
        if not isinstance(value, dict):
            raise InputError(
                f"{where}: element {index} of the JSON array is {_json_kind(value)}, expected "
                "an object (one record per element)"
            )
    if max_rows is not None:
        values = values[:max_rows]
    return values, [0] * len(values)


def _records_to_table(
    records: list[dict], lines: list[int], where: str, objects_as_text: frozenset[str] = frozenset()
) -> pa.Table:
    names: dict[str, None] = {}
    for record in records:
        for key in record:
            names.setdefault(key, None)
    refuse_internal_names(names, where)
    columns: dict[str, pa.Array] = {}
    flagged: list[list[str] | None] = [None] * len(records)
    for name in names:
        values = [record.get(name) for record in records]
        array, marks = _json_column(values, objects_as_text=name in objects_as_text)
        if array is None:
            _raise_bad_unicode(values, name, lines, where)
        columns[name] = array
        for row in marks:
            flagged[row] = (flagged[row] or []) + [name]
    if columns:
        table = pa.table(columns)
    else:  # records without keys: keep the row count
        table = pa.table({"_": pa.nulls(len(records))}).drop_columns(["_"])
    if any(f is not None for f in flagged):
        table = table.append_column(NONSTRING_COLUMN, pa.array(flagged, pa.list_(pa.string())))
    return table


def _json_column(
    values: list[Any], objects_as_text: bool = False
) -> tuple[pa.Array | None, list[int]]:
    """Arrow array for one JSON column and the rows stored as JSON text (see the module notes of
    :mod:`ragbatch.io.read`); with ``objects_as_text``, objects are stored as JSON text too."""
    kinds = {_json_kind(v) for v in values if v is not None}
    if len(kinds) <= 1 and not (objects_as_text and "object" in kinds):
        try:
            return pa.array(values), []
        except (pa.ArrowException, TypeError, ValueError, OverflowError, UnicodeError):
            pass
    texts: list[str | None] = []
    marks: list[int] = []
    for row, value in enumerate(values):
        if value is None or isinstance(value, str):
            texts.append(value)
        else:
            texts.append(json.dumps(value, ensure_ascii=False))
            marks.append(row)
    try:
        return pa.array(texts, pa.string()), marks
    except (pa.ArrowException, UnicodeError):
        return None, []


def _raise_bad_unicode(values: list[Any], name: str, lines: list[int], where: str) -> None:
    for row, value in enumerate(values):
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        try:
            (text or "").encode("utf-8")
        except UnicodeEncodeError:
            place = f"line {lines[row]}" if lines[row] else f"record {row}"
            raise InputError(
                f"{where}, {place}: column {name!r} holds a string with an unpaired UTF-16 "
                "surrogate escape (e.g. \\ud800), which is not valid Unicode; fix the value"
            ) from None
    raise InputError(f"{where}: column {name!r} cannot be converted to Arrow")


def read_json(
    fs: fsspec.AbstractFileSystem,
    path: str,
    fmt: str,
    encoding: str,
    objects_as_text: frozenset[str] = frozenset(),
) -> pa.Table:
    """A JSON lines (``fmt="jsonl"``) or JSON file (``"json"``: an array of objects, or one
    object per line) as a table; mixed-kind columns as in the module notes of
    :mod:`ragbatch.io.read`, with :data:`NONSTRING_COLUMN` when needed.

    The columns named in ``objects_as_text`` keep object values as JSON text (marked as
    mixed-kind values are): a column of objects with different keys per row would
    otherwise become a struct with a field for every key of the file in every row (the
    ``relevance`` grades of :func:`ragbatch.io.read.objects_as_text`).

    Raises ``InputError`` naming the line (or array element) that is not a JSON object.
    """
    where = display_path(fs, path)
    text = _decode(_read_bytes(fs, path), encoding, where)
    records, lines = _json_records(text, fmt, where)
    return _records_to_table(records, lines, where, objects_as_text)
