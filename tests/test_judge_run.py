"""The judge stage's driver: lockstep programs, dedup, cache, retries, failure statuses.

The engine here is :class:`RecordedReplies` (replies written down in the test) or, for
faults a real engine cannot be made to produce on demand (an engine that raises, a
timeout, a truncated reply), the fault-injecting engine below, named as such.
"""

from __future__ import annotations

from typing import Any, Sequence

import polars as pl
import pytest

from ragbatch.core.errors import EngineError

from ragbatch.judge.batch import judge_frame
from ragbatch.judge.cache import JudgmentCache, cache_key
from ragbatch.judge.cache_upkeep import fold_journal, open_files
from ragbatch.judge.parse import STATEMENTS_MAX_TOKENS
from ragbatch.judge.protocol import (
    Ask,
    Completion,
    EngineRequest,
    JudgeEngine,
    OutputSpec,
    run_sync,
)
from ragbatch.judge.recorded import RecordedReplies
from ragbatch.judge.run import REPLY_MAX_CHARS, JudgeRunner
from ragbatch.metrics.faithfulness import Faithfulness
from ragbatch.core.status import CONTEXT_TOO_LONG, JUDGE_ERROR, OK, PARSE_FAILURE, TIMEOUT

STATEMENTS = '{"statements": ["Paris is in France."]}'
YES = '{"verdicts": [{"reason": "stated", "verdict": 1}]}'
NO = '{"verdicts": [{"reason": "not stated", "verdict": 0}]}'


def _frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    schema = {
        "row_id": pl.String,
        "question": pl.String,
        "contexts": pl.List(pl.String),
        "answer": pl.String,
        "reference": pl.String,
    }
    return pl.DataFrame([{k: r.get(k) for k in schema} for r in rows], schema=schema)


def _row(i: int, answer: str = "Paris is in France.") -> dict[str, Any]:
    return {
        "row_id": f"r{i}",
        "question": "Where is Paris?",
        "contexts": ["Paris is in France."],
        "answer": answer,
    }


class FaultInjectingEngine(JudgeEngine):
    """Fault injector: answers every request with the completion ``make(request)``
    returns. Stands in for engine failures that cannot be caused on demand."""

    def __init__(self, make):
        self.model_id = "fault-injector"
        self.max_model_len = 4096
        self.make = make
        self.calls: list[int] = []

    async def complete(self, requests: Sequence[EngineRequest]) -> list[Completion]:
        self.calls.append(len(requests))
        return [self.make(r) for r in requests]

    def sampling_key(self) -> dict[str, Any]:
        return {"engine": "fault-injector"}


def test_two_step_program_runs_in_lockstep_batches():
    engine = RecordedReplies([STATEMENTS, STATEMENTS, STATEMENTS, YES, NO, YES])
    metric = Faithfulness.from_params({"prompt_layout": "instructions_first"})
    runner = JudgeRunner(engine, [metric])
    frame = _frame([_row(0), _row(1, "Paris is in Spain."), _row(2, "Paris!")])
    cells, records = run_sync(judge_frame(runner, frame))["faithfulness"]
    assert [c["score"] for c in cells] == [1.0, 0.0, 1.0]
    assert [r["judge_calls"] for r in records] == [2, 2, 2]
    # first step: the three statement asks; second step: the three verdict asks
    assert [len(r.messages) for r in engine.requests] == [2] * 6
    # one system message holds both steps' instructions; each ask names its set
    assert len({r.messages[0].content for r in engine.requests}) == 1
    assert "Break the answer" in engine.requests[0].messages[0].content
    assert '"faithfulness/statements"' in engine.requests[0].messages[1].content
    assert '"faithfulness/verdicts"' in engine.requests[3].messages[1].content


def test_identical_rows_share_one_call():
    engine = RecordedReplies([STATEMENTS, YES])
    runner = JudgeRunner(engine, [Faithfulness.from_params({})])
    cells, records = run_sync(judge_frame(runner, _frame([_row(0), _row(0)])))["faithfulness"]
    assert [c["score"] for c in cells] == [1.0, 1.0]
    assert [(r["judge_calls"], r["cache_hits"]) for r in records] == [(2, 0), (0, 2)]
    assert len(engine.requests) == 2 and engine.unused == 0
    assert runner.take_tallies()["faithfulness"]["judge_calls"] == 2


