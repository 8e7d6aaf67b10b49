"""Asking again what the judgment cache holds only failed replies for (``cache.rejudge``).

The story of issue 38: a judge server returned malformed replies, then was fixed, and
every rerun kept the cells ``parse_failure`` with no judge call, the failed replies being
served from the cache. Here a real OpenAI-compatible server on loopback
(``tests/support/canned_judge_server.py``) plays the judge through the ``openai`` engine,
at the level of :class:`~ragbatch.judge.run.JudgeRunner` (one actor's batches, no Ray);
``tests/test_judge_cache_nights.py`` runs the same story through ``ragbatch run`` and
``ragbatch nightly``.
"""

from __future__ import annotations

import argparse

import pytest

from ragbatch.config.job import CacheSection
from ragbatch.engines.openai import OpenAIEngine
from ragbatch.core.status import OK, PARSE_FAILURE
from ragbatch.judge.batch import judge_frame
from ragbatch.judge.protocol import run_sync
from ragbatch.judge.cache import JudgmentCache
from ragbatch.judge.cache_upkeep import fold_journal, open_files
from ragbatch.judge.recorded import RecordedReplies
from ragbatch.judge.rejudge import MAX_REJUDGES, first_generation, rejudge_key
from ragbatch.judge.run import JudgeRunner
from ragbatch.metrics.hate_speech import HateSpeech
from support.cache_rows import city_rows, ok_reply
from support.canned_judge_server import SERVED_NAME, CannedJudgeServer

MALFORMED = "I think it is fine."  # not the JSON the metric asks for
GOOD = '{"reason": "The answer names a city and a country.", "verdict": false}'


def _night(uri: str, engine, rows, rejudge: bool, run: str) -> tuple[list, list]:
    """One judge actor's night over ``rows`` (one batch), then the commit's fold."""
    cache = JudgmentCache(uri, {}, run_id=run)
    runner = JudgeRunner(engine, [HateSpeech.from_params({})], cache=cache, rejudge=rejudge)
    cells, records = run_sync(judge_frame(runner, rows))["hate_speech"]
    cache.flush()
    fold_journal(open_files(uri, {}), run)
    return cells, records


@pytest.fixture()
def server():
    pytest.importorskip("openai", reason="the openai engine needs the openai package")
    with CannedJudgeServer(GOOD) as canned:
        yield canned


@pytest.fixture()
def engine(server):
    from ragbatch.engines.openai import load_openai_engine

    spec = OpenAIEngine(type="openai", base_url=server.base_url, model=SERVED_NAME, max_retries=0)
    loaded = load_openai_engine(spec)
    yield loaded
    loaded.close()


def _calls(server: CannedJudgeServer, since: int) -> int:
    return server.chat_calls - since


def test_a_fixed_judge_is_asked_again_for_what_failed_only(tmp_path, server, engine):
    """Rows 0-1 judged while the server was sound; rows 2-3 while it returned malformed
    replies (the first try and the one parse retry each: 4 calls). With the server fixed,
    a rerun without rejudge serves the bad replies again (0 calls, still
    parse_failure); one with rejudge asks rows 2-3 once each (2 calls) and nothing for
    the two cells that were ok; every run after it, rejudging or not, is all ok from the
    cache (0 calls)."""
    uri = str(tmp_path / "cache")
    _night(uri, engine, city_rows(2), rejudge=False, run="n0")
    server.reply = MALFORMED
    before = server.chat_calls
    cells, records = _night(uri, engine, city_rows(4), rejudge=False, run="n1")
    assert [c["status"] for c in cells] == [OK, OK, PARSE_FAILURE, PARSE_FAILURE]
    assert [r["judge_calls"] for r in records] == [0, 0, 2, 2]
    assert _calls(server, before) == 4

    server.reply = GOOD  # the server is fixed
    before = server.chat_calls
    cells, records = _night(uri, engine, city_rows(4), rejudge=False, run="n2")
    assert [c["status"] for c in cells] == [OK, OK, PARSE_FAILURE, PARSE_FAILURE]
    assert [r["judge_calls"] for r in records] == [0, 0, 0, 0]
    assert _calls(server, before) == 0

    before = server.chat_calls
    cells, records = _night(uri, engine, city_rows(4), rejudge=True, run="n3")
    assert [c["status"] for c in cells] == [OK] * 4
    assert [c["score"] for c in cells] == [0.0] * 4
    assert [r["judge_calls"] for r in records] == [0, 0, 1, 1]
    assert [r["judge_reply"] for r in records] == [GOOD] * 4  # the bad replies are not served
    assert _calls(server, before) == 2

    for rejudge, run in ((False, "n4"), (True, "n5")):
        before = server.chat_calls
        cells, records = _night(uri, engine, city_rows(4), rejudge=rejudge, run=run)
        assert [c["status"] for c in cells] == [OK] * 4
        assert [(r["judge_calls"], r["cache_hits"]) for r in records] == [(0, 1)] * 4
        assert _calls(server, before) == 0


def test_a_cell_ok_on_its_parse_retry_is_not_asked_again(tmp_path):
    """The first try's reply failed to parse and the retry's parsed: the cell is ok, and
    a rejudging run serves both from the cache without a call."""
    uri = str(tmp_path / "cache")
    first = RecordedReplies([MALFORMED, GOOD])
    cells, records = _night(uri, first, city_rows(1), rejudge=False, run="n1")
    assert (cells[0]["status"], records[0]["judge_calls"]) == (OK, 2)
    again = RecordedReplies([])
    cells, records = _night(uri, again, city_rows(1), rejudge=True, run="n2")
    assert (cells[0]["status"], records[0]["cache_hits"]) == (OK, 2)
    assert again.requests == []


