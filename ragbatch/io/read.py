"""Find input files, split them into read tasks, and read each task into Arrow.

The reading side of the job has three steps, all driven by :class:`~ragbatch.config.InputSection`:

1. :func:`plan_read` lists the files behind ``input.uri`` (one file, a directory searched
   recursively, or a glob), decides each file's format, and cuts them into picklable
   :class:`ReadTask` units: one per text file, one per group of Parquet row groups.
2. :func:`read_task` reads one task into a :class:`pyarrow.Table` holding the file's own
   columns plus the hive ``key=value`` directory parts as string columns.
3. :func:`ragbatch.io.schema.normalize` turns that raw table into the canonical columns.
   It must see the output of :func:`read_task` unchanged (same process), because JSON
   input can carry the :data:`NONSTRING_COLUMN` marker described below.

Raw column types per format
---------------------------
* Parquet: the file's own Arrow types.
* CSV / TSV: every column is ``string``; an empty field (quoted or not) is null, nothing else
  is (``"NA"``, ``"null"`` and ``"007"`` stay as written).
* JSON lines / JSON array: a column whose non-null values share one JSON kind gets the
  Arrow type pyarrow infers for them (``string``, ``int64``/``double``, ``bool``, ``list``,
  ``struct``). A column that mixes kinds (``"x"`` in one row and ``42`` in another), or
  whose values pyarrow cannot type (ragged nested objects, integers beyond 64 bits),
  becomes a ``string`` column: strings are kept verbatim and every other value is stored
  as its JSON text (``42``, ``true``, ``{"a": 1}``). The rows where that happened are
  listed in the extra column :data:`NONSTRING_COLUMN` (``list<string>`` of column names,
  null when none), so normalization can tell the string ``"42"`` from the number ``42``
  and flag the latter. The marker column only exists when some column needed it and is
  never a slice column.
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import io
import gzip
import json
import lzma
import posixpath
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator
from urllib.parse import unquote

import fsspec
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from fsspec.core import has_magic
from fsspec.implementations.local import LocalFileSystem

from ragbatch.config import InputSection
from ragbatch.errors import InputError, InputNotFoundError
from ragbatch.io.fs import (describe_storage_error, is_not_found, is_process_local, resolve,
                            with_storage_retries)

#: Data file extensions and the format each implies.
FORMAT_BY_EXTENSION: dict[str, str] = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".csv": "csv",
    ".tsv": "tsv",
    ".tab": "tsv",
}

#: Compression suffixes recognised after a data extension (``data.csv.gz``), with the
#: fsspec codec name that reads them.
COMPRESSION_BY_EXTENSION: dict[str, str] = {
    ".gz": "gzip",
    ".gzip": "gzip",
    ".bz2": "bz2",
    ".xz": "xz",
    ".lzma": "lzma",
    ".zst": "zstd",
    ".zstd": "zstd",
    ".lz4": "lz4",
    ".snappy": "snappy",
}

#: Extra raw column (JSON input only) listing, per row, the columns whose value was not a
#: JSON string but is stored as JSON text in a string column. See the module notes.
NONSTRING_COLUMN = "__ragbatch_nonstring__"

#: Hive's spelling of a null partition value.
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"

#: How much of the first file :func:`peek_schema` reads for text formats.
PEEK_BYTES = 1 << 20
_PEEK_JSON_ROWS = 1000

_DELIMITER = {"csv": ",", "tsv": "\t"}


@dataclass(frozen=True)
class ReadTask:
    """One unit of reading, small and picklable, sent to one Ray task.

    Attributes
    ----------
    path : str
        Path inside the filesystem, without protocol (``bucket/key`` on object stores).
    file_key : str
        Path relative to the input root, ``/``-separated (a single file: its basename).
        Generated row ids are ``f"{file_key}:{row_index}"``.
    format : str
        ``parquet``, ``jsonl``, ``json``, ``csv`` or ``tsv``.
    row_offset : int
        Index, within its file, of this task's first row.
    row_groups : tuple of int or None
        Parquet only: the row groups to read; None reads the whole file.
    partition : tuple of (str, str)
        Hive ``key=value`` directory parts between the input root and the file,
        URL-unquoted, in path order.
    """

    path: str
    file_key: str
    format: str
    row_offset: int = 0
    row_groups: tuple[int, ...] | None = None
    partition: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class _InputFile:
    path: str
    key: str
    format: str
    partition: tuple[tuple[str, str], ...]
    info: dict


# --------------------------------------------------------------------------- discovery


def split_extension(path: str) -> tuple[str | None, str | None]:
    """Format and compression implied by a file name.

    Returns
    -------
    tuple of (str or None, str or None)
        ``(format, compression)``; ``format`` is None when the name has no data extension,
        ``compression`` is an fsspec codec name or None.

    Examples
    --------
    >>> split_extension("runs/part-0.csv.gz")
    ('csv', 'gzip')
    >>> split_extension("LICENSE")
    (None, None)
    """
    name = posixpath.basename(path).lower()
    root, ext = posixpath.splitext(name)
    compression = COMPRESSION_BY_EXTENSION.get(ext)
    if compression is not None:
        root, ext = posixpath.splitext(root)
    return FORMAT_BY_EXTENSION.get(ext), compression


def _display(fs: fsspec.AbstractFileSystem, path: str) -> str:
    if isinstance(fs, LocalFileSystem):
        return path
    return fs.unstrip_protocol(path)


def _storage_call(uri: str, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return func(*args, **kwargs)
    except InputError:
        raise
    except Exception as exc:  # storage backends raise many unrelated types
        raise describe_storage_error(uri, exc) from exc


def _is_hidden(rel: str) -> bool:
    return any(part.startswith((".", "_")) for part in rel.split("/") if part)


def _glob_base(pattern: str) -> str:
    parts = pattern.split("/")
    fixed: list[str] = []
    for part in parts:
        if has_magic(part):
            break
        fixed.append(part)
    return "/".join(fixed)


def _relative(path: str, base: str) -> str:
    base = base.rstrip("/")
    if base and path.startswith(base + "/"):
        return path[len(base) + 1 :]
    if not base:
        return path.lstrip("/")
    return posixpath.basename(path)


def _list_tree(fs: fsspec.AbstractFileSystem, uri: str, path: str) -> dict[str, dict]:
    found = _storage_call(uri, fs.find, path, detail=True)
    return {name: info for name, info in found.items() if info.get("type", "file") != "directory"}


def _list_glob(fs: fsspec.AbstractFileSystem, uri: str, pattern: str) -> dict[str, dict]:
    matched = _storage_call(uri, fs.glob, pattern, detail=True)
    files: dict[str, dict] = {}
    for name, info in matched.items():
        if info.get("type") == "directory":
            files.update(_list_tree(fs, uri, name))
        else:
            files[name] = info
    return files


def _partition_of(rel: str) -> tuple[tuple[str, str], ...]:
    pairs = []
    for part in rel.split("/")[:-1]:
        key, sep, value = part.partition("=")
        if sep and key:
            pairs.append((unquote(key), unquote(value)))
    return tuple(pairs)


def _discover(cfg: InputSection) -> tuple[fsspec.AbstractFileSystem, list[_InputFile]]:
    """List the input files of ``cfg.uri`` in path order, with format and partition."""
    fs, root = resolve(cfg.uri, cfg.storage_options)
    if has_magic(root):
        listing = _list_glob(fs, cfg.uri, root)
        if not listing:
            raise InputNotFoundError(f"{cfg.uri}: the glob matched no files; check the pattern "
                                     "in input.uri")
        return fs, _select(cfg, listing, _glob_base(root), what="the glob matched")
    try:
        info = _storage_call(cfg.uri, fs.info, root)
    except InputError as exc:
        if is_not_found(exc.__cause__):
            raise InputNotFoundError(str(exc)) from exc.__cause__
        raise
    if info.get("type") == "directory":
        listing = _list_tree(fs, cfg.uri, root)
        return fs, _select(cfg, listing, root, what="the directory holds")
    path = info.get("name", root)
    fmt = cfg.format or split_extension(path)[0]
    if fmt is None:
        raise InputError(
            f"{cfg.uri}: cannot tell the file format from the name; set input.format to one "
            "of parquet, jsonl, json, csv, tsv"
        )
    return fs, [_InputFile(path, posixpath.basename(path), fmt, (), info)]


def _select(cfg: InputSection, listing: dict[str, dict], base: str, what: str) -> list[_InputFile]:
    visible = {p: i for p, i in listing.items() if not _is_hidden(_relative(p, base))}
    by_format: dict[str, list[str]] = {}
    unknown: list[str] = []
    for path in sorted(visible):
        fmt = split_extension(path)[0]
        if fmt is None:
            unknown.append(path)
        else:
            by_format.setdefault(fmt, []).append(path)
    if cfg.format is not None:
        chosen = by_format.get(cfg.format) or (unknown if not by_format else [])
        fmt = cfg.format
    elif len(by_format) > 1:
        listing_text = "; ".join(
            f"{f}: {len(paths)} file(s), e.g. {_relative(paths[0], base)}"
            for f, paths in sorted(by_format.items())
        )
        raise InputError(
            f"{cfg.uri}: the input mixes file formats ({listing_text}); point input.uri at "
            "one format (a narrower directory or a glob such as '*.csv') or set input.format"
        )
    else:
        fmt, chosen = next(iter(by_format.items()), (None, []))
    if not chosen:
        error = InputNotFoundError if not visible else InputError
        raise error(_no_files_message(cfg, listing, visible, unknown, base, what))
    files = [
        _InputFile(p, _relative(p, base), fmt, _partition_of(_relative(p, base)), visible[p])
        for p in sorted(chosen)
    ]
    _check_partitions(cfg, files)
    return files


def _no_files_message(cfg, listing, visible, unknown, base, what) -> str:
    if not listing:
        return f"{cfg.uri}: no input files ({what} nothing)"
    names = [_relative(p, base) for p in (unknown or sorted(listing))][:5]
    hidden = len(listing) - len(visible)
    wanted = f"{cfg.format} " if cfg.format else ""
    return (
        f"{cfg.uri}: no {wanted}data files: {what} {len(listing)} file(s) "
        f"({hidden} hidden, e.g. {', '.join(names)}); data files end in "
        f"{', '.join(sorted(FORMAT_BY_EXTENSION))} (optionally + .gz/.bz2/.xz/.zst); "
        "set input.format to read other names"
    )


def _check_partitions(cfg: InputSection, files: list[_InputFile]) -> None:
    first = files[0]
    keys = tuple(k for k, _ in first.partition)
    for item in files[1:]:
        other = tuple(k for k, _ in item.partition)
        if other != keys:
            raise InputError(
                f"{cfg.uri}: hive partition directories differ between files: {first.key} has "
                f"{list(keys)} but {item.key} has {list(other)}; every file needs the same "
                "key=value directory levels"
            )


# --------------------------------------------------------------------------- planning


def plan_read(cfg: InputSection, target_rows_per_task: int = 100_000) -> list[ReadTask]:
    """List the input files and cut them into read tasks.

    Parameters
    ----------
    cfg : InputSection
        ``uri``, ``format`` and ``storage_options`` are used.
    target_rows_per_task : int, default 100_000
        Parquet files are split between row groups into tasks of about this many rows
        (a single larger row group stays whole). Text files are one task each. Each task
        is read, scored and written by one Ray task; 100,000 rows of long RAG traces are
        about 0.5 GB in memory, and several tasks per CPU keep the CPUs evenly busy.

    Returns
    -------
    list of ReadTask
        Sorted by file path, then by row offset; the same input gives the same list.

    Raises
    ------
    InputError
        Nothing matches the URI, the directory or glob holds no data files, formats are
        mixed without ``input.format``, partition directories are inconsistent, a Parquet
        footer cannot be read, or the storage is unreachable.

    Notes
    -----
    Reads only listings and Parquet footers (in parallel threads on remote storage).
    """
    if target_rows_per_task < 1:
        raise ValueError("target_rows_per_task must be >= 1")
    fs, files = _discover(cfg)
    tasks: list[ReadTask] = []
    parquet = [f for f in files if f.format == "parquet"]
    counts = _row_group_counts(fs, parquet)
    for item in files:
        if item.format == "parquet":
            tasks.extend(_parquet_tasks(item, counts[item.path], target_rows_per_task))
        else:
            tasks.append(ReadTask(item.path, item.key, item.format, partition=item.partition))
    return tasks


def _row_group_counts(fs: fsspec.AbstractFileSystem, files: list[_InputFile]) -> dict[str, list[int]]:
    def count(item: _InputFile) -> list[int]:
        meta = _parquet_metadata(fs, item.path)
        return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]

    if len(files) > 1 and not isinstance(fs, LocalFileSystem) and not is_process_local(fs):
        with ThreadPoolExecutor(max_workers=min(16, len(files))) as pool:
            return dict(zip((f.path for f in files), pool.map(count, files)))
    return {f.path: count(f) for f in files}


def _parquet_tasks(item: _InputFile, counts: list[int], target: int) -> list[ReadTask]:
    if len(counts) <= 1:
        return [ReadTask(item.path, item.key, "parquet", partition=item.partition)]
    tasks: list[ReadTask] = []
    group: list[int] = []
    start = rows = offset = 0
    for index, n in enumerate(counts):
        if group and rows + n > target:
            tasks.append(ReadTask(item.path, item.key, "parquet", start, tuple(group), item.partition))
            start, group, rows = offset, [], 0
        group.append(index)
        rows += n
        offset += n
    tasks.append(ReadTask(item.path, item.key, "parquet", start, tuple(group), item.partition))
    return tasks


# --------------------------------------------------------------------------- fingerprint


_VERSION_KEYS = ("ETag", "etag", "generation", "md5Hash", "mtime", "LastModified",
                 "last_modified", "updated", "created")


def input_fingerprint(cfg: InputSection, tasks: list[ReadTask]) -> dict:
    """Identify the input files by metadata, to record in the run manifest.

    Parameters
    ----------
    cfg : InputSection
    tasks : list of ReadTask
        As returned by :func:`plan_read`; each distinct file counts once.

    Returns
    -------
    dict
        ``{"files": [{"path": str, "size": int, "etag_or_mtime": str | None}, ...],
        "sha256": str}`` with files in path order; ``sha256`` hashes the canonical JSON of
        ``files``. Never reads file contents: one listing, plus a ``stat`` for any file
        the listing lacks.

    Raises
    ------
    InputError
        The storage cannot be listed.
    """
    fs, files = _discover(cfg)
    known = {f.path: f.info for f in files}
    entries = []
    for path in sorted({t.path for t in tasks}):
        info = known.get(path) or _storage_call(_display(fs, path), fs.info, path)
        entries.append(
            {
                "path": _display(fs, path),
                "size": int(info.get("size") or 0),
                "etag_or_mtime": _version_tag(info),
            }
        )
    digest = hashlib.sha256(json.dumps(entries, sort_keys=True).encode("utf-8")).hexdigest()
    return {"files": entries, "sha256": digest}


def _version_tag(info: dict) -> str | None:
    for key in _VERSION_KEYS:
        value = info.get(key)
        if value not in (None, ""):
            return value.isoformat() if hasattr(value, "isoformat") else str(value)
    return None


# --------------------------------------------------------------------------- reading


def read_task(task: ReadTask, cfg: InputSection) -> pa.Table:
    """Read one task's rows.

    Parameters
    ----------
    task : ReadTask
    cfg : InputSection
        ``uri``, ``storage_options`` and ``encoding`` are used.

    Returns
    -------
    pyarrow.Table
        The file's columns (types per the module notes), then one ``string`` column per
        hive partition key not already in the file (value null for
        ``__HIVE_DEFAULT_PARTITION__``), and for JSON input possibly
        :data:`NONSTRING_COLUMN`. Rows in file order.

    Raises
    ------
    InputError
        The file is missing or unreadable (message names the file and the likely cause;
        an unreachable endpoint, a timeout or throttling is first retried with backoff),
        is not valid Parquet, has a malformed CSV row, a bad JSON line (with its line
        number), or bytes that are invalid in ``input.encoding`` (with byte offset and
        line).
    """
    fs, _ = resolve(cfg.uri, cfg.storage_options)
    reader = _READERS[task.format]
    # The file was listed while planning, so an unreachable or throttling store now is
    # transient: wait and read again (see ragbatch.io.fs.with_storage_retries).
    table = with_storage_retries(lambda: reader(fs, task, cfg), f"read {task.path}")
    return _add_partitions(table, task.partition)


def read_task_head(task: ReadTask, cfg: InputSection, max_rows: int) -> pa.Table:
    """The first ``max_rows`` rows of a task, as :func:`read_task` returns them.

    Parameters
    ----------
    task : ReadTask
    cfg : InputSection
    max_rows : int
        At least 0.

    Returns
    -------
    pyarrow.Table
        At most ``max_rows`` rows, with the columns :func:`read_task` gives.

    Raises
    ------
    InputError
        As :func:`read_task`.

    Notes
    -----
    Parquet: decodes only the row groups that hold those rows. Text formats: the whole
    file is read and parsed (quoted fields may span lines), then cut.
    """
    if task.format != "parquet":
        return read_task(task, cfg).slice(0, max_rows)
    fs, _ = resolve(cfg.uri, cfg.storage_options)
    where = _display(fs, task.path)
    _refuse_compressed_parquet(task.path)

    def head() -> pa.Table:
        with fs.open(task.path, "rb") as handle:
            parquet = pq.ParquetFile(handle)
            groups = (list(task.row_groups) if task.row_groups is not None
                      else list(range(parquet.num_row_groups)))
            parts, rows = [], 0
            for group in groups:
                if rows >= max_rows:
                    break
                parts.append(parquet.read_row_group(group))
                rows += parts[-1].num_rows
            if not parts:
                return parquet.schema_arrow.empty_table()
            return pa.concat_tables(parts).slice(0, max_rows)

    try:
        table = with_storage_retries(head, f"read {task.path}")
    except pa.ArrowException as exc:
        raise _bad_parquet(where, exc) from None
    except InputError:
        raise
    except Exception as exc:
        raise describe_storage_error(where, exc) from exc
    return _add_partitions(table, task.partition)


def peek_schema(cfg: InputSection) -> pa.Schema:
    """The raw column schema of the input, read cheaply from its first data file.

    Returns
    -------
    pyarrow.Schema
        Parquet: the footer schema; CSV/TSV: the header, all ``string``; JSON: the types
        of the first rows (up to 1,000, or the first MiB). Hive partition keys are
        appended as ``string`` fields. :data:`NONSTRING_COLUMN` is never included.

    Raises
    ------
    InputError
        As :func:`plan_read` and :func:`read_task`.

    Notes
    -----
    Other files may differ (JSON types are a sample); normalization copes per task.
    """
    fs, files = _discover(cfg)
    item = next((f for f in files if f.info.get("size", 1) != 0), files[0])
    if item.format == "parquet":
        schema = _parquet_metadata(fs, item.path).schema.to_arrow_schema()
        schema = pa.schema(list(schema))
    else:
        table = _peek_text(fs, item, cfg)
        schema = table.schema
        if NONSTRING_COLUMN in schema.names:
            schema = schema.remove(schema.get_field_index(NONSTRING_COLUMN))
    for key, _ in item.partition:
        if key not in schema.names:
            schema = schema.append(pa.field(key, pa.string()))
    return schema


def _peek_text(fs: fsspec.AbstractFileSystem, item: _InputFile, cfg: InputSection) -> pa.Table:
    where = _display(fs, item.path)
    if item.format in _DELIMITER:
        data = _read_bytes(fs, item.path, limit=PEEK_BYTES)
        text = _decode(data, cfg.encoding, where)
        names = _csv_header(text, _DELIMITER[item.format], where)
        return pa.table({n: pa.array([], pa.string()) for n in names})
    # A JSON array can only be parsed whole; JSON lines are cut after whole lines.
    data = _read_bytes(fs, item.path, limit=None if item.format == "json" else PEEK_BYTES)
    text = _decode(data, cfg.encoding, where)
    records, lines = _json_records(text, item.format, where, max_rows=_PEEK_JSON_ROWS)
    return _records_to_table(records, lines, where)


def _add_partitions(table: pa.Table, partition: tuple[tuple[str, str], ...]) -> pa.Table:
    for key, value in partition:
        if key in table.column_names:
            continue  # the file's own column wins over the directory name
        column = pa.nulls(table.num_rows, pa.string()) if value == HIVE_NULL else (
            pa.array([value] * table.num_rows, pa.string())
        )
        table = table.append_column(pa.field(key, pa.string()), column)
    return table


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
    where = _display(fs, path)
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
            f"{where}: byte 0x{data[exc.start:exc.start + 1].hex()} at byte offset {exc.start} "
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
    return names


def _read_delimited(fs: fsspec.AbstractFileSystem, task: ReadTask, cfg: InputSection) -> pa.Table:
    where = _display(fs, task.path)
    data = _read_bytes(fs, task.path)
    text = _decode(data, cfg.encoding, where)
    names = _csv_header(text, _DELIMITER[task.format], where)
    if not names:
        return pa.table({})
    try:
        table = pacsv.read_csv(
            io.BytesIO(_utf8(data, text, cfg.encoding)),
            parse_options=pacsv.ParseOptions(
                delimiter=_DELIMITER[task.format], quote_char='"', double_quote=True,
                newlines_in_values=True,
            ),
            convert_options=pacsv.ConvertOptions(
                column_types={n: pa.string() for n in names},
                null_values=[""],
                strings_can_be_null=True,
                quoted_strings_can_be_null=True,
            ),
        )
    except pa.ArrowInvalid as exc:
        raise InputError(f"{where}: malformed {task.format.upper()}: {exc}") from None
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


def _json_records(
    text: str, fmt: str, where: str, max_rows: int | None = None
) -> tuple[list[dict], list[int]]:
    """Parse JSON input into records and, per record, its 1-based line (0 for arrays)."""
    if fmt == "json" and text.lstrip()[:1] == "[":
        return _json_array(text, where, max_rows)
    records: list[dict] = []
    lines: list[int] = []
    hint = " (a .json file must hold a JSON array of objects or one object per line)" if fmt == "json" else ""
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
    for index, value in enumerate(values):
        if not isinstance(value, dict):
            raise InputError(
                f"{where}: element {index} of the JSON array is {_json_kind(value)}, expected "
                "an object (one record per element)"
            )
    if max_rows is not None:
        values = values[:max_rows]
    return values, [0] * len(values)


def _records_to_table(records: list[dict], lines: list[int], where: str) -> pa.Table:
    names: dict[str, None] = {}
    for record in records:
        for key in record:
            names.setdefault(key, None)
    columns: dict[str, pa.Array] = {}
    flagged: list[list[str] | None] = [None] * len(records)
    for name in names:
        values = [record.get(name) for record in records]
        array, marks = _json_column(values)
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


def _json_column(values: list[Any]) -> tuple[pa.Array | None, list[int]]:
    """Arrow array for one JSON column and the rows stored as JSON text (see module notes)."""
    kinds = {_json_kind(v) for v in values if v is not None}
    if len(kinds) <= 1:
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


def _read_json(fs: fsspec.AbstractFileSystem, task: ReadTask, cfg: InputSection) -> pa.Table:
    where = _display(fs, task.path)
    text = _decode(_read_bytes(fs, task.path), cfg.encoding, where)
    records, lines = _json_records(text, task.format, where)
    return _records_to_table(records, lines, where)


# ----- Parquet


def _parquet_metadata(fs: fsspec.AbstractFileSystem, path: str) -> pq.FileMetaData:
    where = _display(fs, path)
    _refuse_compressed_parquet(path)
    try:
        with fs.open(path, "rb") as handle:
            return pq.ParquetFile(handle).metadata
    except pa.ArrowException as exc:
        raise _bad_parquet(where, exc) from None
    except Exception as exc:
        raise describe_storage_error(where, exc) from exc


def _read_parquet(fs: fsspec.AbstractFileSystem, task: ReadTask, cfg: InputSection) -> pa.Table:
    where = _display(fs, task.path)
    _refuse_compressed_parquet(task.path)
    try:
        if isinstance(fs, LocalFileSystem):
            # Memory-mapped: Arrow decodes straight from the page cache, about twice as
            # fast as reading through a Python file object.
            return _read_row_groups(pq.ParquetFile(task.path, memory_map=True), task)
        with fs.open(task.path, "rb") as handle:
            return _read_row_groups(pq.ParquetFile(handle), task)
    except pa.ArrowException as exc:
        raise _bad_parquet(where, exc) from None
    except Exception as exc:
        raise describe_storage_error(where, exc) from exc


def _read_row_groups(parquet: pq.ParquetFile, task: ReadTask) -> pa.Table:
    if task.row_groups is None:
        return parquet.read()
    return parquet.read_row_groups(list(task.row_groups))


def _refuse_compressed_parquet(path: str) -> None:
    if split_extension(path)[1] is not None:
        raise InputError(
            f"{path}: Parquet files are compressed internally; decompress the file "
            "(remove the outer compression suffix) before reading it"
        )


def _bad_parquet(where: str, exc: Exception) -> InputError:
    return InputError(
        f"{where}: not a readable Parquet file ({exc}); the file is corrupt, truncated or in "
        "another format: re-export it, or set input.format if the extension is wrong"
    )


_READERS: dict[str, Callable[[fsspec.AbstractFileSystem, ReadTask, InputSection], pa.Table]] = {
    "parquet": _read_parquet,
    "csv": _read_delimited,
    "tsv": _read_delimited,
    "jsonl": _read_json,
    "json": _read_json,
}
