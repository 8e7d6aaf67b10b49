"""Every command that opens an output root takes its storage options.

A real S3 endpoint on loopback (moto) whose endpoint and credentials are ONLY in storage
options: the environment has no AWS endpoint, no credentials, no profile files and no
instance metadata, so a request sent without the options fails at once for want of
credentials (and could not reach AWS anyway) instead of silently going elsewhere.
"""

from __future__ import annotations

import json
import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from support.nightly_runs import run_cli
from ragbatch.core.errors import ConfigError

s3fs = pytest.importorskip("s3fs")

# exact_match per row: the baseline input matches rows 0 and 1 of 4 (mean 0.5), the
# candidate input all 4 (mean 1.0). Both files are named in.parquet: same row ids.
REFS = ["x", "y", "z", "w"]
BASELINE_ANSWERS = ["x", "y", "no", "no"]
CANDIDATE_ANSWERS = REFS


@pytest.fixture()
def bare_aws_env(monkeypatch, tmp_path):
    for var in [v for v in os.environ if v.startswith("AWS_") and v != "AWS_CA_BUNDLE"]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))


def _input(tmp_path, name: str, answers: list[str]) -> str:
    path = tmp_path / name / "in.parquet"
    path.parent.mkdir()
    pq.write_table(pa.table({"q": ["q0", "q1", "q2", "q3"], "a": answers, "ref": REFS}), path)
    return str(path)


def _job(tmp_path, output_uri: str, options: dict) -> str:
    config = {
        "run": {"name": "storage"},
        "input": {
            "uri": _input(tmp_path, "baseline", BASELINE_ANSWERS),
            "columns": {"question": "q", "answer": "a", "reference": "ref"},
        },
        "output": {"uri": output_uri, "storage_options": options},
        "metrics": [{"name": "exact_match"}],
    }
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(config))
    return str(path)


def _flags(flag: str, options: dict) -> list[str]:
    return [a for k, v in options.items() for a in (flag, f"{k}={v}")]


def _ok(argv: list[str]) -> str:
    code, out, err = run_cli(argv)
    assert code == 0, f"ragbatch {' '.join(argv)} exited {code}: {err[-3000:]}"
    return out


def _exact_match(comparison: dict) -> dict:
    (row,) = [
        m for m in comparison["metrics"] if m["metric"] == "exact_match" and m["slice"] is None
    ]
    return row


