"""How a batch finds its rows' entries in the judgment cache: :class:`BucketReader` reads
only the row groups of the bucket files (:mod:`ragbatch.judge.cache_files`, which
describes the layout) whose ``group`` range holds one of the groups asked for.
"""

from __future__ import annotations

import bisect
import logging
import pickle
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.compute as pc
from cachetools import LRUCache

from ragbatch.core.errors import describe_exception
from ragbatch.judge.cache_parquet import (
    Damaged,
    column_spans,
    decode_row_groups,
    tail_start,
)
from ragbatch.judge.cache_files import (
    ENTRY_SCHEMA,
    CacheFiles,
    Pending,
    Reply,
    bucket_of,
)

log = logging.getLogger(__name__)

#: Row groups whose ``group`` range a reader keeps, over all bucket files (the ranges of
#: the least recently used files are dropped first, and read again when needed).
RANGE_CACHE_ROW_GROUPS = 65_536
#: Bytes of bucket-file footers a reader keeps, serialized (about a tenth of a parsed
#: footer; the measured sizes, and the cache size whose footers fit, are in
#: docs/benchmarks/cache.md). A file whose footer is not kept has it read again, one more
#: request to the store per file a lookup reads.
FOOTER_CACHE_BYTES = 32 << 20
#: Bucket files one lookup reads at once, each on its own thread. A batch's groups fall in
#: dozens of buckets; read one after another, every file's request would wait on its own
#: round trip to the store (and PyArrow decodes with the GIL released).
LOOKUP_THREADS = 8
#: Bytes of decoded row groups a reader keeps (the :data:`LOOKUP_COLUMNS` of every row of
#: each, counted as their Arrow buffers), most recently used last. With the rows ordered by
#: cache bucket before the judge stage (``udfs/cache_order.py``) one batch ends in the
#: bucket where the next begins, so consecutive batches read row groups in common: those
#: kept are neither fetched nor decoded again. 0 keeps none (every lookup reads the store).
ROW_GROUP_CACHE_BYTES = 32 << 20

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

#: What a lookup finds for a key: (reply, created_at in microseconds since the epoch or
#: None, group).
Found = tuple[Reply, "int | None", str]
#: An entry as a lookup reads it: the values of :data:`LOOKUP_COLUMNS`, ``created_at`` in
#: microseconds since the epoch.
_Row = tuple[Any, ...]
#: A bucket file as the latest listing gave it: (path, size, version),
#: :meth:`CacheFiles.identity <ragbatch.judge.cache_files.CacheFiles.identity>`.
Identity = tuple[str, "int | None", str]


