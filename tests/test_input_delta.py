"""Delta Lake tables as input (``input.format: delta``, :mod:`ragbatch.io.formats.delta`).

The tables are real: written with the ``deltalake`` package on local disk and on the
loopback S3 endpoint (moto), from the two nights of ARES traces the repository ships
(examples/data/nightly), and the runs are real (in-process, as ``ragbatch run`` runs a job
of expression metrics). Each cell a run scores from the table is compared with the cell
of the same row scored from a Parquet file of the same rows.
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

deltalake = pytest.importorskip("deltalake")


def write_delta(uri: str, options: dict | None = None) -> None:
    """The two nights as a Delta table partitioned by ``run_date``: version 0 holds the
    first night, version 1 adds the second."""
    for night in NIGHTS:
        deltalake.write_deltalake(
            uri,
            night_rows(night),
            partition_by=["run_date"],
            mode="append",
            storage_options=options,
        )


@pytest.mark.parametrize("executor", ["in_process", pytest.param("ray", marks=pytest.mark.slow)])
def test_cells_from_a_delta_table_equal_those_from_parquet(tmp_path, request, executor):
    if executor == "ray":
        request.getfixturevalue("ray_local")  # the data files are read through Ray Data
    table = tmp_path / "traces"
    write_delta(str(table))
    run_job(job(str(table), tmp_path / "out", executor, format="delta"), run_id="delta")
    assert manifest(tmp_path / "out", "delta")["ray"]["executor"] == executor
    got = scores(tmp_path / "out", "delta")
    assert len(got) == 32 * len(METRICS)
    assert got == parquet_scores(tmp_path, NIGHTS)
    info = manifest(tmp_path / "out", "delta")
    assert info["input"]["fingerprint"]["table"] == {"format": "delta", "version": 1}
    assert info["config"]["input"]["version"] == 1  # the latest, pinned
    assert len(info["input"]["fingerprint"]["files"]) == 2


def test_a_version_reads_the_table_as_it_was(tmp_path):
    table = tmp_path / "traces"
    write_delta(str(table))
    run_job(job(str(table), tmp_path / "out", format="delta", version=0), run_id="v0")
    got = scores(tmp_path / "out", "v0")
    assert got == parquet_scores(tmp_path, NIGHTS[:1])
    assert manifest(tmp_path / "out", "v0")["input"]["fingerprint"]["table"]["version"] == 0


def test_a_partition_filter_reads_only_that_partitions_files(tmp_path):
    table = tmp_path / "traces"
    write_delta(str(table))
    # The other night's data files are gone: a reader that opened them would fail.
    for path in (table / f"run_date={NIGHTS[0]}").glob("*.parquet"):
        path.unlink()
    cfg = job(str(table), tmp_path / "out", format="delta", filter=[["run_date", "=", NIGHTS[1]]])
    run_job(cfg, run_id="night2")
    assert scores(tmp_path / "out", "night2") == parquet_scores(tmp_path, NIGHTS[1:])
    files = manifest(tmp_path / "out", "night2")["input"]["fingerprint"]["files"]
    assert [Path(f["path"]).parent.name for f in files] == [f"run_date={NIGHTS[1]}"]


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

    table = tmp_path / "traces"
    write_delta(str(table))
    cfg = job(str(table), tmp_path / "out", format="delta", filter=[condition]).input
    _, files = discover(cfg)
    assert sorted({dict(f.partition)["run_date"] for f in files}) == list(nights)


def test_a_resume_reads_the_version_its_first_attempt_read(tmp_path):
    """Attempt 1 reads version 0 and stops on the error budget; the table then gets a
    new version; attempt 2 still reads version 0 and commits its rows only."""
    from support.binary_callbacks import FIRST_ATTEMPT_MARKER

    table = tmp_path / "traces"
    rows = night_rows(NIGHTS[0])
    rows = rows.append_column("folder", pa.array([str(tmp_path)] * rows.num_rows))
    questions = rows.column("Question").to_pylist()
    rows = rows.set_column(
        rows.column_names.index("Question"),
        "Question",
        pa.array([("flaky " if i == 3 else "") + q for i, q in enumerate(questions)]),
    )
    deltalake.write_deltalake(str(table), rows, partition_by=["run_date"])
    cfg = JobConfig.from_dict(
        {
            "run": {"name": "lake", "executor": "in_process", "error_budget": 0},
            "input": {
                "uri": str(table),
                "format": "delta",
                "columns": {
                    "row_id": "row_id",
                    "question": "Question",
                    "answer": "Answer",
                    "reference": "folder",
                },
            },
            "output": {"uri": str(tmp_path / "out")},
            "metrics": [
                {
                    "name": "binary",
                    "id": "digit",
                    "params": {"callback": "support.binary_callbacks:flaky_digit", "mode": "row"},
                }
            ],
        }
    )
    (tmp_path / FIRST_ATTEMPT_MARKER).touch()
    with pytest.raises(RunError):
        run_job(cfg, run_id="again")
    later = night_rows(NIGHTS[1]).append_column("folder", pa.array([str(tmp_path)] * 16))
    deltalake.write_deltalake(str(table), later, partition_by=["run_date"], mode="append")
    (tmp_path / FIRST_ATTEMPT_MARKER).unlink()
    run_job(cfg, run_id="again")
    info = manifest(tmp_path / "out", "again")
    assert info["input"]["fingerprint"]["table"] == {"format": "delta", "version": 0}
    assert info["resume"]["attempt"] == 2
    got = scores_plain(tmp_path / "out", "again")
    answers = rows.column("Answer").to_pylist()
    want = sorted(
        (f"{NIGHTS[0]}:{i}", float(any(ch.isdigit() for ch in a)), "ok")
        for i, a in enumerate(answers)
    )
    assert got == want


def test_a_delta_table_on_s3(tmp_path, s3_storage_options, s3_bucket):
    from ragbatch.io.formats.delta import object_store_options

    uri = f"s3://{s3_bucket}/lake/traces"
    options = {
        **object_store_options(uri, s3_storage_options),
        "AWS_S3_ALLOW_UNSAFE_RENAME": "true",
    }
    write_delta(uri, options)
    cfg = job(uri, tmp_path / "out", format="delta", storage_options=s3_storage_options)
    run_job(cfg, run_id="s3")
    assert scores(tmp_path / "out", "s3") == parquet_scores(tmp_path, NIGHTS)
    assert manifest(tmp_path / "out", "s3")["input"]["fingerprint"]["table"]["version"] == 1


# --------------------------------------------------------------------------- bad input


def test_a_missing_table_exits_2_before_any_work(tmp_path):
    (tmp_path / "empty").mkdir()
    code, err = cli_run(tmp_path, job(str(tmp_path / "empty"), tmp_path / "out", format="delta"))
    assert code == 2
    assert "no Delta table there" in err and "_delta_log" in err
    assert not (tmp_path / "out" / "_staging").exists()


def test_a_version_the_table_lacks_exits_2_naming_the_latest(tmp_path):
    write_delta(str(tmp_path / "traces"))
    cfg = job(str(tmp_path / "traces"), tmp_path / "out", format="delta", version=7)
    code, err = cli_run(tmp_path, cfg)
    assert code == 2
    assert "cannot read version 7" in err and "the latest version is 1" in err
    assert not (tmp_path / "out" / "_staging").exists()


def test_a_mapped_column_the_table_lacks_is_named(tmp_path):
    write_delta(str(tmp_path / "traces"))
    cfg = JobConfig.from_dict(
        {
            **job(str(tmp_path / "traces"), tmp_path / "out", format="delta").model_dump(
                mode="json", exclude_none=True
            ),
        }
    )
    cfg.input.columns.answer = "Reply"
    code, err = cli_run(tmp_path, cfg)
    assert code == 2
    assert "Reply" in err
    assert not (tmp_path / "out" / "_staging").exists()


def test_a_condition_on_another_column_filters_the_rows_read(tmp_path):
    """A partition condition chooses the files; a condition on another column keeps the
    rows of those files that meet it."""
    table = tmp_path / "traces"
    write_delta(str(table))
    for path in (table / f"run_date={NIGHTS[0]}").glob("*.parquet"):
        path.unlink()  # never opened: the partition condition leaves them out
    conditions = [["run_date", "=", NIGHTS[1]], ["Reaction", "!=", "no_reaction"]]
    cfg = job(str(table), tmp_path / "out", format="delta", filter=conditions)
    run_job(cfg, run_id="thumbs")
    got = scores(tmp_path / "out", "thumbs")
    want = parquet_scores(tmp_path, NIGHTS[1:], keep=lambda r: r["Reaction"] != "no_reaction")
    assert got == want
    assert 0 < len(got) < 16 * len(METRICS)


def test_a_filter_on_a_column_the_table_lacks_is_refused(tmp_path):
    from ragbatch.io.listing import discover

    write_delta(str(tmp_path / "traces"))
    cfg = job(
        str(tmp_path / "traces"), tmp_path / "out", format="delta", filter=[["Reply", "=", "x"]]
    )
    with pytest.raises(InputError, match="'Reply', which is not a column of the Delta table"):
        discover(cfg.input)


def test_a_filter_matching_nothing_is_an_input_error(tmp_path):
    from ragbatch.io.listing import discover

    write_delta(str(tmp_path / "traces"))
    cfg = job(
        str(tmp_path / "traces"),
        tmp_path / "out",
        format="delta",
        filter=[["run_date", "=", "1999-01-01"]],
    )
    with pytest.raises(InputError, match="no data file meets input.filter"):
        discover(cfg.input)


def test_a_missing_table_raises_input_not_found(tmp_path):
    from ragbatch.io.listing import discover

    cfg = job(str(tmp_path / "nowhere"), tmp_path / "out", format="delta")
    with pytest.raises(InputNotFoundError):
        discover(cfg.input)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"format": "parquet", "version": 3}, "input.version applies to input.format delta,"),
        ({"filter": [["a", "=", 1]]}, "input.filter applies to input.format delta or iceberg"),
        (
            {"format": "delta", "snapshot_id": 3},
            "input.snapshot_id applies to input.format iceberg",
        ),
        ({"format": "delta", "filter": [["a", "~", 1]]}, "unknown operator '~'"),
        ({"format": "delta", "filter": [["a", "in", 1]]}, "take a list of values"),
        ({"format": "delta", "version": -1}, "greater than or equal to 0"),
        ({"format": "deltalake"}, "unknown input format 'deltalake'"),
    ],
)
def test_table_options_are_checked_in_the_config(tmp_path, fields, message):
    with pytest.raises(ConfigError, match=message):
        job(str(tmp_path), tmp_path / "out", **fields)


def test_a_missing_package_names_the_extra(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "deltalake" else real(name, *a),
    )
    with pytest.raises(ConfigError, match=r"pip install 'ragbatch\[delta\]'"):
        job(str(tmp_path), tmp_path / "out", format="delta")


def test_s3_options_become_object_store_options():
    from ragbatch.io.formats.delta import object_store_options

    fsspec_options = {
        "key": "AK",
        "secret": "SK",
        "token": "T",
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1"},
    }
    assert object_store_options("s3://b/t", fsspec_options) == {
        "AWS_ACCESS_KEY_ID": "AK",
        "AWS_SECRET_ACCESS_KEY": "SK",
        "AWS_SESSION_TOKEN": "T",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "eu-west-1",
    }
    assert object_store_options("/local/table", fsspec_options) == {}
    assert object_store_options("s3://b/t", {"anon": True}) == {"AWS_SKIP_SIGNATURE": "true"}


def test_a_mapped_column_of_another_type_is_refused_before_any_work(tmp_path):
    """An answer column of integers in the table: refused as with Parquet input, naming
    the column and its type, before staging is written."""
    rows = pa.table(
        {
            "row_id": ["r0", "r1", "r2"],
            "Question": ["q0", "q1", "q2"],
            "Document": ["d0", "d1", "d2"],
            "Answer": pa.array([1, 22, None], pa.int64()),
            "run_date": [NIGHTS[0]] * 3,
            "Reaction": ["a", "b", "c"],
        }
    )
    deltalake.write_deltalake(str(tmp_path / "typed"), rows, partition_by=["run_date"])
    code, err = cli_run(tmp_path, job(str(tmp_path / "typed"), tmp_path / "out", format="delta"))
    assert code == 2
    assert "input.columns.answer: column 'Answer' has type int64" in err
    assert not (tmp_path / "out" / "_staging").exists()


@pytest.mark.parametrize(
    ("condition", "kept"),
    [
        (["n", "=", 2], [1]),
        (["n", "!=", 2], [0, 2, 3]),  # null meets !=
        (["n", "<", "3"], [0, 1]),  # the text is cast to the column's type
        (["n", "in", [1, 3]], [0, 2]),
        (["n", "not in", [1, 3]], [1, 3]),  # null meets not in
        (["n", "=", None], [3]),
        (["d", ">=", "2026-11-28"], [1, 2]),
        (["s", "=", "b"], [1]),
    ],
)
def test_filter_rows_compares_in_the_column_type(condition, kept):
    import datetime as dt

    from ragbatch.io.formats import filter_rows

    table = pa.table(
        {
            "i": [0, 1, 2, 3],
            "n": pa.array([1, 2, 3, None], pa.int64()),
            "d": [dt.date(2026, 11, 27), dt.date(2026, 11, 28), dt.date(2026, 11, 29), None],
            "s": ["a", "b", "c", None],
        }
    )
    assert filter_rows(table, [condition]).column("i").to_pylist() == kept
    assert filter_rows(table, [condition], skip=frozenset({condition[0]})).num_rows == 4


def test_filter_rows_refuses_a_value_of_another_type():
    from ragbatch.io.formats import filter_rows

    table = pa.table({"n": pa.array([1, 2], pa.int64())})
    with pytest.raises(InputError, match="does not fit the column's type int64"):
        filter_rows(table, [["n", "=", "two"]])
