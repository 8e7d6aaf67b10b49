"""Where the judgment cache keeps its entries, and how a batch finds its rows' entries.

Layout under the cache root (any fsspec URI)::

    v2/buckets/bucket=<hh>/part-<uuid>.parquet   entries, sorted by (group, key)
    v2/journal/part-<uuid>.parquet               what judge actors wrote since the last fold

An entry's *group* (:func:`ragbatch.judge.cache.group_key`) is a hash of the judge
engine's identity and the judge inputs of one row; every step of every metric judged on
that row is stored under it, so one lookup per row brings all of them. The bucket is the
group's first :data:`BUCKET_DIGITS` hex digits (256 buckets). Bucket files are written
in row groups of :data:`ROW_GROUP_ROWS` rows, so the Parquet footer's min/max of
``group`` per row group says which row groups can hold a group; a lookup reads only those.

Journal rows with a null ``text`` are *touches*: a hit on an entry, recorded so that
retention knows when it was last used. They are kept until a compaction merges them
into their entries (:mod:`ragbatch.judge.cache_upkeep`).

Caches written before this layout (``metric=<name>/part-*.parquet`` at the root) are
not read: their entries carry no group.
"""

from __future__ import annotations

import bisect
import pickle
import threading
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

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
#: Read-ahead of a lookup's reads, in bytes (object stores fetch this much per request;
#: about one row group, rather than fsspec's default of several MiB).
LOOKUP_BLOCK_BYTES = 1 << 18
#: Bucket files one lookup reads at once, each on its own thread. A batch's groups fall in
#: dozens of buckets; read one after another, every file's footer and row-group reads wait
#: on their own round trip to the store (and PyArrow decodes with the GIL released).
LOOKUP_THREADS = 8

VERSION_DIR = "v2"

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
    """The paths of one cache root.

    Parameters
    ----------
    fs : fsspec.AbstractFileSystem
    root : str
        The cache root as a path on ``fs`` (no protocol).
    """

    def __init__(self, fs: Any, root: str):
        self.fs = fs
        self.root = root.rstrip("/")

    @property
    def buckets_dir(self) -> str:
        return f"{self.root}/{VERSION_DIR}/buckets"

    @property
    def journal_dir(self) -> str:
        return f"{self.root}/{VERSION_DIR}/journal"

    def bucket_dir(self, bucket: str) -> str:
        return f"{self.buckets_dir}/bucket={bucket}"

    def _parquet_under(self, folder: str) -> list[str]:
        # Other processes write here: list afresh (invalidating a folder alone leaves
        # listings of its subfolders cached on object stores).
        self.fs.invalidate_cache()
        if not self.fs.exists(folder):
            return []
        return sorted(p for p in self.fs.find(folder) if p.endswith(".parquet"))

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

    def read(self, path: str, columns: Iterable[str] | None = None) -> pa.Table | None:
        """The table of ``path`` (None when another process removed it meanwhile)."""
        try:
            with self.fs.open(path, "rb") as handle:
                return pq.read_table(handle, columns=list(columns) if columns else None)
        except FileNotFoundError:
            return None


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


