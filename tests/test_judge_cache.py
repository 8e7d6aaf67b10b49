"""The judgment cache: grouped lookups, the journal and its fold, compaction, retention,
and the ``ragbatch cache`` command, on local disk and on a real S3 endpoint (moto on
loopback)."""

from __future__ import annotations

import datetime as dt
import pathlib
import threading
from typing import Any

import polars as pl
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.local import LocalFileSystem

from ragbatch.cli.main import main
from ragbatch.judge.batch import judge_frame
from ragbatch.judge.protocol import run_sync
from ragbatch.judge.cache import JudgmentCache
from ragbatch.judge.cache_files import ROW_GROUP_ROWS, CacheFiles
from ragbatch.judge.cache_upkeep import (
    cache_stats,
    compact,
    fold_journal,
    open_files,
    prune,
)
from ragbatch.judge.recorded import RecordedReplies
from ragbatch.judge.run import JudgeRunner
from ragbatch.metrics.faithfulness import Faithfulness
from support.s3_calls import count_s3_calls
from support.cache_rows import STATEMENTS, YES, city_rows as _frame, ok_reply as _ok


def _judge(uri: str, frame: pl.DataFrame, replies: list[str], params: dict | None = None):
    """One actor's batch: judge ``frame`` with faithfulness and flush the cache."""
    engine = RecordedReplies(replies)
    cache = JudgmentCache(uri, {})
    runner = JudgeRunner(engine, [Faithfulness.from_params(params or {})], cache=cache)
    cells, records = run_sync(judge_frame(runner, frame))["faithfulness"]
    cache.flush()
    return cells, records, engine


def test_rerun_makes_no_call_and_reuses_every_step(tmp_path):
    uri = str(tmp_path / "cache")
    cells1, _, engine1 = _judge(uri, _frame(3), [STATEMENTS] * 3 + [YES] * 3)
    assert len(engine1.requests) == 6  # two steps for each of three rows
    fold_journal(open_files(uri, {}), "run-1")
    cells2, records2, engine2 = _judge(uri, _frame(3), [])
    assert engine2.requests == [] and cells2 == cells1
    assert [r["cache_hits"] for r in records2] == [2, 2, 2]  # statements and verdicts


def test_changed_params_miss(tmp_path):
    uri = str(tmp_path / "cache")
    _judge(uri, _frame(1), [STATEMENTS, YES])
    fold_journal(open_files(uri, {}), "run-1")
    _, records, engine = _judge(uri, _frame(1), [STATEMENTS, YES, YES], {"reasons": False})
    # Both steps are asked again (the bare-verdict step once more: YES has reasons).
    assert len(engine.requests) == 3 and records[0]["cache_hits"] == 0


def test_parse_retry_bypasses_the_cached_bad_reply(tmp_path):
    uri = str(tmp_path / "cache")
    # The first attempt's reply cannot be parsed; it is cached under seed 0 ...
    _judge(uri, _frame(1), ["not json", STATEMENTS, YES])
    fold_journal(open_files(uri, {}), "run-1")
    # ... and a run whose cache lacks the retry's reply asks the engine for seed 1 again.
    (path,) = [p for ps in open_files(uri, {}).bucket_files().values() for p in ps]
    texts = pq.read_table(path).column("text").to_pylist()
    assert sorted(texts) == sorted(["not json", STATEMENTS, YES])
    _, records, engine = _judge(uri, _frame(1), [])
    assert engine.requests == [] and records[0]["cache_hits"] == 3


def test_a_killed_batch_is_reused_after_the_journal_is_folded(tmp_path):
    """An actor killed after its flush: the next run folds the journal before it starts."""
    uri = str(tmp_path / "cache")
    _judge(uri, _frame(2), [STATEMENTS] * 2 + [YES] * 2)
    # Not folded yet: a new actor cannot see the journal.
    _, _, engine = _judge(uri, _frame(2), [STATEMENTS] * 2 + [YES] * 2)
    assert len(engine.requests) == 4
    result = fold_journal(open_files(uri, {}), "run-2")
    assert result.journal_files == 2 and result.rows == 8
    _, _, engine = _judge(uri, _frame(2), [])
    assert engine.requests == []


