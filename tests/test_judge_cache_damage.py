"""A damaged judgment cache never stops a run: a file that cannot be read is set aside
with a warning naming it, its entries are asked again, and ``ragbatch cache check``
finds and repairs such files. On local disk and on a real S3 endpoint (moto on loopback).

Every cache here is written by the project's own writer (:meth:`JudgmentCache.flush`,
then :func:`fold_journal`); the damage is done to its files afterwards, as a storage
fault would: cut short, overwritten with other bytes, replaced by a Parquet file of
other columns, a footer or a page header overwritten.
"""

from __future__ import annotations

import io
import logging

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragbatch.cli.main import main
from ragbatch.core.errors import OutputError
from ragbatch.core.status import OK
from ragbatch.judge.batch import judge_frame
from ragbatch.judge.protocol import run_sync
from ragbatch.judge.cache import JudgmentCache, group_key
from ragbatch.judge.cache_files import bucket_of
from ragbatch.judge.cache_upkeep import (
    cache_stats,
    check_cache,
    compact,
    fold_journal,
    open_files,
)
from ragbatch.judge.recorded import RecordedReplies
from ragbatch.judge.run import JudgeRunner
from ragbatch.metrics.hate_speech import HateSpeech
from support.cache_rows import city_rows, ok_reply

GOOD = '{"reason": "The answer names a city and a country.", "verdict": false}'
ROWS = 6
#: What is done to a file, and the start of why a reader gives up on it.
DAMAGE = {
    "truncated": "no Parquet footer at its end",
    "garbage": "no Parquet footer at its end",
    "wrong_schema": "column 'group' is missing",
    "corrupt_footer": "its footer does not parse",
    "corrupt_page": "its pages do not decode",
    "invalid_utf8": "its pages do not decode",
    "hostile_names": "column 'group' is missing",
}
#: A column name a hostile file could hold: a terminal title, a screen clear, a colour,
#: a line break and a carriage return.
HOSTILE = "\x1b]0;owned\x07\x1b[2J\x1b[31mred\nchecked 0 files\r\u202e"


