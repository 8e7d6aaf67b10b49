"""Several judge batches in flight in one actor (:class:`udfs.judge.JudgeStage` with
``batches_in_flight`` above 1): the same cells and ledger totals as one batch at a
time, a batch failing with an engine fault that leaves the others alone, and a bug that
fails the run.

The engine is the fault-injecting stand-in below: its reply to a request is a function
of the request alone (a hash of its prompt), so the order in which interleaved batches
reach it cannot change a reply, and :class:`HashedRepliesAsync`'s ``complete`` yields to
the event loop a number of times that differs per call, so that the batches' rounds
interleave. The
same comparison on the real vLLM engine is in ``test_engine_vllm.py``.
"""

from __future__ import annotations

import asyncio
import threading
import hashlib
import json
import re
from typing import Any, Sequence

import pyarrow as pa
import pytest

import ragbatch.engines
from ragbatch.core.columns import cell_column, judge_column
from ragbatch.core.errors import EngineError, OutputError, StageBugError
from ragbatch.judge.protocol import Completion, EngineRequest, JudgeEngine, run_sync
from udfs.base import stage_options
from udfs.judge import JudgeStage, judge_stage_class

METRICS = ["faithfulness", "hate_speech"]


def _digest(request: EngineRequest) -> int:
    text = "\n".join(m.content for m in request.messages)
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


class HashedReplies(JudgeEngine):
    """Fault injector and stand-in: answers each request with a reply that depends only
    on its prompt; requests whose prompt holds ``poison`` make the engine raise an
    engine fault (:class:`EngineError`)."""

    model_id = "hashed-replies"
    max_model_len = 1_000_000

    def __init__(self) -> None:
        self.calls = 0
        self.in_flight = 0
        self.peak = 0

    async def complete(self, requests: Sequence[EngineRequest]) -> list[Completion]:
        self.calls += 1
        if any("poison" in m.content for r in requests for m in r.messages):
            raise EngineError("poisoned request")
        return [self._reply(r) for r in requests]

    def _reply(self, request: EngineRequest) -> Completion:
        h = _digest(request)
        schema = request.output.json_schema
        fields = (json.loads(schema) if isinstance(schema, str) else schema or {}).get(
            "properties", {}
        )
        if request.output.choice is not None:
            text = request.output.choice[h % len(request.output.choice)]
        elif "statements" in fields:
            text = json.dumps({"statements": [f"claim {h % 3}", f"claim {h % 5 + 3}"]})
        elif "verdict" in fields:
            text = json.dumps({"reason": "r", "verdict": h % 2 == 1})
        else:
            text = json.dumps(
                {"verdicts": [{"reason": "r", "verdict": (h >> k) % 2} for k in range(2)]}
            )
        return Completion(
            "ok", text=text, finish_reason="stop", prompt_tokens=h % 97 + 1, completion_tokens=3
        )

    def sampling_key(self) -> dict[str, Any]:
        return {"engine": "hashed-replies"}


class HashedRepliesAsync(HashedReplies):
    """:class:`HashedReplies` whose ``complete`` yields to the loop a number of times
    that depends on its requests, so concurrent calls interleave."""

    def __init__(self) -> None:
        super().__init__()
        self.batches_now: list[str] = []
        self.together: set[tuple[str, ...]] = set()

    async def complete(self, requests: Sequence[EngineRequest]) -> list[Completion]:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        # The batches whose calls are in the engine at once (rows are named b<k>r<i>).
        tag = re.search(r"\bb(\d+)r", requests[0].messages[-1].content).group(1)
        self.batches_now.append(tag)
        self.together.add(tuple(sorted(set(self.batches_now))))
        try:
            for _ in range(sum(_digest(r) % 4 for r in requests) + 1):
                await asyncio.sleep(0)
            return await super().complete(requests)
        finally:
            self.in_flight -= 1
            self.batches_now.remove(tag)


class Ledger:
    """Stand-in for the judge ledger's actor handle: ``record.remote`` stores the report."""

    def __init__(self) -> None:
        self.reports: dict[Any, dict[str, dict[str, int]]] = {}
        self.record = self

    def remote(self, engine, key, tallies, stats, actor_key):
        self.reports[key] = tallies
        return None


@pytest.fixture
def stage_of(monkeypatch):
    def make(cls, engine, in_flight=1):
        monkeypatch.setattr(ragbatch.engines, "load_judge_engine", lambda spec: engine)
        monkeypatch.setattr("ray.get", lambda ref: ref)
        spec = {"type": "vllm", "model": "/nonexistent", "batches_in_flight": in_flight}
        stage = cls(
            "judge",
            spec,
            [{"name": m, "id": m, "params": None} for m in METRICS],
            ledger=Ledger(),
        )
        return stage

    return make


