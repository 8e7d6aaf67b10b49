"""Decoded row groups kept by a judgment-cache reader (``ROW_GROUP_CACHE_BYTES``): a row
group a later lookup needs again is taken from memory, with no request and no decoding;
the memory they take stays within the bound; a file written again in place is read
afresh once it is listed again, never served from what was kept of the file it replaced.

Every cache here is real Parquet written through the project's own writer
(:meth:`JudgmentCache.flush`, then :func:`fold_journal`), on local disk and on a real S3
endpoint (moto's server on loopback); requests are counted by a spy that lets every call
through to the store.
"""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragbatch.judge import cache_store
from ragbatch.judge.cache import JudgmentCache
from ragbatch.judge.cache_files import ROW_GROUP_ROWS, CacheFiles
from ragbatch.judge.cache_upkeep import _remove, compact, fold_journal, open_files
from support.s3_calls import count_s3_calls
from support.cache_rows import ok_reply as _ok


@pytest.fixture(params=["local disk", "S3"])
def store(request, tmp_path) -> tuple[str, dict]:
    """(cache URI, storage options): a folder on local disk, or a fresh bucket on the S3
    endpoint on loopback."""
    if request.param == "local disk":
        return str(tmp_path / "cache"), {}
    options = request.getfixturevalue("s3_storage_options")
    bucket = request.getfixturevalue("s3_bucket")
    return f"s3://{bucket}/judge_cache", options


def _write(uri: str, options: dict, entries: list[tuple[str, str, str]], run: str) -> None:
    """Store (key, reply text, group) ``entries`` as one run does: one journal file,
    folded into the bucket files (one file per bucket touched, one row group each)."""
    cache = JudgmentCache(uri, options)
    for key, text, group in entries:
        cache.put(key, "m", "model", _ok(text), group)
    cache.flush()
    fold_journal(open_files(uri, options), run)


def _two_runs_in_one_bucket(uri: str, options: dict) -> tuple[str, str]:
    """Two runs' entries in bucket a1, one file each: ``k1`` -> "first reply" under the
    first group returned, ``k2`` -> "second reply" under the second."""
    first, second = "a1" + "0" * 62, "a1" + "f" * 62
    _write(uri, options, [("k1", "first reply", first)], "run-1")
    _write(uri, options, [("k2", "second reply", second)], "run-2")
    return first, second


def _forty(uri: str, options: dict) -> dict[str, tuple[str, str]]:
    """40 groups, each alone in its bucket file (buckets 00, 02, ..., 4e); returns key ->
    (reply text, group) of what was stored."""
    groups = [f"{i:02x}" + "0" * 62 for i in range(0, 80, 2)]
    entries = [(f"k{i}", f"t{i}", g) for i, g in enumerate(groups)]
    _write(uri, options, entries, "run-1")
    return {key: (text, group) for key, text, group in entries}


def _texts(found: dict) -> dict[str, tuple[str, str]]:
    """key -> (reply text, group) of what :meth:`JudgmentCache.lookup` returned."""
    return {key: (reply[0], group) for key, (reply, group) in found.items()}


def _counting_ranges(monkeypatch) -> list[tuple[str, int, int]]:
    """Every byte range the cache's files ask the store for (a spy: each call goes
    through to the real store)."""
    asked: list[tuple[str, int, int]] = []
    start, fetch = CacheFiles.start_fetch, CacheFiles.fetch

    def counting_start(self, ranges):
        asked.extend(ranges)
        return start(self, ranges)

    def counting_fetch(self, ranges):
        asked.extend(ranges)
        return fetch(self, ranges)

    monkeypatch.setattr(CacheFiles, "start_fetch", counting_start)
    monkeypatch.setattr(CacheFiles, "fetch", counting_fetch)
    return asked


