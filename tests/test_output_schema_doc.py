"""docs/output-schema.md against what a real run writes, and its queries run for real.

The tables of the doc (columns, Arrow / DuckDB / Polars types, order; statuses; manifest
keys) are compared with the Parquet files and manifest of a small real run
(tests/support/summary_run.py), with ``ragbatch.core.status`` and with ``SCORES_COLUMNS`` /
``SUMMARY_SCHEMA``. Every SQL and Python block of the doc is run on a copy of that run's
output root to which the files of two runs that never committed were added.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import duckdb
import polars as pl
import pyarrow.parquet as pq
import pytest

from ragbatch.analysis.summary_types import SUMMARY_SCHEMA
from ragbatch.core.columns import SCORES_COLUMNS
from ragbatch.core.status import DESCRIPTIONS, STATUSES
from support.summary_run import RUN_DATE, RUN_ID, small_run

pytestmark = pytest.mark.slow

DOC = (Path(__file__).resolve().parents[1] / "docs" / "output-schema.md").read_text(
    encoding="utf-8"
)
DOC_ROOT = "out/ares"  # the output root the doc's queries name
SLICES = ["app", "tier"]  # slice columns of the small run
N_CELLS = 18  # 9 rows x 2 metrics


def _section(title: str) -> str:
    parts = re.split(r"^## ", DOC, flags=re.M)
    found = [p for p in parts if p.startswith(title + "\n")]
    assert len(found) == 1, f"section '## {title}' not found once in the doc"
    return found[0]


def _table(title: str) -> list[list[str]]:
    """Body rows of the first Markdown table in a section, cells stripped."""
    lines = [ln for ln in _section(title).splitlines() if ln.startswith("|")]
    assert lines[1].startswith("|---"), f"no table in section {title}"
    return [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines[2:]]


def _name(cell: str) -> str:
    assert cell.startswith("`") and cell.endswith("`"), cell
    return cell.strip("`")


def _blocks(lang: str) -> list[str]:
    return [
        b.replace(DOC_ROOT, "{root}") for b in re.findall(rf"```{lang}\n(.*?)```", DOC, flags=re.S)
    ]


@pytest.fixture(scope="module")
def run(tmp_path_factory, ray_local):
    return small_run(tmp_path_factory, ray_local)


@pytest.fixture(scope="module")
def root(run, tmp_path_factory) -> Path:
    """A copy of the run's output root plus the leftovers of two runs that never
    committed. They are made by copying the committed run's files, because a run that
    dies at exactly these points cannot be brought about on purpose in a test:
    ``unfinished`` moved its scores and wrote its summary but no manifest (died while
    publishing); ``staged`` has scores under ``_staging`` only (still running)."""
    copy = tmp_path_factory.mktemp("schema_doc") / "out"
    shutil.copytree(run.layout.root, copy)
    for table, name in (("scores", "part-00000.parquet"), ("summary", "summary.parquet")):
        source = next((copy / table).glob(f"*/run_id={RUN_ID}/*.parquet"))
        target = copy / table / "run_date=2026-01-16" / "run_id=unfinished" / name
        target.parent.mkdir(parents=True)
        shutil.copy(source, target)
    staged = copy / "_staging" / "run_id=staged" / "scores" / "attempt=1"
    staged.mkdir(parents=True)
    shutil.copy(
        next((copy / "scores").glob(f"*/run_id={RUN_ID}/*.parquet")), staged / "part-0.parquet"
    )
    return copy


@pytest.fixture(scope="module")
def frames(root):
    """The doc's Python block, run on the root: its namespace."""
    (block,) = _blocks("python")
    namespace: dict = {}
    exec(block.replace("{root}", str(root)), namespace)  # noqa: S102 - the doc's own code
    return namespace


def _sql(name: str, root: Path) -> str:
    found = [b for b in _blocks("sql") if b.startswith(f"-- {name}\n")]
    assert len(found) == 1, f"no SQL block '-- {name}' in the doc"
    return found[0].replace("{root}", str(root))


def _duckdb_types(sql: str) -> dict[str, str]:
    select_all = re.sub(r"^SELECT .*?\nFROM", "SELECT *\nFROM", sql.split("\n", 1)[1], flags=re.S)
    return {
        r[0]: r[1] for r in duckdb.sql(f"DESCRIBE {select_all.rstrip().rstrip(';')}").fetchall()
    }


# ------------------------------------------------------------------- tables vs files


