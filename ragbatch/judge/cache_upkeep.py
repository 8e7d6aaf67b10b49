"""Upkeep of the judgment cache: fold the journal into buckets, compact, prune, count.

* :func:`fold_journal` (at a run's commit, before a run starts, for what a killed run
  left, and first in :func:`compact` and :func:`prune`): the journal's rows become at
  most one new file per bucket, sorted by (group, key); the journal files read are then
  removed. A row carries the run that wrote it (``last_run``, stamped by the judge
  actor); one without, from a writer that had no run id, is stamped with the folding
  run's id, or left null by a fold outside a run. A bucket left with more than
  :data:`MAX_BUCKET_FILES` files is compacted.
* :func:`compact` folds the journal, then merges each bucket's files into one: one entry
  per key (the earliest reply where two runs paid for the same key), its ``last_used``
  and ``last_run`` from the latest use of the entry (its touches merged in).
* :func:`prune` compacts and keeps only the entries used within the last ``keep_runs``
  runs or ``keep_days`` days (:func:`retained`).
* :func:`cache_stats` counts files, entries, touches and bytes from the Parquet footers.
* :func:`check_cache` finds the files that cannot be read, and with ``repair`` sets
  them aside.

Concurrent writers are safe: every step writes new files before it removes the files
it read, and removes nothing else; a file another process removed meanwhile is
skipped. The worst a race leaves is the same entry in two files, which lookups and the
next compaction resolve.

A file that cannot be read (cut short, not Parquet, the wrong columns) never stops a
fold, a compaction or a prune: :meth:`CacheFiles.read
<ragbatch.judge.cache_files.CacheFiles.read>` sets it aside under ``v2/damaged/`` with a
warning naming it, and the step goes on without its rows (their entries are asked
again by the runs that need them).
"""

from __future__ import annotations

import datetime as dt
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ragbatch.core.errors import describe_exception
from ragbatch.core.redact import redact_text
from ragbatch.judge.cache_parquet import Damaged
from ragbatch.judge.cache_files import BUCKET_DIGITS, ENTRY_SCHEMA, ROW_GROUP_ROWS, CacheFiles

#: A bucket with more files than this after a fold is compacted at once.
MAX_BUCKET_FILES = 8

#: Keeps a row of merged entries or not: polars frame -> boolean expression.
Keep = Callable[[pl.DataFrame], pl.Series]


def open_files(uri: str, storage_options: dict[str, Any]) -> CacheFiles:
    """The :class:`CacheFiles` of the cache at ``uri``."""
    from ragbatch.io.fs import resolve

    fs, root = resolve(uri.rstrip("/"), storage_options)
    return CacheFiles(fs, root)


@dataclass
class FoldResult:
    """What :func:`fold_journal` did: journal files read, rows folded, bucket files
    written, buckets compacted."""

    journal_files: int = 0
    rows: int = 0
    files_written: int = 0
    compacted: int = 0


def _conform(table: pa.Table) -> pa.Table:
    """``table`` with exactly :data:`ENTRY_SCHEMA`'s columns (absent ones null)."""
    columns = [
        table.column(f.name).cast(f.type)
        if f.name in table.column_names
        else pa.nulls(table.num_rows, f.type)
        for f in ENTRY_SCHEMA
    ]
    return pa.Table.from_arrays(columns, schema=ENTRY_SCHEMA)


def _buckets(table: pa.Table) -> pa.Array:
    return pc.utf8_slice_codeunits(table.column("group"), 0, BUCKET_DIGITS)