def _batches(n_batches: int, rows: int = 3) -> list[pa.Table]:
    out = []
    for b in range(n_batches):
        ids = [f"b{b}r{i}" for i in range(rows)]
        out.append(
            pa.table(
                {
                    "row_id": ids,
                    "question": [f"What is {i}?" for i in ids],
                    "contexts": [[f"{i} is a thing.", "Other text."] for i in ids],
                    "answer": [
                        f"{i} is a thing, {'poison' if b == 1 and k == 0 else 'ok'}."
                        for k, i in enumerate(ids)
                    ],
                }
            )
        )
    return out


def _judged(table: pa.Table) -> list[Any]:
    names = [c for m in METRICS for c in (cell_column(m), judge_column(m))]
    return table.select(names).to_pylist()


def _totals(ledger: Ledger) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for tallies in ledger.reports.values():
        for metric, tally in tallies.items():
            into = out.setdefault(metric, {})
            for k, v in tally.items():
                into[k] = into.get(k, 0) + v
    return out


def test_batches_in_flight_give_the_cells_and_totals_of_one_batch_at_a_time(stage_of):
    batches = _batches(5)
    one = stage_of(JudgeStage, HashedReplies())
    expected = [_judged(run_sync(one(b))) for b in batches]

    engine = HashedRepliesAsync()
    many = stage_of(JudgeStage, engine, in_flight=3)

    async def run_all():
        return await asyncio.gather(*(many(b) for b in batches))

    got = [_judged(t) for t in asyncio.run(run_all())]
    assert got == expected
    assert engine.peak == 3  # three batches' rounds were in the engine at once
    assert many.ledger.reports == one.ledger.reports  # per batch, not only in sum
    totals = _totals(many.ledger)
    # 5 batches x 3 rows: faithfulness asks twice per row, hate_speech once. Batch 1's
    # first call (the 3 + 3 first asks of its rows) raises: each of its requests was
    # sent, so counts as a call, and the faithfulness programs end there.
    assert totals["faithfulness"]["judge_calls"] == 4 * 3 * 2 + 3
    assert totals["hate_speech"]["judge_calls"] == 15
    statuses = [row[cell_column(m)]["status"] for t in got for row in t for m in METRICS]
    assert statuses.count("ok") == 4 * 3 * 2 and statuses.count("judge_error") == 3 * 2
    assert many.batches == 5


def test_a_failing_call_fails_only_its_own_batch(stage_of):
    batches = _batches(3)
    many = stage_of(JudgeStage, HashedRepliesAsync(), in_flight=3)

    async def run_all():
        return await asyncio.gather(*(many(b) for b in batches))

    outs = asyncio.run(run_all())
    for b, out in enumerate(outs):
        statuses = {row[cell_column(m)]["status"] for row in out.to_pylist() for m in METRICS}
        # Batch 1 holds the poisoned request: every request of its engine calls fails.
        assert statuses == ({"judge_error"} if b == 1 else {"ok"})
    reason = outs[1].column(cell_column("hate_speech"))[0].as_py()["reason"]
    assert "EngineError: poisoned request" in reason


def test_a_batch_whose_scoring_raises_an_engine_fault_is_marked_error_alone(stage_of, monkeypatch):
    batches = _batches(3)
    many = stage_of(JudgeStage, HashedRepliesAsync(), in_flight=3)
    original = many._judge_batch

    async def score(runner, batch):
        if batch.column("row_id")[0].as_py() == "b2r0":
            raise EngineError("broken batch")
        return await original(runner, batch)

    monkeypatch.setattr(many, "_judge_batch", score)

    async def run_all():
        return await asyncio.gather(*(many(b) for b in batches))

    outs = asyncio.run(run_all())
    broken = [r[cell_column("faithfulness")] for r in outs[2].to_pylist()]
    assert {c["status"] for c in broken} == {"error"}
    assert "batch failed 2 times: EngineError: broken batch" in broken[0]["reason"]
    assert outs[0].column(cell_column("hate_speech"))[0].as_py()["status"] == "ok"


class RunLedger:
    """Stand-in for the run ledger's actor handle (``ray.get`` is patched away): batch
    ``lost_key``'s earlier start died with its actor."""

    def __init__(self, lost_key: str) -> None:
        self.lost_key = lost_key
        self.batch_started = self.batch_finished = self

    def remote(self, stage, key, actor, *finished):
        return 1 if key == self.lost_key and not finished else None


def test_a_batch_that_lost_an_actor_is_judged_alone(stage_of):
    from udfs.guard import batch_key

    batches = _batches(5)
    engine = HashedRepliesAsync()
    many = stage_of(JudgeStage, engine, in_flight=3)
    many.guard.ledger = RunLedger(batch_key(batches[2]))

    async def run_all():
        return await asyncio.gather(*(many(b) for b in batches))

    one = stage_of(JudgeStage, HashedReplies())
    expected = [_judged(run_sync(one(b))) for b in batches]
    assert [_judged(t) for t in asyncio.run(run_all())] == expected
    assert ("2",) in engine.together
    assert not any("2" in tags and len(tags) > 1 for tags in engine.together)
    assert any(len(tags) > 1 for tags in engine.together)  # the others still overlap


