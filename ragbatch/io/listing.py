"""Find the input files behind ``input.uri`` and tell each one's format and partition.

:func:`discover` lists one file, a directory (searched recursively) or a glob on any
fsspec filesystem, skips hidden names (a path part starting with ``.`` or ``_``),
decides each file's format from ``input.format`` or its extension (a compression suffix
such as ``.gz`` may follow), and reads hive ``key=value`` directory parts. It reads
listings only, never file contents. :mod:`ragbatch.io.read` cuts the files it returns
into read tasks.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any, Callable, cast
from urllib.parse import unquote

import fsspec
from fsspec.core import has_magic
from fsspec.implementations.local import LocalFileSystem

from ragbatch.config.job import InputSection
from ragbatch.core.errors import InputError, InputNotFoundError
from ragbatch.io.fs import describe_storage_error, is_not_found, resolve

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

#: Formats of ``input.format`` read from files of other formats: format -> the file
#: formats (by extension) that hold it. An OpenInference span export is JSON lines or
#: Parquet (:mod:`ragbatch.io.formats.openinference`).
CONTAINERS: dict[str, tuple[str, ...]] = {"openinference": ("jsonl", "json", "parquet")}

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


@dataclass(frozen=True)
class InputFile:
    """One input file found by :func:`discover`.

    Attributes
    ----------
    path : str
        Path inside the filesystem, without protocol.
    key : str
        Path relative to the input root, ``/``-separated (a single file: its basename).
    format : str
        ``parquet``, ``jsonl``, ``json``, ``csv`` or ``tsv``.
    partition : tuple of (str, str)
        Hive ``key=value`` directory parts, URL-unquoted, in path order.
    info : dict
        The listing's entry for the file (size, ETag or mtime, ...).
    """

    path: str
    key: str
    format: str
    partition: tuple[tuple[str, str], ...]
    info: dict


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


def display_path(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """``path`` as users wrote it: plain on the local disk, with protocol elsewhere."""
    if isinstance(fs, LocalFileSystem):
        return path
    return fs.unstrip_protocol(path)


def storage_call(uri: str, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``func(*args, **kwargs)``; a storage failure becomes an ``InputError`` naming ``uri``."""
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
    found = storage_call(uri, fs.find, path, detail=True)
    return {name: info for name, info in found.items() if info.get("type", "file") != "directory"}


def _list_glob(fs: fsspec.AbstractFileSystem, uri: str, pattern: str) -> dict[str, dict]:
    matched = storage_call(uri, fs.glob, pattern, detail=True)
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


def discover(cfg: InputSection) -> tuple[fsspec.AbstractFileSystem, list[InputFile]]:
    """List the input files of ``cfg.uri`` in path order, with format and partition.

    Returns
    -------
    tuple of (fsspec.AbstractFileSystem, list of InputFile)
        The filesystem and at least one file, sorted by path.

    Raises
    ------
    InputNotFoundError
        Nothing matches the URI (missing path, a glob matching nothing).
    InputError
        No data files among those found, formats mixed without ``input.format``,
        partition directories that differ between files, or unreachable storage.

    Notes
    -----
    For a table format (``input.format: delta`` or ``iceberg``) the files are the table's data files at
    the version read (:mod:`ragbatch.io.formats`), listed from its log, not its folders.
    """
    from ragbatch.io.formats import table_format

    reader = table_format(cfg.format)
    if reader is not None:
        return reader.discover(cfg)
    fs, root = resolve(cfg.uri, cfg.storage_options)
    if has_magic(root):
        listing = _list_glob(fs, cfg.uri, root)
        if not listing:
            raise InputNotFoundError(
                f"{cfg.uri}: the glob matched no files; check the pattern in input.uri"
            )
        return fs, _select(cfg, listing, _glob_base(root), what="the glob matched")
    try:
        info = storage_call(cfg.uri, fs.info, root)
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
    return fs, [InputFile(path, posixpath.basename(path), fmt, (), info)]


def _select(cfg: InputSection, listing: dict[str, dict], base: str, what: str) -> list[InputFile]:
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
        held = [p for f in CONTAINERS.get(cfg.format, (cfg.format,)) for p in by_format.get(f, [])]
        chosen = sorted(held) or (unknown if not by_format else [])
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
    fmt = cast(str, fmt)  # None only when by_format is empty: then nothing is chosen (raised above)
    files = [
        InputFile(p, _relative(p, base), fmt, _partition_of(_relative(p, base)), visible[p])
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


def _check_partitions(cfg: InputSection, files: list[InputFile]) -> None:
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