def test_guard_settled_rows_make_no_request():
    engine = RecordedReplies([])
    runner = JudgeRunner(engine, [Faithfulness.from_params({})])
    rows = [
        {"row_id": "a", "question": "q", "contexts": [], "answer": "x"},
        {"row_id": "b", "question": "q", "contexts": ["c"], "answer": "  "},
        {"row_id": "c", "question": None, "contexts": ["c"], "answer": "x"},
    ]
    cells, records = run_sync(judge_frame(runner, _frame(rows)))["faithfulness"]
    assert [c["status"] for c in cells] == ["missing_input"] * 3
    assert [c["reason"] for c in cells] == [
        "contexts is an empty list",
        "answer is empty",
        "question is null",
    ]
    assert all(r["judge_calls"] is None for r in records) and engine.requests == []


@pytest.mark.parametrize("status", [JUDGE_ERROR, TIMEOUT, CONTEXT_TOO_LONG])
def test_engine_failures_become_the_cell_status(status):
    engine = FaultInjectingEngine(lambda r: Completion(status, error=f"injected {status}"))
    runner = JudgeRunner(engine, [Faithfulness.from_params({})], parse_retries=3)
    cells, records = run_sync(judge_frame(runner, _frame([_row(0)])))["faithfulness"]
    assert cells[0]["status"] == status and cells[0]["score"] is None
    assert cells[0]["reason"] == f"statements: injected {status}"
    assert engine.calls == [1], "an engine failure is not a parse failure: no retry"
    # A refused request was not served: it is no judge call.
    assert records[0]["judge_calls"] == (0 if status == CONTEXT_TOO_LONG else 1)


def test_engine_that_raises_gives_judge_error_for_its_requests():
    def boom(request):
        raise EngineError("CUDA error: device lost")  # an adapter's backend failure

    runner = JudgeRunner(FaultInjectingEngine(boom), [Faithfulness.from_params({})])
    cells, _ = run_sync(judge_frame(runner, _frame([_row(0), _row(1, "Other.")])))["faithfulness"]
    assert [c["status"] for c in cells] == [JUDGE_ERROR, JUDGE_ERROR]
    assert "EngineError: CUDA error: device lost" in cells[0]["reason"]


def test_a_bug_raised_in_an_engine_call_is_not_turned_into_cells():
    def bug(request):
        raise AttributeError("'NoneType' object has no attribute 'messages'")

    runner = JudgeRunner(FaultInjectingEngine(bug), [Faithfulness.from_params({})])
    with pytest.raises(AttributeError, match="no attribute 'messages'"):
        run_sync(judge_frame(runner, _frame([_row(0)])))


def test_truncated_reply_is_retried_then_parse_failure_with_raw_reply_kept():
    engine = FaultInjectingEngine(
        lambda r: Completion(
            OK,
            text='{"statements": ["Par',
            finish_reason="length",
            prompt_tokens=10,
            completion_tokens=4,
        )
    )
    runner = JudgeRunner(engine, [Faithfulness.from_params({})], parse_retries=2)
    cells, records = run_sync(judge_frame(runner, _frame([_row(0)])))["faithfulness"]
    assert cells[0]["status"] == PARSE_FAILURE
    assert cells[0]["reason"] == f"statements: reply cut at max_tokens ({STATEMENTS_MAX_TOKENS})"
    assert engine.calls == [1, 1, 1]
    assert records[0]["judge_reply"] == (
        '["{\\"statements\\": [\\"Par", "{\\"statements\\": [\\"Par", "{\\"statements\\": [\\"Par"]'
    )
    assert records[0]["prompt_tokens"] == 30 and records[0]["judge_calls"] == 3