def fold_journal(
    files: CacheFiles, run_id: str | None, max_files: int = MAX_BUCKET_FILES
) -> FoldResult:
    """Fold every journal file into the buckets. Rows whose ``last_run`` is null get
    ``run_id`` (None: they stay null, and only ``keep_days`` retains them).

    Memory: one journal file and one bucket's share of the journal at a time (the rows
    are spread over a local temporary folder first). A journal file that cannot be read
    is set aside (:meth:`CacheFiles.read <ragbatch.judge.cache_files.CacheFiles.read>`)
    and the fold goes on without it.

    Raises
    ------
    OSError
        The store cannot be listed, read or written (callers name the URI).
    """
    result = FoldResult()
    paths = files.journal_files()
    if not paths:
        return result
    read: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ragbatch-cache-") as tmp:
        writers: dict[str, pq.ParquetWriter] = {}
        try:
            for path in paths:
                table = files.read(path)
                if table is None:
                    continue  # folded by another process meanwhile, or set aside
                read.append(path)
                table = _conform(table)
                if run_id is not None:
                    runs = pc.fill_null(table.column("last_run"), pa.scalar(run_id, pa.string()))
                    where = table.schema.get_field_index("last_run")
                    table = table.set_column(where, "last_run", runs)
                buckets = _buckets(table)
                for bucket in pc.unique(buckets).to_pylist():
                    part = table.filter(pc.equal(buckets, bucket))
                    if bucket not in writers:
                        writers[bucket] = pq.ParquetWriter(
                            os.path.join(tmp, f"{bucket}.parquet"), ENTRY_SCHEMA
                        )
                    writers[bucket].write_table(part)
                result.rows += table.num_rows
        finally:
            for writer in writers.values():
                writer.close()
        for bucket in sorted(writers):
            table = pq.read_table(os.path.join(tmp, f"{bucket}.parquet"))
            table = table.sort_by([("group", "ascending"), ("key", "ascending")])
            files.write(files.bucket_dir(bucket), table, ROW_GROUP_ROWS)
            result.files_written += 1
    for path in read:
        _remove(files, path)
    result.journal_files = len(read)
    crowded = [b for b, p in files.bucket_files().items() if len(p) > max_files]
    for bucket in crowded:
        compact_bucket(files, bucket)
    result.compacted = len(crowded)
    return result


def _remove(files: CacheFiles, path: str) -> None:
    """Delete one cache file, refusing anything outside the cache root
    (:func:`ragbatch.io.removal.remove_under`); a file another process removed first is
    skipped."""
    from ragbatch.io.removal import remove_under

    try:
        remove_under(files.fs, files.root, path)
    except FileNotFoundError:
        pass


def merge_entries(table: pa.Table) -> pl.DataFrame:
    """One row per key of ``table`` (entries and touches, :data:`ENTRY_SCHEMA`): the
    entry with the earliest (``created_at``, ``text``), with ``last_used`` and
    ``last_run`` of the key's latest use. Touches without an entry are dropped."""
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    latest = (
        frame.sort("last_used", nulls_last=False)
        .group_by("key")
        .agg(pl.col("last_used").last(), pl.col("last_run").last())
    )
    entries = (
        frame.filter(pl.col("text").is_not_null())
        .sort(["created_at", "text"], nulls_last=True)
        .unique("key", keep="first", maintain_order=True)
        .drop(["last_used", "last_run"])
    )
    merged = entries.join(latest, on="key", how="left")
    return merged.select(ENTRY_SCHEMA.names).sort(["group", "key"])


def compact_bucket(files: CacheFiles, bucket: str, keep: Keep | None = None) -> tuple[int, int]:
    """Merge the files of ``bucket`` into one (:func:`merge_entries`), keeping the rows
    ``keep`` selects (all when None); return (entries kept, entries dropped). Only the
    files read are removed: one another process removed meanwhile is skipped, and one
    that cannot be read is set aside (its entries are lost, and asked again)."""
    read: list[str] = []
    tables = []
    for path in files.bucket_files().get(bucket, []):
        table = files.read(path)
        if table is not None:
            read.append(path)
            tables.append(table)
    if not tables:
        return 0, 0
    merged = merge_entries(pa.concat_tables([_conform(t) for t in tables]))
    kept = merged.filter(keep(merged)) if keep is not None else merged
    if kept.height:
        files.write(
            files.bucket_dir(bucket),
            kept.to_arrow().cast(ENTRY_SCHEMA),
            ROW_GROUP_ROWS,
        )
    for path in read:
        _remove(files, path)
    return kept.height, merged.height - kept.height


@dataclass
class CompactResult:
    """What :func:`compact` did: the journal fold first, then buckets and entries."""

    fold: FoldResult
    buckets: int = 0
    entries: int = 0


def compact(files: CacheFiles) -> CompactResult:
    """Fold the journal (outside a run: rows keep the run their writer stamped), then
    merge every bucket's files into one."""
    result = CompactResult(fold_journal(files, None))
    buckets = files.bucket_files()
    result.buckets = len(buckets)
    result.entries = sum(compact_bucket(files, b)[0] for b in sorted(buckets))
    return result


