"""Judge metrics end to end through real Ray: the vLLM engine in an actor pool on the
shipped ARES rows, the OpenAI-compatible engine against a real ``vllm serve`` on the
shipped Tonic rows, and the judgment cache across reruns.

The judge is the tiny random model of ``tests/judge_models.py``: its verdicts mean
nothing, so these tests check what must hold whatever the model says (every cell has a
valid status, ok scores lie in range, rows are conserved, the manifest's judge counts
match the table, the cache serves reruns), not the scores themselves.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import polars as pl
import pytest

from ragbatch.config import load_config
from ragbatch.registry import get_metric
from ragbatch.runner import run_job
from ragbatch.status import STATUSES

pytest.importorskip("vllm", reason="the judge tests need the CPU judge stack (ragbatch[judge-cpu])")

REPO = Path(__file__).resolve().parents[1]
ARES = REPO / "examples/data/ares/datasets_v2__LLM_Judge_Test_Set_Human_Annotations.tsv"
TONIC = REPO / "examples/data/tonic_validate_paul_graham/system=cohere/examples__titan_vs_cohere__cohere_run.csv"
pytestmark = pytest.mark.slow
#: Reply budget cap: the random model fills JSON strings up to their length limits, so
#: uncapped replies of thousands of tokens would dominate the test's run time.
MAX_TOKENS = 160
#: ARES rows the vLLM test judges: their documents run to thousands of tokens, and each
#: row costs about 13 judge calls (seconds each on two CPU cores); the checks hold for any
#: rows.
ARES_ROWS = 2


def _ares_rows(tmp_path: Path, n: int) -> Path:
    """The first ``n`` rows of the shipped ARES file (one row per line), as a TSV."""
    lines = ARES.read_text(encoding="utf-8").splitlines(keepends=True)
    out = tmp_path / "ares_subset.tsv"
    out.write_text("".join(lines[: n + 1]), encoding="utf-8")
    return out


def _tonic_rows(tmp_path: Path, n: int) -> Path:
    out = tmp_path / "tonic" / "system=cohere" / "rows.csv"
    if out.exists():
        return out.parent.parent
    out.parent.mkdir(parents=True)
    pl.read_csv(TONIC, infer_schema=False).head(n).write_csv(out)
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
    metric_ids = [m["id"] for m in result.manifest["metrics"]]
    assert scores.height == n_rows * len(metric_ids)
    assert scores.select(pl.struct("row_id", "metric").n_unique()).item() == scores.height
    assert set(scores["status"].unique()) <= set(STATUSES)
    for m in result.manifest["metrics"]:
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
    judge = result.manifest["judge"]
    for mid in metric_ids:
        rows = scores.filter(pl.col("metric") == mid)
        assert judge["metrics"][mid]["judge_calls"] == (rows["judge_calls"].sum() or 0), mid
        assert judge["metrics"][mid]["cache_hits"] == (rows["cache_hits"].sum() or 0), mid
    counts = scores.group_by("metric", "status").len()
    for metric, status, n in counts.iter_rows():
        assert result.manifest["counts"][metric][status] == n
    return scores


def _tiny_engine(model: Path) -> dict:
    return {"type": "vllm", "model": str(model), "max_model_len": 8192, "num_gpus": 0,
            "concurrency": 1, "batch_size": 4, "max_tokens": MAX_TOKENS,
            "engine_kwargs": {"enforce_eager": True}}


def test_vllm_actor_pool_runs_every_judge_metric_on_ares(ray_local, tiny_judge_model, tmp_path):
    config = load_config(REPO / "jobs" / "ares_judge.yaml")
    config.input.uri = str(_ares_rows(tmp_path, ARES_ROWS))
    config.output.uri = str(tmp_path / "out")
    config.engines["judge"] = type(config.engines["judge"]).model_validate(
        _tiny_engine(tiny_judge_model))
    result = run_job(config, run_id="vllm-ares")
    scores = _check(result, ARES_ROWS)
    assert len(result.manifest["metrics"]) == 10
    judge = result.manifest["judge"]
    assert judge["total"]["judge_calls"] > 0 and judge["total"]["prompt_tokens"] > 0
    stats = judge["engines"]["judge"]
    assert stats.get("prefix_cache_queries", 0) > 0
    # the shared block makes later asks of a row reuse the prefix of earlier ones
    assert stats["prefix_cache_hit_rate"] > 0.2
    assert scores.filter(pl.col("judge_calls") > 0)["judge_reply"].is_not_null().any()


def _openai_config(tmp_path: Path, base_url: str, metrics: list[dict]):
    config = load_config(REPO / "jobs" / "tonic_judge.yaml")
    config.input.uri = str(_tonic_rows(tmp_path, 4))
    config.output.uri = str(tmp_path / "out")
    data = config.model_dump(mode="json")
    data["engines"] = {"judge": {"kind": "openai", "base_url": base_url, "model": "tiny",
                                 "max_concurrency": 8, "concurrency": 1, "batch_size": 4,
                                 "request_timeout_s": 300, "max_tokens": MAX_TOKENS}}
    data["metrics"] = metrics
    return type(config).from_dict(data)


def test_openai_engine_and_the_judgment_cache(ray_local, vllm_base_url, tmp_path):
    metrics = [{"name": "answer_similarity", "engine": "judge"},
               {"name": "context_recall", "engine": "judge"},
               {"name": "answer_relevancy", "engine": "judge", "params": {"n_questions": 2}}]
    first = run_job(_openai_config(tmp_path, vllm_base_url, metrics), run_id="first")
    scores1 = _check(first, 4)
    assert first.manifest["judge"]["total"]["judge_calls"] > 0

    # One more run (each costs an actor that loads its engine and embedder) checks both
    # ways the cache is keyed: the three metrics again, answer_relevancy's under a new id
    # (an id is not part of the key), all from the cache with equal scores; and
    # answer_relevancy with changed params under its old id, judged again.
    rerun = [*metrics[:2],
             {"name": "answer_relevancy", "id": "relevancy_2q", "engine": "judge",
              "params": {"n_questions": 2}},
             {"name": "answer_relevancy", "engine": "judge", "params": {"n_questions": 3}}]
    second = run_job(_openai_config(tmp_path, vllm_base_url, rerun), run_id="second")
    scores2 = _check(second, 4)
    made = first.manifest["judge"]["metrics"]
    per_metric = second.manifest["judge"]["metrics"]
    cached = {"answer_similarity": "answer_similarity", "context_recall": "context_recall",
              "relevancy_2q": "answer_relevancy"}  # id now -> id in the first run
    for now, then in cached.items():
        assert per_metric[now]["judge_calls"] == 0, now
        assert per_metric[now]["cache_hits"] == made[then]["judge_calls"] + made[then]["cache_hits"], now
    keep = ["row_id", "metric", "score", "status", "reason", "details", "judge_reply"]
    again = (scores2.filter(pl.col("metric").is_in(list(cached)))
             .with_columns(pl.col("metric").replace(cached)))
    assert again.select(keep).sort("row_id", "metric").equals(scores1.select(keep).sort("row_id", "metric"))
    judged_rows = scores1.filter((pl.col("metric") == "answer_relevancy") & pl.col("judge_calls").is_not_null()).height
    assert per_metric["answer_relevancy"]["judge_calls"] >= judged_rows > 0
    manifest = json.loads(Path(second.layout.manifest_path).read_text())
    assert manifest["judge"] == second.manifest["judge"]
