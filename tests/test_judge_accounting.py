"""Judge accounting: ``judge_calls`` and the token counts hold only what the engine
served; a request refused as ``context_too_long`` is counted apart
(``refused_too_long``, ``refused_prompt_tokens``), and cache hits are never calls.

The end-to-end test reproduces the report: a run and an identical rerun (judgment cache
on) of judge metrics over rows one of which is too long for the judge's window. The
judge is the OpenAI-compatible stand-in of ``benchmarks/instant_judge.py`` on loopback,
reporting a small window; its own counters (``GET /metrics``: requests answered, prompt
tokens received) are what the manifest must agree with.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from ragbatch.config.job import JobConfig
from ragbatch.judge.batch import judge_frame
from ragbatch.judge.protocol import run_sync
from ragbatch.judge.cache import JudgmentCache
from ragbatch.judge.cache_upkeep import fold_journal, open_files
from ragbatch.judge.recorded import RecordedReplies
from ragbatch.judge.run import JudgeRunner
from ragbatch.metrics.faithfulness import Faithfulness
from ragbatch.pipeline.runner import run_job
from support.vllm_server import free_port

REPO = Path(__file__).resolve().parents[1]
STATEMENTS = '{"statements": ["Paris is in France."]}'
YES = '{"verdicts": [{"reason": "stated", "verdict": 1}]}'
WINDOW = 4096
LONG_ANSWER = "Paris is in France. " * 2000  # 40,000 characters: 10,000 tokens as counted below


def _frame(answers: list[str]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "row_id": [f"r{i}" for i in range(len(answers))],
            "question": ["Where is Paris?"] * len(answers),
            "contexts": [["Paris is in France."]] * len(answers),
            "answer": answers,
            "reference": [None] * len(answers),
        },
        schema={
            "row_id": pl.String,
            "question": pl.String,
            "contexts": pl.List(pl.String),
            "answer": pl.String,
            "reference": pl.String,
        },
    )


def _tokens(request) -> int:
    """The recorded engine's own count of a request's prompt tokens (characters / 4)."""
    return sum(len(m.content) for m in request.messages) // 4


def test_refused_request_is_not_a_call_and_its_tokens_are_kept_apart(tmp_path):
    answers = ["Paris is in France.", LONG_ANSWER]
    engine = RecordedReplies([STATEMENTS, YES], max_model_len=WINDOW)
    cache = JudgmentCache(str(tmp_path / "cache"), {}, ["faithfulness"])
    runner = JudgeRunner(engine, [Faithfulness.from_params({})], cache=cache)
    cells, records = run_sync(judge_frame(runner, _frame(answers)))["faithfulness"]
    assert [c["status"] for c in cells] == ["ok", "context_too_long"]
    # The engine saw 3 requests: r0's two steps (served) and r1's first (refused).
    served, refused = engine.requests[:1] + engine.requests[2:], engine.requests[1:2]
    assert len(engine.requests) == 3 and _tokens(refused[0]) + 16 > WINDOW > _tokens(served[0])
    tally = runner.take_tallies()["faithfulness"]
    assert tally["judge_calls"] == 2
    assert tally["prompt_tokens"] == sum(_tokens(r) for r in served)
    assert tally["refused_too_long"] == 1
    assert tally["refused_prompt_tokens"] == _tokens(refused[0])
    assert tally["completion_tokens"] == len(STATEMENTS) // 4 + len(YES) // 4
    assert records[0]["judge_calls"] == 2 and records[1]["judge_calls"] == 0
    assert records[1]["prompt_tokens"] == 0 and records[1]["completion_tokens"] == 0
    assert cache.flush() == 2
    fold_journal(open_files(str(tmp_path / "cache"), {}), "run-1")

    # The rerun: r0 comes from the cache (not calls); r1 is refused again, and only it.
    again = RecordedReplies([], max_model_len=WINDOW)
    again.model_id = engine.model_id
    runner = JudgeRunner(
        again,
        [Faithfulness.from_params({})],
        cache=JudgmentCache(str(tmp_path / "cache"), {}, ["faithfulness"]),
    )
    cells2, records2 = run_sync(judge_frame(runner, _frame(answers)))["faithfulness"]
    assert cells2 == cells and len(again.requests) == 1
    assert runner.take_tallies()["faithfulness"] == {
        "judge_calls": 0,
        "cache_hits": 2,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "cached_prompt_tokens": 0,
        "refused_too_long": 1,
        "refused_prompt_tokens": _tokens(refused[0]),
    }
    assert records2[0]["judge_calls"] == 0 and records2[0]["cache_hits"] == 2


def test_dry_run_estimate_and_pilot_count_refused_requests_apart():
    """The dry run's estimate counts like the run: a prompt over the window is
    ``over_window``, not a call, and its tokens are not in ``prompt_tokens``; a pilot's
    spend leaves refused requests out too (both with the recorded stand-in engine)."""
    from types import SimpleNamespace

    from ragbatch.judge.cache_probe import CacheProbe
    from ragbatch.judge.estimate import estimate_stage
    from ragbatch.judge.pilot import Pilot
    from ragbatch.judge.tokens import PromptCounter

    metric = Faithfulness.from_params({})
    sample = _frame(["Paris is in France.", LONG_ANSWER]).with_columns(
        latency_s=pl.lit(None, pl.Float64)
    )
    counter = PromptCounter("chars/4", "test")
    spec = SimpleNamespace(max_tokens=16, batch_size=64)
    [alone] = estimate_stage([metric], spec, sample.head(1), counter, CacheProbe("off"), WINDOW)
    [both] = estimate_stage([metric], spec, sample, counter, CacheProbe("off"), WINDOW)
    first = both.steps[0]
    assert (first.calls, first.over_window) == (1, 1)
    assert first.prompt_tokens == alone.steps[0].prompt_tokens < WINDOW
    assert first.completion_bound == 16

    # A pilot sent both rows' first asks; the engine served one of them.
    engine = RecordedReplies([STATEMENTS], max_model_len=WINDOW)
    pilot = Pilot(engine, rows=2, max_tokens=16)
    replies = pilot.replies([next(metric.program(row)) for row in sample.to_dicts()])
    assert replies[1] is None and len(engine.requests) == 2
    assert pilot.calls == 1
    assert pilot.prompt_tokens == _tokens(engine.requests[0]) < WINDOW < _tokens(engine.requests[1])
    assert pilot.completion_tokens == len(STATEMENTS) // 4


# -- end to end -------------------------------------------------------------------------------

JUDGE_METRICS = ["faithfulness", "hate_speech", "duplication"]
E2E_WINDOW = 8192


def _server_counters(base: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {
        name: int(float(value))
        for name, value in (
            line.split() for line in text.splitlines() if line and not line.startswith("#")
        )
    }


@pytest.fixture
def instant_judge(tmp_path):
    """The stand-in judge on a free loopback port, reporting a window of E2E_WINDOW."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "benchmarks" / "instant_judge.py"),
            "--port",
            str(port),
            "--max-model-len",
            str(E2E_WINDOW),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{base}/health", timeout=2).close()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("the instant judge did not start")
            time.sleep(0.2)
    yield base
    proc.terminate()
    proc.wait(timeout=30)


