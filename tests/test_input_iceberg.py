"""Apache Iceberg tables as input (``input.format: iceberg``,
:mod:`ragbatch.io.formats.iceberg`).

The tables are real: written with ``pyiceberg`` through its SQL catalog on a SQLite file,
their data on local disk or on the loopback S3 endpoint (moto), from the two nights of
ARES traces the repository ships (examples/data/nightly). The runs are real (in-process).
Each cell a run scores from the table is compared with the cell of the same row scored
from a Parquet file of the same rows.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from support.lake_tables import (
    METRICS,
    NIGHTS,
    cli_run,
    job,
    manifest,
    night_rows,
    parquet_scores,
    scores,
    scores_plain,
)
from ragbatch.config.job import JobConfig
from ragbatch.core.errors import ConfigError, InputError, InputNotFoundError, RunError
from ragbatch.pipeline.runner import run_job

pytest.importorskip("pyiceberg")


def catalog_of(tmp_path: Path, warehouse: str, extra: dict | None = None) -> dict:
    """``input.catalog`` of a SQLite catalog in ``tmp_path``."""
    return {"uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": warehouse, **(extra or {})}


def write_iceberg(props: dict, rows: list[pa.Table] | None = None) -> tuple[str, list[int]]:
    """The nights (or ``rows``, one append each) as table ``rag.traces`` partitioned by
    ``run_date`` (identity); its location and its snapshot ids, oldest first."""
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("default", **{"type": "sql", **props})
    catalog.create_namespace_if_not_exists("rag")
    appends = rows if rows is not None else [night_rows(n) for n in NIGHTS]
    table = catalog.create_table("rag.traces", schema=appends[0].schema)
    with table.update_spec() as spec:
        spec.add_identity("run_date")
    for part in appends:
        table.append(part)
    return table.location(), [s.snapshot_id for s in table.snapshots()]


def iceberg_job(tmp_path: Path, location: str, props: dict, **fields) -> JobConfig:
    return job(
        location, tmp_path / "out", format="iceberg", table="rag.traces", catalog=props, **fields
    )


@pytest.mark.parametrize("executor", ["in_process", pytest.param("ray", marks=pytest.mark.slow)])
def test_cells_from_an_iceberg_table_equal_those_from_parquet(tmp_path, request, executor):
    if executor == "ray":
        request.getfixturevalue("ray_local")  # the data files are read through Ray Data
    props = catalog_of(tmp_path, f"file://{tmp_path}/wh")
    location, snapshots = write_iceberg(props)
    cfg = iceberg_job(tmp_path, location, props)
    cfg.run.executor = executor
    run_job(cfg, run_id="iceberg")
    assert manifest(tmp_path / "out", "iceberg")["ray"]["executor"] == executor
    got = scores(tmp_path / "out", "iceberg")
    assert len(got) == 32 * len(METRICS)
    assert got == parquet_scores(tmp_path, NIGHTS)
    info = manifest(tmp_path / "out", "iceberg")
    assert info["input"]["fingerprint"]["table"] == {
        "format": "iceberg",
        "snapshot_id": snapshots[-1],
    }
    assert info["config"]["input"]["snapshot_id"] == snapshots[-1]  # the current one, pinned


def test_a_snapshot_reads_the_table_as_it_was(tmp_path):
    props = catalog_of(tmp_path, f"file://{tmp_path}/wh")
    location, snapshots = write_iceberg(props)
    run_job(iceberg_job(tmp_path, location, props, snapshot_id=snapshots[0]), run_id="first")
    assert scores(tmp_path / "out", "first") == parquet_scores(tmp_path, NIGHTS[:1])


def test_a_partition_filter_reads_only_that_partitions_files(tmp_path):
    props = catalog_of(tmp_path, f"file://{tmp_path}/wh")
    location, _ = write_iceberg(props)
    # The other night's data files are gone: a reader that opened them would fail.
    gone = list((tmp_path / "wh").rglob(f"run_date={NIGHTS[0]}/*.parquet"))
    assert gone
    for path in gone:
        path.unlink()
    cfg = iceberg_job(tmp_path, location, props, filter=[["run_date", "=", NIGHTS[1]]])
    run_job(cfg, run_id="night2")
    assert scores(tmp_path / "out", "night2") == parquet_scores(tmp_path, NIGHTS[1:])


@pytest.mark.parametrize(
    ("condition", "nights"),
    [
        (["run_date", "!=", NIGHTS[0]], NIGHTS[1:]),
        (["run_date", "<", NIGHTS[1]], NIGHTS[:1]),
        (["run_date", "in", list(NIGHTS)], NIGHTS),
        (["run_date", "not in", [NIGHTS[1]]], NIGHTS[:1]),
    ],
)
def test_filter_operators_pick_the_partitions(tmp_path, condition, nights):
    from ragbatch.io.listing import discover

    props = catalog_of(tmp_path, f"file://{tmp_path}/wh")
    location, _ = write_iceberg(props)
    _, files = discover(iceberg_job(tmp_path, location, props, filter=[condition]).input)
    assert sorted({Path(f.path).parent.name for f in files}) == [f"run_date={n}" for n in nights]


def test_a_resume_reads_the_snapshot_its_first_attempt_read(tmp_path):
    """Attempt 1 reads the first snapshot and stops on the error budget; the table then
    gets a new snapshot; attempt 2 still reads the first one."""
    from pyiceberg.catalog import load_catalog

    from support.binary_callbacks import FIRST_ATTEMPT_MARKER

    rows = night_rows(NIGHTS[0])
    rows = rows.append_column("folder", pa.array([str(tmp_path)] * rows.num_rows))
    questions = rows.column("Question").to_pylist()
    rows = rows.set_column(
        rows.column_names.index("Question"),
        "Question",
        pa.array([("flaky " if i == 3 else "") + q for i, q in enumerate(questions)]),
    )
    props = catalog_of(tmp_path, f"file://{tmp_path}/wh")
    location, snapshots = write_iceberg(props, [rows])
    cfg = iceberg_job(tmp_path, location, props)
    cfg = JobConfig.from_dict(
        {
            **cfg.model_dump(mode="json", exclude_none=True),
            "run": {"name": "lake", "executor": "in_process", "error_budget": 0},
            "metrics": [
                {
                    "name": "binary",
                    "id": "digit",
                    "params": {"callback": "support.binary_callbacks:flaky_digit", "mode": "row"},
                }
            ],
        }
    )
    cfg.input.columns.reference = "folder"
    cfg.input.slice_columns = None
    (tmp_path / FIRST_ATTEMPT_MARKER).touch()
    with pytest.raises(RunError):
        run_job(cfg, run_id="again")
    later = night_rows(NIGHTS[1]).append_column("folder", pa.array([str(tmp_path)] * 16))
    load_catalog("default", **{"type": "sql", **props}).load_table("rag.traces").append(later)
    (tmp_path / FIRST_ATTEMPT_MARKER).unlink()
    run_job(cfg, run_id="again")
    info = manifest(tmp_path / "out", "again")
    assert info["input"]["fingerprint"]["table"] == {
        "format": "iceberg",
        "snapshot_id": snapshots[0],
    }
    assert info["resume"]["attempt"] == 2
    answers = rows.column("Answer").to_pylist()
    want = sorted(
        (f"{NIGHTS[0]}:{i}", float(any(ch.isdigit() for ch in a)), "ok")
        for i, a in enumerate(answers)
    )
    assert scores_plain(tmp_path / "out", "again") == want


def test_an_iceberg_table_on_s3(tmp_path, s3_storage_options, s3_bucket):
    from ragbatch.io.formats.iceberg import catalog_properties

    warehouse = f"s3://{s3_bucket}/wh"
    base = iceberg_job(tmp_path, f"{warehouse}/rag/traces", catalog_of(tmp_path, warehouse))
    base.input.storage_options = s3_storage_options
    props = catalog_properties(base.input)  # the S3 settings as pyiceberg's FileIO takes them
    props.pop("type")
    location, snapshots = write_iceberg(props)
    assert location == f"{warehouse}/rag/traces"
    cfg = iceberg_job(tmp_path, location, catalog_of(tmp_path, warehouse))
    cfg.input.storage_options = s3_storage_options
    run_job(cfg, run_id="s3")
    assert scores(tmp_path / "out", "s3") == parquet_scores(tmp_path, NIGHTS)
    table = manifest(tmp_path / "out", "s3")["input"]["fingerprint"]["table"]
    assert table == {"format": "iceberg", "snapshot_id": snapshots[-1]}


# --------------------------------------------------------------------------- bad input


def test_a_missing_table_exits_2_before_any_work(tmp_path):
    props = catalog_of(tmp_path, f"file://{tmp_path}/wh")
    location, _ = write_iceberg(props)
    cfg = iceberg_job(tmp_path, location, props)
    cfg.input.table = "rag.nothing"
    code, err = cli_run(tmp_path, cfg)
    assert code == 2
    assert "the catalog has no Iceberg table 'rag.nothing'" in err
    assert not (tmp_path / "out" / "_staging").exists()


def test_a_snapshot_the_table_lacks_exits_2_naming_its_snapshots(tmp_path):
    props = catalog_of(tmp_path, f"file://{tmp_path}/wh")
    location, snapshots = write_iceberg(props)
    code, err = cli_run(tmp_path, iceberg_job(tmp_path, location, props, snapshot_id=12345))
    assert code == 2
    assert "has no snapshot 12345" in err and str(snapshots[-1]) in err
    assert not (tmp_path / "out" / "_staging").exists()


def test_a_mapped_column_the_table_lacks_exits_2(tmp_path):
    props = catalog_of(tmp_path, f"file://{tmp_path}/wh")
    location, _ = write_iceberg(props)
    cfg = iceberg_job(tmp_path, location, props)
    cfg.input.columns.answer = "Reply"
    code, err = cli_run(tmp_path, cfg)
    assert code == 2
    assert "Reply" in err
    assert not (tmp_path / "out" / "_staging").exists()


def test_a_uri_other_than_the_tables_location_is_refused(tmp_path):
    from ragbatch.io.listing import discover

    props = catalog_of(tmp_path, f"file://{tmp_path}/wh")
    location, _ = write_iceberg(props)
    cfg = iceberg_job(tmp_path, str(tmp_path / "elsewhere"), props)
    with pytest.raises(InputError, match="the catalog places the Iceberg table rag.traces at"):
        discover(cfg.input)
    assert location.endswith("/wh/rag/traces")


def test_a_condition_on_another_column_filters_the_rows_read(tmp_path):
    props = catalog_of(tmp_path, f"file://{tmp_path}/wh")
    location, _ = write_iceberg(props)
    for path in (tmp_path / "wh").rglob(f"run_date={NIGHTS[0]}/*.parquet"):
        path.unlink()  # never opened: the partition condition leaves them out
    conditions = [["run_date", "=", NIGHTS[1]], ["Reaction", "!=", "no_reaction"]]
    run_job(iceberg_job(tmp_path, location, props, filter=conditions), run_id="thumbs")
    got = scores(tmp_path / "out", "thumbs")
    want = parquet_scores(tmp_path, NIGHTS[1:], keep=lambda r: r["Reaction"] != "no_reaction")
    assert got == want
    assert 0 < len(got) < 16 * len(METRICS)


def test_a_filter_on_a_column_the_table_lacks_is_refused(tmp_path):
    from ragbatch.io.listing import discover

    props = catalog_of(tmp_path, f"file://{tmp_path}/wh")
    location, _ = write_iceberg(props)
    cfg = iceberg_job(tmp_path, location, props, filter=[["Reply", "=", "x"]])
    with pytest.raises(InputError, match="'Reply', which is not a column of the Iceberg table"):
        discover(cfg.input)


def test_a_missing_catalog_database_is_named(tmp_path):
    from ragbatch.io.listing import discover

    cfg = iceberg_job(tmp_path, str(tmp_path), {"warehouse": str(tmp_path)})
    with pytest.raises(InputError, match="the SQL catalog needs its database: uri: sqlite:///"):
        discover(cfg.input)


def test_a_missing_namespace_is_input_not_found(tmp_path):
    from ragbatch.io.listing import discover

    props = catalog_of(tmp_path, f"file://{tmp_path}/wh")
    cfg = iceberg_job(tmp_path, str(tmp_path), props)
    cfg.input.table = "nowhere.traces"
    with pytest.raises(InputNotFoundError, match="no Iceberg table 'nowhere.traces'"):
        discover(cfg.input)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"format": "iceberg"}, "input.format 'iceberg' needs input.table"),
        (
            {"format": "iceberg", "table": "a.b", "version": 1},
            "input.version applies to input.format delta,",
        ),
        (
            {"format": "csv", "catalog": {"uri": "x"}},
            "input.catalog applies to input.format iceberg",
        ),
    ],
)
def test_iceberg_options_are_checked_in_the_config(tmp_path, fields, message):
    with pytest.raises(ConfigError, match=message):
        job(str(tmp_path), tmp_path / "out", **fields)


def test_a_missing_package_names_the_extra(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "pyiceberg" else real(name, *a),
    )
    with pytest.raises(ConfigError, match=r"pip install 'ragbatch\[iceberg\]'"):
        job(str(tmp_path), tmp_path / "out", format="iceberg", table="a.b")