def _damage(fs, path: str, kind: str) -> None:
    """Do ``kind`` of :data:`DAMAGE` to the file at ``path``."""
    data = fs.cat_file(path)
    if kind == "truncated":
        damaged = data[: len(data) // 2]
    elif kind == "garbage":
        damaged = b"this is not a parquet file " * 20
    elif kind == "wrong_schema":
        sink = io.BytesIO()
        pq.write_table(pa.table({"x": [1, 2]}), sink)
        damaged = sink.getvalue()
    elif kind == "hostile_names":
        sink = io.BytesIO()
        pq.write_table(pa.table({HOSTILE: [1, 2]}), sink)
        damaged = sink.getvalue()
    elif kind == "invalid_utf8":  # Parquet stores the replies' bytes without checking them
        table = pq.read_table(pa.BufferReader(data))
        marker = "Q" * 16
        at = table.schema.get_field_index("text")
        table = table.set_column(at, "text", pa.array([marker] * table.num_rows, pa.string()))
        sink = io.BytesIO()
        pq.write_table(
            table, sink, compression="none", use_dictionary=False, write_statistics=["group"]
        )
        damaged = sink.getvalue().replace(marker.encode(), b"\xff\x1b[31m" + b"Q" * 10)
    elif kind == "corrupt_footer":
        length = int.from_bytes(data[-8:-4], "little")
        start = len(data) - 8 - length
        damaged = data[:start] + b"\xff" * 32 + data[start + 32 :]
    else:  # corrupt_page: the header of the first data page of the text column
        meta = pq.read_metadata(pa.BufferReader(data))
        text = meta.schema.to_arrow_schema().get_field_index("text")
        at = meta.row_group(0).column(text).data_page_offset
        damaged = data[:at] + b"\xff" * 16 + data[at + 16 :]
    fs.pipe_file(path, damaged)
    fs.invalidate_cache()


def _night(uri: str, options: dict, replies: list[str], run: str):
    """One actor's batch of ROWS rows with hate_speech, then the commit's fold."""
    engine = RecordedReplies(replies)
    cache = JudgmentCache(uri, options, run_id=run)
    runner = JudgeRunner(engine, [HateSpeech.from_params({})], cache=cache)
    cells, records = run_sync(judge_frame(runner, city_rows(ROWS)))["hate_speech"]
    cache.flush()
    fold_journal(open_files(uri, options), run)
    return cells, records, engine


def _row_buckets(engine) -> list[str]:
    """The bucket of each row of city_rows(ROWS) under ``engine``."""
    return [bucket_of(group_key(engine, row)) for row in city_rows(ROWS).to_dicts()]


def _damaged_run(uri: str, options: dict, kind: str, caplog) -> None:
    """Night 1 fills the cache; one bucket file gets ``kind`` of damage; night 2 judges
    the same rows: it finishes, every cell ok, asking again only the row whose entry was
    in that file, which is now under v2/damaged/ with the same bytes, named by a
    warning; night 3 finds everything again."""
    _, _, first = _night(uri, options, [GOOD] * ROWS, "n1")
    files = open_files(uri, options)
    buckets = _row_buckets(first)
    assert len(set(buckets)) == ROWS  # one row per bucket file
    (path,) = files.bucket_files()[buckets[0]]
    _damage(files.fs, path, kind)
    damaged_bytes = files.fs.cat_file(path)

    with caplog.at_level(logging.WARNING, logger="ragbatch.judge.cache_store"):
        cells, records, engine = _night(uri, options, [GOOD], "n2")
    assert [c["status"] for c in cells] == [OK] * ROWS
    assert [r["judge_calls"] for r in records] == [1] + [0] * (ROWS - 1)
    assert len(engine.requests) == 1
    moved = f"{files.damaged_dir}/buckets/bucket={buckets[0]}/{path.rsplit('/', 1)[1]}"
    assert files.damaged_files() == [moved]
    assert files.fs.cat_file(moved) == damaged_bytes
    assert not files.fs.exists(path)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert files.uri(path) in warning and DAMAGE[kind] in warning
    assert files.uri(moved) in warning
    assert warning.isprintable()  # whatever the file held, one line that shows as written

    cells, records, engine = _night(uri, options, [], "n3")
    assert [c["status"] for c in cells] == [OK] * ROWS
    assert engine.requests == []


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_damaged_bucket_file_is_set_aside_and_its_entries_asked_again(tmp_path, kind, caplog):
    _damaged_run(str(tmp_path / "cache"), {}, kind, caplog)


@pytest.mark.release
@pytest.mark.parametrize("kind", ["truncated", "wrong_schema"])
def test_a_damaged_bucket_file_is_set_aside_on_s3(s3_storage_options, s3_bucket, kind, caplog):
    _damaged_run(f"s3://{s3_bucket}/judge_cache", s3_storage_options, kind, caplog)


def test_a_damaged_journal_file_is_set_aside_and_the_fold_goes_on(tmp_path, caplog):
    """Two journal files, one cut short: the fold folds the other (its 2 rows), sets the
    cut one aside, and the next fold has nothing left to do."""
    uri = str(tmp_path / "cache")
    for n, run in enumerate(("a", "b")):
        cache = JudgmentCache(uri, {}, run_id=run)
        for i in range(2):
            cache.put(f"{run}{i}", "m", "model", ok_reply(GOOD), f"{n}{i}" + "0" * 62)
        cache.flush()
    files = open_files(uri, {})
    first, second = files.journal_files()
    _damage(files.fs, first, "truncated")
    with caplog.at_level(logging.WARNING, logger="ragbatch.judge.cache_store"):
        result = fold_journal(files, "run-1")
    assert (result.journal_files, result.rows) == (1, 2)
    assert files.journal_files() == []
    assert files.damaged_files() == [f"{files.damaged_dir}/journal/{first.rsplit('/', 1)[1]}"]
    assert any(files.uri(first) in r.getMessage() for r in caplog.records)
    assert fold_journal(files, "run-2").journal_files == 0


def _cache_with_damage(uri: str, options: dict) -> tuple[object, dict[str, str]]:
    """A cache of ROWS bucket files and one journal file, with four files damaged:
    kind -> path (three bucket files, and the journal file cut short)."""
    _night(uri, options, [GOOD] * ROWS, "n1")
    cache = JudgmentCache(uri, options, run_id="n2")
    cache.put("extra", "m", "model", ok_reply(GOOD), "ff" + "0" * 62)
    cache.flush()
    files = open_files(uri, options)
    buckets = sorted(files.bucket_files().items())
    damaged = {}
    for kind, (_, (path,)) in zip(("garbage", "wrong_schema", "corrupt_page"), buckets):
        _damage(files.fs, path, kind)
        damaged[kind] = path
    (journal,) = files.journal_files()
    _damage(files.fs, journal, "truncated")
    damaged["truncated journal"] = journal
    return files, damaged


def _check_and_repair(uri: str, options: dict, capsys) -> None:
    files, damaged = _cache_with_damage(uri, options)
    flags = ["--uri", uri] + [f"--storage-option={k}={v}" for k, v in options.items()]
    # footers and columns: three of the four (a page header is not in the footer)
    assert main(["cache", "check", *flags]) == 3
    out = capsys.readouterr().out
    for kind in ("garbage", "wrong_schema", "truncated journal"):
        assert files.uri(damaged[kind]) in out, kind
    assert files.uri(damaged["corrupt_page"]) not in out
    assert f"checked {ROWS + 1} files (footers and columns): 3 damaged" in out
    assert "ragbatch cache check --repair" in out
    # every byte: all four, each with why
    assert main(["cache", "check", *flags, "--data"]) == 3
    out = capsys.readouterr().out
    assert f"damaged   {files.uri(damaged['garbage'])}: no Parquet footer at its end" in out
    assert f"damaged   {files.uri(damaged['wrong_schema'])}: column 'group' is missing" in out
    assert f"damaged   {files.uri(damaged['corrupt_page'])}: its pages do not decode" in out
    assert f"damaged   {files.uri(damaged['truncated journal'])}: no Parquet footer" in out
    assert f"checked {ROWS + 1} files (every byte): 4 damaged" in out
    # PyArrow's message about the page spans lines and quotes a byte of the file: each
    # file's line stays one printable line
    assert all(line.isprintable() for line in out.splitlines())
    assert len(out.splitlines()) == 4 + 2
    # repair: each is moved under v2/damaged/, keeping its path below v2/
    assert main(["cache", "check", *flags, "--data", "--repair"]) == 0
    out = capsys.readouterr().out
    assert "4 damaged, 4 set aside" in out
    version = f"{files.root}/v2/"
    expected = sorted(f"{files.damaged_dir}/{path[len(version) :]}" for path in damaged.values())
    assert files.damaged_files() == expected
    assert main(["cache", "check", *flags, "--data"]) == 0
    assert f"checked {ROWS - 3} files (every byte): 0 damaged" in capsys.readouterr().out
    assert main(["cache", "stats", *flags]) == 0
    assert "damaged  files       4  (set aside, not read)" in capsys.readouterr().out


def test_text_that_is_not_utf8_and_hostile_names_are_found_by_check(tmp_path, capsys):
    uri = str(tmp_path / "cache")
    _, _, first = _night(uri, {}, [GOOD] * ROWS, "n1")
    files = open_files(uri, {})
    (text_file,) = files.bucket_files()[_row_buckets(first)[0]]
    (names_file,) = files.bucket_files()[_row_buckets(first)[1]]
    _damage(files.fs, text_file, "invalid_utf8")
    _damage(files.fs, names_file, "hostile_names")
    assert main(["cache", "check", "--uri", uri]) == 3  # the text's footer is sound
    out = capsys.readouterr().out
    assert files.uri(text_file) not in out
    escaped = "\\x1b]0;owned\\x07\\x1b[2J\\x1b[31mred checked 0 files \\u202e"
    assert (
        f"damaged   {files.uri(names_file)}: column 'group' is missing (columns: {escaped})" in out
    )
    assert main(["cache", "check", "--uri", uri, "--data"]) == 3
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if files.uri(text_file) in x)
    assert line.startswith(f"damaged   {files.uri(text_file)}: its pages do not decode: ")
    assert "utf" in line.lower() and "\\xff" not in line  # PyArrow names the fault
    assert all(x.isprintable() for x in out.splitlines()) and len(out.splitlines()) == 2 + 2