def test_analysis_commands_on_s3_with_options_only(
    ray_local, bare_aws_env, s3_storage_options, s3_endpoint, tmp_path
):
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3_storage_options)
    first, second = "rb-first-store", "rb-second-store"
    for bucket in (first, second):
        if not fs.exists(bucket):
            fs.mkdir(bucket)
    root, other = f"s3://{first}/eval", f"s3://{second}/eval"
    job = _job(tmp_path, root, s3_storage_options)
    candidate_input = _input(tmp_path, "candidate", CANDIDATE_ANSWERS)

    # run --report: the report and the comparison with the previous run, on S3
    _ok(["run", job, "--run-id", "base", "--report"])
    out = _ok(["run", job, "--run-id", "cand", "--input", candidate_input, "--report"])
    assert "comparison:" in out and "with base" in out
    fs.invalidate_cache()
    reports = fs.glob(f"{first}/eval/reports/run_date=*/run_id=cand/*")
    assert sorted(p.rsplit("/", 1)[1] for p in reports) == [
        "comparison.json",
        "comparison.txt",
        "report.html",
    ]
    published = json.loads(fs.cat([p for p in reports if p.endswith(".json")][0]))
    assert published["baseline"]["run_id"] == "base"
    assert (
        _exact_match(published)["baseline_mean"],
        _exact_match(published)["candidate_mean"],
        _exact_match(published)["mean_diff"],
        _exact_match(published)["n_pairs"],
    ) == (0.5, 1.0, 0.5, 4)

    # nightly, on another bucket (through --output), with its comparison
    _ok(["nightly", job, "--output", other, "--run-date", "2026-01-01"])
    _ok(["nightly", job, "--output", other, "--run-date", "2026-01-02", "--input", candidate_input])
    fs.invalidate_cache()
    (nightly,) = fs.glob(
        f"{second}/eval/reports/run_date=2026-01-02/run_id=nightly-2026-01-02/comparison.json"
    )
    assert _exact_match(json.loads(fs.cat(nightly)))["mean_diff"] == 0.5

    # report and compare: options on the command line only
    options = _flags("--storage-option", s3_storage_options)
    html = tmp_path / "report.html"
    _ok(["report", "--output", root, "cand", "--baseline", "base", "-o", str(html), *options])
    assert "cand" in html.read_text(encoding="utf-8") and "base" in html.read_text(encoding="utf-8")
    compared = tmp_path / "compare.json"
    _ok(
        [
            "compare",
            "--output",
            root,
            "base",
            "nightly-2026-01-02",
            "--candidate-output",
            other,
            *options,
            *_flags("--candidate-storage-option", s3_storage_options),
            "--json",
            str(compared),
        ]
    )
    result = json.loads(compared.read_text())
    assert (result["candidate"]["root"], _exact_match(result)["mean_diff"]) == (other, 0.5)

    # without the options: a clear error at once, not a request that leaves loopback. A
    # filesystem cached in this process by an earlier test (fsspec caches instances by their
    # arguments, so one made while AWS_ENDPOINT_URL was set would be reused) is dropped
    # first: a `ragbatch` process starts with none.
    s3fs.S3FileSystem.clear_instance_cache()
    started = time.monotonic()
    code, _, err = run_cli(["compare", "--output", root, "base", "cand"])
    assert code == 2 and root in err, err
    code, _, err = run_cli(
        [
            "compare",
            "--output",
            root,
            "base",
            "nightly-2026-01-02",
            "--candidate-output",
            other,
            *options,
        ]
    )
    assert code == 2 and other in err, err
    assert time.monotonic() - started < 60


def test_storage_option_flags_parse_to_nested_options():
    from ragbatch.io.options import parse_storage_option, storage_options_from

    pairs = [
        parse_storage_option(t)
        for t in (
            "endpoint_url=http://127.0.0.1:9000",
            "anon=false",
            "config_kwargs.connect_timeout=2",
            "config_kwargs.retries.mode=standard",
            "secret='0123'",
            "token=",
        )
    ]
    assert storage_options_from(pairs, "--storage-option") == {
        "endpoint_url": "http://127.0.0.1:9000",
        "anon": False,
        "secret": "0123",
        "token": "",
        "config_kwargs": {"connect_timeout": 2, "retries": {"mode": "standard"}},
    }


@pytest.mark.parametrize("text", ["anon", "=1", "a..b=1", "client_kwargs={a: 1}"])
def test_storage_option_flag_errors(text):
    from ragbatch.io.options import parse_storage_option

    with pytest.raises(ValueError, match="KEY=VALUE|single value"):
        parse_storage_option(text)


def test_storage_option_given_twice():
    from ragbatch.io.options import parse_storage_option, storage_options_from

    with pytest.raises(ConfigError, match="given twice"):
        storage_options_from([parse_storage_option("a.b=1"), parse_storage_option("a=2")], "--x")
    with pytest.raises(ConfigError, match="already has a value"):
        storage_options_from([parse_storage_option("a=2"), parse_storage_option("a.b=1")], "--x")


def test_s3_retry_defaults_give_way_to_the_environment(monkeypatch):
    from ragbatch.io.fs import resolve

    options = {
        "endpoint_url": "http://127.0.0.1:1",
        "key": "k",
        "secret": "s",
        "skip_instance_cache": True,
    }
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "7")
    monkeypatch.setenv("AWS_RETRY_MODE", "adaptive")
    fs, _ = resolve("s3://bucket/x", options)
    fs.connect()
    assert fs.s3._client_config.retries == {"mode": "adaptive", "total_max_attempts": 7}
