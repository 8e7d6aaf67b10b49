"""The judgment cache's Parquet files as bytes: footers, the byte ranges of row groups,
decoding from fetched ranges, and telling a damaged file from a storage failure.

A lookup on object storage pays per request, so the reader
(:class:`~ragbatch.judge.cache_store.BucketReader`) fetches the bytes itself, every file's
ranges sent at once (concurrent on object stores), and hands PyArrow only bytes already
in memory. That also draws the line between the two kinds of failure:

* fetching fails (the store is unreachable, access is denied): a storage error, raised
  as it is, for the caller to report (a run fails and may be retried);
* the bytes fetched are not a cache file (cut short, not Parquet, a footer that does
  not parse or points outside the file, columns missing or of another type, pages that
  do not decode): :class:`Damaged`, and the file is set aside
  (:meth:`~ragbatch.judge.cache_files.CacheFiles.set_aside`) while its entries count as
  misses.
"""

from __future__ import annotations

import io
from typing import Any, Callable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from ragbatch.core.errors import describe_exception, printable

#: Bytes a lookup reads first from a file whose footer it does not know: the whole file
#: when it is no larger (the row groups are then decoded from it, with no second request),
#: else the last this many bytes, which hold the footer of a file of up to about 200 row
#: groups (a footer longer than that is read with one more request).
FIRST_READ_BYTES = 256 << 10
#: Ranges of one file closer than this are fetched as one (a request costs more than
#: this many bytes on object storage).
COALESCE_GAP_BYTES = 1 << 20
#: The 4 bytes that start and end a Parquet file.
MAGIC = b"PAR1"
#: Columns a cache file cannot be read without, with their type.
REQUIRED_COLUMNS = {"group": pa.string(), "key": pa.string(), "text": pa.string()}


class Damaged(Exception):
    """The bytes of a cache file are not a readable cache file; the message says why, as
    one :func:`~ragbatch.core.errors.printable` line (it may quote the file's own column
    names and types)."""

    def __init__(self, why: str) -> None:
        super().__init__(printable(why))


def tail_start(size: int) -> int:
    """Where the first read of a file of ``size`` bytes starts (:data:`FIRST_READ_BYTES`)."""
    return max(0, size - FIRST_READ_BYTES)


def footer_length(tail: bytes, size: int) -> int:
    """The length of the serialized footer, from the last 8 bytes of a file.

    Parameters
    ----------
    tail : bytes
        The file's last bytes (at least 8 when the file has them).
    size : int
        The file's size in bytes.

    Returns
    -------
    int
        Bytes of the footer itself (before its 4-byte length and the closing magic).

    Raises
    ------
    Damaged
        The file is shorter than a Parquet file can be, the read came back short, it
        does not end in ``PAR1`` (cut short, or not Parquet), or the length it records
        does not fit in the file.
    """
    if size < 12:
        raise Damaged(f"{size} bytes: too short to be a Parquet file")
    if len(tail) < 8:
        raise Damaged(f"read {len(tail)} bytes at its end, expected 8 or more (cut short?)")
    if tail[-4:] != MAGIC:
        raise Damaged("no Parquet footer at its end (cut short, or not a Parquet file)")
    length = int.from_bytes(tail[-8:-4], "little")
    if length + 12 > size:
        raise Damaged(f"its footer claims {length} bytes, more than the file's {size}")
    return length


def parse_footer(footer: bytes) -> Any:
    """The ``pyarrow.parquet.FileMetaData`` of ``footer`` (the serialized footer, its
    4-byte length and the closing ``PAR1``: a file's last ``footer_length + 8`` bytes),
    its schema checked (:func:`check_schema`).

    Raises
    ------
    Damaged
        The footer does not parse, or the columns are not a cache file's.
    """
    try:
        meta = pq.read_metadata(pa.BufferReader(MAGIC + footer))
    except Exception as exc:  # noqa: BLE001 - whatever PyArrow raises, the bytes are bad
        raise Damaged(f"its footer does not parse: {describe_exception(exc)}") from None
    check_schema(meta)
    return meta


def check_schema(meta: Any) -> None:
    """Check that a file's columns are a cache file's.

    Parameters
    ----------
    meta : pyarrow.parquet.FileMetaData

    Raises
    ------
    Damaged
        A column of :data:`REQUIRED_COLUMNS` is missing, or a column of
        :data:`~ragbatch.judge.cache_files.ENTRY_SCHEMA` has another type (the message
        names it). Other columns may be absent (files written before they existed).
    """
    from ragbatch.judge.cache_files import ENTRY_SCHEMA

    try:
        schema = meta.schema.to_arrow_schema()
    except Exception as exc:  # noqa: BLE001 - a schema PyArrow cannot map is a bad file
        raise Damaged(f"its schema cannot be read: {describe_exception(exc)}") from None
    for name in REQUIRED_COLUMNS:
        if schema.get_field_index(name) < 0:
            raise Damaged(f"column {name!r} is missing (columns: {', '.join(schema.names)})")
    for field in ENTRY_SCHEMA:
        at = schema.get_field_index(field.name)
        if at >= 0 and not schema.field(at).type.equals(field.type):
            raise Damaged(f"column {field.name!r} is {schema.field(at).type}, not {field.type}")


