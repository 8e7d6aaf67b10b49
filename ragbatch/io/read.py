"""Find input files, split them into read tasks, and read each task into Arrow.

The reading side of the job has three steps, all driven by :class:`~ragbatch.config.job.InputSection`:

1. :func:`plan_read` lists the files behind ``input.uri`` (one file, a directory searched
   recursively, or a glob; :mod:`ragbatch.io.listing`), decides each file's format, and
   cuts them into picklable :class:`ReadTask` units: one per text file, one per group of
   Parquet row groups.
2. :func:`read_task` reads one task into a :class:`pyarrow.Table` holding the file's own
   columns plus the hive ``key=value`` directory parts as string columns (Parquet here,
   the text formats in :mod:`ragbatch.io.text_formats`).
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

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from ragbatch.config.job import InputSection
from ragbatch.core.errors import InputError
from ragbatch.io.formats import filter_rows, table_format
from ragbatch.io.formats.openinference import read_spans
from ragbatch.io.fs import describe_storage_error, is_process_local, resolve, with_storage_retries
from ragbatch.io.names import refuse_internal_names
from ragbatch.io.listing import (
    COMPRESSION_BY_EXTENSION,
    FORMAT_BY_EXTENSION,
    InputFile,
    discover,
    display_path,
    split_extension,
    storage_call,
)
from ragbatch.io.text_formats import (
    DELIMITERS,
    NONSTRING_COLUMN,
    PEEK_BYTES,
    peek_text,
    read_delimited,
    read_json,
)

__all__ = [
    "COMPRESSION_BY_EXTENSION",
    "FORMAT_BY_EXTENSION",
    "HIVE_NULL",
    "NONSTRING_COLUMN",
    "PEEK_BYTES",
    "ReadTask",
    "input_fingerprint",
    "peek_schema",
    "plan_read",
    "read_task",
    "read_task_head",
    "split_extension",
]

#: Hive's spelling of a null partition value.
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


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


# --------------------------------------------------------------------------- planning


#: What :func:`ragbatch.io.listing.discover` returns: the filesystem and the input files.
Listing = tuple[fsspec.AbstractFileSystem, list[InputFile]]


def plan_read(
    cfg: InputSection, target_rows_per_task: int = 100_000, listing: Listing | None = None
) -> list[ReadTask]:
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
    listing : (filesystem, list of InputFile), optional
        A :func:`~ragbatch.io.listing.discover` of ``cfg`` already made (a run lists its
        input once, for its tasks, schema and fingerprint); None lists it here.

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
    fs, files = listing or discover(cfg)
    tasks: list[ReadTask] = []
    parquet = [f for f in files if f.format == "parquet"]
    counts = _row_group_counts(fs, parquet)
    for item in files:
        if item.format == "parquet":
            tasks.extend(_parquet_tasks(item, counts[item.path], target_rows_per_task))
        else:
            tasks.append(ReadTask(item.path, item.key, item.format, partition=item.partition))
    return tasks


def _row_group_counts(
    fs: fsspec.AbstractFileSystem, files: list[InputFile]
) -> dict[str, list[int]]:
    def count(item: InputFile) -> list[int]:
        meta = _parquet_metadata(fs, item.path)
        return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]

    if len(files) > 1 and not isinstance(fs, LocalFileSystem) and not is_process_local(fs):
        with ThreadPoolExecutor(max_workers=min(16, len(files))) as pool:
            return dict(zip((f.path for f in files), pool.map(count, files)))
    return {f.path: count(f) for f in files}


def _parquet_tasks(item: InputFile, counts: list[int], target: int) -> list[ReadTask]:
    if len(counts) <= 1:
        return [ReadTask(item.path, item.key, "parquet", partition=item.partition)]
    tasks: list[ReadTask] = []
    group: list[int] = []
    start = rows = offset = 0
    for index, n in enumerate(counts):
        if group and rows + n > target:
            tasks.append(
                ReadTask(item.path, item.key, "parquet", start, tuple(group), item.partition)
            )
            start, group, rows = offset, [], 0
        group.append(index)
        rows += n
        offset += n
    tasks.append(ReadTask(item.path, item.key, "parquet", start, tuple(group), item.partition))
    return tasks


# --------------------------------------------------------------------------- fingerprint


_VERSION_KEYS = (
    "ETag",
    "etag",
    "generation",
    "md5Hash",
    "mtime",
    "LastModified",
    "last_modified",
    "updated",
    "created",
)


def input_fingerprint(
    cfg: InputSection, tasks: list[ReadTask], listing: Listing | None = None
) -> dict:
    """Identify the input files by metadata, to record in the run manifest.

    Parameters
    ----------
    cfg : InputSection
    tasks : list of ReadTask
        As returned by :func:`plan_read`; each distinct file counts once.
    listing : (filesystem, list of InputFile), optional
        The listing ``tasks`` were planned from (the fingerprint then describes exactly
        the files the run reads, as they were listed); None lists the input here.

    Returns
    -------
    dict
        ``{"files": [{"path": str, "size": int, "etag_or_mtime": str | None}, ...],
        "sha256": str}`` with files in path order; ``sha256`` hashes the canonical JSON of
        ``files``. A table format (``input.format: delta``) adds ``"table": {"format":
        str, <pin field>: int}`` (``version`` of a Delta table, ``snapshot_id`` of an
        Iceberg one), the version read, and ``sha256`` covers it too. Never
        reads file contents: one listing, plus a ``stat`` for any file the listing lacks.

    Raises
    ------
    InputError
        The storage cannot be listed.
    """
    fs, files = listing or discover(cfg)
    known = {f.path: f.info for f in files}
    entries = []
    for path in sorted({t.path for t in tasks}):
        info = known.get(path) or storage_call(display_path(fs, path), fs.info, path)
        entries.append(
            {
                "path": display_path(fs, path),
                "size": int(info.get("size") or 0),
                "etag_or_mtime": _version_tag(info),
            }
        )
    table = next((f.info["table_version"] for f in files if "table_version" in f.info), None)
    if table is not None:  # a table format: the version read identifies the input too
        blob: object = {"files": entries, "table": table}
        digest = hashlib.sha256(json.dumps(blob, sort_keys=True).encode("utf-8")).hexdigest()
        return {"files": entries, "table": table, "sha256": digest}
    digest = hashlib.sha256(json.dumps(entries, sort_keys=True).encode("utf-8")).hexdigest()
    return {"files": entries, "sha256": digest}


def _version_tag(info: dict) -> str | None:
    for key in _VERSION_KEYS:
        value = info.get(key)
        if value not in (None, ""):
            return value.isoformat() if hasattr(value, "isoformat") else str(value)
    return None


# --------------------------------------------------------------------------- reading


def read_task(
    task: ReadTask,
    cfg: InputSection,
    views: frozenset[str] = frozenset(),
    columns: frozenset[str] | None = None,
) -> pa.Table:
    """Read one task's rows.

    Parameters
    ----------
    task : ReadTask
    cfg : InputSection
        ``uri``, ``storage_options`` and ``encoding`` are used.
    views : frozenset of str
        Columns that may come back as string views (``string_view``, or a list of them,
        for a string or a list of strings) instead of the file's own type, when Polars'
        decoder reads the file (:func:`_read_text_columns_fast`): the strings are then
        not copied out of the decoded pages, which matters when many rows repeat the same
        long text. :func:`ragbatch.io.schema.normalize` takes them with ``views=True``.
        Empty (the default): every column has its type in the file, as PyArrow reads it.
        Ignored for a table input with ``input.filter``, whose rows are filtered.
    columns : frozenset of str, optional
        Parquet: read only the file's columns named here (those the file has, in the
        file's order; :func:`ragbatch.pipeline.projection.project_input` chooses them),
        so that columns no stage reads are not decoded. None (the default), or a set
        the file has none of: every column. Other formats read every column.

    Returns
    -------
    pyarrow.Table
        The file's columns (or those of ``columns`` it has; types per the module
        notes), then one ``string`` column per
        hive partition key not already in the file (value null for
        ``__HIVE_DEFAULT_PARTITION__``), and for JSON input possibly
        :data:`NONSTRING_COLUMN`. Rows in file order; for a table input, only those that
        meet ``input.filter`` (:func:`ragbatch.io.formats.filter_rows`).

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
    if cfg.filter and table_format(cfg.format) is not None:
        views = frozenset()  # rows are filtered, and Arrow cannot filter string views
    if task.format == "parquet":
        read = lambda: _read_parquet(fs, task, cfg, views, columns)  # noqa: E731
    else:
        read = lambda: _READERS[task.format](fs, task, cfg)  # noqa: E731
    # The file was listed while planning, so an unreachable or throttling store now is
    # transient: wait and read again (see ragbatch.io.fs.with_storage_retries).
    table = with_storage_retries(read, f"read {task.path}")
    return _table_rows(_add_partitions(table, task.partition), task, cfg)