def test_cache_check_finds_and_repairs_damaged_files(tmp_path, capsys):
    _check_and_repair(str(tmp_path / "cache"), {}, capsys)


@pytest.mark.release
def test_cache_check_finds_and_repairs_damaged_files_on_s3(s3_storage_options, s3_bucket, capsys):
    _check_and_repair(f"s3://{s3_bucket}/judge_cache", s3_storage_options, capsys)


def test_stats_counts_an_unreadable_file_and_moves_nothing(tmp_path, capsys):
    uri = str(tmp_path / "cache")
    files, damaged = _cache_with_damage(uri, {})
    stats = cache_stats(files)
    assert (stats["buckets"].files, stats["buckets"].unreadable) == (ROWS, 2)
    assert (stats["journal"].files, stats["journal"].unreadable) == (1, 1)
    assert files.damaged_files() == []
    assert main(["cache", "stats", "--uri", uri]) == 0
    assert "unreadable 2 (ragbatch cache check --repair)" in capsys.readouterr().out
    assert main(["cache", "stats", "--uri", uri, "--repair"]) == 2
    assert "--data and --repair apply to `ragbatch cache check` only" in capsys.readouterr().err


def test_compaction_sets_a_damaged_file_aside_and_keeps_the_rest(tmp_path):
    """Two files in one bucket, one overwritten: compaction keeps the other's entry and
    sets the damaged one aside rather than deleting it."""
    uri = str(tmp_path / "cache")
    group = "aa" + "0" * 62
    for key in ("k1", "k2"):
        cache = JudgmentCache(uri, {})
        cache.put(key, "m", "model", ok_reply(GOOD), group)
        cache.flush()
        fold_journal(open_files(uri, {}), "run")
    files = open_files(uri, {})
    first, second = files.bucket_files()["aa"]
    (kept,) = pq.read_table(second).column("key").to_pylist()
    (lost,) = {"k1", "k2"} - {kept}
    _damage(files.fs, first, "garbage")
    done = compact(files)
    assert (done.buckets, done.entries) == (1, 1)
    assert len(files.damaged_files()) == 1
    reader = JudgmentCache(uri, {})
    reader.prefetch([group])
    assert reader.get(kept).text == GOOD and reader.get(lost) is None
    assert check_cache(files).damaged == []