def recent_runs(files: CacheFiles, n: int) -> list[str]:
    """The ``n`` runs with the latest ``last_used`` recorded in the buckets, latest
    first (reads two columns of every bucket file, one file at a time)."""
    latest: dict[str, Any] = {}
    for paths in files.bucket_files().values():
        for path in paths:
            table = files.read(path, columns=["last_run", "last_used"])
            if table is None:
                continue
            frame = pl.from_arrow(table)
            assert isinstance(frame, pl.DataFrame)
            per_run = frame.drop_nulls().group_by("last_run").agg(pl.col("last_used").max())
            for run, used in per_run.iter_rows():
                if run not in latest or used > latest[run]:
                    latest[run] = used
    return [r for r, _ in sorted(latest.items(), key=lambda kv: kv[1], reverse=True)[:n]]


def retained(runs: list[str] | None, keep_days: float | None, now: dt.datetime) -> Keep:
    """The retention rule: an entry is kept when its ``last_run`` is one of ``runs``
    or its ``last_used`` is within ``keep_days`` days before ``now`` (either rule may
    be None; with both None nothing is kept)."""

    def keep(frame: pl.DataFrame) -> pl.Series:
        mask = pl.Series([False] * frame.height)
        if runs is not None:
            mask = mask | frame["last_run"].is_in(runs).fill_null(False)
        if keep_days is not None:
            cutoff = now - dt.timedelta(days=keep_days)
            mask = mask | (frame["last_used"] >= cutoff).fill_null(False)
        return mask

    return keep


@dataclass
class PruneResult:
    """What :func:`prune` did: the journal fold first, buckets rewritten, entries kept
    and dropped, and the runs whose entries were kept by the run rule."""

    fold: FoldResult = field(default_factory=FoldResult)
    buckets: int = 0
    kept: int = 0
    dropped: int = 0
    runs: list[str] = field(default_factory=list)


def prune(
    files: CacheFiles,
    keep_runs: int | None,
    keep_days: float | None,
    now: dt.datetime | None = None,
) -> PruneResult:
    """Fold the journal, then compact every bucket, keeping the entries used within the
    last ``keep_runs`` runs or the last ``keep_days`` days. Folding first means that
    what a run in progress (or a killed one) has written counts: its entries and touches
    carry its run id and their time of use.

    Raises
    ------
    ValueError
        Neither ``keep_runs`` nor ``keep_days`` is given, or one is below zero.
    """
    if keep_runs is None and keep_days is None:
        raise ValueError(
            "give keep_runs, keep_days or both: pruning with neither would empty the cache"
        )
    if (keep_runs is not None and keep_runs < 0) or (keep_days is not None and keep_days < 0):
        raise ValueError("keep_runs and keep_days must be at least 0")
    now = now or dt.datetime.now(dt.timezone.utc)
    fold = fold_journal(files, None)
    runs = recent_runs(files, keep_runs) if keep_runs is not None else None
    keep = retained(runs, keep_days, now)
    result = PruneResult(fold=fold, runs=list(runs or []))
    for bucket in sorted(files.bucket_files()):
        kept, dropped = compact_bucket(files, bucket, keep)
        result.buckets += 1
        result.kept += kept
        result.dropped += dropped
    return result


@dataclass
class AreaStats:
    """Files, rows (entries and touches), touches and bytes of one part of the cache,
    and how many of its files cannot be read (counted in ``files`` and ``bytes`` only)."""

    files: int = 0
    rows: int = 0
    touches: int = 0
    bytes: int = 0
    unreadable: int = 0


def _legacy_footer(files: CacheFiles, path: str) -> Any:
    """The footer of a file of the layout before (another schema: not checked)."""
    with files.fs.open(path, "rb") as handle:
        return pq.ParquetFile(handle).metadata


