"""Reading from S3 through a real HTTP endpoint (moto server on loopback)."""

from __future__ import annotations

import io
import socket

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragbatch.config.job import InputSection
from ragbatch.core.errors import InputError
from ragbatch.io import input_fingerprint, normalize, peek_schema, plan_read, read_task, resolve
from ragbatch.io.fs import describe_storage_error

s3fs = pytest.importorskip("s3fs")


def upload(storage_options: dict, files: dict[str, bytes]) -> None:
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **storage_options)
    for path, data in files.items():
        fs.pipe(path, data)


def parquet_bytes(table: pa.Table, **kwargs) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, **kwargs)
    return sink.getvalue()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_csv_on_s3(s3_storage_options, s3_bucket):
    upload(s3_storage_options, {f"{s3_bucket}/in/traces.csv": b"q,a\nwhat?,007\nwhy?,\n"})
    config = InputSection(
        uri=f"s3://{s3_bucket}/in/traces.csv",
        storage_options=s3_storage_options,
        columns={"question": "q", "answer": "a"},
    )
    tasks = plan_read(config)
    assert [(t.path, t.file_key, t.format) for t in tasks] == [
        (f"{s3_bucket}/in/traces.csv", "traces.csv", "csv")
    ]
    raw = read_task(tasks[0], config)
    assert raw.to_pydict() == {"q": ["what?", "why?"], "a": ["007", None]}
    out = normalize(raw, config, tasks[0])
    assert out["row_id"].to_pylist() == ["traces.csv:0", "traces.csv:1"]
    assert peek_schema(config) == pa.schema([("q", pa.string()), ("a", pa.string())])


def test_partitioned_parquet_dataset_on_s3(s3_storage_options, s3_bucket):
    big = pa.table({"q": [f"q{i}" for i in range(30)]})
    upload(
        s3_storage_options,
        {
            f"{s3_bucket}/ds/day=2024-01-02/part-0.parquet": parquet_bytes(big, row_group_size=10),
            f"{s3_bucket}/ds/day=2024-01-01/part-0.parquet": parquet_bytes(
                pa.table({"q": ["only"]})
            ),
            f"{s3_bucket}/ds/_SUCCESS": b"",
        },
    )
    config = InputSection(uri=f"s3://{s3_bucket}/ds", storage_options=s3_storage_options)
    tasks = plan_read(config, target_rows_per_task=20)
    assert [(t.file_key, t.row_offset, t.row_groups) for t in tasks] == [
        ("day=2024-01-01/part-0.parquet", 0, None),
        ("day=2024-01-02/part-0.parquet", 0, (0, 1)),
        ("day=2024-01-02/part-0.parquet", 20, (2,)),
    ]
    tables = [read_task(t, config) for t in tasks]
    assert [t.num_rows for t in tables] == [1, 20, 10]
    assert tables[2].to_pydict() == {
        "q": [f"q{i}" for i in range(20, 30)],
        "day": ["2024-01-02"] * 10,
    }
    assert peek_schema(config) == pa.schema([("q", pa.string()), ("day", pa.string())])
    fingerprint = input_fingerprint(config, tasks)
    assert [f["path"] for f in fingerprint["files"]] == [
        f"s3://{s3_bucket}/ds/day=2024-01-01/part-0.parquet",
        f"s3://{s3_bucket}/ds/day=2024-01-02/part-0.parquet",
    ]
    assert all(f["etag_or_mtime"] for f in fingerprint["files"])


def test_glob_on_s3(s3_storage_options, s3_bucket):
    upload(
        s3_storage_options,
        {
            f"{s3_bucket}/g/a.jsonl": b'{"q": "a"}\n',
            f"{s3_bucket}/g/b.jsonl": b'{"q": "b"}\n',
            f"{s3_bucket}/g/c.csv": b"q\nc\n",
        },
    )
    config = InputSection(uri=f"s3://{s3_bucket}/g/*.jsonl", storage_options=s3_storage_options)
    tasks = plan_read(config)
    assert [t.file_key for t in tasks] == ["a.jsonl", "b.jsonl"]
    assert [read_task(t, config)["q"][0].as_py() for t in tasks] == ["a", "b"]


def test_missing_bucket_is_an_input_error(s3_storage_options):
    uri = "s3://rb-no-such-bucket-here/x.csv"
    with pytest.raises(InputError) as info:
        plan_read(InputSection(uri=uri, storage_options=s3_storage_options))
    assert str(info.value).startswith(f"{uri}: not found")


def test_missing_key_is_an_input_error(s3_storage_options, s3_bucket):
    uri = f"s3://{s3_bucket}/nothing/here.parquet"
    with pytest.raises(InputError, match="not found") as info:
        plan_read(InputSection(uri=uri, storage_options=s3_storage_options))
    assert uri in str(info.value)


@pytest.mark.slow  # waits out the connection retries to a closed port
def test_wrong_endpoint_fails_with_the_uri():
    options = {"endpoint_url": f"http://127.0.0.1:{closed_port()}", "key": "k", "secret": "s"}
    uri = "s3://some-bucket/traces/"
    with pytest.raises(InputError) as info:
        plan_read(InputSection(uri=uri, storage_options=options))
    message = str(info.value)
    assert message.startswith(f"{uri}: cannot reach the storage endpoint")
    assert "endpoint_url" in message


def test_bad_credentials_are_reported(s3_storage_options, s3_bucket):
    upload(s3_storage_options, {f"{s3_bucket}/t.csv": b"q\n1\n"})
    error = describe_storage_error(f"s3://{s3_bucket}/t.csv", PermissionError("Access Denied"))
    assert str(error).startswith(f"s3://{s3_bucket}/t.csv: access denied or no valid credentials")


def test_s3_defaults_and_user_overrides(s3_storage_options):
    fs, path = resolve(
        "s3://b/k.csv", {**s3_storage_options, "config_kwargs": {"read_timeout": 99}}
    )
    assert path == "b/k.csv"
    assert fs.retries == 2
    assert fs.config_kwargs["read_timeout"] == 99
    assert fs.config_kwargs["connect_timeout"] == 5
    assert fs.config_kwargs["retries"] == {"max_attempts": 3, "mode": "standard"}
    fs, _ = resolve("s3://b/k.csv", {**s3_storage_options, "retries": 7})
    assert fs.retries == 7


def test_storage_error_advice_names_the_config_section():
    error = describe_storage_error(
        "s3://b/out", FileNotFoundError("NoSuchBucket"), section="output"
    )
    assert str(error) == (
        "s3://b/out: not found (NoSuchBucket); check that the bucket and path in "
        "output.uri exist and are spelled right"
    )
