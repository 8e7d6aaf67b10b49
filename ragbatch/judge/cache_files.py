"""Where the judgment cache keeps its entries: the layout of a cache root, the schema of
an entry, and reading, writing and setting aside its files (:class:`CacheFiles`).

Layout under the cache root (any fsspec URI)::

    v2/buckets/bucket=<hh>/part-<uuid>.parquet   entries, sorted by (group, key)
    v2/journal/part-<uuid>.parquet               what judge actors wrote since the last fold
    v2/damaged/<path below v2>                    files that could not be read, set aside

An entry's *group* (:func:`ragbatch.judge.cache.group_key`) is a hash of the judge
engine's identity and the judge inputs of one row; every step of every metric judged on
that row is stored under it, so one lookup per row brings all of them. The bucket is the
group's first :data:`BUCKET_DIGITS` hex digits (256 buckets). Bucket files are written
in row groups of :data:`ROW_GROUP_ROWS` rows, so the Parquet footer's min/max of
``group`` per row group says which row groups can hold a group; a lookup
(:class:`ragbatch.judge.cache_store.BucketReader`) reads only those.

Journal rows with a null ``text`` are *touches*: a hit on an entry, recorded so that
retention knows when it was last used. They are kept until a compaction merges them
into their entries (:mod:`ragbatch.judge.cache_upkeep`).

A file whose bytes are not a cache file's is moved under ``v2/damaged/`` by whoever
reads it (:meth:`CacheFiles.set_aside`), and its entries are asked again.

Caches written before this layout (``metric=<name>/part-*.parquet`` at the root) are
not read: their entries carry no group.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any, Iterable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from ragbatch.core.errors import describe_exception, printable
from ragbatch.judge.cache_parquet import (
    Damaged,
    decode_whole,
    footer_length,
    parse_footer,
    tail_start,
)

log = logging.getLogger(__name__)

#: Hex digits of the group that name its bucket: 16**2 = 256 buckets.
BUCKET_DIGITS = 2
#: Rows per Parquet row group of a bucket file: the unit a lookup reads.
ROW_GROUP_ROWS = 512
VERSION_DIR = "v2"
#: Where unreadable files are moved, under :data:`VERSION_DIR`, keeping their path below it.
DAMAGED_DIR = "damaged"

ENTRY_SCHEMA = pa.schema(
    [
        ("group", pa.string()),
        ("key", pa.string()),
        ("metric", pa.string()),
        ("text", pa.string()),
        ("finish_reason", pa.string()),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("model_id", pa.string()),
        ("logprobs", pa.string()),
        ("created_at", pa.timestamp("us", tz="UTC")),
        ("last_used", pa.timestamp("us", tz="UTC")),
        ("last_run", pa.string()),
    ]
)
#: A cached reply: (text, finish_reason, prompt_tokens, completion_tokens, logprobs JSON).
Reply = tuple[str, str, int, int, "str | None"]


def bucket_of(group: str) -> str:
    """The bucket name (``hh``) of a group (hex string)."""
    return group[:BUCKET_DIGITS]


class CacheFiles:
    """The paths of one cache root, and reading, writing and setting aside its files.

    Parameters
    ----------
    fs : fsspec.AbstractFileSystem
    root : str
        The cache root as a path on ``fs`` (no protocol).

    Attributes
    ----------
    sizes : dict
        Path -> size in bytes, of the files the listings so far found (a lookup reads
        ranges of a file without asking the store for its size).
    versions : dict
        Path -> what the latest listing says of that version of the file, besides its
        size (:data:`VERSION_FIELDS`: an object store's ETag or generation, a local
        file's inode and modification time), as a string; see :meth:`identity`.
    """

    def __init__(self, fs: Any, root: str):
        self.fs = fs
        self.root = root.rstrip("/")
        self.sizes: dict[str, int] = {}
        self.versions: dict[str, str] = {}

    @property
    def buckets_dir(self) -> str:
        return f"{self.root}/{VERSION_DIR}/buckets"

    @property
    def journal_dir(self) -> str:
        return f"{self.root}/{VERSION_DIR}/journal"

    @property
    def damaged_dir(self) -> str:
        """Where :meth:`set_aside` moves unreadable files."""
        return f"{self.root}/{VERSION_DIR}/{DAMAGED_DIR}"

    def bucket_dir(self, bucket: str) -> str:
        return f"{self.buckets_dir}/bucket={bucket}"

    def uri(self, path: str) -> str:
        """``path`` as a URI with the filesystem's protocol, for messages: one
        :func:`~ragbatch.core.errors.printable` line, whatever the file's name holds."""
        return printable(str(self.fs.unstrip_protocol(path)))

    def _parquet_under(self, folder: str) -> list[str]:
        # Other processes write here: list afresh (invalidating a folder alone leaves
        # listings of its subfolders cached on object stores).
        self.fs.invalidate_cache()
        if not self.fs.exists(folder):
            return []
        found = self.fs.find(folder, detail=True)
        # Other threads list (a reader's lookups in flight) and set files aside at the same
        # time: walk a copy, and drop what another thread may have dropped first.
        for known in (self.sizes, self.versions):
            for gone in [p for p in list(known) if p.startswith(folder + "/") and p not in found]:
                known.pop(gone, None)
        out = []
        for path, info in found.items():
            if not path.endswith(".parquet") or info.get("type", "file") != "file":
                continue
            if info.get("size") is not None:
                self.sizes[path] = int(info["size"])
            self.versions[path] = _version(info)
            out.append(path)
        return sorted(out)

    def identity(self, path: str) -> tuple[str, int | None, str]:
        """What tells this version of ``path`` from another written at the same path:
        ``(path, size, version)`` as the latest listing gave them (size None and version
        ``""`` for a file no listing found). A file rewritten in place has another size,
        ETag, generation or modification time, so what a reader keeps under one
        identity (footers, row groups) is never used for the file listed after it."""
        return (path, self.sizes.get(path), self.versions.get(path, ""))

    def bucket_files(self) -> dict[str, list[str]]:
        """Bucket name -> its files (one listing of the whole bucket tree)."""
        out: dict[str, list[str]] = {}
        for path in self._parquet_under(self.buckets_dir):
            folder = path.rsplit("/", 2)[-2]
            if folder.startswith("bucket="):
                out.setdefault(folder[len("bucket=") :], []).append(path)
        return out

    def journal_files(self) -> list[str]:
        return self._parquet_under(self.journal_dir)

    def damaged_files(self) -> list[str]:
        """The files :meth:`set_aside` has moved under :attr:`damaged_dir`."""
        return self._parquet_under(self.damaged_dir)

    def legacy_files(self) -> list[str]:
        """Segments of the layout before :data:`VERSION_DIR` (not read)."""
        self.fs.invalidate_cache()
        if not self.fs.exists(self.root):
            return []
        return sorted(
            p
            for p in self.fs.find(self.root)
            if p.endswith(".parquet") and f"/{VERSION_DIR}/" not in p
        )

    def write(self, folder: str, table: pa.Table, row_group_size: int | None = None) -> str:
        """Write ``table`` as a new file in ``folder``; return its path. Only ``group``
        (for lookups) and ``metric`` (null in touches, counted by
        :func:`~ragbatch.judge.cache_upkeep.cache_stats`) get column statistics:
        the others' would make the footers several times larger. The file appears whole or not at all: local files are
        written under a hidden name and renamed; object stores publish an object only
        when its upload completes."""
        name = f"part-{uuid.uuid4().hex}.parquet"
        path = f"{folder}/{name}"
        local = "file" in _protocols(self.fs)
        target = f"{folder}/.{name}.tmp" if local else path
        self.fs.makedirs(folder, exist_ok=True)
        with self.fs.open(target, "wb") as handle:
            pq.write_table(
                table, handle, row_group_size=row_group_size, write_statistics=["group", "metric"]
            )
        if local:
            self.fs.mv(target, path)
        return path

    def size(self, path: str) -> int:
        """The size of ``path`` in bytes: from the listing, else asked of the store.

        Raises
        ------
        FileNotFoundError
            The file is gone.
        """
        known = self.sizes.get(path)
        return known if known is not None else int(self.fs.size(path))

    def fetch(self, ranges: Sequence[tuple[str, int, int]]) -> list[bytes | None]:
        """The bytes ``[start, end)`` of each ``(path, start, end)``, fetched in one call
        (``fs.cat_ranges``: concurrent requests on object stores, one per range); None
        for a file that is gone (another process removed it meanwhile).

        Raises
        ------
        OSError
            A range could not be fetched (the store is unreachable, access denied); the
            message names the file.
        """
        if not ranges:
            return []
        paths = [r[0] for r in ranges]
        got = self.fs.cat_ranges(
            paths, [r[1] for r in ranges], [r[2] for r in ranges], on_error="return"
        )
        out: list[bytes | None] = []
        for path, data in zip(paths, got):
            if isinstance(data, FileNotFoundError):
                out.append(None)
            elif isinstance(data, BaseException):
                raise self.fetch_error(path, data)
            else:
                out.append(bytes(data))
        return out

    def fetch_error(self, path: str, exc: BaseException) -> Exception:
        """What a failed fetch of ``path`` means: :class:`Damaged` when the file is now
        shorter than the listing said (cut short since: a range past its end is refused),
        else an ``OSError`` naming the file (the store failed)."""
        listed = self.sizes.get(path)
        if listed is not None:
            try:
                self.fs.invalidate_cache(path)
                now = int(self.fs.size(path))
            except Exception:  # noqa: BLE001 - the fetch's own error says more
                now = listed
            if now < listed:
                return Damaged(f"it has {now} bytes, {listed} when listed (cut short)")
        error = OSError(f"cannot read {self.uri(path)}: {describe_exception(exc)}")
        error.__cause__ = exc
        return error

    def start_fetch(self, ranges: Sequence[tuple[str, int, int]]) -> list[Pending]:
        """Start fetching the bytes ``[start, end)`` of each ``(path, start, end)``; a
        :class:`Pending` for each. On a filesystem with async requests (s3fs, gcsfs,
        adlfs) every request is sent now, concurrently, on the filesystem's own event
        loop; elsewhere (local disk) each read happens when its result is asked for, on
        the asking thread."""
        if getattr(self.fs, "async_impl", False) and getattr(self.fs, "loop", None) is not None:
            import asyncio

            return [
                Pending(
                    self,
                    path,
                    asyncio.run_coroutine_threadsafe(
                        self.fs._cat_file(path, start=start, end=end), self.fs.loop
                    ),
                )
                for path, start, end in ranges
            ]
        return [Pending(self, path, (start, end)) for path, start, end in ranges]

    def footer(self, path: str, size: int, tail: bytes) -> tuple[Any, bytes | None]:
        """The footer of ``path`` (``FileMetaData``, its schema checked) from ``tail``,
        the bytes from :func:`~ragbatch.judge.cache_parquet.tail_start` to its end,
        fetching the rest of a footer longer than that (one more request); and the whole
        file's bytes when ``tail`` is all of it.

        Raises
        ------
        Damaged
            The bytes are not a cache file's (:func:`~ragbatch.judge.cache_parquet.parse_footer`).
        FileNotFoundError
            The file went away before the rest of its footer was read.
        """
        if len(tail) != size - tail_start(size):
            raise Damaged(f"read {len(tail)} bytes at its end, expected {size - tail_start(size)}")
        length = footer_length(tail, size)
        if length + 8 <= len(tail):
            footer = tail[len(tail) - length - 8 :]
        else:
            (head,) = self.fetch([(path, size - length - 8, tail_start(size))])
            if head is None:
                raise FileNotFoundError(path)
            footer = head + tail
        whole = tail if len(tail) == size else None
        if whole is not None and whole[:4] != b"PAR1":
            raise Damaged("it does not start with PAR1 (not a Parquet file)")
        return parse_footer(footer), whole

    def read(self, path: str, columns: Iterable[str] | None = None) -> pa.Table | None:
        """The table of ``path`` (``columns``, or all; columns the file lacks are left
        out); None when another process removed it meanwhile, or when it is damaged: then
        it is set aside (:meth:`set_aside`, with a warning) and its rows are lost to the
        caller.

        Raises
        ------
        OSError
            The store cannot be read.
        """
        try:
            data = self.fs.cat_file(path)
        except FileNotFoundError:
            return None
        try:
            return decode_whole(bytes(data), list(columns) if columns else None)
        except Damaged as exc:
            self.set_aside(path, str(exc))
            return None

    def read_footer(self, path: str) -> Any | None:
        """The footer of ``path`` (``FileMetaData``, its schema checked), or None when
        the file is gone; one ranged read (two for a footer longer than
        :data:`~ragbatch.judge.cache_parquet.FIRST_READ_BYTES`).

        Raises
        ------
        Damaged
            The file's end is not a cache file's footer.
        OSError
            The store cannot be read.
        """
        try:
            size = self.size(path)
            (tail,) = self.fetch([(path, tail_start(size), size)])
            return None if tail is None else self.footer(path, size, tail)[0]
        except FileNotFoundError:
            return None

    def problem(self, path: str, data: bool = False) -> str | None:
        """Why ``path`` is not a readable cache file, or None (also when it is gone).

        Parameters
        ----------
        path : str
        data : bool
            Read and decode every byte; else the footer and schema only (one ranged
            read, two for a footer longer than
            :data:`~ragbatch.judge.cache_parquet.FIRST_READ_BYTES`).

        Raises
        ------
        OSError
            The store cannot be read.
        """
        try:
            if data:
                decode_whole(bytes(self.fs.cat_file(path)))
            else:
                self.read_footer(path)
            return None
        except FileNotFoundError:
            return None
        except Damaged as exc:
            return str(exc)

    def set_aside(self, path: str, why: str) -> str | None:
        """Move the unreadable file ``path`` (a bucket or journal file) to the same place
        under :attr:`damaged_dir`, and warn, naming it and ``why``; return where it went.

        Safe when several processes find the same file at once: the first move wins, and
        a file another process moved (or removed) first is skipped (None).

        Raises
        ------
        OutputError
            ``path`` is not below ``<root>/v2`` (nothing is moved), or is already under
            :attr:`damaged_dir`.
        OSError
            The store refused the move.
        """
        from ragbatch.core.errors import OutputError
        from ragbatch.io.removal import ensure_under

        version = f"{self.root}/{VERSION_DIR}"
        source = ensure_under(version, path)
        relative = source[len(ensure_under(self.root, version)) + 1 :]
        if relative.split("/", 1)[0] == DAMAGED_DIR:
            raise OutputError(f"{self.uri(path)} is already set aside")
        target = ensure_under(self.damaged_dir, f"{self.damaged_dir}/{relative}")
        try:
            self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
            self.fs.mv(source, target)
        except FileNotFoundError:
            return None  # another process set it aside, or removed it, first
        self.sizes.pop(path, None)
        self.versions.pop(path, None)
        log.warning(
            "judgment cache: %s cannot be read (%s); moved to %s, and its entries will "
            "be asked again ('ragbatch cache check' lists such files)",
            self.uri(path),
            why,
            self.uri(target),
        )
        return target


class Pending:
    """The bytes of one range of one file, being fetched (:meth:`CacheFiles.start_fetch`)."""

    def __init__(self, files: CacheFiles, path: str, how: Any):
        self._files = files
        self._path = path
        self._how = how  # a concurrent.futures.Future, or (start, end) to read on demand

    def result(self) -> bytes | None:
        """The bytes, waiting for them; None when the file is gone.

        Raises
        ------
        OSError
            The range could not be fetched; the message names the file.
        Damaged
            It could not be fetched because the file is now shorter than listed.
        """
        try:
            if isinstance(self._how, tuple):
                data = self._files.fs.cat_file(self._path, start=self._how[0], end=self._how[1])
            else:
                data = self._how.result()
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise self._files.fetch_error(self._path, exc) from exc
        return bytes(data)


#: Fields of a listing's entry that change when a file is written again at the same path:
#: S3 and Azure (``ETag``/``etag``), Google Cloud Storage (``generation``), local disk
#: (``ino`` and ``mtime``: a file replaced by a rename has another inode).
VERSION_FIELDS = ("ETag", "etag", "generation", "version_id", "VersionId", "ino", "mtime")


def _version(info: dict[str, Any]) -> str:
    """The :data:`VERSION_FIELDS` of one listing entry, as one string (``""`` when the
    store gives none of them: then only the size tells two versions apart)."""
    return "|".join(f"{name}={info[name]}" for name in VERSION_FIELDS if info.get(name) is not None)


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)
