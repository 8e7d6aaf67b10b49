"""Shared parts of the lakehouse input tests (tests/test_input_delta.py,
tests/test_input_iceberg.py): the two nights of ARES traces the repository ships
(examples/data/nightly) as Arrow rows, the job run over them, and the scores a run of the
same job over a Parquet file of the same rows gives."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import yaml

from ragbatch.config.job import JobConfig
from ragbatch.pipeline.runner import run_job

NIGHTS = ("2026-11-27", "2026-11-28")
REPO = Path(__file__).resolve().parents[2]

METRICS = [
    {"name": "response_length", "params": {"min_chars": 1, "max_chars": 400}},
    {"name": "context_length", "params": {"max_chars": 2000}},
    {"name": "contains_text", "id": "mentions_delta", "params": {"text": ["delta"]}},
]


def night_rows(night: str) -> pa.Table:
    """One night's TSV with every column a string, plus ``row_id`` (night and line) and
    ``run_date``."""
    path = REPO / "examples/data/nightly" / f"run_date={night}" / f"ares-{night}.tsv"
    names = path.read_text(encoding="utf-8").splitlines()[0].split("\t")
    table = pcsv.read_csv(
        path,
        parse_options=pcsv.ParseOptions(delimiter="\t", quote_char=False),
        convert_options=pcsv.ConvertOptions(column_types={n: pa.string() for n in names}),
    )
    ids = pa.array([f"{night}:{i}" for i in range(table.num_rows)])
    table = table.append_column("row_id", ids)
    return table.append_column("run_date", pa.array([night] * table.num_rows))


def job(uri: str, out: Path, executor: str = "in_process", **input_fields) -> JobConfig:
    """The job over ``uri`` (``input_fields`` added to its input), run by ``executor``."""
    return JobConfig.from_dict(
        {
            "run": {"name": "lake", "executor": executor},
            "input": {
                "uri": uri,
                "columns": {
                    "row_id": "row_id",
                    "question": "Question",
                    "contexts": "Document",
                    "answer": "Answer",
                },
                "slice_columns": ["run_date", "Reaction"],
                **input_fields,
            },
            "output": {"uri": str(out)},
            "metrics": METRICS,
        }
    )


def scores(out: Path, run_id: str) -> list[tuple]:
    return duckdb.sql(
        "SELECT row_id, metric, score, status, reason, run_date, Reaction FROM "
        f"read_parquet('{out}/scores/**/*.parquet', hive_partitioning=true, union_by_name=true) "
        f"WHERE run_id = '{run_id}' ORDER BY row_id, metric"
    ).fetchall()


def manifest(out: Path, run_id: str) -> dict:
    (path,) = out.glob(f"runs/*/run_id={run_id}/manifest.json")
    return json.loads(path.read_text())


def parquet_scores(tmp_path: Path, nights: tuple[str, ...], keep=None) -> list[tuple]:
    """The same job over a Parquet file of the same rows (with ``keep``, a predicate on
    a row dict: only the rows it keeps)."""
    src = tmp_path / "parquet" / "rows.parquet"
    src.parent.mkdir()
    rows = pa.concat_tables([night_rows(n) for n in nights])
    if keep is not None:
        rows = pa.Table.from_pylist([r for r in rows.to_pylist() if keep(r)], schema=rows.schema)
    pq.write_table(rows, src)
    run_job(job(str(src), tmp_path / "parquet_out"), run_id="parquet")
    return scores(tmp_path / "parquet_out", "parquet")


def scores_plain(out: Path, run_id: str) -> list[tuple]:
    return duckdb.sql(
        "SELECT row_id, score, status FROM "
        f"read_parquet('{out}/scores/**/*.parquet', hive_partitioning=true) "
        f"WHERE run_id = '{run_id}' ORDER BY ALL"
    ).fetchall()


def cli_run(tmp_path: Path, cfg: JobConfig) -> tuple[int, str]:
    from support.nightly_runs import run_cli

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)))
    code, _, err = run_cli(["run", str(path), "--run-id", "bad"])
    return code, err
