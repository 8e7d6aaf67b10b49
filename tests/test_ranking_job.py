"""jobs/trec_dl_retrieval.yaml through `ragbatch validate` and a real run.

Expected values are worked out here from the judgments file itself: the ``by_grade``
retriever ranks every query's passages in decreasing grade, so wherever a query has a
relevant passage its nDCG and reciprocal rank are 1.0; a query without one is
``not_applicable`` for every metric.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import duckdb
import pytest

from ragbatch.cli import main
from ragbatch.config.job import load_config

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "jobs" / "trec_dl_retrieval.yaml"
JUDGMENTS = REPO / "examples" / "data" / "trec_dl" / "trec_dl_2021_2022_benchmark.csv"
METRICS = ["hit_rate", "precision_at_k", "recall_at_k", "mrr", "ndcg_at_k", "average_precision"]


def _config_file(tmp_path: Path, **columns: str) -> Path:
    config = load_config(JOB).model_dump(mode="json", exclude_none=True)
    config["input"]["uri"] = str(REPO / config["input"]["uri"])
    config["input"]["columns"].update(columns)
    config["output"]["uri"] = str(tmp_path / "out")
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def test_validate_accepts_the_job_and_names_an_unusable_column(tmp_path, capsys):
    assert main(["validate", str(_config_file(tmp_path))]) == 0
    capsys.readouterr()
    assert main(["validate", str(_config_file(tmp_path, relevant_ids="grades"))]) == 2
    err = capsys.readouterr().err
    assert "input.columns.relevant_ids: column 'grades' has type list<item: struct<" in err
    assert "relevant_ids needs a list of string or integer ids" in err


def test_validate_names_a_missing_mapping(tmp_path, capsys):
    config = json.loads(_config_file(tmp_path).read_text())
    del config["input"]["columns"]["relevance"]
    path = tmp_path / "bare.yaml"
    path.write_text(json.dumps(config))
    assert main(["validate", str(path)]) == 2
    assert "add `relevant_ids: <input column>`" in capsys.readouterr().err


@pytest.mark.slow
def test_run_scores_every_row_and_the_ideal_ranking_scores_one(ray_local, tmp_path):
    from ragbatch.pipeline.runner import run_job

    relevant: dict[str, int] = {}
    with JUDGMENTS.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            hit = float(row["expected_score"]) > 0
            relevant[row["query_id"]] = relevant.get(row["query_id"], 0) + hit
    config = load_config(_config_file(tmp_path))
    result = run_job(config)
    con = duckdb.connect()
    scores = f"read_parquet('{tmp_path / 'out'}/scores/**/*.parquet', hive_partitioning=true)"
    rows = con.execute(
        f"SELECT row_id, metric, status, score, retriever FROM {scores} "
        f"WHERE run_id = '{result.run_id}'"
    ).fetchall()
    assert len(rows) == 2 * len(relevant) * len(METRICS)
    for row_id, metric, status, score, retriever in rows:
        query = row_id.split(":")[1]
        assert retriever == row_id.split(":")[0]
        if relevant[query] == 0:
            assert (status, score) == ("not_applicable", None), row_id
            continue
        assert status == "ok", (row_id, metric)
        if retriever == "by_grade" and metric in ("ndcg_at_k", "mrr", "hit_rate"):
            assert score == pytest.approx(1.0), (row_id, metric)