def test_files_per_fold_are_bounded_by_buckets_not_batches(tmp_path):
    uri = str(tmp_path / "cache")
    group = "a1" + "0" * 62
    cache = JudgmentCache(uri, {})
    for batch in range(12):
        cache.put(f"k{batch}", "m", "model", _ok(f"t{batch}"), group)
        cache.flush()
    files = open_files(uri, {})
    assert len(files.journal_files()) == 12
    result = fold_journal(files, "run-1")
    assert result.files_written == 1 and files.journal_files() == []
    assert {b: len(p) for b, p in files.bucket_files().items()} == {"a1": 1}


def test_lookup_reads_only_the_row_groups_of_the_groups_asked(tmp_path):
    uri = str(tmp_path / "cache")
    cache = JudgmentCache(uri, {})
    groups = [f"00{i:062d}" for i in range(ROW_GROUP_ROWS * 4)]  # one bucket, four row groups
    for i, g in enumerate(groups):
        cache.put(f"k{i}", "m", "model", _ok(f"t{i}"), g)
    cache.flush()
    fold_journal(open_files(uri, {}), "run-1")
    reader = JudgmentCache(uri, {})
    assert reader.prefetch([groups[3], groups[ROW_GROUP_ROWS * 3 + 1]]) == 2
    assert reader.row_groups_read == 2
    assert reader.get("k3").text == "t3" and reader.get("k5") is None


def test_a_key_paid_twice_reads_back_the_earlier_reply(tmp_path):
    uri = str(tmp_path / "cache")
    group = "b2" + "0" * 62
    first, second = JudgmentCache(uri, {}), JudgmentCache(uri, {})
    first.put("k", "m", "model", _ok("earlier"), group)
    second.put("k", "m", "model", _ok("later"), group)
    first.flush()
    fold_journal(open_files(uri, {}), "run-1")
    second.flush()
    fold_journal(open_files(uri, {}), "run-2")
    files = open_files(uri, {})
    assert len(files.bucket_files()["b2"]) == 2
    reader = JudgmentCache(uri, {})
    reader.prefetch([group])
    assert reader.get("k").text == "earlier"
    done = compact(files)
    assert (done.buckets, done.entries, done.fold.journal_files) == (1, 1, 0)
    reader = JudgmentCache(uri, {})
    reader.prefetch([group])
    assert reader.get("k").text == "earlier"


@pytest.mark.parametrize("threads", [1, 8])
def test_lookup_over_many_bucket_files_at_once_finds_each_entry_once(
    tmp_path, monkeypatch, threads
):
    # 40 groups in 40 buckets, two keys each, folded in two runs so that 20 buckets hold
    # two files; key "k0-a" is paid in both runs (the first run's reply is the earlier).
    # Read one file at a time or eight at once, a lookup finds every entry once, with
    # the first run's reply for the key paid twice, and reads each file's row group once.
    from ragbatch.judge import cache_store

    monkeypatch.setattr(cache_store, "LOOKUP_THREADS", threads)
    uri = str(tmp_path / "cache")
    groups = [f"{i:02x}" + "0" * 62 for i in range(0, 80, 2)]
    first, second = JudgmentCache(uri, {}), JudgmentCache(uri, {})
    for i, g in enumerate(groups):
        first.put(f"k{i}-a", "m", "model", _ok(f"first {i}"), g)
        if i % 2 == 0:
            second.put(f"k{i}-b", "m", "model", _ok(f"second {i}"), g)
    second.put("k0-a", "m", "model", _ok("second 0, paid again"), groups[0])
    first.flush()
    fold_journal(open_files(uri, {}), "run-1")
    # the first run's file of groups[0]'s bucket is read first (files are read in name
    # order), so a merge that kept the last reply read would keep the second run's
    (old,) = open_files(uri, {}).bucket_files()["00"]
    LocalFileSystem().mv(old, old.rsplit("/", 1)[0] + "/part-0.parquet")
    second.flush()
    fold_journal(open_files(uri, {}), "run-2")
    assert sum(len(p) for p in open_files(uri, {}).bucket_files().values()) == 60
    reader = JudgmentCache(uri, {})
    found = reader.lookup(groups)
    expected = {f"k{i}-a": (f"first {i}", g) for i, g in enumerate(groups)}
    expected.update({f"k{i}-b": (f"second {i}", g) for i, g in enumerate(groups) if i % 2 == 0})
    assert {key: (reply[0], group) for key, (reply, group) in found.items()} == expected
    assert reader.row_groups_read == 60