class BucketReader:
    """Finds the entries of given groups in the bucket files, reading only the row
    groups whose ``group`` range holds one of them.

    Memory is bounded by the ``group`` ranges of :data:`RANGE_CACHE_ROW_GROUPS` row
    groups, :data:`FOOTER_CACHE_BYTES` of serialized footers and the entries of the
    groups asked for, whatever the cache's size; opening costs one listing.

    Thread-safe: :meth:`lookup` may be called from several threads at once (a judge
    actor looks up the batches in flight on worker threads). The range and footer
    caches, their byte and row-group counts and :attr:`row_groups_read` change only
    under one lock, and every lookup reads its files on the one pool of
    :data:`LOOKUP_THREADS` threads made with the reader. The caches only save reads:
    what a lookup returns, and the row groups it counts, are those it would find alone.

    Parameters
    ----------
    files : CacheFiles
    """

    def __init__(self, files: CacheFiles):
        self.files = files
        self.by_bucket = files.bucket_files()
        self._ranges: OrderedDict[str, tuple[list[str], list[str]]] = OrderedDict()
        self._range_row_groups = 0
        # path -> the file's footer, pickled (parsed again when the file is read)
        self._footers: OrderedDict[str, bytes] = OrderedDict()
        self._footer_bytes = 0
        self.row_groups_read = 0
        # The range and footer caches and the counters are shared by the read threads of
        # a lookup and by lookups made at once from several threads.
        self._lock = threading.Lock()
        # Made here, not at the first lookup, so that concurrent first lookups share one;
        # its threads start with the first read of several files.
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
        # our own bytes, pickled by _keep_footer in this process
        return None if serialized is None else pickle.loads(serialized)

    def _range(self, path: str) -> tuple[list[str], list[str]] | None:
        """The (min, max) of ``group`` per row group of ``path`` (None: file gone)."""
        with self._lock:
            found = self._ranges.get(path)
            if found is not None:
                self._ranges.move_to_end(path)
                return found
        try:
            with self.files.fs.open(path, "rb", block_size=LOOKUP_BLOCK_BYTES) as handle:
                meta = pq.ParquetFile(handle).metadata
        except FileNotFoundError:
            return None
        self._keep_footer(path, meta)
        column = meta.schema.to_arrow_schema().get_field_index("group")
        lows, highs = [], []
        for i in range(meta.num_row_groups):
            stats = meta.row_group(i).column(column).statistics
            lows.append(stats.min if stats is not None and stats.has_min_max else "")
            highs.append(stats.max if stats is not None and stats.has_min_max else "\uffff")
        found = (lows, highs)
        with self._lock:
            if path not in self._ranges:
                self._ranges[path] = found
                self._range_row_groups += len(lows)
            while self._range_row_groups > RANGE_CACHE_ROW_GROUPS and len(self._ranges) > 1:
                _, (dropped, _) = self._ranges.popitem(last=False)
                self._range_row_groups -= len(dropped)
        return found

    def lookup(self, groups: Iterable[str]) -> dict[str, Found]:
        """Key -> (reply, created_at, group) for every entry stored under ``groups``. Where a key
        is stored twice (two runs paid for it at once), the earlier reply is kept, so that
        every reader settles on the same one.

        The bucket files are read up to :data:`LOOKUP_THREADS` at once (over all the
        lookups running on this reader); what they hold is merged in file order
        afterwards, so the result does not depend on which read ends first, nor on the
        other lookups running meanwhile.

        Raises
        ------
        OSError, pyarrow.ArrowException
            A bucket file cannot be read or parsed (one that another process removed
            meanwhile is skipped); :meth:`JudgmentCache.lookup
            <ragbatch.judge.cache.JudgmentCache.lookup>` reports it as an ``OutputError``."""
        wanted: dict[str, set[str]] = {}
        for g in groups:
            wanted.setdefault(bucket_of(g), set()).add(g)
        reads = [
            (path, in_bucket)
            for bucket, in_bucket in wanted.items()
            for path in self.by_bucket.get(bucket, [])
        ]
        if len(reads) > 1 and LOOKUP_THREADS > 1:
            tables = list(self._pool.map(lambda read: self._read(*read), reads))
        else:
            tables = [self._read(path, in_bucket) for path, in_bucket in reads]
        out: dict[str, Found] = {}
        for table in tables:
            if table is not None:
                _merge_into(table, out)
        return out

    def _read(self, path: str, groups: set[str]) -> pa.Table | None:
        """The entries of ``groups`` in bucket file ``path`` (LOOKUP_COLUMNS, replies
        only), reading only the row groups whose ``group`` range can hold one of them;
        None when there are none or the file is gone."""
        ranges = self._range(path)
        if ranges is None:
            return None
        lows, highs = ranges
        chosen: set[int] = set()
        for g in groups:
            # Row groups are sorted by group: those whose range holds g are contiguous.
            i = bisect.bisect_left(highs, g)
            while i < len(lows) and lows[i] <= g:
                chosen.add(i)
                i += 1
        if not chosen:
            return None
        footer = self._footer(path)
        try:
            with self.files.fs.open(path, "rb", block_size=LOOKUP_BLOCK_BYTES) as handle:
                parquet = pq.ParquetFile(handle, metadata=footer)
                self._keep_footer(path, parquet.metadata)
                table = parquet.read_row_groups(sorted(chosen), columns=list(LOOKUP_COLUMNS))
        except FileNotFoundError:
            return None
        with self._lock:
            self.row_groups_read += len(chosen)
        mask = pc.and_(
            pc.is_in(table.column("group"), value_set=pa.array(sorted(groups), pa.string())),
            pc.is_valid(table.column("text")),
        )
        return table.filter(mask)


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