def test_scores_table_matches_the_written_files(run, root, frames):
    rows = _table("Scores table")
    fixed = [r for r in rows if r[0].startswith("`") and r[1] != "partition"]
    partitions = [r for r in rows if r[1] == "partition"]
    assert [r[0] for r in rows if not r[0].startswith("`")] == ["*slice columns*"]
    schema = pq.read_schema(next(Path(run.layout.scores_path).glob("*.parquet")))
    assert [_name(r[0]) for r in fixed] == list(SCORES_COLUMNS)
    assert schema.names == [_name(r[0]) for r in fixed] + SLICES
    assert [r[1] for r in fixed] == [str(schema.field(_name(r[0])).type) for r in fixed]
    duck = _duckdb_types(_sql("committed scores", root))
    polars = frames["scores"].collect_schema()
    assert list(duck) == list(polars) == schema.names + ["run_date", "run_id"]
    for r in fixed + partitions:
        assert (r[2], r[3]) == (duck[_name(r[0])], str(polars[_name(r[0])])), r[0]
    assert [_name(r[0]) for r in partitions] == ["run_date", "run_id"]


def test_summary_table_matches_the_written_file(run, root, frames):
    rows = _table("Summary table")
    columns = [r for r in rows if r[1] != "partition"]
    schema = pq.read_schema(run.layout.summary_path)
    assert schema.equals(SUMMARY_SCHEMA)
    assert [_name(r[0]) for r in columns] == schema.names
    assert [r[1] for r in columns] == [str(t) for t in schema.types]
    status_counts = [r[0] for r in columns if r[0].startswith("`n_") and r[0] != "`n_labelled`"]
    assert [f"`n_{s}`" for s in STATUSES] == status_counts[1:]
    duck = _duckdb_types(_sql("committed summaries", root))
    polars = frames["summary"].collect_schema()
    assert list(duck) == list(polars) == schema.names + ["run_date", "run_id"]
    for r in rows:
        assert (r[2], r[3]) == (duck[_name(r[0])], str(polars[_name(r[0])])), r[0]


def test_partition_keys_table(root, frames):
    rows = _table("Layout and partition keys")
    assert [_name(r[0]) for r in rows] == ["run_date", "run_id"]
    duck = _duckdb_types(_sql("committed scores", root))
    polars = frames["scores"].collect_schema()
    for r in rows:
        assert (r[2], r[3]) == (duck[_name(r[0])], str(polars[_name(r[0])]))


def test_statuses_table_is_the_vocabulary():
    rows = _table("Statuses")
    assert [_name(r[0]) for r in rows] == list(STATUSES)
    assert {_name(r[0]): r[1] for r in rows} == DESCRIPTIONS


def test_manifest_table_lists_every_key_in_order(run):
    manifest = json.loads(Path(run.layout.manifest_path).read_text(encoding="utf-8"))
    rows = _table("Manifest")
    assert [_name(r[0]) for r in rows] == list(manifest)
    json_type = {str: "string", dict: "object", list: "array", int: "integer"}
    assert {_name(r[0]): r[1] for r in rows} == {k: json_type[type(v)] for k, v in manifest.items()}


# ------------------------------------------------------------------- the queries


def test_root_holds_uncommitted_files_the_queries_must_skip(root):
    def cells(pattern: str) -> int:
        return duckdb.sql(f"SELECT count(*) FROM read_parquet('{root}/{pattern}')").fetchall()[0][0]

    assert cells("scores/*/*/*.parquet") == 2 * N_CELLS  # committed and unfinished
    assert cells("_staging/**/*.parquet") == N_CELLS
    assert cells("summary/*/*/*.parquet") == 2 * 16


def test_duckdb_scores_query_reads_only_the_committed_run(root):
    relation = duckdb.sql(_sql("committed scores", root))
    columns, result = relation.columns, relation.fetchall()
    run_ids = {dict(zip(columns, r))["run_id"] for r in result}
    assert len(result) == N_CELLS and run_ids == {RUN_ID}


def test_duckdb_summary_query_reads_the_overall_rows_of_the_committed_run(run, root):
    got = duckdb.sql(_sql("committed summaries", root)).fetchall()
    want = sorted(
        (r["metric"], r["n_total"], r["n_ok"], r["mean"])
        for r in pq.read_table(run.layout.summary_path).to_pylist()
        if r["slice_column"] is None
    )
    assert [(str(r[0]), r[1], r[2], r[3], r[4], r[5]) for r in got] == [
        (RUN_DATE, RUN_ID, *w) for w in want
    ]


def test_duckdb_manifest_query(root):
    got = duckdb.sql(_sql("committed manifests", root)).fetchall()
    assert [(r[0], str(r[1]), r[2], r[3]) for r in got] == [(RUN_ID, RUN_DATE, 9, 2000)]


def test_polars_query_reads_only_the_committed_run(frames):
    scores = frames["scores"].collect()
    summary = frames["summary"].collect()
    assert scores.height == N_CELLS and scores["run_id"].unique().to_list() == [RUN_ID]
    assert summary["run_id"].unique().to_list() == [RUN_ID]
    assert summary.height == 16  # 2 metrics x (overall + 5 app values + 2 tier values)
    assert scores.filter(pl.col("run_date") == pl.date(2026, 1, 15)).height == N_CELLS