def _aged_cache(files: CacheFiles, uri: str) -> dict[str, str]:
    """Three runs: old (entry k_old), mid (k_mid), new (k_new; and a hit on k_hit,
    written in run old). Returns key -> group."""
    groups = {k: f"c{i}" + "0" * 62 for i, k in enumerate(["k_old", "k_mid", "k_new", "k_hit"])}
    for run, keys in (("old", ["k_old", "k_hit"]), ("mid", ["k_mid"]), ("new", ["k_new"])):
        cache = JudgmentCache(uri, {})
        for k in keys:
            cache.put(k, "m", "model", _ok(k), groups[k])
        if run == "new":
            cache.prefetch([groups["k_hit"]])
            assert cache.get("k_hit").text == "k_hit"  # a touch
        cache.flush()
        fold_journal(files, run)
    return groups


def test_compaction_merges_touches_and_prune_keeps_recent_runs(tmp_path):
    uri = str(tmp_path / "cache")
    files = open_files(uri, {})
    groups = _aged_cache(files, uri)
    stats = cache_stats(files)
    assert stats["buckets"].rows == 5 and stats["buckets"].touches == 1
    assert stats["journal"].files == 0
    result = prune(files, keep_runs=1, keep_days=None)
    assert result.runs == ["new"] and (result.kept, result.dropped) == (2, 2)
    reader = JudgmentCache(uri, {})
    reader.prefetch(groups.values())
    assert [k for k in groups if reader.get(k) is not None] == ["k_new", "k_hit"]
    assert cache_stats(files)["buckets"].touches == 0


def test_prune_folds_the_journal_of_a_run_in_progress_first(tmp_path):
    """Runs old and mid are folded; run cur has flushed batches (a reply of its own
    and a touch of old's k_old) but not committed. Pruning to the latest run keeps
    cur's reply and the entry it used, and drops mid's: the journal is folded first,
    with each row counted for the run that wrote it."""
    uri = str(tmp_path / "cache")
    files = open_files(uri, {})
    groups = {k: f"d{i}" + "0" * 62 for i, k in enumerate(["k_old", "k_mid", "k_cur"])}
    for run, key in (("old", "k_old"), ("mid", "k_mid")):
        cache = JudgmentCache(uri, {}, run_id=run)
        cache.put(key, "m", "model", _ok(key), groups[key])
        cache.flush()
        fold_journal(files, run)
    cur = JudgmentCache(uri, {}, run_id="cur")
    cur.prefetch([groups["k_old"]])
    assert cur.get("k_old").text == "k_old"
    cur.put("k_cur", "m", "model", _ok("k_cur"), groups["k_cur"])
    cur.flush()
    assert len(files.journal_files()) == 1
    result = prune(files, keep_runs=1, keep_days=None)
    assert (result.fold.journal_files, result.fold.rows) == (1, 2)
    assert result.runs == ["cur"] and (result.kept, result.dropped) == (2, 1)
    assert files.journal_files() == []
    reader = JudgmentCache(uri, {})
    reader.prefetch(groups.values())
    assert [k for k in groups if reader.get(k) is not None] == ["k_old", "k_cur"]


def test_prune_by_days(tmp_path):
    uri = str(tmp_path / "cache")
    files = open_files(uri, {})
    _aged_cache(files, uri)
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=10)
    assert (prune(files, None, keep_days=9, now=later).kept) == 0
    files = open_files(str(tmp_path / "cache2"), {})
    _aged_cache(files, str(tmp_path / "cache2"))
    assert prune(files, None, keep_days=11, now=later).kept == 4
    with pytest.raises(ValueError, match="keep_runs, keep_days"):
        prune(files, None, None)


