"""The judgment cache off the event loop: a batch's lookup runs on a worker thread
(:meth:`JudgeRunner.run`), so several lookups may run at once on one cache while
the loop's thread answers requests from it.

Every test reads a real cache on local disk, written through the project's own writer
(:meth:`JudgmentCache.flush`, then :func:`fold_journal`). Two fakes stand in for what
cannot be made to happen on demand here, a lookup as slow as one on object storage and
the worst interleaving of threads; each says so in its docstring. The waits they hold
are bounded (:data:`HOLD_BOUND_S`) only so that code without the property under test
fails instead of hanging; no assertion is on time.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import threading
from typing import Any, Iterable, Sequence

import polars as pl
import pyarrow.parquet as pq

from ragbatch.judge import cache_store
from ragbatch.judge.batch import guarded_rows, judge_frame, with_issues
from ragbatch.judge.cache import JudgmentCache, group_key
from ragbatch.judge.cache_upkeep import fold_journal, open_files
from ragbatch.judge.protocol import Completion, EngineRequest, JudgeEngine, run_sync
from ragbatch.judge.run import JudgeRunner
from ragbatch.metrics.faithfulness import Faithfulness
from support.cache_rows import STATEMENTS, YES, city_rows as _frame, ok_reply as _ok

#: Longest a fake holds a thread waiting for what the test expects to happen meanwhile.
HOLD_BOUND_S = 10.0


class ShapedReplies(JudgeEngine):
    """Stand-in engine: a statements request gets one statement and a verdicts request
    one supported verdict, whatever the prompt, so a cell does not depend on which
    batch reaches the engine first."""

    model_id = "shaped-replies"
    max_model_len = 1_000_000

    async def complete(self, requests: Sequence[EngineRequest]) -> list[Completion]:
        out = []
        for request in requests:
            schema = request.output.json_schema
            fields = (json.loads(schema) if isinstance(schema, str) else schema or {}).get(
                "properties", {}
            )
            out.append(_ok(STATEMENTS if "statements" in fields else YES))
        return out

    def sampling_key(self) -> dict[str, Any]:
        return {"engine": "shaped-replies"}


class ShapedRepliesAsync(ShapedReplies):
    """:class:`ShapedReplies` whose ``complete`` first waits, off the
    loop, until ``lookup_held`` is set (at most :data:`HOLD_BOUND_S`), then is noted in
    ``events`` and sets ``answered``."""

    def __init__(
        self, events: list[str], lookup_held: threading.Event, answered: threading.Event
    ) -> None:
        self.events = events
        self.lookup_held = lookup_held
        self.answered = answered

    async def complete(self, requests: Sequence[EngineRequest]) -> list[Completion]:
        await asyncio.to_thread(self.lookup_held.wait, HOLD_BOUND_S)
        self.events.append("engine round")
        self.answered.set()
        return await super().complete(requests)


class HeldLookups:
    """Fake for a fault local disk cannot cause: a lookup as slow as one on a distant
    object store (over a second a batch). It wraps a cache's real reader; the lookup of
    exactly the ``held`` groups sets ``waiting`` and waits until ``release`` is set (at
    most :data:`HOLD_BOUND_S`), then reads as the reader does. ``released`` says whether
    the release came before the bound."""

    def __init__(self, reader: Any, held: set[str], events: list[str]) -> None:
        self.reader = reader
        self.held = held
        self.events = events
        self.waiting = threading.Event()
        self.release = threading.Event()
        self.released: bool | None = None

    @property
    def empty(self) -> bool:
        return self.reader.empty

    def lookup(self, groups: Iterable[str]) -> dict[str, Any]:
        groups = set(groups)
        if groups == self.held:
            self.events.append("held lookup waits")
            self.waiting.set()
            self.released = self.release.wait(HOLD_BOUND_S)
            self.events.append("held lookup resumes")
        return self.reader.lookup(groups)


def _judged_and_folded(uri: str, frame: pl.DataFrame) -> None:
    """Judge ``frame`` with faithfulness, write its replies and fold them into the
    cache's bucket files."""
    cache = JudgmentCache(uri, {})
    run_sync(
        judge_frame(
            JudgeRunner(ShapedReplies(), [Faithfulness.from_params({})], cache=cache), frame
        )
    )
    cache.flush()
    fold_journal(open_files(uri, {}), "run-1")


def _groups_of(engine: JudgeEngine, frame: pl.DataFrame) -> set[str]:
    """The judgment-cache groups of ``frame``'s rows, as a runner works them out."""
    _, todo = guarded_rows([Faithfulness.from_params({})], with_issues(frame))
    return {group_key(engine, row) for rows in todo.values() for _, row in rows}