def test_retry_uses_a_new_seed():
    engine = RecordedReplies(["not json", STATEMENTS, YES])
    runner = JudgeRunner(engine, [Faithfulness.from_params({})], parse_retries=1, seed=7)
    cells, _ = run_sync(judge_frame(runner, _frame([_row(0)])))["faithfulness"]
    assert cells[0]["status"] == OK
    assert [r.seed for r in engine.requests] == [7, 8, 7]


def test_long_replies_are_truncated_in_the_record():
    long = '{"statements": [' + ", ".join(['"' + "x" * 300 + '"'] * 20) + "]}"
    engine = RecordedReplies(
        [long, '{"verdicts": [' + ", ".join(['{"reason": "r", "verdict": 1}'] * 20) + "]}"]
    )
    runner = JudgeRunner(engine, [Faithfulness.from_params({})])
    _, records = run_sync(judge_frame(runner, _frame([_row(0)])))["faithfulness"]
    assert records[0]["judge_reply"].endswith("…[truncated]")
    assert len(records[0]["judge_reply"]) == REPLY_MAX_CHARS + len("…[truncated]")


def test_cache_round_trip_and_second_run_makes_no_call(tmp_path):
    uri = str(tmp_path / "cache")
    metric = Faithfulness.from_params({})
    first = RecordedReplies([STATEMENTS, YES])
    cache = JudgmentCache(uri, {}, ["faithfulness"])
    runner = JudgeRunner(first, [metric], cache=cache)
    cells1, _ = run_sync(judge_frame(runner, _frame([_row(0)])))["faithfulness"]
    assert cache.flush() == 2
    assert len(list((tmp_path / "cache" / "v2" / "journal").glob("part-*.parquet"))) == 1
    fold_journal(open_files(uri, {}), "run-1")  # what a run's commit does
    assert not list((tmp_path / "cache" / "v2" / "journal").glob("part-*.parquet"))

    second = RecordedReplies([])
    runner = JudgeRunner(second, [metric], cache=JudgmentCache(uri, {}, ["faithfulness"]))
    second.model_id = first.model_id
    cells2, records2 = run_sync(judge_frame(runner, _frame([_row(0)])))["faithfulness"]
    assert cells2 == cells1 and second.requests == []
    assert records2[0]["cache_hits"] == 2 and records2[0]["judge_calls"] == 0


def test_cache_key_covers_model_sampling_seed_prompt_output_and_metric():
    engine = RecordedReplies([])
    ask = Ask((), OutputSpec.of_choice(["0", "1"]), parse=str)
    base = cache_key(engine, {"metric": "m", "version": 1, "params": {}}, ask, 0)
    assert cache_key(engine, {"metric": "m", "version": 1, "params": {}}, ask, 0) == base
    assert cache_key(engine, {"metric": "m", "version": 2, "params": {}}, ask, 0) != base
    assert cache_key(engine, {"metric": "m", "version": 1, "params": {"n": 1}}, ask, 0) != base
    assert cache_key(engine, {"metric": "m", "version": 1, "params": {}}, ask, 1) != base
    other = Ask((), OutputSpec.of_choice(["0", "1", "2"]), parse=str)
    assert cache_key(engine, {"metric": "m", "version": 1, "params": {}}, other, 0) != base
    engine.model_id = "another-model"
    assert cache_key(engine, {"metric": "m", "version": 1, "params": {}}, ask, 0) != base


def test_cache_in_memory_filesystem():
    uri = "memory://judge-cache-test"
    cache = JudgmentCache(uri, {}, ["faithfulness"])
    group = "ab" + "0" * 62
    ok = Completion(OK, text="t", finish_reason="stop", prompt_tokens=3, completion_tokens=1)
    cache.put("k1", "faithfulness", "m", ok, group)
    cache.put("k2", "faithfulness", "m", Completion(JUDGE_ERROR, error="x"), group)
    assert cache.flush() == 1
    fold_journal(open_files(uri, {}), "run-1")
    again = JudgmentCache(uri, {}, ["faithfulness"])
    assert not again.empty and again.get("k1") is None  # not yet looked up
    assert again.prefetch([group]) == 1
    assert again.get("k1").text == "t" and again.get("k2") is None