def test_row_groups_kept_are_neither_fetched_nor_decoded_again(store, monkeypatch):
    # 40 files of one row group each, looked up twice by one reader. The first lookup
    # reads each file whole (one request a file: they are smaller than FIRST_READ_BYTES)
    # and decodes its row group: 40 read, none from memory. The second needs the same 40
    # row groups and finds them all kept: no request (on S3, no call to the API at all),
    # 40 from memory, nothing more read; the same entries.
    uri, options = store
    expected = _forty(uri, options)
    groups = sorted({group for _, group in expected.values()})
    paths = {p for ps in open_files(uri, options).bucket_files().values() for p in ps}
    asked = _counting_ranges(monkeypatch)
    s3_calls = count_s3_calls(monkeypatch) if options else []
    cache = JudgmentCache(uri, options)
    s3_calls.clear()  # the listing made when the cache is opened

    assert _texts(cache.lookup(groups)) == expected
    assert len(asked) == 40
    assert {path for path, _, _ in asked} == paths
    assert (cache.row_groups_read, cache.reader.row_group_hits) == (40, 0)
    if options:
        assert s3_calls == ["get_object"] * 40

    asked.clear()
    s3_calls.clear()
    assert _texts(cache.lookup(groups)) == expected
    assert asked == []
    assert s3_calls == []
    assert (cache.row_groups_read, cache.reader.row_group_hits) == (40, 40)


def test_consecutive_batches_in_bucket_order_fetch_the_file_between_them_once(
    tmp_path, monkeypatch
):
    # Rows ordered by cache bucket: batch one's groups fall in buckets 10, 11 and 12,
    # batch two's in 12, 13 and 14 (another group of bucket 12, in the same row group).
    # Batch two fetches the files of 13 and 14 only and takes bucket 12's row group from
    # memory; it finds what a fresh reader finds.
    uri = str(tmp_path / "cache")
    one = ["10" + "1" * 62, "11" + "1" * 62, "12" + "1" * 62]
    two = ["12" + "2" * 62, "13" + "2" * 62, "14" + "2" * 62]
    entries = [(f"k-{g[:3]}", f"reply {g[:3]}", g) for g in one + two]
    _write(uri, {}, entries, "run-1")
    files = open_files(uri, {}).bucket_files()
    assert sorted(files) == ["10", "11", "12", "13", "14"]
    assert all(len(paths) == 1 for paths in files.values())
    asked = _counting_ranges(monkeypatch)
    cache = JudgmentCache(uri, {})
    cache.lookup(one)
    asked.clear()

    found = cache.lookup(two)

    assert _texts(found) == {
        "k-122": ("reply 122", two[0]),
        "k-132": ("reply 132", two[1]),
        "k-142": ("reply 142", two[2]),
    }
    assert sorted(path for path, _, _ in asked) == sorted(files["13"] + files["14"])
    assert (cache.row_groups_read, cache.reader.row_group_hits) == (3 + 2, 1)
    assert _texts(JudgmentCache(uri, {}).lookup(two)) == _texts(found)


def _decoded_bytes(path: str) -> int:
    """Arrow buffer bytes of the one row group of bucket file ``path``, decoded with
    PyArrow from the file directly (the columns a lookup reads)."""
    parquet = pq.ParquetFile(path)
    assert parquet.metadata.num_row_groups == 1
    return parquet.read_row_group(
        0, columns=list(cache_store.LOOKUP_COLUMNS)
    ).get_total_buffer_size()