def _table_rows(table: pa.Table, task: ReadTask, cfg: InputSection) -> pa.Table:
    """A table input's rows that meet ``input.filter`` (its partition conditions chose
    the task's file already); any other input's rows as they are."""
    if not cfg.filter or table_format(cfg.format) is None:
        return table
    return filter_rows(table, list(cfg.filter), frozenset(k for k, _ in task.partition))


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
    where = display_path(fs, task.path)
    _refuse_compressed_parquet(task.path)

    def head() -> pa.Table:
        with fs.open(task.path, "rb") as handle:
            parquet = pq.ParquetFile(handle)
            refuse_internal_names(parquet.schema_arrow.names, where)
            groups = (
                list(task.row_groups)
                if task.row_groups is not None
                else list(range(parquet.num_row_groups))
            )
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
    return _table_rows(_add_partitions(table, task.partition), task, cfg)


def peek_schema(cfg: InputSection, listing: Listing | None = None) -> pa.Schema:
    """The raw column schema of the input, read cheaply from its first data file
    (``listing``: as for :func:`plan_read`).

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
    fs, files = listing or discover(cfg)
    item = next((f for f in files if f.info.get("size", 1) != 0), files[0])
    if item.format == "parquet":
        schema = _parquet_metadata(fs, item.path).schema.to_arrow_schema()
        schema = pa.schema(list(schema))
        refuse_internal_names(schema.names, display_path(fs, item.path))
    elif item.format == "openinference":
        schema = read_spans(fs, item.path, cfg).schema
    else:
        table = peek_text(fs, item.path, item.format, cfg.encoding, objects_as_text(cfg))
        schema = table.schema
        if NONSTRING_COLUMN in schema.names:
            schema = schema.remove(schema.get_field_index(NONSTRING_COLUMN))
    for key, _ in item.partition:
        if key not in schema.names:
            schema = schema.append(pa.field(key, pa.string()))
    return schema


def _add_partitions(table: pa.Table, partition: tuple[tuple[str, str], ...]) -> pa.Table:
    for key, value in partition:
        if key in table.column_names:
            continue  # the file's own column wins over the directory name
        column = (
            pa.nulls(table.num_rows, pa.string())
            if value == HIVE_NULL
            else (pa.array([value] * table.num_rows, pa.string()))
        )
        table = table.append_column(pa.field(key, pa.string()), column)
    return table


# ----- Parquet


def _parquet_metadata(fs: fsspec.AbstractFileSystem, path: str) -> pq.FileMetaData:
    where = display_path(fs, path)
    _refuse_compressed_parquet(path)
    try:
        with fs.open(path, "rb") as handle:
            return pq.ParquetFile(handle).metadata
    except pa.ArrowException as exc:
        raise _bad_parquet(where, exc) from None
    except Exception as exc:
        raise describe_storage_error(where, exc) from exc


def _read_parquet(
    fs: fsspec.AbstractFileSystem,
    task: ReadTask,
    cfg: InputSection,
    views: frozenset[str] = frozenset(),
    columns: frozenset[str] | None = None,
) -> pa.Table:
    where = display_path(fs, task.path)
    _refuse_compressed_parquet(task.path)
    try:
        if isinstance(fs, LocalFileSystem):
            # Memory-mapped: Arrow decodes straight from the page cache, about twice as
            # fast as reading through a Python file object.
            parquet = pq.ParquetFile(task.path, memory_map=True)
            refuse_internal_names(parquet.schema_arrow.names, task.file_key)
            chosen = _chosen_columns(parquet.schema_arrow, columns)
            fast = _read_text_columns_fast(parquet, task, views, chosen)
            return fast if fast is not None else _read_row_groups(parquet, task, chosen)
        with fs.open(task.path, "rb") as handle:
            parquet = pq.ParquetFile(handle)
            chosen = _chosen_columns(parquet.schema_arrow, columns)
            return _read_row_groups(parquet, task, chosen)
    except pa.ArrowException as exc:
        raise _bad_parquet(where, exc) from None
    except Exception as exc:
        raise describe_storage_error(where, exc) from exc


def _chosen_columns(schema: pa.Schema, columns: frozenset[str] | None) -> list[str] | None:
    """The names of ``schema`` in ``columns``, in the file's order; None (read every
    column) when ``columns`` is None, names none of them, or the file repeats a name."""
    if columns is None or len(set(schema.names)) != len(schema.names):
        return None
    chosen = [n for n in schema.names if n in columns]
    return chosen or None


def _read_row_groups(
    parquet: pq.ParquetFile, task: ReadTask, columns: list[str] | None = None
) -> pa.Table:
    refuse_internal_names(parquet.schema_arrow.names, task.file_key)
    if task.row_groups is None:
        return parquet.read(columns=columns)
    return parquet.read_row_groups(list(task.row_groups), columns=columns)


#: Fixed-width column types :func:`_read_text_columns_fast` reads besides strings and
#: lists of strings: those Polars keeps as they are.
_FAST_FIXED = (pa.int32(), pa.int64(), pa.float32(), pa.float64(), pa.bool_())


def _read_text_columns_fast(
    parquet: pq.ParquetFile,
    task: ReadTask,
    views: frozenset[str] = frozenset(),
    columns: list[str] | None = None,
) -> pa.Table | None:
    """The task's rows of a local Parquet file decoded by Polars' reader, cast back to the
    file's own Arrow schema (the table :func:`_read_row_groups` returns, equal value for
    value); None when this path does not apply, and the caller reads with Arrow.

    It applies when every column's type passes :func:`_fast_type` and the task's row
    groups are consecutive. Arrow's reader decodes ``list<string>`` columns (the
    contexts) about twice as slowly as Polars' (``docs/benchmarks/whole-job.md``). Any
    error on this path (an invalid file, invalid UTF-8, a name Polars refuses) also gives
    None, so that Arrow's reader meets the file and raises the error it always raised.

    The columns named in ``views`` keep Polars' string views (:func:`_view_column`): the
    same values, without copying the strings into one buffer per column (a Parquet
    dictionary page of long texts that many rows share is decoded once, and stays so).

    ``columns`` (from :func:`_chosen_columns`): only these are decoded, and only their
    types must pass; None: every column.
    """
    schema = parquet.schema_arrow
    if columns is not None:
        schema = pa.schema([schema.field(n) for n in columns], metadata=schema.metadata)
    meta = parquet.metadata
    if meta.num_rows == 0 or any(not _fast_type(f.type) for f in schema):
        return None
    groups = (
        list(task.row_groups) if task.row_groups is not None else list(range(meta.num_row_groups))
    )
    if not groups or groups != list(range(groups[0], groups[-1] + 1)):
        return None
    start = sum(meta.row_group(i).num_rows for i in range(groups[0]))
    length = sum(meta.row_group(i).num_rows for i in groups)
    try:
        import polars as pl

        scan = pl.scan_parquet(task.path, hive_partitioning=False, glob=False)
        if columns is not None:
            scan = scan.select(columns)
        frame = scan.slice(start, length).collect()
        if frame.columns != schema.names or frame.height != length:
            return None
        if not views & set(schema.names):
            return frame.to_arrow().cast(schema)
        decoded = frame.to_arrow(compat_level=pl.CompatLevel.newest())
        columns = [
            _view_column(decoded.column(i), field)
            if field.name in views
            else decoded.column(i).cast(field.type)
            for i, field in enumerate(schema)
        ]
        table = pa.Table.from_arrays(columns, schema=_view_schema(schema, views))
    except Exception:  # noqa: BLE001 - Arrow's reader reports the problem
        return None
    return table


def _view_type(t: pa.DataType) -> pa.DataType:
    """The type a column of type ``t`` gets from :func:`_view_column`: ``string_view`` for
    a string, ``list<string_view>`` for a list of strings, else ``t``."""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pa.string_view()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        if pa.types.is_string(t.value_type) or pa.types.is_large_string(t.value_type):
            return pa.list_(pa.field(t.value_field.name, pa.string_view(), True))
    return t


def _view_schema(schema: pa.Schema, views: frozenset[str]) -> pa.Schema:
    """``schema`` with the columns named in ``views`` of their :func:`_view_type`."""
    return pa.schema(
        [f.with_type(_view_type(f.type)) if f.name in views else f for f in schema],
        metadata=schema.metadata,
    )


def _view_column(column: pa.ChunkedArray, field: pa.Field) -> pa.ChunkedArray:
    """A column of Polars' Arrow export as :func:`_view_type` of the file's ``field``:
    strings stay views; the offsets of a list become 32-bit (its items counted, not its
    bytes)."""
    wanted = _view_type(field.type)
    return column if column.type == wanted else column.cast(wanted)


def _fast_type(t: pa.DataType) -> bool:
    """Whether :func:`_read_text_columns_fast` reads a column of type ``t``: a string, a
    list of strings (values nullable), or one of :data:`_FAST_FIXED`."""
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return t.value_field.nullable and (
            pa.types.is_string(t.value_type) or pa.types.is_large_string(t.value_type)
        )
    return pa.types.is_string(t) or pa.types.is_large_string(t) or t in _FAST_FIXED


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


def _read_text(fs: fsspec.AbstractFileSystem, task: ReadTask, cfg: InputSection) -> pa.Table:
    if task.format in DELIMITERS:
        return read_delimited(fs, task.path, task.format, cfg.encoding)
    return read_json(fs, task.path, task.format, cfg.encoding, objects_as_text(cfg))


def objects_as_text(cfg: InputSection) -> frozenset[str]:
    """The input columns whose JSON objects are read as JSON text: the one mapped to
    ``relevance``, whose objects key grades by id, different ids in every row (a struct
    would hold every id of the file in every row; :mod:`ragbatch.io.ranking` parses the
    text to the same grades)."""
    column = cfg.columns.relevance
    return frozenset() if column is None else frozenset({column})


_READERS: dict[str, Callable[[fsspec.AbstractFileSystem, ReadTask, InputSection], pa.Table]] = {
    "parquet": _read_parquet,
    "csv": _read_text,
    "tsv": _read_text,
    "jsonl": _read_text,
    "json": _read_text,
    "openinference": lambda fs, task, cfg: read_spans(fs, task.path, cfg),
}
