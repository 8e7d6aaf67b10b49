"""Where the judgment cache keeps its entries, and how a batch finds its rows' entries.

Layout under the cache root (any fsspec URI)::

    v2/buckets/bucket=<hh>/part-<uuid>.parquet   entries, sorted by (group, key)
    v2/journal/part-<uuid>.parquet               what judge actors wrote since the last fold
    v2/damaged/<path below v2>                    files that could not be read, set aside

An entry's *group* (:func:`ragbatch.judge.cache.group_key`) is a hash of the judge
engine's identity and the judge inputs of one row; every step of every metric judged on
that row is stored under it, so one lookup per row brings all of them. The bucket is the
group's first :data:`BUCKET_DIGITS` hex digits (256 buckets). Bucket files are written
in row groups of :data:`ROW_GROUP_ROWS` rows, so the Parquet footer's min/max of
``group`` per row group says which row groups can hold a group; a lookup reads only those.

Journal rows with a null ``text`` are *touches*: a hit on an entry, recorded so that
retention knows when it was last used. They are kept until a compaction merges them
into their entries (:mod:`ragbatch.judge.cache_upkeep`).

A file whose bytes are not a cache file's is moved under ``v2/damaged/`` by whoever
reads it (:meth:`CacheFiles.set_aside`), and its entries are asked again.

Caches written before this layout (``metric=<name>/part-*.parquet`` at the root) are
not read: their entries carry no group.
"""

from __future__ import annotations

