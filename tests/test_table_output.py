"""Committed runs also written to lakehouse tables (``output.table``,
:mod:`ragbatch.ops.table_output`): Delta tables with ``deltalake`` (local disk and the
loopback S3 endpoint), Iceberg tables with ``pyiceberg`` on a SQLite catalog. Each table is
read back by another engine (Polars) and compared with the run's hive-partitioned
Parquet scores; a run written again never duplicates a cell.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from ragbatch.config.job import JobConfig
from ragbatch.core.errors import ConfigError

pytest.importorskip("deltalake")
pytest.importorskip("pyiceberg")

CELLS = ["run_id", "row_id", "metric", "score", "status", "team"]


def _config(tmp_path: Path, table: dict) -> JobConfig:
    src = tmp_path / "in.parquet"
    pq.write_table(
        pa.table(
            {
                "id": ["r0", "r1", "r2", "r3"],
                "a": ["yes", "no answer here", "yes", None],
                "ref": ["yes", "yes", "no", "yes"],
                "team": ["red", "red", "blue", "blue"],
            }
        ),
        src,
    )
    return JobConfig.from_dict(
        {
            "run": {"name": "tables", "executor": "in_process"},
            "input": {
                "uri": str(src),
                "columns": {"row_id": "id", "answer": "a", "reference": "ref"},
            },
            "output": {"uri": str(tmp_path / "out"), "table": table},
            "metrics": [
                {"name": "exact_match"},
                {"name": "response_length", "params": {"min_chars": 1, "max_chars": 5}},
            ],
        }
    )


def _cli(tmp_path: Path, cfg: JobConfig, run_id: str) -> tuple[int, str, str]:
    from support.nightly_runs import run_cli

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)))
    return run_cli(["run", str(path), "--run-id", run_id])


def _parquet_cells(tmp_path: Path) -> list[tuple]:
    return duckdb.sql(
        f"SELECT {', '.join(CELLS)} FROM read_parquet('{tmp_path}/out/scores/**/*.parquet', "
        "hive_partitioning=true) ORDER BY ALL"
    ).fetchall()


def _rows(frame: pl.DataFrame) -> list[tuple]:
    return sorted(frame.select(CELLS).rows(), key=lambda r: tuple(str(v) for v in r))


def test_delta_tables_hold_each_run_once(tmp_path):
    from deltalake import DeltaTable

    from ragbatch.ops.table_output import write_run_tables

    cfg = _config(tmp_path, {"format": "delta", "uri": str(tmp_path / "lake")})
    for run_id in ("night-1", "night-2"):
        code, out, err = _cli(tmp_path, cfg, run_id)
        assert code == 0, err
        assert f"table:      {tmp_path}/lake/scores (8 rows)" in out
    versions = DeltaTable(str(tmp_path / "lake/scores")).version()
    write_run_tables(cfg, "night-1")  # again: replaces the run's rows in one commit
    assert DeltaTable(str(tmp_path / "lake/scores")).version() == versions + 1

    scores = pl.read_delta(str(tmp_path / "lake/scores"))
    assert scores.columns[:2] == ["run_id", "run_date"]
    want = sorted(_parquet_cells(tmp_path), key=lambda r: tuple(str(v) for v in r))
    assert _rows(scores) == want
    assert scores.height == 16  # 2 runs x 4 rows x 2 metrics, none twice
    summary = pl.read_delta(str(tmp_path / "lake/summary"))
    assert sorted(set(summary["run_id"])) == ["night-1", "night-2"]
    assert summary.filter(pl.col("run_id") == "night-1").height == summary.height // 2


def test_iceberg_tables_hold_each_run_once(tmp_path):
    from pyiceberg.catalog import load_catalog

    from ragbatch.ops.table_output import write_run_tables

    catalog = {"uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/wh"}
    cfg = _config(tmp_path, {"format": "iceberg", "catalog": catalog, "namespace": "evals"})
    for run_id in ("night-1", "night-2"):
        code, out, err = _cli(tmp_path, cfg, run_id)
        assert code == 0, err
        assert "table:      evals.scores (8 rows)" in out
    write_run_tables(cfg, "night-2")  # again

    table = load_catalog("default", type="sql", **catalog).load_table("evals.scores")
    scores = pl.scan_iceberg(table).collect()
    want = sorted(_parquet_cells(tmp_path), key=lambda r: tuple(str(v) for v in r))
    assert _rows(scores) == want
    assert scores.height == 16
    assert [f.source_id for f in table.spec().fields] == [
        table.schema().find_field("run_date").field_id
    ]


def test_a_delta_table_on_s3(tmp_path, s3_storage_options, s3_bucket):
    from deltalake import DeltaTable

    from ragbatch.io.formats.delta import object_store_options

    uri = f"s3://{s3_bucket}/lake"
    table = {"format": "delta", "uri": uri, "storage_options": s3_storage_options}
    code, _, err = _cli(tmp_path, _config(tmp_path, table), "s3-night")
    assert code == 0, err
    options = object_store_options(uri, s3_storage_options)
    got = pa.table(
        DeltaTable(f"{uri}/scores", storage_options=options).to_pyarrow_dataset().to_table()
    )
    assert sorted(zip(got["row_id"].to_pylist(), got["metric"].to_pylist())) == sorted(
        (f"r{i}", m) for i in range(4) for m in ("exact_match", "response_length")
    )


def test_a_failure_leaves_the_run_committed_and_says_so(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the tables should be")
    cfg = _config(tmp_path, {"format": "delta", "uri": str(blocker / "lake")})
    code, out, err = _cli(tmp_path, cfg, "night-9")
    assert code == 1
    assert "run night-9 committed, but it could not be written to its tables" in err
    assert list((tmp_path / "out").glob("runs/*/run_id=night-9/manifest.json"))


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"format": "delta"}, "format delta needs uri"),
        ({"format": "iceberg", "namespace": "e"}, "format iceberg needs namespace and catalog"),
        ({"format": "hudi", "uri": "x"}, "Input should be 'delta' or 'iceberg'"),
    ],
)
def test_the_table_section_is_checked(tmp_path, table, message):
    with pytest.raises(ConfigError, match=message):
        _config(tmp_path, table)


def test_a_night_run_again_is_written_once(tmp_path):
    import datetime as dt

    from ragbatch.ops.nightly_job import run_nightly

    cfg = _config(tmp_path, {"format": "delta", "uri": str(tmp_path / "lake")})
    for _ in range(2):
        outcome = run_nightly(cfg, run_date=dt.date(2026, 11, 27), report=False)
        assert outcome.exit_code == 0, outcome.message
    scores = pl.read_delta(str(tmp_path / "lake/scores"))
    assert scores.height == 8
    assert set(scores["run_id"]) == {outcome.run_id}
    assert set(scores["run_date"]) == {dt.date(2026, 11, 27)}