def test_the_row_groups_kept_stay_within_their_byte_bound(tmp_path, monkeypatch):
    # The bound is what the row groups of the last three of the 40 files take, decoded.
    # The reader looks up the first 37 groups at once, then the last three one at a
    # time: it keeps the latest within the bound, those three, and counts their bytes.
    # Looked up again, all 40 at once, those three come from memory and the other 37
    # are read again. With a bound of one byte, nothing is kept.
    uri = str(tmp_path / "cache")
    expected = _forty(uri, {})
    groups = [f"{i:02x}" + "0" * 62 for i in range(0, 80, 2)]
    by_bucket = open_files(uri, {}).bucket_files()
    paths = [by_bucket[g[:2]][0] for g in groups]
    sizes = [_decoded_bytes(p) for p in paths]
    monkeypatch.setattr(cache_store, "ROW_GROUP_CACHE_BYTES", sum(sizes[-3:]))
    cache = JudgmentCache(uri, {})
    reader = cache.reader

    found = cache.lookup(groups[:37])
    for group in groups[37:]:
        found.update(cache.lookup([group]))
    assert _texts(found) == expected
    assert [identity[0] for identity, _ in reader._row_groups] == paths[-3:]
    assert reader._row_groups.currsize == sum(sizes[-3:])
    assert _texts(cache.lookup(groups)) == expected
    assert (cache.row_groups_read, reader.row_group_hits) == (40 + 37, 3)
    assert reader._row_groups.currsize <= cache_store.ROW_GROUP_CACHE_BYTES

    monkeypatch.setattr(cache_store, "ROW_GROUP_CACHE_BYTES", 1)
    bare = JudgmentCache(uri, {})
    for _ in range(2):
        assert _texts(bare.lookup(groups)) == expected
    assert (bare.row_groups_read, bare.reader.row_group_hits) == (80, 0)
    assert (len(bare.reader._row_groups), bare.reader._row_groups.currsize) == (0, 0)


def _rewrite_in_place(files: CacheFiles, path: str, old: str, new: str) -> None:
    """Write bucket file ``path`` again at the same path, reply text ``old`` replaced by
    ``new`` (as long), with the writer's options: a file of the same size."""
    table = pq.read_table(files.fs.open(path, "rb"))
    texts = [new if t == old else t for t in table.column("text").to_pylist()]
    table = table.set_column(
        table.schema.get_field_index("text"), "text", pa.array(texts, pa.string())
    )
    local = files.fs.protocol in ("file", ("file", "local"))
    target = f"{path}.tmp" if local else path
    with files.fs.open(target, "wb") as handle:
        pq.write_table(
            table, handle, row_group_size=ROW_GROUP_ROWS, write_statistics=["group", "metric"]
        )
    if local:
        files.fs.mv(target, path)  # as the writer does: a new file under the old name


def test_a_file_written_again_in_place_is_read_afresh_once_listed_again(store, monkeypatch):
    # A reader looks a group up and keeps its file's footer, ranges and row group. The
    # file is then written again at the same path, with the same size and another
    # reply; another group is folded into a new file meanwhile. Listed again, the reader
    # reads the rewritten file from the store (its row group read again, none from
    # memory), finds the new reply, keeps nothing of the file it replaced, and finds the
    # new file's entry too.
    uri, options = store
    group = "a1" + "0" * 62
    later = "b2" + "0" * 62
    _write(uri, options, [("k", "old reply", group)], "run-1")
    files = open_files(uri, options)
    (path,) = files.bucket_files()["a1"]
    cache = JudgmentCache(uri, options)
    reader = cache.reader
    assert _texts(cache.lookup([group])) == {"k": ("old reply", group)}
    before = files.identity(path)

    _rewrite_in_place(files, path, "old reply", "new reply")
    _write(uri, options, [("k-later", "later reply", later)], "run-2")
    files.bucket_files()
    after = files.identity(path)
    assert after[:2] == before[:2] and after != before  # same path and size, another version
    asked = _counting_ranges(monkeypatch)
    reader.relist()

    assert _texts(cache.lookup([group, later])) == {
        "k": ("new reply", group),
        "k-later": ("later reply", later),
    }
    assert path in {p for p, _, _ in asked}
    assert (cache.row_groups_read, reader.row_group_hits) == (1 + 2, 0)
    kept = {identity for identity, _ in reader._row_groups} | set(reader._footers)
    assert before not in kept and after in kept


