"""The ``openai`` engine under a provider's rate limit (issue 38, item 6).

The concurrency limit on its own (:class:`~ragbatch.engines.openai_limits.AimdLimit`:
sequences of successes, 429s and reply times against limits worked out by hand), the
gate that applies it, then the engine against a real HTTP server on loopback that admits
chat requests at a fixed rate (``tests/support/canned_judge_server.py``, a token bucket
answering 429 with ``Retry-After``), and one ``ragbatch run`` through Ray against it.

The only timed assertion is the issue's acceptance condition: the share of the allowed
requests a run used, measured from the server's own log of admitted requests.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml

from ragbatch.engines.openai import OpenAIEngine
from ragbatch.engines.openai_limits import AimdLimit, SendGate
from support.canned_judge_server import (
    SERVED_NAME,
    CannedJudgeProcess,
    CannedJudgeServer,
    TokenBucket,
    admitted_share,
)
from support.degenerate_judge import ares_tsv_input
from udfs.judge import combine_engine_stats

# ------------------------------------------------------------ the limit alone


def _succeed(limit: AimdLimit, n: int, epoch: int | None = None, latency_s: float = 0.1):
    for _ in range(n):
        limit.on_success(limit.epoch if epoch is None else epoch, latency_s)


def test_slow_start_then_a_decrease_then_one_more_per_window():
    limit = AimdLimit(ceiling=8)
    assert limit.slots == 1
    _succeed(limit, 3)  # slow start: +1 per success
    assert limit.slots == 4 and limit.epoch == 0
    limit.on_rate_limit(0, now=10.0, retry_after=None)  # 4 * 0.7 = 2.8
    assert (limit.limit, limit.slots, limit.epoch) == (pytest.approx(2.8), 2, 1)
    limit.on_rate_limit(0, now=10.0, retry_after=None)  # sent before the decrease: no news
    _succeed(limit, 5, epoch=0)  # nor do its successes count
    assert limit.slots == 2
    _succeed(limit, 1)
    assert limit.slots == 2  # one of a window of 2
    _succeed(limit, 1)
    assert (limit.limit, limit.slots) == (pytest.approx(3.8), 3)  # the window is full: +1
    _succeed(limit, 3)  # a window of 3
    assert (limit.limit, limit.slots) == (pytest.approx(4.8), 4)
    assert list(limit.changes) == [
        ("increase", 2),
        ("increase", 3),
        ("increase", 4),
        ("decrease", 2),
        ("increase", 3),
        ("increase", 4),
    ]
    assert limit.stats() == {
        "rate_limited": 2,
        "concurrency": 4,
        "concurrency_max": 4,
        "concurrency_min": 2,
        "concurrency_decreases": 1,
        "latency_decreases": 0,
        "retry_after_paused_s": 0.0,
    }


def test_halving_keeps_the_fraction_and_stops_at_the_floor():
    limit = AimdLimit(ceiling=8, decrease=0.5)  # RFC 5681's factor: exact by hand
    _succeed(limit, 2)  # 1 -> 2 -> 3
    limit.on_rate_limit(0, 0.0, None)
    assert (limit.limit, limit.slots) == (1.5, 1)
    _succeed(limit, 1)  # a window of 1 slot
    assert (limit.limit, limit.slots) == (2.5, 2)
    limit.on_rate_limit(1, 0.0, None)
    assert (limit.limit, limit.slots) == (1.25, 1)
    limit.on_rate_limit(2, 0.0, None)  # 0.625 is below the floor
    assert (limit.limit, limit.slots, limit.epoch) == (1.0, 1, 3)
    stats = limit.stats()
    # 3 -> 1 and 2 -> 1 lowered the slots; 1 -> 1 did not
    assert stats["concurrency_decreases"] == 2 and stats["concurrency_min"] == 1
    assert stats["concurrency_max"] == 3 and stats["rate_limited"] == 3


def test_floor_is_the_start_and_the_ceiling_caps():
    limit = AimdLimit(ceiling=3, floor=2)
    assert limit.slots == 2
    _succeed(limit, 4)
    assert limit.slots == 3 and list(limit.changes) == [("increase", 3)]
    limit.on_rate_limit(0, 0.0, None)  # 3 * 0.7
    assert (limit.limit, limit.slots) == (pytest.approx(2.1), 2)
    limit.on_rate_limit(1, 0.0, None)  # 1.47 is below the floor
    assert (limit.limit, limit.slots) == (2.0, 2)


def test_without_a_decrease_min_is_the_current_slots():
    limit = AimdLimit(ceiling=8)
    _succeed(limit, 2)
    stats = limit.stats()
    assert (stats["concurrency"], stats["concurrency_min"], stats["concurrency_max"]) == (3, 3, 3)


def test_retry_after_pauses_are_merged():
    limit = AimdLimit(ceiling=8)
    limit.on_rate_limit(0, now=100.0, retry_after=2.0)
    assert limit.paused_until == 102.0 and limit.pause_left(101.0) == 1.0
    limit.on_rate_limit(1, now=101.0, retry_after=0.5)  # ends within the pause
    assert limit.paused_until == 102.0
    limit.on_rate_limit(2, now=101.5, retry_after=1.5)  # extends it by 1 s
    assert limit.paused_until == 103.0 and limit.pause_left(104.0) == 0.0
    limit.on_rate_limit(3, now=110.0, retry_after=1.0)  # a new pause
    assert limit.stats()["retry_after_paused_s"] == 4.0


def test_latency_backoff_counts_a_slow_reply_as_a_rate_limit():
    limit = AimdLimit(ceiling=8, latency_backoff=3.0)
    limit.on_success(0, 0.1)  # -> 2
    limit.on_success(0, 0.2)  # -> 3 (0.2 is within 3 x 0.1)
    limit.on_success(0, 0.35)  # over 0.3: 3 * 0.7 = 2.1
    assert (limit.slots, limit.epoch, limit.paused_until) == (2, 1, 0.0)
    limit.on_success(1, 0.25)  # within 0.3: one of a window of 2
    limit.on_success(1, 0.25)  # -> 3.1
    assert limit.slots == 3
    stats = limit.stats()
    assert stats["latency_decreases"] == 1 and stats["rate_limited"] == 0


def test_send_interval_paces_a_window_over_the_smoothed_reply_time():
    limit = AimdLimit(ceiling=8)
    assert limit.send_interval() == 0.0  # no reply time yet
    limit.on_success(0, 0.4)  # srtt 0.4, 2 slots, slow start
    assert limit.send_interval() == pytest.approx(0.4 / (2 * 2.0))
    limit.on_success(0, 0.8)  # srtt 0.4 + (0.8 - 0.4) / 8 = 0.45, 3 slots
    assert limit.srtt == pytest.approx(0.45)
    assert limit.send_interval() == pytest.approx(0.45 / (3 * 2.0))
    limit.on_rate_limit(0, 0.0, None)  # 2.1: 2 slots, after slow start
    assert limit.send_interval() == pytest.approx(0.45 / (2 * 1.2))


def test_fixed_limit_counts_but_never_moves_or_pauses():
    limit = AimdLimit(ceiling=4, adaptive=False)
    limit.on_rate_limit(0, now=5.0, retry_after=3.0)
    _succeed(limit, 10)
    assert (limit.slots, limit.paused_until, limit.send_interval()) == (4, 0.0, 0.0)
    assert limit.stats()["rate_limited"] == 1 and list(limit.changes) == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ceiling": 0},
        {"ceiling": 4, "floor": 0},
        {"ceiling": 4, "floor": 5},
        {"ceiling": 4, "latency_backoff": 1.0},
        {"ceiling": 4, "decrease": 1.0},
    ],
)
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        AimdLimit(**kwargs)


def test_config_refuses_a_floor_above_the_ceiling():
    with pytest.raises(ValueError, match="min_concurrency 4 exceeds max_concurrency 2"):
        OpenAIEngine(
            type="openai", base_url="http://x/v1", model="m", max_concurrency=2, min_concurrency=4
        )


def test_admitted_share_by_hand():
    # 11 admitted over 2 s at 4/s with a bucket of 2: 11 / (2 + 4 * 2)
    assert admitted_share([0.5 + 0.2 * i for i in range(11)], 4.0, 2) == pytest.approx(1.1)
    with pytest.raises(ValueError):
        admitted_share([1.0], 4.0, 2)


def test_token_bucket_by_hand():
    now = [0.0]
    bucket = TokenBucket(rate_per_s=10.0, burst=2, clock=lambda: now[0])
    assert bucket.take() == 0.0 and bucket.take() == 0.0  # the burst
    assert bucket.take() == pytest.approx(0.1)  # empty: one token in 0.1 s
    now[0] = 0.05
    assert bucket.take() == pytest.approx(0.05)
    now[0] = 0.1
    assert bucket.take() == 0.0


def test_engine_counters_combine_over_actors():
    per_actor = [
        {"attempts": 3, "concurrency": 4, "concurrency_max": 4, "concurrency_min": 2},
        {"attempts": 5, "concurrency": 2, "concurrency_max": 8, "concurrency_min": 1},
        {"attempts": 1, "token_counter": "none"},
    ]
    assert combine_engine_stats(per_actor) == {
        "attempts": 9,
        "concurrency": 6,
        "concurrency_max": 8,
        "concurrency_min": 1,
    }


# ------------------------------------------------------------------ the gate


def test_gate_serves_retries_first_and_frees_cancelled_slots():
    async def scenario():
        gate = SendGate(AimdLimit(ceiling=2, floor=2))
        order: list[str] = []

        async def take(name: str, retry: bool = False):
            await gate.acquire(retry=retry)
            order.append(name)

        a, b = asyncio.ensure_future(take("a")), asyncio.ensure_future(take("b"))
        await asyncio.sleep(0)
        assert gate.in_flight == 2 and order == ["a", "b"]
        waiting = [
            asyncio.ensure_future(take("c")),
            asyncio.ensure_future(take("gone")),
            asyncio.ensure_future(take("r", retry=True)),
        ]
        await asyncio.sleep(0)
        waiting[1].cancel()  # leaves the queue without taking a slot
        gate.release()
        await asyncio.sleep(0)
        assert order == ["a", "b", "r"]  # the retry goes first
        gate.release()
        await asyncio.sleep(0)
        assert order == ["a", "b", "r", "c"] and gate.in_flight == 2
        await asyncio.gather(a, b, waiting[0], waiting[2])
        assert waiting[1].cancelled()

    asyncio.run(scenario())


def test_gate_holds_sends_while_paused():
    async def scenario():
        limit = AimdLimit(ceiling=4, floor=4)
        gate = SendGate(limit)
        limit.on_rate_limit(0, asyncio.get_running_loop().time(), retry_after=0.05)
        task = asyncio.ensure_future(gate.acquire())
        await asyncio.sleep(0)
        assert not task.done() and gate.in_flight == 0
        await asyncio.wait_for(task, timeout=10)  # granted once the pause is over
        assert gate.in_flight == 1

    asyncio.run(scenario())


# -------------------------------------------- the engine against a real server

pytest.importorskip("openai", reason="the openai engine needs the openai package")

from ragbatch.engines.openai import load_openai_engine  # noqa: E402
from ragbatch.judge.protocol import EngineRequest, Message, OutputSpec, run_sync  # noqa: E402

YES_NO = OutputSpec.of_choice(["yes", "no"], max_tokens=8)
#: The rate-limited server of the acceptance test: 25 requests/s, a bucket of 5 (0.2 s
#: of the rate), 0.1 s per reply (so 2.5 requests must be in flight to use the rate),
#: and 200 requests (8 s at the full rate). It runs in a process of its own, so that
#: what is measured is the client, not the two sharing one interpreter lock.
RATE_PER_S, BURST, LATENCY_S, N_REQUESTS = 25.0, 5, 0.1, 200


def _ask(i: int) -> EngineRequest:
    return EngineRequest((Message("user", f"question {i}"),), YES_NO, seed=i)


def _spec(base_url: str, **overrides) -> OpenAIEngine:
    fields: dict = dict(
        type="openai",
        base_url=base_url,
        model=SERVED_NAME,
        max_model_len=100_000,
        logprobs=False,
        max_concurrency=16,
        max_retries=0,  # 429s do not use it up
        backoff_s=0.01,
    )
    fields.update(overrides)
    return OpenAIEngine(**fields)


def test_engine_uses_the_allowed_rate_and_scores_every_request():
    server = CannedJudgeProcess("yes", rate_per_s=RATE_PER_S, burst=BURST, latency_s=LATENCY_S)
    with server:
        with load_openai_engine(_spec(server.base_url)) as engine:
            out = run_sync(engine.complete([_ask(i) for i in range(N_REQUESTS)]))
            stats = engine.stats()
            changes = list(engine.limit.changes)
        log, share = server.log(), server.admitted_share()
    assert [c.status for c in out] == ["ok"] * N_REQUESTS and all(c.text == "yes" for c in out)
    assert log["chat_calls"] == N_REQUESTS == stats["ok"]
    refused = log["refused"]
    assert refused > 0 and stats["rate_limited"] == refused
    assert stats["attempts"] == N_REQUESTS + refused == stats["requests"] + stats["retries"]
    kinds = [kind for kind, _ in changes]
    first_decrease = kinds.index("decrease")
    assert "increase" in kinds[first_decrease:]  # it fell, then grew back
    assert 1 <= stats["concurrency_min"] < stats["concurrency_max"] <= 16
    assert stats["concurrency_decreases"] >= 1 and stats["retry_after_paused_s"] > 0
    assert share >= 0.8, (share, stats)  # the acceptance condition


def test_fixed_concurrency_still_scores_every_request():
    with CannedJudgeServer("yes", rate_per_s=50.0, burst=5, latency_s=0.02) as srv:
        with load_openai_engine(_spec(srv.base_url, adaptive_concurrency=False)) as engine:
            out = run_sync(engine.complete([_ask(i) for i in range(60)]))
            stats = engine.stats()
    assert [c.status for c in out] == ["ok"] * 60
    assert stats["rate_limited"] == srv.refused > 0
    assert (stats["concurrency"], stats["concurrency_min"], stats["concurrency_max"]) == (16,) * 3
    assert stats["concurrency_decreases"] == 0 and stats["retry_after_paused_s"] == 0.0


def test_rate_limit_retries_end_at_rate_limit_timeout_s():
    # one token, then a 429 asking for 20 ms on every request, for good
    with CannedJudgeServer("yes", rate_per_s=1e-6, burst=1, retry_after_s=0.02) as srv:
        with load_openai_engine(_spec(srv.base_url, rate_limit_timeout_s=0.3)) as engine:
            out = run_sync(engine.complete([_ask(0), _ask(1)]))
    assert sorted(c.status for c in out) == ["judge_error", "ok"]
    (failed,) = [c for c in out if c.status == "judge_error"]
    assert failed.error.startswith("HTTP 429: Rate limit reached")
    assert "after the first 429 (rate_limit_timeout_s=0.3)" in failed.error
    assert srv.refused >= 2 and failed.error.endswith(f"({srv.refused} attempts)")


def test_spent_quota_is_not_retried():
    with CannedJudgeServer(
        "yes", rate_per_s=1e-6, burst=1, refusal_code="insufficient_quota"
    ) as srv:
        with load_openai_engine(_spec(srv.base_url)) as engine:
            (first,) = run_sync(engine.complete([_ask(0)]))
            (second,) = run_sync(engine.complete([_ask(1)]))
            stats = engine.stats()
    assert first.status == "ok" and second.status == "judge_error"
    assert "quota is spent; not retried" in second.error and second.error.endswith("(1 attempt)")
    assert stats["attempts"] == 2 and stats["retries"] == 0 and stats["rate_limited"] == 0


# ------------------------------------------------- a whole run through Ray

#: ARES rows of the run, each one hate_speech request.
RUN_ROWS = 120


@pytest.mark.slow
def test_ragbatch_run_under_a_rate_limit_scores_every_row(ray_local, tmp_path):
    from ragbatch.cli import main

    reply = json.dumps({"reason": "No hateful language.", "verdict": False})
    with CannedJudgeProcess(reply, rate_per_s=20.0, burst=4, latency_s=LATENCY_S) as srv:
        config = {
            "input": ares_tsv_input(tmp_path, RUN_ROWS),
            "output": {"uri": str(tmp_path / "out")},
            "engines": {
                "judge": {
                    "kind": "openai",
                    "base_url": srv.base_url,
                    "model": SERVED_NAME,
                    "max_model_len": 100_000,
                    "max_concurrency": 16,
                    "max_retries": 0,
                    "batch_size": RUN_ROWS,
                }
            },
            "metrics": [{"name": "hate_speech", "engine": "judge"}],
        }
        path = tmp_path / "job.yaml"
        path.write_text(yaml.safe_dump(config))
        code = main(["run", str(path), "--run-id", "limited", "--run-date", "2024-06-03"])
        log, share = srv.log(), srv.admitted_share()
    assert code == 0
    [manifest] = (tmp_path / "out" / "runs").glob("run_date=*/run_id=limited/manifest.json")
    manifest = json.loads(manifest.read_text())
    assert manifest["counts"]["hate_speech"] == {"ok": RUN_ROWS}
    assert log["chat_calls"] == RUN_ROWS
    engine = manifest["judge"]["engines"]["judge"]
    assert engine["rate_limited"] == log["refused"] > 0
    assert engine["ok"] == RUN_ROWS and engine["judge_errors"] == 0
    assert 1 <= engine["concurrency_min"] < engine["concurrency_max"] <= 16
    assert share >= 0.8, (share, engine)