import bisect
import logging
import pickle
import threading
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ragbatch.judge.cache_parquet import (
    Damaged,
    column_spans,
    decode,
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
#: Row groups whose ``group`` range a reader keeps, over all bucket files (the ranges of
#: the least recently used files are dropped first, and read again when needed).
RANGE_CACHE_ROW_GROUPS = 65_536
#: Bytes of bucket-file footers a reader keeps, serialized (about 1.1 KiB per row group,
#: a tenth of a parsed footer): 32 MiB hold every footer of a cache of about 14 million
#: entries. A file whose footer is not kept has it read again, one more request to the
#: store per file a lookup reads.
FOOTER_CACHE_BYTES = 32 << 20
#: Bucket files one lookup reads at once, each on its own thread. A batch's groups fall in
#: dozens of buckets; read one after another, every file's request would wait on its own
#: round trip to the store (and PyArrow decodes with the GIL released).
LOOKUP_THREADS = 8

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
#: Columns a lookup reads back.
LOOKUP_COLUMNS = (
    "group",
    "key",
    "text",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "logprobs",
    "created_at",
)

#: A cached reply: (text, finish_reason, prompt_tokens, completion_tokens, logprobs JSON).
Reply = tuple[str, str, int, int, "str | None"]
#: What a lookup finds for a key: (reply, created_at, group).
Found = tuple[Reply, Any, str]


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
    """

    def __init__(self, fs: Any, root: str):
        self.fs = fs
        self.root = root.rstrip("/")
        self.sizes: dict[str, int] = {}

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
        """``path`` as a URI with the filesystem's protocol, for messages."""
        return str(self.fs.unstrip_protocol(path))

    def _parquet_under(self, folder: str) -> list[str]:
        # Other processes write here: list afresh (invalidating a folder alone leaves
        # listings of its subfolders cached on object stores).
        self.fs.invalidate_cache()
        if not self.fs.exists(folder):
            return []
        found = self.fs.find(folder, detail=True)
        for gone in [p for p in self.sizes if p.startswith(folder + "/") and p not in found]:
            del self.sizes[gone]
        out = []
        for path, info in found.items():
            if not path.endswith(".parquet") or info.get("type", "file") != "file":
                continue
            if info.get("size") is not None:
                self.sizes[path] = int(info["size"])
            out.append(path)
        return sorted(out)

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
        error = OSError(f"cannot read {self.uri(path)}: {type(exc).__name__}: {exc}")
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


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


@dataclass
class _Plan:
    """One bucket file in one lookup: the groups asked of it, its size, the row groups
    chosen and its footer (None where not known yet), the byte ranges of its first
    request and, once made, their bytes (None for a file gone)."""

    path: str
    groups: set[str]
    size: int
    chosen: list[int] | None
    meta: Any
    first: list[tuple[int, int]]
    pending: list[Pending] = field(default_factory=list)


def _choose(ranges: tuple[list[str], list[str]], groups: set[str]) -> list[int]:
    """The row groups whose ``group`` range holds one of ``groups``, in order."""
    lows, highs = ranges
    chosen: set[int] = set()
    for g in groups:
        # Row groups are sorted by group: those whose range holds g are contiguous.
        i = bisect.bisect_left(highs, g)
        while i < len(lows) and lows[i] <= g:
            chosen.add(i)
            i += 1
    return sorted(chosen)


def _ranges_of(meta: Any) -> tuple[list[str], list[str]]:
    """The (min, max) of ``group`` per row group of a footer (``""`` and ``"\\uffff"``
    where a row group has no statistics: it may hold any group)."""
    column = meta.schema.to_arrow_schema().get_field_index("group")
    lows, highs = [], []
    for i in range(meta.num_row_groups):
        stats = meta.row_group(i).column(column).statistics
        lows.append(stats.min if stats is not None and stats.has_min_max else "")
        highs.append(stats.max if stats is not None and stats.has_min_max else "\uffff")
    return lows, highs


class BucketReader:
    """Finds the entries of given groups in the bucket files, reading only the row
    groups whose ``group`` range holds one of them.

    A lookup reads each file it touches with at most two ranged requests, and one when
    the file's footer is kept: the file's end when its footer is not kept (all of a file
    of at most :data:`~ragbatch.judge.cache_parquet.FIRST_READ_BYTES`, whose row groups
    are then decoded from those bytes), then the byte ranges of the row groups chosen
    (row groups closer than :data:`~ragbatch.judge.cache_parquet.COALESCE_GAP_BYTES`
    are read as one range). The first request of every file is planned without asking
    the store anything (:meth:`_plan`; sizes come from the listing made when the reader
    was opened) and all are sent at once (:meth:`CacheFiles.start_fetch`). So with the
    footers kept, a batch's lookup makes one request per file that may hold one of its
    groups (about 57 for 64 rows over 256 buckets), whatever the cache's size, and no
    request for a size, a listing or an object's metadata.

    A file whose bytes are not a cache file's (cut short, not Parquet, a footer that
    does not parse, the wrong columns, pages that do not decode) is set aside
    (:meth:`CacheFiles.set_aside`, with a warning naming it) and left out of this and
    later lookups: its entries are misses, asked again. A failure to fetch bytes (the
    store is unreachable) is raised.

    Memory is bounded by the ``group`` ranges of :data:`RANGE_CACHE_ROW_GROUPS` row
    groups, :data:`FOOTER_CACHE_BYTES` of serialized footers and the entries of the
    groups asked for, whatever the cache's size; opening costs one listing.

    Thread-safe: :meth:`lookup` may be called from several threads at once (a judge
    actor looks up the batches in flight on worker threads). The range and footer
    caches, their byte and row-group counts, the listing and the counters change only
    under one lock, and every lookup reads its files on the one pool of
    :data:`LOOKUP_THREADS` threads made with the reader (each file decoded as soon as its
    bytes are in, while the requests of others are still out). The caches only save
    reads: what a lookup returns, and the row groups it counts, are those it would find
    alone.

    Parameters
    ----------
    files : CacheFiles
    repair : bool
        Set damaged files aside; False (a dry run's probe) only leaves them out.

    Attributes
    ----------
    row_groups_read : int
        Row groups decoded so far.
    footers_read : int
        Footers read from the store so far (a footer kept is not read again).
    damaged : list of (str, str)
        The files found unreadable so far, with why.
    """

    def __init__(self, files: CacheFiles, repair: bool = True):
        self.files = files
        self.repair = repair
        self.by_bucket = files.bucket_files()
        self._ranges: OrderedDict[str, tuple[list[str], list[str]]] = OrderedDict()
        self._range_row_groups = 0
        # path -> the file's footer, pickled (parsed again when the file is read)
        self._footers: OrderedDict[str, bytes] = OrderedDict()
        self._footer_bytes = 0
        self.row_groups_read = 0
        self.footers_read = 0
        self.damaged: list[tuple[str, str]] = []
        # The range and footer caches, the listing and the counters are shared by the
        # read threads of a lookup and by lookups made at once from several threads.
        self._lock = threading.Lock()
        # Made here, not at the first lookup, so that concurrent first lookups share one;
        # its threads start with the first decode of several files.
        self._pool = ThreadPoolExecutor(max(1, LOOKUP_THREADS), thread_name_prefix="ragbatch-cache")

    @property
    def empty(self) -> bool:
        return not self.by_bucket

    def _keep_footer(self, path: str, meta: Any) -> None:
        """Keep ``path``'s footer (a ``pyarrow.parquet.FileMetaData``), most recently
        used last; drop the least recently used past :data:`FOOTER_CACHE_BYTES`."""
        with self._lock:
            if path in self._footers:
                self._footers.move_to_end(path)
                return
        serialized = pickle.dumps(meta)
        with self._lock:
            if path not in self._footers:
                self._footers[path] = serialized
                self._footer_bytes += len(serialized)
            while self._footer_bytes > FOOTER_CACHE_BYTES and len(self._footers) > 1:
                _, dropped = self._footers.popitem(last=False)
                self._footer_bytes -= len(dropped)

    def _footer(self, path: str) -> Any:
        """``path``'s kept footer (``FileMetaData``), or None."""
        with self._lock:
            serialized = self._footers.get(path)
            if serialized is not None:
                self._footers.move_to_end(path)
        # our own bytes, pickled by _keep_footer in this process
        return None if serialized is None else pickle.loads(serialized)

    def _known_range(self, path: str) -> tuple[list[str], list[str]] | None:
        """The kept (min, max) of ``group`` per row group of ``path``, or None."""
        with self._lock:
            found = self._ranges.get(path)
            if found is not None:
                self._ranges.move_to_end(path)
            return found

    def _keep_range(self, path: str, meta: Any) -> tuple[list[str], list[str]]:
        """Work out and keep ``path``'s ranges from its footer; drop the least recently
        used past :data:`RANGE_CACHE_ROW_GROUPS`."""
        found = _ranges_of(meta)
        with self._lock:
            if path not in self._ranges:
                self._ranges[path] = found
                self._range_row_groups += len(found[0])
            while self._range_row_groups > RANGE_CACHE_ROW_GROUPS and len(self._ranges) > 1:
                _, (dropped, _) = self._ranges.popitem(last=False)
                self._range_row_groups -= len(dropped)
        return found

    def lookup(self, groups: Iterable[str]) -> dict[str, Found]:
        """Key -> (reply, created_at, group) for every entry stored under ``groups``. Where a key
        is stored twice (two runs paid for it at once), the earlier reply is kept, so that
        every reader settles on the same one.

        The bucket files are read up to :data:`LOOKUP_THREADS` at once (over all the
        lookups running on this reader), each with the requests the class notes count;
        what they hold is merged in file order afterwards, so the result does not depend
        on which read ends first, nor on the other lookups running meanwhile.

        Raises
        ------
        OSError
            Bytes of a bucket file cannot be fetched (the message names the file; one
            that another process removed meanwhile is skipped, and one that is damaged
            is set aside); :meth:`JudgmentCache.lookup
            <ragbatch.judge.cache.JudgmentCache.lookup>` reports it as an ``OutputError``."""
        wanted: dict[str, set[str]] = {}
        for g in groups:
            wanted.setdefault(bucket_of(g), set()).add(g)
        with self._lock:
            listed = {bucket: list(self.by_bucket.get(bucket, [])) for bucket in wanted}
        plans = [
            self._plan(path, in_bucket)
            for bucket, in_bucket in wanted.items()
            for path in listed[bucket]
        ]
        todo = [plan for plan in plans if plan is not None]
        # The first request of every file, all sent now (concurrently on object stores);
        # each file is decoded as soon as its bytes are in.
        pending = self.files.start_fetch(
            [(plan.path, a, b) for plan in todo for a, b in plan.first]
        )
        at = 0
        for plan in todo:
            plan.pending, at = pending[at : at + len(plan.first)], at + len(plan.first)
        if len(todo) > 1 and LOOKUP_THREADS > 1:
            tables = list(self._pool.map(self._finish, todo))
        else:
            tables = [self._finish(plan) for plan in todo]
        out: dict[str, Found] = {}
        for table in tables:
            if table is not None:
                _merge_into(table, out)
        return out

    def _plan(self, path: str, groups: set[str]) -> _Plan | None:
        """What to fetch first from bucket file ``path`` for ``groups`` (no request
        made): the byte ranges of the row groups chosen when its footer is kept, else its
        end (:func:`~ragbatch.judge.cache_parquet.tail_start`). None when its kept ranges
        show that no row group can hold one of ``groups``, or it is gone or damaged."""
        try:
            size = self.files.size(path)
            ranges = self._known_range(path)
            chosen = _choose(ranges, groups) if ranges is not None else None
            if chosen == []:
                return None
            meta = self._footer(path)
            if meta is None:
                return _Plan(path, groups, size, chosen, None, [(tail_start(size), size)])
            if chosen is None:  # its ranges were not kept: work them out from the footer
                chosen = _choose(self._keep_range(path, meta), groups)
                if not chosen:
                    return None
            return _Plan(path, groups, size, chosen, meta, self._spans(meta, chosen, size))
        except FileNotFoundError:
            return None  # removed by another process (a compaction) meanwhile
        except Damaged as exc:
            self._damaged(path, str(exc))
            return None

    def _finish(self, plan: _Plan) -> pa.Table | None:
        """The entries of ``plan.groups`` in its file (LOOKUP_COLUMNS, replies only),
        from the bytes of its first request: the row groups chosen, or the file's end
        (:meth:`_after_footer`). None when there are none, or the file is gone or damaged
        (then set aside)."""
        try:
            got = [p.result() for p in plan.pending]
            if any(data is None for data in got):
                return None  # removed by another process (a compaction) meanwhile
            fetched = [data for data in got if data is not None]
            if plan.meta is None:
                found = self._after_footer(plan, fetched[0])
                if found is None:
                    return None
                meta, chosen, pieces = found
            else:  # a plan with a footer has its row groups chosen (_plan)
                meta, chosen = plan.meta, plan.chosen or []
                pieces = self._pieces(plan.path, plan.first, fetched)
            if not pieces or not chosen:
                return None  # gone, or nothing to read
            table = decode(meta, plan.size, pieces, chosen, LOOKUP_COLUMNS)
        except FileNotFoundError:
            return None
        except Damaged as exc:
            self._damaged(plan.path, str(exc))
            return None
        with self._lock:
            self.row_groups_read += len(chosen)
        table = _with_lookup_columns(table)
        mask = pc.and_(
            pc.is_in(table.column("group"), value_set=pa.array(sorted(plan.groups), pa.string())),
            pc.is_valid(table.column("text")),
        )
        return table.filter(mask)

    def _after_footer(
        self, plan: _Plan, tail: bytes
    ) -> tuple[Any, list[int], list[tuple[int, bytes]]] | None:
        """Parse and keep the footer of ``plan``'s file from ``tail`` (its end), choose
        its row groups, and get their bytes: from ``tail`` when it is the whole file,
        else with one more request. (footer, row groups chosen, pieces), or None when no
        row group can hold one of the groups.

        Raises
        ------
        Damaged, FileNotFoundError
            As :meth:`CacheFiles.footer` and :meth:`_pieces`.
        """
        meta, whole = self.files.footer(plan.path, plan.size, tail)
        with self._lock:
            self.footers_read += 1
        self._keep_footer(plan.path, meta)
        kept = self._keep_range(plan.path, meta)
        chosen = plan.chosen if plan.chosen is not None else _choose(kept, plan.groups)
        if not chosen:
            return None
        if whole is not None:
            return meta, chosen, [(0, whole)]
        return meta, chosen, self._pieces(plan.path, self._spans(meta, chosen, plan.size), None)

    @staticmethod
    def _spans(meta: Any, chosen: list[int], size: int) -> list[tuple[int, int]]:
        """The byte ranges of the ``chosen`` row groups (LOOKUP_COLUMNS,
        :func:`~ragbatch.judge.cache_parquet.column_spans`: one for row groups close
        together).

        Raises
        ------
        Damaged
            The footer places them past the file's ``size`` bytes.
        """
        spans = column_spans(meta, chosen, LOOKUP_COLUMNS)
        if spans and spans[-1][1] > size:
            raise Damaged(f"its footer places row groups past its {size} bytes (cut short?)")
        return [(start, end) for start, end in spans]

    def _pieces(
        self, path: str, spans: list[tuple[int, int]], fetched: list[bytes] | None
    ) -> list[tuple[int, bytes]]:
        """(start, bytes) of each span of ``path``: ``fetched`` already, or fetched now
        (one request per span); empty when the file is gone.

        Raises
        ------
        Damaged
            Fewer bytes came back than a span holds (the file was cut short).
        """
        got = fetched if fetched is not None else self.files.fetch([(path, a, b) for a, b in spans])
        pieces = []
        for (start, end), data in zip(spans, got):
            if data is None:
                return []
            if len(data) != end - start:
                raise Damaged(f"read {len(data)} bytes at {start}, expected {end - start}")
            pieces.append((start, data))
        return pieces

    def _damaged(self, path: str, why: str) -> None:
        """Leave the unreadable file ``path`` out of this and later lookups, and set it
        aside (with ``repair``); a file that cannot be moved is only left out, with a
        warning."""
        with self._lock:
            self.damaged.append((path, why))
            for paths in self.by_bucket.values():
                if path in paths:
                    paths.remove(path)
            dropped = self._footers.pop(path, None)
            self._footer_bytes -= len(dropped) if dropped is not None else 0
            ranges = self._ranges.pop(path, None)
            self._range_row_groups -= len(ranges[0]) if ranges is not None else 0
        if not self.repair:
            log.warning(
                "judgment cache: %s cannot be read (%s); its entries count as misses "
                "('ragbatch cache check --repair' sets it aside)",
                self.files.uri(path),
                why,
            )
            return
        try:
            self.files.set_aside(path, why)
        except Exception as exc:  # noqa: BLE001 - the lookup goes on without the file
            log.warning(
                "judgment cache: %s cannot be read (%s), nor moved aside (%s: %s); this "
                "process leaves it out and asks its entries again",
                self.files.uri(path),
                why,
                type(exc).__name__,
                exc,
            )


def _with_lookup_columns(table: pa.Table) -> pa.Table:
    """``table`` with every column of LOOKUP_COLUMNS (null where a file lacks one)."""
    if table.column_names == list(LOOKUP_COLUMNS):
        return table
    for name in LOOKUP_COLUMNS:
        if name not in table.column_names:
            type_ = ENTRY_SCHEMA.field(name).type
            table = table.append_column(pa.field(name, type_), pa.nulls(table.num_rows, type_))
    return table.select(list(LOOKUP_COLUMNS))


def _merge_into(table: pa.Table, out: dict[str, Found]) -> None:
    """Add the entries of ``table`` (LOOKUP_COLUMNS) to ``out``, keeping for a key stored
    twice the earlier reply (:func:`_earlier`)."""
    for group, key, text, finish, pt, ct, lp, created in zip(
        *(table.column(c).to_pylist() for c in LOOKUP_COLUMNS)
    ):
        reply: Reply = (text, finish or "", pt or 0, ct or 0, lp)
        known = out.get(key)
        if known is None or _earlier((created, text), (known[1], known[0][0])):
            out[key] = (reply, created, group)


def _earlier(a: tuple[Any, str], b: tuple[Any, str]) -> bool:
    """Whether (created_at, text) ``a`` sorts before ``b`` (a null time sorts last)."""
    if a[0] is None or b[0] is None:
        return b[0] is None and (a[0] is not None or a[1] < b[1])
    return a < b