def test_a_slow_lookup_does_not_hold_the_other_batches_on_the_event_loop(tmp_path):
    # Two batches in flight on one event loop, as in a judge actor. The first batch's
    # rows are all in the cache, and its lookup is held until the engine answers a
    # round; only the second batch's rows need the engine, whose rounds wait until the
    # first lookup is held. A lookup on the loop holds the loop, so no round can come
    # before it ends (the hold runs out its bound); a lookup on a worker thread leaves
    # the second batch free to reach the engine meanwhile. Either way the cells and
    # totals are those of the batches judged one after another.
    uri = str(tmp_path / "cache")
    first, second = _frame(3), _frame(3, start=3)
    _judged_and_folded(uri, first)
    one_at_a_time = JudgeRunner(
        ShapedReplies(), [Faithfulness.from_params({})], cache=JudgmentCache(uri, {})
    )
    expected = []
    for frame in (first, second):
        runner = one_at_a_time.fork()
        expected.append((run_sync(judge_frame(runner, frame)), runner.take_tallies()))

    events: list[str] = []
    cache = JudgmentCache(uri, {})
    held = HeldLookups(cache.reader, _groups_of(ShapedReplies(), first), events)
    cache.reader = held
    engine = ShapedRepliesAsync(events, held.waiting, held.release)
    runner = JudgeRunner(engine, [Faithfulness.from_params({})], cache=cache)

    async def batch(frame: pl.DataFrame) -> Any:
        mine = runner.fork()
        return await judge_frame(mine, frame), mine.take_tallies()

    async def both() -> list[Any]:
        return list(await asyncio.gather(batch(first), batch(second)))

    got = asyncio.run(both())
    assert events[:2] == ["held lookup waits", "engine round"]
    assert events.index("engine round") < events.index("held lookup resumes")
    assert held.released  # by the engine's round, not by the bound
    assert got == expected
    first_tallies, second_tallies = got[0][1]["faithfulness"], got[1][1]["faithfulness"]
    assert (first_tallies["cache_hits"], first_tallies["judge_calls"]) == (6, 0)
    assert (second_tallies["cache_hits"], second_tallies["judge_calls"]) == (0, 6)


BUCKETS = 24
FOLDS = 3


def _spread_cache(uri: str) -> list[str]:
    """A cache of :data:`BUCKETS` groups, one per bucket, written in :data:`FOLDS` runs:
    each bucket holds a file per run, with two keys of its group, and key ``dup`` of
    each group paid in every run (the first run's reply is the one read back). Returns
    the groups."""
    groups = [f"{b * 7:02x}" + "0" * 62 for b in range(BUCKETS)]
    for run in range(FOLDS):
        cache = JudgmentCache(uri, {})
        for g in groups:
            for k in range(2):
                cache.put(f"{g[:2]}-{run}-{k}", "m", "model", _ok(f"{g[:2]} {run} {k}"), g)
            cache.put(f"{g[:2]}-dup", "m", "model", _ok(f"{g[:2]} dup {run}"), g)
        cache.flush()
        fold_journal(open_files(uri, {}), f"run-{run}")
    return groups


def _plan(groups: list[str], callers: int, rounds: int) -> dict[tuple[int, int], list[str]]:
    """(caller, round) -> the groups it looks up: ten buckets' groups, overlapping other
    callers', plus a group of a bucket with files but not that group, and one of a
    bucket with no file."""
    absent = ["ff" + "1" * 62, groups[0][:2] + "f" * 62]
    return {
        (c, r): [groups[(c * 4 + r * 5 + k) % len(groups)] for k in range(10)] + absent
        for c in range(callers)
        for r in range(rounds)
    }


def _look_up_and_hit(cache: JudgmentCache, groups: list[str]) -> tuple[dict, int]:
    """What ``cache`` finds for ``groups``, and how many hits it noted from it."""
    found = cache.lookup(groups)
    hits = sum(cache.hit(key, entry) is not None for key, entry in found.items())
    return found, hits


def _flushed_touches(cache: JudgmentCache, uri: str) -> set[tuple[str, str]]:
    """(group, key) of the touches ``cache`` writes when it is flushed."""
    files = open_files(uri, {})
    before = set(files.journal_files())
    cache.flush()
    (written,) = set(files.journal_files()) - before
    table = files.read(written, ["group", "key", "text"])
    assert table is not None
    return {(r["group"], r["key"]) for r in table.to_pylist() if r["text"] is None}