def test_a_lookup_whose_files_were_compacted_away_lists_again_and_finds_them(store):
    # Two runs fold into bucket a1 (two files); a reader opens and lists them. Another
    # process then compacts the cache, merging the two files into a new one and removing
    # them. The reader's lookup finds its listed files gone, lists once more and finds
    # both entries in the merged file (missed, they would be judged again). A reader
    # that had kept the row groups of the removed files serves them from memory, with
    # no listing. A lookup with nothing removed lists nothing.
    uri, options = store
    first, second = _two_runs_in_one_bucket(uri, options)
    before = open_files(uri, options).bucket_files()["a1"]
    assert len(before) == 2
    expected = {"k1": ("first reply", first), "k2": ("second reply", second)}
    fresh = JudgmentCache(uri, options)
    warm = JudgmentCache(uri, options)
    assert _texts(warm.lookup([first, second])) == expected

    compact(open_files(uri, options))
    (merged,) = open_files(uri, options).bucket_files()["a1"]
    assert merged not in before

    assert _texts(fresh.lookup([first, second])) == expected
    assert fresh.reader.relists == 1
    assert fresh.reader.by_bucket["a1"] == [merged]
    assert _texts(fresh.lookup([first])) == {"k1": ("first reply", first)}
    assert fresh.reader.relists == 1
    assert _texts(warm.lookup([first, second])) == expected
    assert (warm.reader.relists, warm.reader.row_group_hits) == (0, 2)


def test_a_failed_listing_after_a_compaction_leaves_misses_and_a_warning(tmp_path, caplog):
    # The files a reader listed are compacted away, and listing the cache again fails
    # (a stand-in fault: the reader's listing call is replaced by one that raises, as an
    # unreachable store would). The lookup does not fail: it warns, naming the cache and
    # the error, and finds nothing in the bucket whose files moved; a later lookup, once
    # the store answers again, lists again and finds both entries.
    uri, options = str(tmp_path / "cache"), {}
    first, second = _two_runs_in_one_bucket(uri, options)
    cache = JudgmentCache(uri, options)
    compact(open_files(uri, options))
    files = cache.reader.files
    listing = files.bucket_files

    def unreachable() -> dict:
        raise OSError("store unreachable (stand-in fault)")

    files.bucket_files = unreachable  # type: ignore[method-assign]
    with caplog.at_level("WARNING", logger="ragbatch.judge.cache_store"):
        assert cache.lookup([first, second]) == {}
    (record,) = [r for r in caplog.records if "listing the cache again failed" in r.message]
    assert "store unreachable (stand-in fault)" in record.message
    assert str(tmp_path / "cache") in record.message
    files.bucket_files = listing  # type: ignore[method-assign]
    assert _texts(cache.lookup([first, second])) == {
        "k1": ("first reply", first),
        "k2": ("second reply", second),
    }
    assert cache.reader.relists == 1


#: Seconds a held thread waits for the other before giving up (a hang fails the test).
HOLD_BOUND_S = 10.0