def column_spans(meta: Any, row_groups: Sequence[int], columns: Sequence[str]) -> list[list[int]]:
    """The byte ranges ``[start, end)`` that hold ``columns`` of ``row_groups``, one per
    row group (from its first needed column chunk to the end of its last), sorted and
    merged where closer than :data:`COALESCE_GAP_BYTES`.

    Raises
    ------
    Damaged
        A column chunk's recorded place is negative (a footer that parsed but is wrong).
    """
    schema = meta.schema.to_arrow_schema()
    leaves = [schema.get_field_index(c) for c in columns if schema.get_field_index(c) >= 0]
    spans: list[list[int]] = []
    for i in sorted(row_groups):
        group = meta.row_group(i)
        starts, ends = [], []
        for leaf in leaves:
            chunk = group.column(leaf)
            start = chunk.data_page_offset
            if chunk.has_dictionary_page and chunk.dictionary_page_offset is not None:
                start = min(start, chunk.dictionary_page_offset)
            if start < 0 or chunk.total_compressed_size < 0:
                raise Damaged(f"row group {i} records a column chunk at byte {start}")
            starts.append(start)
            ends.append(start + chunk.total_compressed_size)
        if starts:
            spans.append([min(starts), max(ends)])
    spans.sort()
    merged: list[list[int]] = []
    for span in spans:
        if merged and span[0] - merged[-1][1] <= COALESCE_GAP_BYTES:
            merged[-1][1] = max(merged[-1][1], span[1])
        else:
            merged.append(span)
    return merged


class Pieces(io.RawIOBase):
    """A read-only file of ``size`` bytes of which only some ranges were fetched: a read
    inside one of them is served from memory, any other raises :class:`Damaged` (the
    footer pointed PyArrow elsewhere than its own column chunks say)."""

    def __init__(self, size: int, pieces: Sequence[tuple[int, bytes]]):
        super().__init__()
        self._size = size
        self._pieces = sorted(pieces, key=lambda p: p[0])
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        self._position = base + offset
        return self._position

    def tell(self) -> int:
        return self._position

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            size = self._size - self._position
        start, end = self._position, min(self._position + size, self._size)
        for at, data in self._pieces:
            if at <= start and end <= at + len(data):
                self._position = end
                return data[start - at : end - at]
        raise Damaged(f"bytes {start}-{end} were not among those its footer points to")

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def decode(
    meta: Any,
    size: int,
    pieces: Sequence[tuple[int, bytes]],
    row_groups: Sequence[int],
    columns: Sequence[str],
) -> pa.Table:
    """``columns`` of ``row_groups`` of a file, decoded from the bytes fetched, as one
    table (the row groups in file order).

    Parameters and errors as :func:`decode_row_groups`.
    """
    return _decoded(
        meta,
        size,
        pieces,
        lambda file, present: file.read_row_groups(sorted(row_groups), columns=present),
        columns,
    )


def decode_row_groups(
    meta: Any,
    size: int,
    pieces: Sequence[tuple[int, bytes]],
    row_groups: Sequence[int],
    columns: Sequence[str],
) -> list[pa.Table]:
    """``columns`` of each of ``row_groups`` of a file, decoded from the bytes fetched:
    one table per row group, in the order of ``row_groups``, each holding its own
    buffers (one can be kept without the others).

    Parameters
    ----------
    meta : pyarrow.parquet.FileMetaData
        The file's footer.
    size : int
        The file's size in bytes.
    pieces : sequence of (int, bytes)
        Fetched ranges (start, bytes): the whole file as ``[(0, data)]``, or the spans of
        :func:`column_spans`.
    row_groups : sequence of int
    columns : sequence of str
        Columns to read; those the file lacks are left out of the tables.

    Raises
    ------
    Damaged
        The pages do not decode, lie outside what the footer's column chunks said, or
        hold text that is not UTF-8.
    """
    return _decoded(
        meta,
        size,
        pieces,
        lambda file, present: [file.read_row_group(i, columns=present) for i in row_groups],
        columns,
    )


def _decoded(
    meta: Any,
    size: int,
    pieces: Sequence[tuple[int, bytes]],
    read: Callable[[Any, list[str]], Any],
    columns: Sequence[str],
) -> Any:
    """``read(parquet_file, columns present)`` over the fetched ``pieces`` of a file,
    each table validated in full (text that is not UTF-8 included); whatever fails to
    decode or validate is :class:`Damaged`."""
    schema = meta.schema.to_arrow_schema()
    present = [c for c in columns if schema.get_field_index(c) >= 0]
    try:
        if len(pieces) == 1 and pieces[0][0] == 0 and len(pieces[0][1]) == size:
            source: Any = pa.BufferReader(pieces[0][1])
        else:
            source = pa.PythonFile(Pieces(size, pieces), mode="r")
        got = read(pq.ParquetFile(source, metadata=meta, pre_buffer=False), present)
        for table in got if isinstance(got, list) else [got]:
            table.validate(full=True)  # PyArrow decodes text without checking its UTF-8
        return got
    except Damaged:
        raise
    except Exception as exc:  # noqa: BLE001 - decoding bytes in memory: they are bad
        raise Damaged(f"its pages do not decode: {describe_exception(exc)}") from None


def decode_whole(data: bytes, columns: Sequence[str] | None = None) -> pa.Table:
    """The table of a whole file's bytes (``columns``, or all), its footer and schema
    checked as a lookup checks them.

    Raises
    ------
    Damaged
        As :func:`footer_length`, :func:`parse_footer` and :func:`decode`.
    """
    size = len(data)
    length = footer_length(data[-8:], size)
    if data[:4] != MAGIC:
        raise Damaged("it does not start with PAR1 (not a Parquet file)")
    meta = parse_footer(data[size - length - 8 :])
    wanted = list(columns) if columns is not None else meta.schema.to_arrow_schema().names
    return decode(meta, size, [(0, data)], range(meta.num_row_groups), wanted)