def test_lookups_from_several_threads_find_what_serial_lookups_find(tmp_path, monkeypatch):
    # Six threads look up overlapping groups three times each on one shared cache, and
    # note their hits, while the reader keeps a few footers', group ranges' and decoded
    # row groups' worth only: they are dropped and read again throughout. Each lookup
    # finds what the same lookup finds when made alone, one after another; the row
    # groups needed (read from the store or taken from memory: which, depends on the
    # interleaving), the hits and the touches written are the same; the reader's bounds
    # still hold.
    uri = str(tmp_path / "cache")
    groups = _spread_cache(uri)
    paths = [p for ps in open_files(uri, {}).bucket_files().values() for p in ps]
    assert len(paths) == BUCKETS * FOLDS
    footer_bytes = max(len(pickle.dumps(pq.read_metadata(p))) for p in paths)
    monkeypatch.setattr(cache_store, "FOOTER_CACHE_BYTES", 4 * footer_bytes)
    monkeypatch.setattr(cache_store, "RANGE_CACHE_ROW_GROUPS", 6)
    row_group_bytes = max(
        pq.ParquetFile(p)
        .read_row_group(0, columns=list(cache_store.LOOKUP_COLUMNS))
        .get_total_buffer_size()
        for p in paths
    )
    monkeypatch.setattr(cache_store, "ROW_GROUP_CACHE_BYTES", 5 * row_group_bytes)
    callers, rounds = 6, 3
    plan = _plan(groups, callers, rounds)

    alone = JudgmentCache(uri, {})
    expected = {at: _look_up_and_hit(alone, asked) for at, asked in plan.items()}
    expected_row_groups = alone.row_groups_read + alone.reader.row_group_hits
    assert alone.reader.row_group_hits > 0  # some were taken from memory
    expected_touches = _flushed_touches(alone, uri)
    assert alone.reader.footers_read > len(paths)  # footers were dropped and read again
    assert sum(len(found) for found, _ in expected.values()) > 0

    shared = JudgmentCache(uri, {})
    got: dict[tuple[int, int], tuple[dict, int]] = {}
    start = threading.Barrier(callers)
    failures: list[BaseException] = []

    def caller(c: int) -> None:
        try:
            start.wait(HOLD_BOUND_S)
            for r in range(rounds):
                got[(c, r)] = _look_up_and_hit(shared, plan[(c, r)])
        except BaseException as exc:  # reported by the test thread below
            failures.append(exc)

    threads = [threading.Thread(target=caller, args=(c,)) for c in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert got == expected
    assert shared.row_groups_read + shared.reader.row_group_hits == expected_row_groups
    assert _flushed_touches(shared, uri) == expected_touches
    assert shared.reader.footers_read > len(paths)
    reader = shared.reader
    assert reader._footers.currsize == sum(map(len, reader._footers.values()))
    assert reader._footers.currsize <= cache_store.FOOTER_CACHE_BYTES
    assert reader._ranges.currsize == sum(len(lows) for lows, _ in reader._ranges.values())
    assert reader._ranges.currsize <= cache_store.RANGE_CACHE_ROW_GROUPS
    kept = [table.get_total_buffer_size() for table in reader._row_groups.values()]
    assert reader._row_groups.currsize == sum(kept)
    assert reader._row_groups.currsize <= cache_store.ROW_GROUP_CACHE_BYTES
    assert 0 < len(kept) <= 5


def test_lookups_started_at_once_share_one_pool_of_read_threads(tmp_path, monkeypatch):
    # Four threads make their first lookups on one reader at the same moment. They share
    # one pool of read threads (LOOKUP_THREADS in all), and find the same entries.
    uri = str(tmp_path / "cache")
    groups = _spread_cache(uri)
    expected = JudgmentCache(uri, {}).lookup(groups)
    callers = 4
    arrived = threading.Barrier(callers)
    made: list[Any] = []

    class CountedPool(cache_store.ThreadPoolExecutor):
        """Fake for an interleaving that cannot be forced otherwise: a pool made off the
        main thread (by a lookup) waits there until every looking-up thread has come to
        make one too (at most :data:`HOLD_BOUND_S`), the worst case of lookups started at
        once. Every pool made is counted."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if threading.current_thread() is not threading.main_thread():
                try:
                    arrived.wait(HOLD_BOUND_S)
                except threading.BrokenBarrierError:
                    pass
            made.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(cache_store, "ThreadPoolExecutor", CountedPool)
    cache = JudgmentCache(uri, {})
    got: list[dict] = []
    threads = [
        threading.Thread(target=lambda: got.append(cache.lookup(groups))) for _ in range(callers)
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for pool in made:
            pool.shutdown()
    assert got == [expected] * callers
    assert len(made) == 1