def test_two_lookups_that_list_again_at_once_both_find_their_entries(tmp_path):
    # Two batches in flight on one reader both find their listed files compacted away.
    # A fake forces the interleaving: the first listing is held while it walks what the
    # reader knows of the files (their sizes), until the second lookup has found its file
    # gone too. Listings are made one at a time, so the second waits for the first and
    # then lists again (it found its file gone after the first listing began). Both must
    # find their entries (before listings were made one at a time, the first failed: the
    # dictionary it walked changed size under it).
    uri = str(tmp_path / "cache")
    first, second = _two_runs_in_one_bucket(uri, {})
    cache = JudgmentCache(uri, {})
    compact(open_files(uri, {}))  # another process: both listed files are gone

    fs = cache.reader.files.fs
    real_find = fs.find
    held, released = threading.Event(), threading.Event()

    class Held(dict):
        """The first listing's result, holding its walker at the first membership test."""

        def __contains__(self, path):
            if not held.is_set():
                held.set()
                released.wait(HOLD_BOUND_S)
            return dict.__contains__(self, path)

    calls = []

    def find(*args, **kwargs):
        calls.append(1)
        found = real_find(*args, **kwargs)
        return Held(found) if len(calls) == 1 else found

    fs.find = find
    results: dict[str, object] = {}

    def one(name: str, group: str) -> None:
        try:
            results[name] = _texts(cache.lookup([group]))
        except Exception as exc:  # noqa: BLE001 - compared below
            results[name] = exc

    reader = cache.reader
    a = threading.Thread(target=one, args=("a", first))
    a.start()
    assert held.wait(HOLD_BOUND_S)
    b = threading.Thread(target=one, args=("b", second))
    try:
        b.start()
        # a found its file gone (moment 1) and began listing (2); b finds its file gone (3).
        deadline = time.monotonic() + HOLD_BOUND_S
        while reader._clock < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert reader._clock == 3
        assert reader.relists == 0  # the first listing is still held
    finally:
        released.set()
    a.join(HOLD_BOUND_S)
    b.join(HOLD_BOUND_S)
    assert results == {
        "a": {"k1": ("first reply", first)},
        "b": {"k2": ("second reply", second)},
    }
    assert reader.relists == 2 == len(calls)


def _hold_the_first_relist(reader) -> list:
    """Make the first lookup that lists again wait until a second one has come to its own
    listing (a fake forcing the interleaving; each then goes on to the real
    :meth:`BucketReader.relist`). Returns the moments they passed, as they arrive."""
    real_relist = reader.relist
    arrived: list = []
    both = threading.Event()

    def relist(after=None):
        arrived.append(after)
        if len(arrived) == 1:
            both.wait(HOLD_BOUND_S)  # the first waits for the second
        else:
            both.set()
        return real_relist(after=after)

    reader.relist = relist
    return arrived