@dataclass
class _Plan:
    """One bucket file in one lookup: its identity, the groups asked of it, its size, the
    row groups chosen and its footer (None where not known yet), the byte ranges of its
    first request (none when every row group chosen is kept), the row groups found kept
    in memory and, once the request is made, its bytes (None for a file gone)."""

    path: str
    identity: Identity
    groups: set[str]
    size: int
    chosen: list[int] | None
    meta: Any
    first: list[tuple[int, int]]
    kept: dict[int, pa.Table] = field(default_factory=dict)
    pending: list[Pending] = field(default_factory=list)
    #: Set by :meth:`BucketReader._finish` when the file was removed meanwhile.
    gone: bool = False


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
    groups (docs/benchmarks/cache.md counts them), whatever the cache's size, and no
    request for a size, a listing or an object's metadata.

    A file whose bytes are not a cache file's (cut short, not Parquet, a footer that
    does not parse, the wrong columns, pages that do not decode) is set aside
    (:meth:`CacheFiles.set_aside`, with a warning naming it) and left out of this and
    later lookups: its entries are misses, asked again. A failure to fetch bytes (the
    store is unreachable) is raised.

    The row groups a lookup decodes are kept, up to :data:`ROW_GROUP_CACHE_BYTES`: a
    later lookup that needs one of them takes it from memory, with no request and no
    decoding (a file whose row groups chosen are all kept is not fetched at all). What
    the reader keeps of a file (footer, ``group`` ranges, row groups) is filed under the
    file's identity as listed (path, size and the store's ETag, generation or
    modification time, :meth:`CacheFiles.identity`), so a file written again in place
    and listed again (:meth:`relist`) is read afresh, never served from what was kept of
    the file it replaced.

    A lookup that finds one of its files removed since the listing (another process
    folded or compacted the cache meanwhile, merging the bucket's files into a new one)
    lists the files again (:meth:`relist`) and looks the groups of that file's bucket up
    once more, in the files listed now: entries moved by a compaction are found, not
    judged again. Listings are made one at a time, so an older listing never replaces a
    newer one, and lookups that found files gone before a listing began take its
    outcome rather than list again: its files when it succeeded, its error when it
    failed (a store that cannot be listed is not asked again once per waiting lookup).

    Memory is bounded by the ``group`` ranges of :data:`RANGE_CACHE_ROW_GROUPS` row
    groups, :data:`FOOTER_CACHE_BYTES` of serialized footers,
    :data:`ROW_GROUP_CACHE_BYTES` of decoded row groups and the entries of the groups
    asked for, whatever the cache's size; opening costs one listing.

    Thread-safe: :meth:`lookup` may be called from several threads at once (a judge
    actor looks up the batches in flight on worker threads). The range and footer
    caches, their byte and row-group counts, the listing and the counters change only
    under one lock, and every lookup reads its files on the one pool of
    :data:`LOOKUP_THREADS` threads made with the reader (each file decoded as soon as its
    bytes are in, while the requests of others are still out). The caches only save
    reads: what a lookup returns is what it would find alone, and every row group it
    needs is counted once, as read or as kept (``row_groups_read + row_group_hits`` does
    not depend on what ran before or at once).

    Parameters
    ----------
    files : CacheFiles
    repair : bool
        Set damaged files aside; False (a dry run's probe) only leaves them out.

    Attributes
    ----------
    row_groups_read : int
        Row groups fetched and decoded so far.
    row_group_hits : int
        Row groups a lookup needed and took from memory so far (neither fetched nor
        decoded).
    footers_read : int
        Footers read from the store so far (a footer kept is not read again).
    relists : int
        Listings made again since the reader was opened, by :meth:`relist`, that
        succeeded (a lookup that found a file removed makes one unless another listing
        began after it found it and ended before its turn).
    damaged : list of (str, str)
        The files found unreadable so far, with why.
    """

    def __init__(self, files: CacheFiles, repair: bool = True):
        self.files = files
        self.repair = repair
        self.by_bucket = files.bucket_files()
        # Least recently used dropped first, past each one's bound (``currsize``: what
        # they hold, in the bound's unit); keyed by the file's identity (path, size,
        # version) as listed. Read and changed only under ``_lock``.
        # identity -> (min, max) of ``group`` per row group; bounded in row groups
        self._ranges: LRUCache[Identity, tuple[list[str], list[str]]] = LRUCache(
            RANGE_CACHE_ROW_GROUPS, getsizeof=lambda ranges: len(ranges[0])
        )
        # identity -> the file's footer, pickled (parsed again when the file is read)
        self._footers: LRUCache[Identity, bytes] = LRUCache(FOOTER_CACHE_BYTES, getsizeof=len)
        # (identity, row group) -> its LOOKUP_COLUMNS, decoded; bounded in buffer bytes
        self._row_groups: LRUCache[tuple[Identity, int], pa.Table] = LRUCache(
            ROW_GROUP_CACHE_BYTES, getsizeof=lambda table: table.get_total_buffer_size()
        )
        self.row_groups_read = 0
        self.row_group_hits = 0
        self.footers_read = 0
        self.relists = 0
        self.damaged: list[tuple[str, str]] = []
        # The range and footer caches, the listing and the counters are shared by the
        # read threads of a lookup and by lookups made at once from several threads.
        self._lock = threading.Lock()
        # One listing at a time (:meth:`relist`); ``_clock`` orders the moments a lookup
        # found a file gone and a listing began, ``_listed_at`` is when the latest
        # listing to finish began. Both under ``_lock``.
        self._listing = threading.Lock()
        self._clock = 0
        self._listed_at = 0
        # When the latest failed listing began, and its error (raised again to the
        # lookups that were waiting for it).
        self._failed_at = 0
        self._failure: Exception | None = None
        # Made here, not at the first lookup, so that concurrent first lookups share one;
        # its threads start with the first decode of several files.
        self._pool = ThreadPoolExecutor(max(1, LOOKUP_THREADS), thread_name_prefix="ragbatch-cache")

    @property
    def empty(self) -> bool:
        return not self.by_bucket

    def relist(self, after: int | None = None) -> None:
        """List the bucket files again (one listing): later lookups read the files
        written since the reader was opened, and what it kept of a file since removed or
        written again in place (another size or version) is dropped. Files found
        damaged stay left out.

        Listings are made one at a time. With ``after`` (a moment from :meth:`_tick`,
        taken when a lookup found a file gone), nothing is listed when a listing that
        began later has ended meanwhile: if it succeeded it already leaves the file out,
        and if it failed its error is raised again.

        Raises
        ------
        Exception
            The store cannot be listed (``OSError``, or what the filesystem raises as it
            is: s3fs passes some of botocore's errors on unchanged).
        """
        with self._listing:
            with self._lock:
                if after is not None and self._listed_at > after:
                    return  # a later listing succeeded: it leaves the file out
                if after is not None and self._failed_at > after and self._failure:
                    raise self._failure  # a later listing failed: its error is ours
            began = self._tick()
            try:
                listed = self.files.bucket_files()
            except Exception as exc:
                with self._lock:
                    self._failed_at, self._failure = began, exc
                raise
            self._use_listing(listed, began)

    def _tick(self) -> int:
        """The next moment of the reader's clock (listings and files found gone)."""
        with self._lock:
            self._clock += 1
            return self._clock

    def _use_listing(self, listed: dict[str, list[str]], began: int) -> None:
        """Make ``listed`` (begun at moment ``began``) the files later lookups read."""
        with self._lock:
            self._listed_at = began
            self.relists += 1
            damaged = {path for path, _ in self.damaged}
            self.by_bucket = {
                bucket: [p for p in paths if p not in damaged] for bucket, paths in listed.items()
            }
            current = {self.files.identity(p) for paths in listed.values() for p in paths}
            self._forget(lambda identity: identity not in current)

    def _forget(self, stale: Any) -> None:
        """Drop the footers, ranges and row groups kept of the files whose identity
        ``stale(identity)`` says; under the lock."""
        for identity in [k for k in self._footers if stale(k)]:
            del self._footers[identity]
        for identity in [k for k in self._ranges if stale(k)]:
            del self._ranges[identity]
        for key in [k for k in self._row_groups if stale(k[0])]:
            del self._row_groups[key]

    def _kept_row_groups(self, identity: Identity, chosen: list[int]) -> dict[int, pa.Table]:
        """Those of the ``chosen`` row groups of the file ``identity`` kept in memory
        (row group -> table), marked most recently used."""
        out = {}
        with self._lock:
            for i in chosen:
                table = self._row_groups.get((identity, i))  # marks it used
                if table is not None:
                    out[i] = table
        return out

    def _keep_row_groups(self, identity: Identity, tables: dict[int, pa.Table]) -> None:
        """Keep the decoded row groups ``tables`` (row group -> table) of the file
        ``identity``, most recently used last; drop the least recently used past
        :data:`ROW_GROUP_CACHE_BYTES` (:func:`_keep`)."""
        with self._lock:
            for i, table in tables.items():
                if (identity, i) not in self._row_groups:
                    _keep(self._row_groups, (identity, i), table)

    def _keep_footer(self, identity: Identity, meta: Any) -> None:
        """Keep the footer (a ``pyarrow.parquet.FileMetaData``) of the file ``identity``,
        most recently used last; drop the least recently used past
        :data:`FOOTER_CACHE_BYTES` (:func:`_keep`)."""
        with self._lock:
            if self._footers.get(identity) is not None:  # marks it used
                return
        serialized = pickle.dumps(meta)  # outside the lock: other lookups go on
        with self._lock:
            if identity not in self._footers:
                _keep(self._footers, identity, serialized)

    def _footer(self, identity: Identity) -> Any:
        """The kept footer (``FileMetaData``) of the file ``identity``, or None."""
        with self._lock:
            serialized = self._footers.get(identity)  # marks it used
        # our own bytes, pickled by _keep_footer in this process
        return None if serialized is None else pickle.loads(serialized)

    def _known_range(self, identity: Identity) -> tuple[list[str], list[str]] | None:
        """The kept (min, max) of ``group`` per row group of the file ``identity``, or
        None."""
        with self._lock:
            return self._ranges.get(identity)  # marks it used

    def _keep_range(self, identity: Identity, meta: Any) -> tuple[list[str], list[str]]:
        """Work out and keep the ranges of the file ``identity`` from its footer; drop
        the least recently used past :data:`RANGE_CACHE_ROW_GROUPS` (:func:`_keep`)."""
        found = _ranges_of(meta)
        with self._lock:
            if identity not in self._ranges:
                _keep(self._ranges, identity, found)
        return found

    def lookup(self, groups: Iterable[str]) -> dict[str, Found]:
        """Key -> (reply, created_at, group) for every entry stored under ``groups``. Where a key
        is stored twice (two runs paid for it at once), the earlier reply is kept, so that
        every reader settles on the same one.

        The bucket files are read up to :data:`LOOKUP_THREADS` at once (over all the
        lookups running on this reader), each with the requests the class notes count;
        what they hold is merged in file order afterwards, so the result does not depend
        on which read ends first, nor on the other lookups running meanwhile. Row groups
        kept in memory (:data:`ROW_GROUP_CACHE_BYTES`) are taken from there; a file whose
        row groups chosen are all kept is not fetched.

        A file removed since the listing (a compaction by another process) makes the
        reader list the files again and look its bucket's groups up once more, in the
        files listed now (once a lookup: a file removed again is then skipped). Where
        that listing fails, a warning says so and the entries of those buckets are
        misses.

        Raises
        ------
        OSError
            Bytes of a bucket file cannot be fetched (the message names the file; one
            that another process removed meanwhile is skipped, as above, and one that is
            damaged is set aside); :meth:`JudgmentCache.lookup <ragbatch.judge.cache.JudgmentCache.lookup>`
            reports it as an ``OutputError``."""
        wanted: dict[str, set[str]] = {}
        for g in groups:
            wanted.setdefault(bucket_of(g), set()).add(g)
        out, gone, read = self._lookup_once(wanted)
        if gone:
            found_gone = self._tick()
            try:
                self.relist(after=found_gone)
            # Any failure: s3fs passes some of botocore's errors on as they are (an
            # endpoint that cannot be reached is not an OSError). The entries moved are
            # then misses, asked again, as they were before the relist existed.
            except Exception as exc:  # noqa: BLE001
                log.warning(
                    "judgment cache %s: bucket files were removed meanwhile and listing the "
                    "cache again failed (%s); their entries will be asked again",
                    self.files.uri(self.files.root),
                    describe_exception(exc),
                )
                return out
            again, _, _ = self._lookup_once({bucket: wanted[bucket] for bucket in gone}, read)
            for key, found in again.items():
                known = out.get(key)
                if known is None or _earlier((found[1], found[0][0]), (known[1], known[0][0])):
                    out[key] = found
        return out

    def _lookup_once(
        self, wanted: dict[str, set[str]], done: frozenset[str] | set[str] = frozenset()
    ) -> tuple[dict[str, Found], set[str], set[str]]:
        """:meth:`lookup` of the groups ``wanted`` (bucket -> groups) in the files as
        listed now, leaving out the paths in ``done`` (files this lookup has read
        already: each row group it needs is read or counted once). Returns what was
        found, the buckets of the files found removed, and the paths of the files read
        (or found in memory) and not removed."""
        with self._lock:
            listed = {
                bucket: [p for p in self.by_bucket.get(bucket, []) if p not in done]
                for bucket in wanted
            }
        gone: set[str] = set()
        todo: list[_Plan] = []
        for bucket, in_bucket in wanted.items():
            for path in listed[bucket]:
                try:
                    plan = self._plan(path, in_bucket)
                except FileNotFoundError:  # removed by another process (a compaction)
                    gone.add(bucket)
                    continue
                if plan is not None:
                    todo.append(plan)
        # The first request of every file, all sent now (concurrently on object stores);
        # each file is decoded as soon as its bytes are in.
        pending = self.files.start_fetch(
            [(plan.path, a, b) for plan in todo for a, b in plan.first]
        )
        at = 0
        for plan in todo:
            plan.pending, at = pending[at : at + len(plan.first)], at + len(plan.first)
        if len(todo) > 1 and LOOKUP_THREADS > 1:
            per_file = list(self._pool.map(self._finish, todo))
        else:
            per_file = [self._finish(plan) for plan in todo]
        out: dict[str, Found] = {}
        for rows in per_file:
            if rows is not None:
                _merge_into(rows, out)
        gone |= {bucket_of(next(iter(plan.groups))) for plan in todo if plan.gone}
        return out, gone, {plan.path for plan in todo if not plan.gone}

    def _plan(self, path: str, groups: set[str]) -> _Plan | None:
        """What to fetch first from bucket file ``path`` for ``groups`` (no request
        made): nothing when every row group chosen is kept in memory; the byte ranges of
        the row groups chosen and not kept when its footer is kept; else its end
        (:func:`~ragbatch.judge.cache_parquet.tail_start`). None when its kept ranges
        show that no row group can hold one of ``groups``, or it is damaged.

        Raises
        ------
        FileNotFoundError
            The file is gone (removed by another process since the listing).
        """
        try:
            size = self.files.size(path)
            identity = self.files.identity(path)
            ranges = self._known_range(identity)
            chosen = _choose(ranges, groups) if ranges is not None else None
            if chosen == []:
                return None
            kept = self._kept_row_groups(identity, chosen) if chosen is not None else {}
            if chosen is not None and len(kept) == len(chosen):
                return _Plan(path, identity, groups, size, chosen, None, [], kept)
            meta = self._footer(identity)
            if meta is None:
                first = [(tail_start(size), size)]
                return _Plan(path, identity, groups, size, chosen, None, first, kept)
            if chosen is None:  # its ranges were not kept: work them out from the footer
                chosen = _choose(self._keep_range(identity, meta), groups)
                if not chosen:
                    return None
                kept = self._kept_row_groups(identity, chosen)
                if len(kept) == len(chosen):
                    return _Plan(path, identity, groups, size, chosen, meta, [], kept)
            missing = [i for i in chosen if i not in kept]
            first = self._spans(meta, missing, size)
            return _Plan(path, identity, groups, size, chosen, meta, first, kept)
        except Damaged as exc:
            self._damaged(path, str(exc))
            return None

    def _finish(self, plan: _Plan) -> list[_Row] | None:
        """The entries of ``plan.groups`` in its file (replies only, as :data:`_Row`:
        turned into Python values here, on the read thread, while other files' requests
        may still be out), from the row groups kept and the bytes of its first request:
        the row groups chosen and not kept, or the file's end (:meth:`_after_footer`).
        The row groups decoded are kept. None when there are none, or the file is gone
        or damaged (then set aside)."""
        try:
            got = [p.result() for p in plan.pending]
            if any(data is None for data in got):
                plan.gone = True  # removed by another process (a compaction) meanwhile
                return None
            fetched = [data for data in got if data is not None]
            decoded: dict[int, pa.Table] = {}
            if plan.first:
                if plan.meta is None:
                    found = self._after_footer(plan, fetched[0])
                    if found is None:
                        return None
                    meta, missing, pieces = found
                else:  # a plan with a footer has its row groups chosen (_plan)
                    meta = plan.meta
                    missing = [i for i in plan.chosen or [] if i not in plan.kept]
                    pieces = self._pieces(plan.path, plan.first, fetched) if missing else []
                if missing:
                    if not pieces:
                        plan.gone = True
                        return None
                    tables = decode_row_groups(meta, plan.size, pieces, missing, LOOKUP_COLUMNS)
                    decoded = {i: _with_lookup_columns(t) for i, t in zip(missing, tables)}
        except FileNotFoundError:
            plan.gone = True
            return None
        except Damaged as exc:
            self._damaged(plan.path, str(exc))
            return None
        with self._lock:
            self.row_groups_read += len(decoded)
            self.row_group_hits += len(plan.kept)
        self._keep_row_groups(plan.identity, decoded)
        chosen = sorted({**plan.kept, **decoded})
        if not chosen:
            return None
        whole = {**plan.kept, **decoded}
        table = pa.concat_tables([whole[i] for i in chosen])
        mask = pc.and_(
            pc.is_in(table.column("group"), value_set=pa.array(sorted(plan.groups), pa.string())),
            pc.is_valid(table.column("text")),
        )
        return _rows(table.filter(mask))

    def _after_footer(
        self, plan: _Plan, tail: bytes
    ) -> tuple[Any, list[int], list[tuple[int, bytes]]] | None:
        """Parse and keep the footer of ``plan``'s file from ``tail`` (its end), choose
        its row groups (noting in ``plan`` those kept in memory), and get the bytes of
        the others: from ``tail`` when it is the whole file, else with one more request.
        (footer, row groups to decode, pieces), or None when no row group can hold one
        of the groups.

        Raises
        ------
        Damaged, FileNotFoundError
            As :meth:`CacheFiles.footer` and :meth:`_pieces`.
        """
        meta, whole = self.files.footer(plan.path, plan.size, tail)
        with self._lock:
            self.footers_read += 1
        self._keep_footer(plan.identity, meta)
        ranges = self._keep_range(plan.identity, meta)
        if plan.chosen is None:
            plan.chosen = _choose(ranges, plan.groups)
            plan.kept = self._kept_row_groups(plan.identity, plan.chosen)
        if not plan.chosen:
            return None
        missing = [i for i in plan.chosen if i not in plan.kept]
        if not missing:
            return meta, [], []
        if whole is not None:
            return meta, missing, [(0, whole)]
        spans = self._spans(meta, missing, plan.size)
        return meta, missing, self._pieces(plan.path, spans, None)

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
            self._forget(lambda identity: identity[0] == path)
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
                "judgment cache: %s cannot be read (%s), nor moved aside (%s); this "
                "process leaves it out and asks its entries again",
                self.files.uri(path),
                why,
                describe_exception(exc),
            )


def _keep(kept: LRUCache, key: Any, value: Any) -> None:
    """Put ``value`` under ``key`` in ``kept`` (a bounded least-recently-used map),
    dropping the least recently used past its bound; a value larger than the whole bound
    (``kept.maxsize``, in the unit of its ``getsizeof``) is not kept, and is read again
    when next needed."""
    try:
        kept[key] = value
    except ValueError:  # larger than the bound alone
        pass


def _with_lookup_columns(table: pa.Table) -> pa.Table:
    """``table`` with every column of LOOKUP_COLUMNS (null where a file lacks one)."""
    if table.column_names == list(LOOKUP_COLUMNS):
        return table
    for name in LOOKUP_COLUMNS:
        if name not in table.column_names:
            type_ = ENTRY_SCHEMA.field(name).type
            table = table.append_column(pa.field(name, type_), pa.nulls(table.num_rows, type_))
    return table.select(list(LOOKUP_COLUMNS))


def _rows(table: pa.Table) -> list[_Row]:
    """The rows of ``table`` (LOOKUP_COLUMNS) as tuples, ``created_at`` as an integer
    (microseconds since the epoch, UTC; None where null): making a timezone-aware
    ``datetime`` of each costs more than all the other columns together."""
    columns = [table.column(c) for c in LOOKUP_COLUMNS]
    at = LOOKUP_COLUMNS.index("created_at")
    columns[at] = columns[at].cast(pa.int64())
    return list(zip(*(column.to_pylist() for column in columns)))


def _merge_into(rows: list[_Row], out: dict[str, Found]) -> None:
    """Add the entries ``rows`` (:func:`_rows`) to ``out``, keeping for a key stored twice
    the earlier reply (:func:`_earlier`)."""
    for group, key, text, finish, pt, ct, lp, created in rows:
        reply: Reply = (text, finish or "", pt or 0, ct or 0, lp)
        known = out.get(key)
        if known is None or _earlier((created, text), (known[1], known[0][0])):
            out[key] = (reply, created, group)


def _earlier(a: tuple[Any, str], b: tuple[Any, str]) -> bool:
    """Whether (created_at, text) ``a`` sorts before ``b`` (a null time sorts last)."""
    if a[0] is None or b[0] is None:
        return b[0] is None and (a[0] is not None or a[1] < b[1])
    return a < b