def _job_dict(tmp_path: Path, base: str) -> dict:
    src = tmp_path / "in"
    if not src.exists():
        src.mkdir()
        pq.write_table(
            pa.table(
                {
                    "q": ["Where is Paris?", "What is the capital of Italy?", "Where is Paris?"],
                    "c": [
                        "Paris is the capital of France.",
                        "Rome is the capital of Italy.",
                        "Paris is the capital of France.",
                    ],
                    "a": [
                        "Paris is in France.",
                        "Rome.",
                        LONG_ANSWER * 2,
                    ],  # the last: 20,000 tokens
                }
            ),
            src / "rows.parquet",
        )
    return {
        "run": {"name": "accounting"},
        "input": {"uri": str(src), "columns": {"question": "q", "contexts": "c", "answer": "a"}},
        "output": {"uri": str(tmp_path / "out")},
        "engines": {
            "judge": {
                "type": "openai",
                "base_url": f"{base}/v1",
                "model": "instant",
                "concurrency": 1,
                "batch_size": 8,
                "max_tokens": 256,
            }
        },
        "metrics": [{"name": m, "engine": "judge"} for m in JUDGE_METRICS],
    }


def _cli_run(tmp_path: Path, base: str, run_id: str) -> tuple[dict, str, str]:
    """``ragbatch run`` in a new process, as a user starts it: its manifest, stdout and
    stderr."""
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(_job_dict(tmp_path, base)))
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("ragbatch")), "run", str(config), "--run-id", run_id],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = (tmp_path / "out").glob(f"runs/*/run_id={run_id}/manifest.json")
    return json.loads(path.read_text()), proc.stdout, proc.stderr