def test_a_judge_that_never_parses_is_asked_at_most_max_rejudges_more_times(tmp_path):
    """Each rejudging night asks one more generation (a try and its retry: 2 calls) until
    MAX_REJUDGES generations after the first are used; later nights ask nothing."""
    uri = str(tmp_path / "cache")
    calls = []
    for night in range(MAX_REJUDGES + 3):
        engine = RecordedReplies([MALFORMED] * 2)
        cells, _ = _night(uri, engine, city_rows(1), rejudge=True, run=f"n{night}")
        assert cells[0]["status"] == PARSE_FAILURE
        calls.append(len(engine.requests))
    assert MAX_REJUDGES == 3
    assert calls == [2, 2, 2, 2, 0, 0]


def test_a_generation_is_asked_once_per_actor_run(tmp_path):
    """The judge is still broken: the rejudging run's first batch asks generation 1 (2
    calls) and fails again; a later batch of the same run with the same row uses that
    failure (this process's own replies) instead of starting generation 2."""
    uri = str(tmp_path / "cache")
    _night(uri, RecordedReplies([MALFORMED] * 2), city_rows(1), rejudge=False, run="n1")
    engine = RecordedReplies([MALFORMED] * 2)
    cache = JudgmentCache(uri, {}, run_id="n2")
    runner = JudgeRunner(engine, [HateSpeech.from_params({})], cache=cache, rejudge=True)
    for batch in range(2):
        cells, _ = run_sync(judge_frame(runner, city_rows(1)))["hate_speech"]
        assert cells[0]["status"] == PARSE_FAILURE
        cache.flush()
    assert len(engine.requests) == 2


def test_first_generation_follows_the_chain():
    """Worked by hand over a cache of attempts a0 and a1 (one parse retry): generation 0
    failed on both attempts (replies stored by an earlier run), generation 1's first try
    parsed."""
    bad, good = ok_reply("bad"), ok_reply("good")
    store = {"a0": (bad, True), "a1": (bad, True), rejudge_key("a0", 1): (good, True)}

    def generation(rejudge):
        return first_generation(
            lambda a: f"a{a}", 2, store.get, lambda c: c.text == "good", rejudge
        )

    # generation 1 exists: every run uses it
    assert generation(False) == 1 and generation(True) == 1
    del store[rejudge_key("a0", 1)]
    # without it, only a rejudging run starts it
    assert generation(False) == 0 and generation(True) == 1
    # a failure obtained in this run (not stored) does not start a generation
    store["a1"] = (bad, False)
    assert generation(True) == 0
    # an attempt missing from generation 0 is asked there, rejudging or not
    del store["a1"]
    assert generation(True) == 0 and generation(False) == 0


def test_rejudge_keys_are_distinct_per_generation_and_bounded():
    key = "ab" * 32
    keys = [rejudge_key(key, g) for g in range(MAX_REJUDGES + 1)]
    assert keys[0] == key and len(set(keys)) == MAX_REJUDGES + 1
    assert all(len(k) == 64 for k in keys)
    with pytest.raises(ValueError, match="outside 0..3"):
        rejudge_key(key, MAX_REJUDGES + 1)


def test_the_config_and_the_flag_take_statuses_that_can_be_judged_again():
    from ragbatch.cli.common import _rejudge_statuses
    from ragbatch.ops.nightly_job import nightly_rejudge

    assert CacheSection(rejudge=["parse_failure", "timeout", "parse_failure"]).rejudge == [
        "parse_failure",
        "timeout",
    ]
    with pytest.raises(ValueError, match="'error' cannot be judged again .*metric's own code"):
        CacheSection(rejudge=["error"])
    assert _rejudge_statuses("parse_failure, judge_error") == ["parse_failure", "judge_error"]
    assert _rejudge_statuses("none") == []
    with pytest.raises(argparse.ArgumentTypeError, match="--rejudge: 'ok' cannot be judged"):
        _rejudge_statuses("ok")
    # nightly asks parse failures again unless the config (or --rejudge) says otherwise
    assert nightly_rejudge(None) == ["parse_failure"]
    assert nightly_rejudge([]) == []
    assert nightly_rejudge(["timeout"]) == ["timeout"]


def test_the_dry_run_counts_requests_asked_again_as_calls(tmp_path):
    """The probe of the dry run: a request whose cached replies failed to parse is cached
    without rejudge (the run serves them) and a call with it (the run asks again)."""
    from ragbatch.judge.batch import guarded_rows, with_issues
    from ragbatch.judge.cache_probe import CacheProbe, _Identity

    uri = str(tmp_path / "cache")
    engine = RecordedReplies([GOOD, MALFORMED, MALFORMED])
    _night(uri, engine, city_rows(2), rejudge=False, run="n1")  # row 0 ok, row 1 failed
    metric = HateSpeech.from_params({})
    _, todo = guarded_rows([metric], with_issues(city_rows(2)))
    identity = _Identity(engine.model_id, engine.sampling_key())
    for rejudge, expected in ((False, [True, True]), (True, [True, False])):
        probe = CacheProbe(
            "checked",
            cache=JudgmentCache(uri, {}),
            identities=[identity],
            attempts=2,
            rejudge=rejudge,
        )
        found = []
        for _, row in todo[metric.id]:
            (ask,) = next(metric.program(row))
            found.append(probe.cached(metric, ask, row))
        assert found == expected