def _two_lookups_at_once(cache, first: str, second: str) -> dict[str, object]:
    """``cache.lookup([first])`` and ``cache.lookup([second])`` on two threads at once:
    {"a": what the first found (key -> (text, group)), "b": the second's}, or the
    exception one raised."""
    results: dict[str, object] = {}

    def one(name: str, group: str) -> None:
        try:
            results[name] = _texts(cache.lookup([group]))
        except Exception as exc:  # noqa: BLE001 - compared by the caller
            results[name] = exc

    threads = [
        threading.Thread(target=one, args=("a", first)),
        threading.Thread(target=one, args=("b", second)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HOLD_BOUND_S)
    return results


def test_lookups_that_found_files_gone_before_a_listing_began_share_it(tmp_path):
    # Two batches in flight both find their listed files compacted away before either
    # lists again (a fake holds the first relist until the second lookup has come to its
    # own). The second lists; the first takes that listing instead of making another:
    # one listing for both, and both find their entries.
    uri = str(tmp_path / "cache")
    first, second = _two_runs_in_one_bucket(uri, {})
    cache = JudgmentCache(uri, {})
    compact(open_files(uri, {}))
    reader = cache.reader
    arrived = _hold_the_first_relist(reader)
    results = _two_lookups_at_once(cache, first, second)
    assert results == {
        "a": {"k1": ("first reply", first)},
        "b": {"k2": ("second reply", second)},
    }
    assert sorted(arrived) == [1, 2]
    assert reader.relists == 1
    # A lookup that finds a file gone after that listing began lists again.
    reader.relist(after=reader._tick())
    assert reader.relists == 2


def test_lookups_waiting_for_a_listing_that_fails_take_its_error(tmp_path, caplog):
    # As above, but the listing fails (a stand-in fault: the reader's listing call is
    # replaced by one that raises, as an unreachable store would). The lookup that waited
    # for it does not ask the store again: both warn and find nothing in the moved
    # bucket. Once the store answers, a later lookup lists and finds both entries.
    uri = str(tmp_path / "cache")
    first, second = _two_runs_in_one_bucket(uri, {})
    cache = JudgmentCache(uri, {})
    compact(open_files(uri, {}))
    reader = cache.reader
    listing = reader.files.bucket_files
    asked: list[int] = []

    def unreachable() -> dict:
        asked.append(1)
        raise OSError("store unreachable (stand-in fault)")

    reader.files.bucket_files = unreachable  # type: ignore[method-assign]
    _hold_the_first_relist(reader)
    with caplog.at_level("WARNING", logger="ragbatch.judge.cache_store"):
        results = _two_lookups_at_once(cache, first, second)
    assert results == {"a": {}, "b": {}}
    assert len(asked) == 1
    warnings = [r for r in caplog.records if "listing the cache again failed" in r.message]
    assert len(warnings) == 2
    assert all("store unreachable (stand-in fault)" in r.message for r in warnings)
    assert reader.relists == 0

    reader.files.bucket_files = listing  # type: ignore[method-assign]
    assert _texts(cache.lookup([first, second])) == {
        "k1": ("first reply", first),
        "k2": ("second reply", second),
    }
    assert reader.relists == 1


def test_a_listing_failing_as_s3fs_fails_after_a_compaction_leaves_misses(tmp_path, caplog):
    # As the failed-listing test above, with the error s3fs passes on when an endpoint
    # cannot be reached (botocore's EndpointConnectionError, not an OSError), made by a
    # real s3fs listing a closed port.
    s3fs = pytest.importorskip("s3fs")

    uri = str(tmp_path / "cache")
    first, second = _two_runs_in_one_bucket(uri, {})
    cache = JudgmentCache(uri, {})
    compact(open_files(uri, {}))
    closed = s3fs.S3FileSystem(
        key="k",
        secret="s",
        skip_instance_cache=True,
        client_kwargs={"endpoint_url": "http://127.0.0.1:9", "region_name": "us-east-1"},
        config_kwargs={"retries": {"max_attempts": 1}, "connect_timeout": 1},
    )
    unreachable = CacheFiles(closed, "bkt/cache").bucket_files
    cache.reader.files.bucket_files = unreachable  # type: ignore[method-assign]
    with caplog.at_level("WARNING", logger="ragbatch.judge.cache_store"):
        assert cache.lookup([first, second]) == {}
    assert any("listing the cache again failed" in r.message for r in caplog.records)


def test_a_lookup_that_lists_again_counts_each_row_group_it_needs_once(tmp_path):
    # Bucket a1 holds F1 (k1) and F3 (k3). Another process merges F1 alone into a new
    # file M (a compactor that listed before F3 was written) and removes F1. The lookup
    # finds F1 gone, lists again and reads M; F3, read in the first pass, is not read
    # again: row_groups_read + row_group_hits is what a reader opened now counts.
    uri = str(tmp_path / "cache")
    g1, g3 = "a1" + "0" * 62, "a1" + "f" * 62
    _write(uri, {}, [("k1", "r1", g1)], "run-1")
    _write(uri, {}, [("k3", "r3", g3)], "run-3")
    files = open_files(uri, {})
    (f1,) = [
        p
        for p in files.bucket_files()["a1"]
        if pq.read_table(p).column("key").to_pylist() == ["k1"]
    ]
    cache = JudgmentCache(uri, {})
    files.write(files.bucket_dir("a1"), pq.read_table(f1), ROW_GROUP_ROWS)
    _remove(files, f1)

    expected = {"k1": ("r1", g1), "k3": ("r3", g3)}
    assert _texts(cache.lookup([g1, g3])) == expected
    fresh = JudgmentCache(uri, {})
    assert _texts(fresh.lookup([g1, g3])) == expected
    reader = cache.reader
    assert reader.relists == 1
    assert reader.row_groups_read + reader.row_group_hits == fresh.reader.row_groups_read == 2
