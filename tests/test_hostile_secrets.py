"""Credentials written into an input or output URI (``s3://key:secret@bucket/...``) never
reach a printed error, even where the storage client quotes the bucket name it was given
(the userinfo then sits in it, with no scheme for the URL redaction to find)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import s3fs
import yaml

from ragbatch.cli import main
from ragbatch.core.redact import redact_text
from ragbatch.io.fs import describe_storage_error

KEY, SECRET = "AKIAHOSTILE0000001", "hostileSecretValue0123456789"


@pytest.fixture(autouse=True)
def _fresh_s3_filesystems():
    """Leave no S3 filesystem cached with this module's endpoint and no credentials
    (fsspec keeps instances by their options, and a later test on the same endpoint
    would get this one)."""
    yield
    s3fs.S3FileSystem.clear_instance_cache()


def test_a_storage_error_quoting_the_bucket_leaves_out_the_uri_userinfo():
    exc = ValueError(f'Invalid bucket name "{KEY}:{SECRET}@bkt": Bucket name must match')
    message = redact_text(str(describe_storage_error(f"s3://{KEY}:{SECRET}@bkt/in/x.parquet", exc)))
    assert KEY not in message and SECRET not in message
    assert message.startswith("s3://bkt/in/x.parquet: cannot read (ValueError: ")
    assert '"***@bkt"' in message


def test_validate_and_run_print_no_credential_of_an_s3_uri(tmp_path, capsys, s3_storage_options):
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"q": ["a"], "a": ["x"]}), source)
    config = {
        "run": {"name": "creds", "executor": "in_process"},
        "input": {
            "uri": f"s3://{KEY}:{SECRET}@bkt/in/p.parquet",
            "columns": {"question": "q", "answer": "a"},
            "storage_options": {"endpoint_url": s3_storage_options["endpoint_url"]},
        },
        "output": {"uri": str(tmp_path / "out")},
        "metrics": [{"name": "response_length", "params": {"min_chars": 1, "max_chars": 5}}],
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    for argv in (["validate", str(path)], ["run", str(path)]):
        assert main(argv) == 2
        captured = capsys.readouterr()
        printed = captured.out + captured.err
        assert "cannot read" in printed
        assert KEY not in printed and SECRET not in printed, printed