def test_cli_stats_compact_prune(tmp_path, capsys):
    uri = str(tmp_path / "cache")
    _aged_cache(open_files(uri, {}), uri)
    (tmp_path / "cache" / "metric=faithfulness").mkdir()
    legacy = tmp_path / "cache" / "metric=faithfulness" / "part-0.parquet"
    pq.write_table(pl.DataFrame({"key": ["x"]}).to_arrow(), legacy)
    assert main(["cache", "stats", "--uri", uri]) == 0
    out = capsys.readouterr().out
    assert "buckets  files       5  entries           4  touches         1" in out
    assert "legacy   files       1  entries           1" in out
    assert main(["cache", "compact", "--uri", uri]) == 0
    out = capsys.readouterr().out
    assert "folded 0 journal files (0 rows) into 0 bucket files" in out
    assert "compacted 4 buckets: 4 entries" in out
    assert main(["cache", "prune", "--uri", uri, "--keep-runs", "2"]) == 0
    assert "kept 3 entries, dropped 1" in capsys.readouterr().out
    assert main(["cache", "prune", "--uri", uri]) == 2
    assert "--keep-runs, --keep-days" in capsys.readouterr().err


def _writer(uri: str, options: dict, start: int, run: str, errors: list) -> None:
    try:
        for batch in range(3):
            cache = JudgmentCache(uri, options, run_id=run)
            for i in range(start + batch * 10, start + batch * 10 + 10):
                cache.put(f"k{i}", "m", "model", _ok(f"t{i}"), f"{i % 4:02d}" + "0" * 62)
            cache.flush()
            fold_journal(open_files(uri, options), run, max_files=2)
    except Exception as exc:  # reported by the test
        errors.append(exc)


def _all_keys(uri: str, options: dict) -> set[str]:
    reader = JudgmentCache(uri, options)
    groups = [f"{i:02d}" + "0" * 62 for i in range(4)]
    reader.prefetch(groups)
    return {k for k in (f"k{i}" for i in range(60)) if reader.get(k) is not None}