@pytest.mark.slow
@pytest.mark.release
def test_a_rerun_reports_no_calls_for_refused_rows(ray_local, instant_judge, tmp_path):
    """Release check: two CLI runs through Ray against a stand-in server. The default suite
    covers the same accounting in-process (the refused request kept apart, above) and the
    cache across runs (tests/test_judge_e2e.py, tests/test_nightly.py)."""
    before = _server_counters(instant_judge)
    first_manifest, stdout, stderr = _cli_run(tmp_path, instant_judge, "first")
    served = _server_counters(instant_judge)
    calls = served["vllm:request_success_total"] - before["vllm:request_success_total"]
    tokens = served["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"]
    total = first_manifest["judge"]["total"]
    # Two rows fit: faithfulness asks twice each (statements, then verdicts), the other
    # metrics once: 8 calls. The long row is refused once per metric, before the engine.
    assert calls == 8
    assert total["judge_calls"] == calls and total["prompt_tokens"] == tokens
    assert total["refused_too_long"] == len(JUDGE_METRICS)
    assert total["refused_prompt_tokens"] > len(JUDGE_METRICS) * E2E_WINDOW
    assert all(
        first_manifest["judge"]["metrics"][m]["refused_too_long"] == 1 for m in JUDGE_METRICS
    )
    engine = first_manifest["judge"]["engines"]["judge"]
    assert engine["context_too_long"] == len(JUDGE_METRICS) and engine["prompt_tokens"] == tokens
    # The actor stage is placed with Ray Data's supported parameters: no deprecation
    # warning of ours in the run's output.
    assert "ray_remote_args" not in stderr and "RayDeprecationWarning" not in stderr
    assert "retried_io_errors" not in stderr
    assert f"{len(JUDGE_METRICS)} requests refused as context_too_long" in stdout

    second = run_job(JobConfig.from_dict(_job_dict(tmp_path, instant_judge)), run_id="second")
    after = _server_counters(instant_judge)
    for counter in ("vllm:request_success_total", "vllm:prompt_tokens_total"):
        assert after[counter] == served[counter], "a chat request reached the judge"
    assert second.manifest.judge.total.model_dump() == {
        "judge_calls": 0,
        "cache_hits": calls,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "cached_prompt_tokens": 0,
        "refused_too_long": len(JUDGE_METRICS),
        "refused_prompt_tokens": total["refused_prompt_tokens"],
    }
    refused = duckdb.sql(
        f"SELECT metric, judge_calls, prompt_tokens FROM read_parquet("
        f"'{tmp_path}/out/scores/**/*.parquet', hive_partitioning=true) "
        f"WHERE run_id = 'second' AND status = 'context_too_long' ORDER BY metric"
    ).fetchall()
    assert refused == [(m, 0, 0) for m in sorted(JUDGE_METRICS)]