def test_output_errors_still_stop_the_run(stage_of, monkeypatch):
    many = stage_of(JudgeStage, HashedRepliesAsync(), in_flight=2)

    async def score(runner, batch):
        raise OutputError("cache unreadable")

    monkeypatch.setattr(many, "_judge_batch", score)
    with pytest.raises(OutputError, match="cache unreadable"):
        asyncio.run(many(_batches(1)[0]))


def test_a_bug_in_the_stage_fails_the_run_naming_the_stage(stage_of, monkeypatch):
    """Test-only fault injection: the stage's batch judging raises a TypeError, as a bug
    in ragbatch's own code would. No error cells: the call raises, once (no retry)."""
    many = stage_of(JudgeStage, HashedRepliesAsync(), in_flight=2)
    calls = []

    async def score(runner, batch):
        calls.append(batch.num_rows)
        raise TypeError("injected bug")

    monkeypatch.setattr(many, "_judge_batch", score)
    with pytest.raises(StageBugError) as caught:
        asyncio.run(many(_batches(1)[0]))
    message = str(caught.value)
    assert message.startswith(
        "stage judge:judge failed with a bug in ragbatch's own code: TypeError: injected bug"
    )
    assert "Traceback (most recent call last)" in message and "in score" in message
    assert calls == [3]


def test_stage_class_and_pool_options_follow_batches_in_flight():
    spec = {"type": "vllm", "model": "/m", "num_cpus": 1, "concurrency": 1}
    assert judge_stage_class(spec) is JudgeStage
    assert stage_options(spec)["compute"].max_concurrent_calls_per_actor is None
    spec["batches_in_flight"] = 4
    assert judge_stage_class(spec) is JudgeStage
    assert stage_options(spec)["compute"].max_concurrent_calls_per_actor == 4


@pytest.mark.release
def test_a_run_with_batches_in_flight_commits_what_one_at_a_time_commits(
    ray_local, smollm2_model, tmp_path
):
    """Through Ray Data: the async judge stage in an actor pool, four one-row batches
    three at a time, against the same job one batch at a time (lighter sibling in the
    default suite: the stage itself, in this process, on the tiny model, in
    tests/test_engine_vllm.py)."""
    import polars as pl

    from ragbatch.config.job import load_config
    from ragbatch.pipeline.runner import run_job
    from support.vllm_server import SMOLLM2_DTYPE
    from test_judge_e2e import REPO, _check, _tonic_rows

    config = load_config(REPO / "jobs" / "tonic_judge.yaml")
    config.input.uri = str(_tonic_rows(tmp_path, 4))
    data = config.model_dump(mode="json")
    data["metrics"] = [
        {"name": "hate_speech", "engine": "judge"},
        {"name": "answer_similarity", "engine": "judge"},
    ]
    tables = {}
    for in_flight in (1, 3):
        data["output"]["uri"] = str(tmp_path / f"out{in_flight}")
        data["engines"] = {
            "judge": {
                "kind": "vllm",
                "model": str(smollm2_model),
                "max_model_len": 8192,
                "num_gpus": 0,
                "concurrency": 1,
                "batch_size": 1,
                "batches_in_flight": in_flight,
                "max_tokens": 96,
                "dtype": SMOLLM2_DTYPE,
                "engine_kwargs": {"enforce_eager": True},
            }
        }
        result = run_job(type(config).from_dict(data), run_id=f"in-flight-{in_flight}")
        scores = _check(result, 4)
        tables[in_flight] = scores.select(
            "row_id", "metric", "status", "score", "judge_reply", "judge_calls", "cache_hits"
        ).sort("row_id", "metric")
    assert tables[3].equals(tables[1])
    assert tables[3].filter(pl.col("status") == "ok").height > 0


def test_the_cache_is_flushed_off_the_event_loop(stage_of, monkeypatch, tmp_path):
    """A batch's flush writes a journal file (an upload on object storage): it runs on a
    worker thread, not on the loop that steps the other batches in flight. The flush
    is the real one, on a real cache on disk; a spy notes its thread."""
    from ragbatch.judge.cache import JudgmentCache
    from ragbatch.judge.cache_upkeep import open_files

    flushed_on: list[int] = []
    real_flush = JudgmentCache.flush

    def spied(self):
        flushed_on.append(threading.get_ident())
        return real_flush(self)

    monkeypatch.setattr(JudgmentCache, "flush", spied)
    many = stage_of(JudgeStage, HashedRepliesAsync(), in_flight=2)
    many.cache = many.runner.cache = JudgmentCache(str(tmp_path / "cache"), {})

    async def run_all():
        loop_thread = threading.get_ident()
        await asyncio.gather(*(many(b) for b in _batches(2)))
        return loop_thread

    loop_thread = asyncio.run(run_all())
    assert len(flushed_on) == 2 and loop_thread not in flushed_on
    assert open_files(str(tmp_path / "cache"), {}).journal_files()  # the replies were written