def _two_runs_at_once(uri: str, options: dict) -> None:
    """Two runs write, fold and compact one cache at once: nothing is lost, a
    compaction leaves one file per bucket, and every entry counts for the run that
    wrote it, whichever run's fold moved it (run-a wrote k0..k29, run-b k30..k59)."""
    errors: list[Any] = []
    threads = [
        threading.Thread(target=_writer, args=(uri, options, s, r, errors))
        for s, r in ((0, "run-a"), (30, "run-b"))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert _all_keys(uri, options) == {f"k{i}" for i in range(60)}
    files = open_files(uri, options)
    assert files.journal_files() == []
    done = compact(files)
    assert (done.buckets, done.entries) == (4, 60)
    assert all(len(p) == 1 for p in files.bucket_files().values())
    result = prune(files, keep_runs=2, keep_days=None)
    assert (result.kept, result.dropped) == (60, 0)
    assert sorted(result.runs) == ["run-a", "run-b"]
    latest = prune(files, keep_runs=1, keep_days=None)
    assert (latest.kept, latest.dropped) == (30, 30)
    wrote = {"run-a": range(0, 30), "run-b": range(30, 60)}[latest.runs[0]]
    assert _all_keys(uri, options) == {f"k{i}" for i in wrote}
    assert prune(files, keep_runs=0, keep_days=None).kept == 0


def test_two_runs_fold_and_compact_one_cache_at_once(tmp_path):
    _two_runs_at_once(str(tmp_path / "cache"), {})


@pytest.mark.release
def test_two_runs_fold_and_compact_one_cache_at_once_on_s3(s3_storage_options, s3_bucket):
    _two_runs_at_once(f"s3://{s3_bucket}/judge_cache", s3_storage_options)


@pytest.mark.release
def test_rerun_and_prune_on_s3(s3_storage_options, s3_bucket):
    uri = f"s3://{s3_bucket}/judge_cache"
    engine = RecordedReplies([STATEMENTS] * 2 + [YES] * 2)
    cache = JudgmentCache(uri, s3_storage_options)
    runner = JudgeRunner(engine, [Faithfulness.from_params({})], cache=cache)
    cells, _ = run_sync(judge_frame(runner, _frame(2)))["faithfulness"]
    cache.flush()
    files = open_files(uri, s3_storage_options)
    assert fold_journal(files, "run-1").journal_files == 1
    again = RecordedReplies([])
    cache = JudgmentCache(uri, s3_storage_options)
    runner = JudgeRunner(again, [Faithfulness.from_params({})], cache=cache)
    cells2, _ = run_sync(judge_frame(runner, _frame(2)))["faithfulness"]
    cache.flush()
    assert again.requests == [] and cells2 == cells
    fold_journal(files, "run-2")
    stats = cache_stats(files)
    assert stats["buckets"].rows - stats["buckets"].touches == 4 and stats["buckets"].touches == 4
    assert prune(files, keep_runs=1, keep_days=None).kept == 4
    assert cache_stats(files)["buckets"].touches == 0


def test_settle_journal_folds_only_for_judge_stages_with_the_cache_on(tmp_path):
    from types import SimpleNamespace

    from ragbatch.core.stages import StageKind
    from ragbatch.judge.cache_upkeep import settle_journal

    uri = str(tmp_path / "cache")
    _judge(uri, _frame(1), [STATEMENTS, YES])

    def config(enabled: bool) -> Any:
        return SimpleNamespace(
            cache=SimpleNamespace(enabled=enabled), cache_location=lambda: (uri, {})
        )

    judge, expression = SimpleNamespace(kind=StageKind.JUDGE), SimpleNamespace(kind="expression")
    assert settle_journal(config(True), "run-1", [expression]) is None
    assert settle_journal(config(False), "run-1", [judge]) is None
    assert len(open_files(uri, {}).journal_files()) == 1
    assert settle_journal(config(True), "run-1", [expression, judge]).rows == 2
    assert open_files(uri, {}).journal_files() == []
    # A store that cannot be written is logged, not raised: the run has committed.
    broken = SimpleNamespace(
        cache=SimpleNamespace(enabled=True), cache_location=lambda: ("nope://x", {})
    )
    assert settle_journal(broken, "run-1", [judge]) is None


def test_a_batch_in_flight_keeps_its_entries_when_another_batch_flushes(tmp_path):
    """Two batches in flight on one actor share its cache: one ending (its flush) must
    not take the other's looked-up entries away."""
    from ragbatch.judge.batch import guarded_rows, with_issues
    from ragbatch.judge.cache import cache_key

    uri = str(tmp_path / "cache")
    _judge(uri, _frame(1), [STATEMENTS, YES])
    fold_journal(open_files(uri, {}), "run-1")
    metric = Faithfulness.from_params({})
    engine = RecordedReplies([])
    runner = JudgeRunner(engine, [metric], cache=JudgmentCache(uri, {}))
    first, second = runner.fork(), runner.fork()
    _, todo = guarded_rows([metric], with_issues(_frame(1)))
    for batch in (first, second):  # each batch's start: its rows' entries looked up
        batch._found = batch._lookup(batch._groups(todo))
    runner.cache.flush()  # the second batch ends first
    (ask,) = list(next(metric.program(todo[metric.id][0][1])))
    key = cache_key(engine, metric.cache_identity(), ask, 0)
    assert first._cached(key).text == STATEMENTS


def test_upkeep_refuses_to_delete_outside_the_cache_root(tmp_path):
    # A path that is not below the cache root (a listing gone wrong, a hostile name)
    # is refused, and the file stays.
    from ragbatch.core.errors import OutputError
    from ragbatch.judge.cache_upkeep import _remove

    outside = tmp_path / "elsewhere.parquet"
    outside.write_bytes(b"keep me")
    files = CacheFiles(LocalFileSystem(), str(tmp_path / "cache"))
    for path in (str(outside), str(tmp_path / "cache" / ".." / "elsewhere.parquet")):
        with pytest.raises(OutputError, match="refusing to delete"):
            _remove(files, path)
    assert outside.read_bytes() == b"keep me"
    # Inside the root it deletes, and a file already gone is skipped.
    inside = tmp_path / "cache" / "v2" / "journal" / "part-1.parquet"
    inside.parent.mkdir(parents=True)
    inside.write_bytes(b"x")
    _remove(files, str(inside))
    _remove(files, str(inside))
    assert not inside.exists()


@pytest.mark.parametrize("bound, footer_reads", [(None, 40), (1, 40 + 40)])
def test_a_reader_keeps_the_footers_it_read_within_its_byte_bound(
    tmp_path, monkeypatch, bound, footer_reads
):
    # 40 groups in 40 bucket files, looked up twice, one file at a time. Each footer is
    # read once, with the file's group ranges, and kept (serialized) for the row-group
    # reads after it: the second lookup reads no footer. With the bound at one byte no
    # footer fits and none is kept: the second lookup reads all 40 again. Either way the
    # same entries are found. (No row group is kept in memory here: a
    # file whose row groups are all kept needs no footer, nor any request.)
    from ragbatch.judge import cache_store

    monkeypatch.setattr(cache_store, "LOOKUP_THREADS", 1)  # files read in order
    monkeypatch.setattr(cache_store, "ROW_GROUP_CACHE_BYTES", 0)
    if bound is not None:
        monkeypatch.setattr(cache_store, "FOOTER_CACHE_BYTES", bound)
    uri = str(tmp_path / "cache")
    groups = [f"{i:02x}" + "0" * 62 for i in range(0, 80, 2)]
    cache = JudgmentCache(uri, {})
    for i, g in enumerate(groups):
        cache.put(f"k{i}", "m", "model", _ok(f"t{i}"), g)
    cache.flush()
    fold_journal(open_files(uri, {}), "run-1")
    reader = JudgmentCache(uri, {})
    expected = {f"k{i}": (f"t{i}", g) for i, g in enumerate(groups)}
    for _ in range(2):
        found = reader.lookup(groups)
        assert {key: (reply[0], group) for key, (reply, group) in found.items()} == expected
    assert reader.reader.footers_read == footer_reads
    assert reader.row_groups_read == 80


def test_a_failed_flush_keeps_its_replies_for_the_next_flush(tmp_path):
    """The journal folder is blocked (a file stands where it goes): the flush fails
    naming the cache, and the next one, once storage is back, writes the replies and
    touches of both."""
    import shutil
    from pathlib import Path

    from ragbatch.core.errors import OutputError

    uri = str(tmp_path / "cache")
    seeded = JudgmentCache(uri, {})
    seeded.put("old", "m", "model", _ok("t-old"), "a0" + "0" * 62)
    seeded.flush()
    fold_journal(open_files(uri, {}), "run-1")
    cache = JudgmentCache(uri, {})
    cache.prefetch(["a0" + "0" * 62])
    assert cache.get("old").text == "t-old"  # a touch to write
    for i in range(2):
        cache.put(f"k{i}", "m", "model", _ok(f"t{i}"), f"b{i}" + "0" * 62)
    journal = Path(open_files(uri, {}).journal_dir)
    shutil.rmtree(journal, ignore_errors=True)  # the fold left it empty
    journal.parent.mkdir(parents=True, exist_ok=True)
    journal.write_text("in the way")
    with pytest.raises(OutputError, match=r"judgment cache .*cache: cannot write"):
        cache.flush()
    journal.unlink()
    cache.put("k2", "m", "model", _ok("t2"), "b2" + "0" * 62)
    assert cache.flush() == 3
    (written,) = open_files(uri, {}).journal_files()
    rows = pq.read_table(written).to_pylist()
    assert sorted(r["key"] for r in rows) == ["k0", "k1", "k2", "old"]
    assert [r["text"] for r in rows if r["key"] == "old"] == [None]  # a touch, not a reply
    assert cache.flush() == 0  # nothing is written twice


def _forty_files(uri: str, options: dict) -> list[str]:
    """40 groups, each alone in its bucket file; returns the groups."""
    groups = [f"{i:02x}" + "0" * 62 for i in range(0, 80, 2)]
    cache = JudgmentCache(uri, options)
    for i, g in enumerate(groups):
        cache.put(f"k{i}", "m", "model", _ok(f"t{i}"), g)
    cache.flush()
    fold_journal(open_files(uri, options), "run-1")
    return groups


def _counting_ranges(monkeypatch) -> list[int]:
    """Count the byte ranges the cache's files ask the store for (a spy: every call goes
    through to the real store)."""
    counted: list[int] = []
    start, fetch = CacheFiles.start_fetch, CacheFiles.fetch

    def counting_start(self, ranges):
        counted.append(len(ranges))
        return start(self, ranges)

    def counting_fetch(self, ranges):
        counted.append(len(ranges))
        return fetch(self, ranges)

    monkeypatch.setattr(CacheFiles, "start_fetch", counting_start)
    monkeypatch.setattr(CacheFiles, "fetch", counting_fetch)
    return counted


@pytest.mark.parametrize("first_read", ["whole file", "footer", "less than the footer"])
def test_a_lookup_makes_one_request_per_file_once_its_footer_is_kept(
    tmp_path, monkeypatch, first_read
):
    # 40 files of one row group each. The first lookup reads each file's end: all of it
    # when it fits in FIRST_READ_BYTES (1 request a file); its footer only (then 1 more
    # for the row group: 2); less than its footer (then 1 more for the rest of the
    # footer, and 1 for the row group: 3). The second lookup keeps every footer: 1
    # request a file. The entries found are the same. (No row group is kept in memory
    # here: a kept one is not fetched at all, tests/test_judge_cache_row_groups.py.)
    from ragbatch.judge import cache_parquet, cache_store

    monkeypatch.setattr(cache_store, "ROW_GROUP_CACHE_BYTES", 0)

    uri = str(tmp_path / "cache")
    groups = _forty_files(uri, {})
    paths = [p for ps in open_files(uri, {}).bucket_files().values() for p in ps]
    size = min(pathlib.Path(p).stat().st_size for p in paths)
    footer = max(pq.read_metadata(p).serialized_size for p in paths)
    monkeypatch.setattr(
        cache_parquet,
        "FIRST_READ_BYTES",
        {"whole file": 1 << 20, "footer": footer + 8, "less than the footer": 16}[first_read],
    )
    assert footer + 8 < size
    counted = _counting_ranges(monkeypatch)
    reader = JudgmentCache(uri, {})
    expected = {f"k{i}": (f"t{i}", g) for i, g in enumerate(groups)}
    per_file = []
    for _ in range(2):
        counted.clear()
        found = reader.lookup(groups)
        assert {key: (reply[0], group) for key, (reply, group) in found.items()} == expected
        per_file.append(sum(counted) / 40)
    assert per_file == [{"whole file": 1, "footer": 2, "less than the footer": 3}[first_read], 1]


@pytest.mark.release
def test_a_lookup_on_s3_sends_one_get_per_file_and_nothing_else(
    monkeypatch, s3_storage_options, s3_bucket
):
    # Counted at s3fs's call to the S3 API: once the footers are kept, a lookup of 40
    # groups in 40 files is 40 GetObject calls, and no HeadObject or listing (no row
    # group kept in memory: one kept is not fetched, tests/test_judge_cache_row_groups.py).
    from ragbatch.judge import cache_store

    monkeypatch.setattr(cache_store, "ROW_GROUP_CACHE_BYTES", 0)
    uri = f"s3://{s3_bucket}/judge_cache"
    groups = _forty_files(uri, s3_storage_options)
    reader = JudgmentCache(uri, s3_storage_options)
    reader.lookup(groups)
    calls = count_s3_calls(monkeypatch)
    assert len(reader.lookup(groups)) == 40
    assert calls == ["get_object"] * 40
