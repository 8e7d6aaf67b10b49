"""`validate`, `run` and `nightly` prove the output root writable with a probe object.

Reproductions: an output under a regular file (what `/etc/passwd/out` is), a directory
this process may not write, a missing bucket on a real S3 endpoint on loopback (moto),
and an endpoint that refuses connections (transient: exit 1, not 2).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from support.nightly_runs import run_cli
from ragbatch.core.errors import OutputError

REPO = Path(__file__).resolve().parents[1]


def _job(tmp_path: Path, output_uri: str, storage_options: dict | None = None) -> Path:
    """A valid one-metric job on a local 2-row input, writing to ``output_uri``."""
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"q": ["a", "b"], "a": ["x", "y"], "ref": ["x", "z"]}), src)
    config = {
        "run": {"name": "probe"},
        "input": {"uri": str(src), "columns": {"question": "q", "answer": "a", "reference": "ref"}},
        "output": {"uri": output_uri, "storage_options": storage_options or {}},
        "metrics": [{"name": "exact_match"}],
    }
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def _under_a_file(tmp_path: Path) -> tuple[Path, str]:
    blocker = tmp_path / "passwd"
    blocker.write_text("root:x:0:0::/root:/bin/sh\n")
    return blocker, str(blocker / "out")


def test_validate_refuses_an_output_under_a_regular_file(tmp_path):
    blocker, uri = _under_a_file(tmp_path)
    code, out, err = run_cli(["validate", str(_job(tmp_path, uri))])
    assert code == 2, (out, err)
    assert f"{uri}: cannot write under output.uri: {blocker} is a regular file" in err
    assert "writable" not in out
    assert blocker.read_text() == "root:x:0:0::/root:/bin/sh\n"


def test_run_and_nightly_refuse_it_before_ray_starts(tmp_path, monkeypatch):
    _, uri = _under_a_file(tmp_path)
    job = _job(tmp_path, uri)

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started for an output that cannot be written")

    monkeypatch.setattr("ragbatch.pipeline.runner.ensure_ray", no_ray)
    code, _, err = run_cli(["run", str(job)])
    assert code == 2 and "cannot write under output.uri" in err, err
    code, out, err = run_cli(["nightly", str(job), "--run-date", "2026-01-02"])
    assert code == 2 and "cannot write under output.uri" in err, (out, err)


def _without_dac_override() -> None:
    """In the child, before exec: drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the
    bounding set, so that a root process obeys file modes like any other user."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_validate_refuses_a_read_only_directory(tmp_path):
    read_only = tmp_path / "ro"
    read_only.mkdir()
    job = _job(tmp_path, str(read_only / "evals"))
    read_only.chmod(0o555)
    code = "import sys; from ragbatch.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, "validate", str(job)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            preexec_fn=_without_dac_override if os.geteuid() == 0 else None,
        )
    finally:
        read_only.chmod(0o755)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{read_only / 'evals'}: cannot write under output.uri: permission denied" in done.stderr
    assert list(read_only.iterdir()) == []


def test_probe_deletes_only_its_object_and_the_directories_it_made(tmp_path):
    from ragbatch.io.probe import PROBE_PREFIX, probe_output

    root = tmp_path / "new" / "out"
    path = probe_output(str(root))
    assert Path(path).parent == root / "_staging" and Path(path).name.startswith(PROBE_PREFIX)
    assert list(tmp_path.iterdir()) == []  # nothing left, not even the directories
    keep = tmp_path / "old" / "_staging" / "keep.parquet"
    keep.parent.mkdir(parents=True)
    keep.write_bytes(b"x")
    probe_output(str(tmp_path / "old"))
    assert [p.name for p in (tmp_path / "old" / "_staging").iterdir()] == ["keep.parquet"]


def test_validate_refuses_a_missing_bucket_with_exit_2(s3_storage_options, tmp_path):
    uri = "s3://rb-no-such-output-bucket/eval"
    code, out, err = run_cli(["validate", str(_job(tmp_path, uri, s3_storage_options))])
    assert code == 2, (out, err)
    assert (
        f"{uri}: cannot write under output.uri: bucket 'rb-no-such-output-bucket' does not exist"
    ) in err


def test_validate_probes_a_bucket_and_leaves_it_empty(s3_storage_options, s3_bucket, tmp_path):
    import s3fs

    uri = f"s3://{s3_bucket}/eval"
    code, out, err = run_cli(["validate", str(_job(tmp_path, uri, s3_storage_options))])
    assert code == 0, err
    assert f"output {uri}: writable" in out
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3_storage_options)
    assert fs.find(s3_bucket) == []


def test_an_unreachable_endpoint_stays_retryable(tmp_path):
    from ragbatch.core.errors import OutputNotWritableError
    from ragbatch.io.probe import probe_output
    from support.s3_fixtures import _free_port

    options = {
        "endpoint_url": f"http://127.0.0.1:{_free_port()}",
        "key": "k",
        "secret": "s",
        "retries": 1,
        "config_kwargs": {"retries": {"max_attempts": 0}},
    }
    started = time.monotonic()
    with pytest.raises(OutputError) as info:
        probe_output("s3://rb-bucket/eval", options)
    assert not isinstance(info.value, OutputNotWritableError), info.value
    assert "cannot write to the storage service now" in str(info.value)
    assert time.monotonic() - started < 30
    code, _, err = run_cli(["validate", str(_job(tmp_path, "s3://rb-bucket/eval", options))])
    assert code == 1, err
