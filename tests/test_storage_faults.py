"""The S3 endpoint goes down in the middle of a run and comes back: reads and writes are
retried with backoff and the run commits exactly the cells of an undisturbed run.

The fault is real: a moto S3 server of its own on a loopback port is stopped (the port
refuses connections) while the run reads and writes through it, and a new server is
started on the same port a few seconds later. moto keeps bucket contents in this
process, so the restarted endpoint serves the same objects, as a real store would.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import duckdb
import pytest

from ragbatch.config.job import JobConfig
from ragbatch.pipeline.runner import run_job
from support.s3_fixtures import S3_KEY, S3_SECRET, _free_port

pytestmark = pytest.mark.slow

N_FILES, ROWS_PER_FILE = 10, 30
METRICS = [
    {"name": "response_length", "params": {"min_chars": 1, "max_chars": 40}},
    {"name": "exact_match"},
    # 0.6 s per batch: the run is still reading and writing when the endpoint goes down.
    {
        "name": "binary",
        "id": "digit",
        "params": {"callback": "support.binary_callbacks:slow_digit"},
    },
]


def _rows(file_index: int) -> list[dict]:
    return [
        {
            "q": f"q{file_index}-{i}",
            "a": f"answer {i} é中👍" if i % 3 else "",
            "ref": f"answer {i} é中👍",
        }
        for i in range(ROWS_PER_FILE)
    ]


def _config(uri: str, out: str, options: dict | None) -> JobConfig:
    storage = {"storage_options": options} if options else {}
    return JobConfig.from_dict(
        {
            "input": {
                "uri": uri,
                "format": "jsonl",
                **storage,
                "columns": {"question": "q", "answer": "a", "reference": "ref"},
            },
            "output": {"uri": out, **storage},
            "metrics": METRICS,
        }
    )


def _staged_files(bucket: str) -> int:
    """Score files the run has staged so far, read from moto's in-process state."""
    from moto.s3.models import s3_backends

    for backend in s3_backends.values():
        for region in backend.values():
            store = region.buckets.get(bucket)
            if store is not None:
                return sum(
                    1 for k in store.keys.keys() if "/_staging/" in k and k.endswith(".parquet")
                )
    return 0


def _cells(con, root: str) -> dict:
    rows = con.execute(
        f"SELECT row_id, metric, score, status, reason FROM read_parquet('{root}/scores/**/*.parquet', "
        "hive_partitioning=true)"
    ).fetchall()
    assert len(rows) == len({(r[0], r[1]) for r in rows})
    return {(r[0], r[1]): r[2:] for r in rows}


def test_endpoint_down_mid_run_is_retried_and_the_run_commits(ray_local, tmp_path):
    from moto.server import ThreadedMotoServer

    import s3fs

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    options = {"endpoint_url": f"http://127.0.0.1:{port}", "key": S3_KEY, "secret": S3_SECRET}
    fs = s3fs.S3FileSystem(**options)
    bucket = f"rb-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    local = tmp_path / "in"
    local.mkdir()
    for f in range(N_FILES):
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in _rows(f))
        (local / f"part-{f:02d}.jsonl").write_text(text, encoding="utf-8")
        fs.pipe(f"{bucket}/in/part-{f:02d}.jsonl", text.encode("utf-8"))

    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = run_job(
                _config(f"s3://{bucket}/in/", f"s3://{bucket}/out", options), run_id="outage"
            )
        except BaseException as exc:  # handed to the test thread
            outcome["error"] = exc

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    deadline = time.monotonic() + 240
    while _staged_files(bucket) == 0 and runner.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert runner.is_alive(), f"the run ended before the outage: {outcome}"
    server.stop()  # the endpoint refuses connections from here on
    time.sleep(4)
    assert runner.is_alive(), f"the run ended during the outage: {outcome}"
    staged_during_outage = _staged_files(bucket)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        runner.join(timeout=300)
        assert "error" not in outcome, outcome.get("error")
        result = outcome["result"]
        assert staged_during_outage < N_FILES  # files were still to be written when it came back
        assert result.check.n_rows == N_FILES * ROWS_PER_FILE

        reference = run_job(_config(str(local), str(tmp_path / "ref"), None), run_id="reference")
        con = duckdb.connect()
        from ragbatch.io.write import connect

        s3con = connect(result.layout)
        got = _cells(s3con, result.layout.uri(result.layout.root))
        want = _cells(con, reference.layout.root)
        assert len(want) == N_FILES * ROWS_PER_FILE * len(METRICS)
        assert got == want
    finally:
        server.stop()


def test_missing_key_is_not_retried(s3_storage_options, s3_bucket):
    from ragbatch.io.fs import is_transient, resolve, with_storage_retries

    fs, _ = resolve(f"s3://{s3_bucket}/nothing.csv", s3_storage_options)
    calls = []

    def read():
        calls.append(1)
        return fs.cat(f"{s3_bucket}/nothing.csv")

    started = time.monotonic()
    with pytest.raises(FileNotFoundError) as info:
        with_storage_retries(read, "read nothing.csv")
    assert calls == [1] and time.monotonic() - started < 5
    assert not is_transient(info.value)


def test_refused_connection_is_transient_and_retried_until_the_last_attempt():
    from ragbatch.io.fs import is_transient, resolve, with_storage_retries

    port = _free_port()  # nothing listens here
    fs, _ = resolve(
        "s3://b/x", {"endpoint_url": f"http://127.0.0.1:{port}", "key": S3_KEY, "secret": S3_SECRET}
    )
    calls = []

    def read():
        calls.append(1)
        return fs.cat("b/x")

    with pytest.raises(Exception) as info:
        with_storage_retries(read, "read b/x", attempts=2, max_backoff_s=0.1)
    assert len(calls) == 2 and is_transient(info.value)


@pytest.fixture(autouse=True)
def _callbacks_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))


def test_storage_error_patterns_are_added_without_a_warning_and_match_as_before():
    """Ray Data warns about any non-default ``retried_io_errors``; ours are escaped
    patterns that match exactly what the plain substrings matched, set without that
    warning reaching the user."""
    import re
    import warnings

    import ray.data
    from ray._common.retry import matches_error

    from ragbatch.pipeline.runner import RETRIED_STORAGE_ERRORS, _retry_storage_errors

    ctx = ray.data.DataContext()
    defaults = list(ctx.retried_io_errors)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _retry_storage_errors(ctx)
    assert not [w for w in caught if "retried_io_errors" in str(w.message)]
    added = ctx.retried_io_errors[len(defaults) :]
    assert ctx.retried_io_errors[: len(defaults)] == defaults
    assert added == [re.escape(t) for t in RETRIED_STORAGE_ERRORS]
    for text in RETRIED_STORAGE_ERRORS:
        message = f"OSError: An error occurred (x): {text} while writing part-0.parquet"
        assert any(matches_error(p, message) for p in added)
    # A bucket that does not exist is not retried.
    assert not any(
        matches_error(p, "NoSuchBucket: The specified bucket does not exist") for p in added
    )