def test_setting_aside_is_safe_when_another_process_did_it_first(tmp_path):
    """Two processes find the same bad file: the first move wins, the second finds it
    gone and moves nothing; a path outside the cache's v2/ is refused."""
    uri = str(tmp_path / "cache")
    _night(uri, {}, [GOOD] * ROWS, "n1")
    one, other = open_files(uri, {}), open_files(uri, {})
    path = sorted(p for ps in one.bucket_files().values() for p in ps)[0]
    _damage(one.fs, path, "garbage")
    target = one.set_aside(path, "test")
    assert target is not None and other.set_aside(path, "test") is None
    assert one.damaged_files() == [target]
    outside = tmp_path / "elsewhere.parquet"
    outside.write_bytes(b"keep me")
    with pytest.raises(OutputError, match="refusing"):
        one.set_aside(str(outside), "test")
    with pytest.raises(OutputError, match="already set aside"):
        one.set_aside(target, "test")
    assert outside.read_bytes() == b"keep me"


def test_a_file_the_store_cannot_read_fails_the_lookup_and_stays(tmp_path):
    """Not damage: the store refuses the read (here a folder stands where the file was
    listed). The lookup fails naming the cache and the file, and nothing is moved."""
    uri = str(tmp_path / "cache")
    _, _, first = _night(uri, {}, [GOOD] * ROWS, "n1")
    cache = JudgmentCache(uri, {})
    files = cache.files
    bucket = _row_buckets(first)[0]
    (path,) = files.bucket_files()[bucket]
    files.fs.rm(path)
    files.fs.makedirs(path)
    group = group_key(first, city_rows(1).to_dicts()[0])
    with pytest.raises(OutputError, match=rf"judgment cache {uri}: cannot read: .*{path}"):
        cache.lookup([group])
    assert files.damaged_files() == []
    assert fsspec.filesystem("file").isdir(path)


@pytest.mark.release
def test_a_file_cut_short_after_the_listing_is_set_aside_on_s3(
    s3_storage_options, s3_bucket, monkeypatch
):
    """The reader listed the file, then it was cut short to 4 bytes: S3 refuses the range
    of its end as listed (past its new end). Not a storage failure: the file is damaged,
    and it is set aside. (The first read is made smaller than the file, so that it starts
    past the new end.)"""
    from ragbatch.judge import cache_parquet

    monkeypatch.setattr(cache_parquet, "FIRST_READ_BYTES", 64)
    uri = f"s3://{s3_bucket}/judge_cache"
    _, _, first = _night(uri, s3_storage_options, [GOOD] * ROWS, "n1")
    cache = JudgmentCache(uri, s3_storage_options)
    files = cache.files
    (path,) = files.bucket_files()[_row_buckets(first)[0]]
    listed = files.sizes[path]
    assert listed > 64 + 4
    files.fs.pipe_file(path, b"PAR1")
    group = group_key(first, city_rows(1).to_dicts()[0])
    assert cache.lookup([group]) == {}
    assert cache.reader.damaged == [(path, f"it has 4 bytes, {listed} when listed (cut short)")]
    (moved,) = files.damaged_files()
    assert moved.endswith(path.rsplit("/", 1)[1])