def cache_stats(files: CacheFiles) -> dict[str, AreaStats]:
    """``{"buckets", "journal", "legacy", "damaged"}`` -> :class:`AreaStats`, from the
    footers only (rows of the legacy layout, which is not read, are counted as entries;
    the files set aside under ``damaged`` are counted with their bytes, not read). A
    file whose footer cannot be read is counted as ``unreadable`` and left where it is
    (``ragbatch cache check --repair`` sets such files aside)."""
    out: dict[str, AreaStats] = {}
    areas = {
        "buckets": [p for ps in files.bucket_files().values() for p in ps],
        "journal": files.journal_files(),
        "legacy": files.legacy_files(),
    }
    for area, paths in areas.items():
        stats = out[area] = AreaStats()
        for path in paths:
            try:
                meta = _legacy_footer(files, path) if area == "legacy" else files.read_footer(path)
                size = files.size(path)
            except FileNotFoundError:
                continue
            except (Damaged, pa.ArrowException):
                stats.files += 1
                stats.unreadable += 1
                stats.bytes += files.sizes.get(path, 0)
                continue
            if meta is None:
                continue  # removed meanwhile
            stats.files += 1
            stats.rows += meta.num_rows
            stats.bytes += int(size or 0)
            names = meta.schema.to_arrow_schema().names
            if area != "legacy" and "metric" in names:
                column = names.index("metric")  # null in touches only
                for i in range(meta.num_row_groups):
                    s = meta.row_group(i).column(column).statistics
                    stats.touches += s.null_count if s is not None and s.has_null_count else 0
    damaged = out["damaged"] = AreaStats()
    for path in files.damaged_files():
        damaged.files += 1
        damaged.bytes += files.sizes.get(path, 0)
    return out


@dataclass
class CheckResult:
    """What :func:`check_cache` found: files checked, the unreadable ones with why, and
    where ``repair`` moved them (another process may have moved one first: then it is
    not listed there)."""

    files: int = 0
    damaged: list[tuple[str, str]] = field(default_factory=list)
    set_aside: list[tuple[str, str]] = field(default_factory=list)


def check_cache(files: CacheFiles, data: bool = False, repair: bool = False) -> CheckResult:
    """Check every bucket and journal file: its footer parses and its columns are a
    cache file's (one ranged read per file), and with ``data`` every page decodes (the
    whole file is read). With ``repair``, set each file found unreadable aside
    (:meth:`CacheFiles.set_aside <ragbatch.judge.cache_files.CacheFiles.set_aside>`).

    Raises
    ------
    OSError
        The store cannot be listed or read, or a file cannot be moved.
    """
    result = CheckResult()
    paths = [p for ps in files.bucket_files().values() for p in ps] + files.journal_files()
    for path in paths:
        why = files.problem(path, data)
        result.files += 1
        if why is None:
            continue
        result.damaged.append((path, why))
        if repair:
            target = files.set_aside(path, why)
            if target is not None:
                result.set_aside.append((path, target))
    return result


def damaged_cache_files(config: Any, stages: Any) -> set[str] | None:
    """The files of the judgment cache of ``config`` (a
    :class:`~ragbatch.config.job.JobConfig`) already set aside under ``v2/damaged/``, as
    URIs without credentials: the runner lists them before a run's stages start and
    again after they end, and the files new in the second listing were set aside while
    the stages ran (the manifest's ``judge.cache_files_set_aside``). None when the cache
    is disabled, no stage of ``stages`` is a judge stage, or the listing fails (logged;
    never raises)."""
    import logging

    from ragbatch.core.stages import StageKind

    if not config.cache.enabled or not any(s.kind == StageKind.JUDGE for s in stages):
        return None
    uri, options = config.cache_location()
    try:
        files = open_files(uri, options)
        return {redact_text(files.uri(path)) for path in files.damaged_files()}
    except Exception as exc:  # noqa: BLE001 - a count for the manifest, not the run's work
        logging.getLogger(__name__).warning(
            "judgment cache %s: files set aside could not be listed: %s",
            redact_text(uri),
            describe_exception(exc),
        )
        return None


def settle_journal(config: Any, run_id: str, stages: Any) -> FoldResult | None:
    """Fold the journal of the judgment cache of ``config`` (a
    :class:`~ragbatch.config.job.JobConfig`) for run ``run_id``: called before a run's
    stages start (what a killed run paid for becomes visible to this run's actors) and
    after it commits. Does nothing when the cache is disabled or no stage of ``stages``
    is a judge stage. Never raises: a failure is logged and the journal stays, to be
    folded by the next run or ``ragbatch cache compact``."""
    import logging

    from ragbatch.core.stages import StageKind

    if not config.cache.enabled or not any(s.kind == StageKind.JUDGE for s in stages):
        return None
    uri, options = config.cache_location()
    log = logging.getLogger(__name__)
    try:
        result = fold_journal(open_files(uri, options), run_id)
    except Exception as exc:
        log.warning(
            "judgment cache %s: journal not folded: %s", redact_text(uri), describe_exception(exc)
        )
        return None
    if result.journal_files:
        log.info(
            "judgment cache %s: %d journal files (%d rows) folded into %d bucket files",
            uri,
            result.journal_files,
            result.rows,
            result.files_written,
        )
    return result
