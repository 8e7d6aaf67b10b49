"""Credentials never reach an output: the redaction itself (every credential key name in
every config section, URL userinfo, nested values), and a run, a calibration and a report
against a real S3 endpoint on loopback and an openai judge whose ``base_url`` holds a
password, after which every file written, every object in the bucket and every captured
log line is searched for the seeded secrets."""

from __future__ import annotations

import io
import json
import logging
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from ragbatch.calibrate.config import CalibrationConfig
from ragbatch.config.job import JobConfig
from ragbatch.core.redact import (
    REDACTED,
    RedactingFilter,
    drop_redacted,
    is_credential_key,
    redact,
    redact_text,
    redact_url,
)

REPO = Path(__file__).resolve().parents[1]

#: Key names that hold credentials in fsspec backends (s3fs, gcsfs, adlfs, HTTP headers,
#: botocore client kwargs) and OpenAI-style clients; each must be redacted wherever it is.
CREDENTIAL_KEYS = (
    "key",
    "secret",
    "token",
    "password",
    "credential",
    "credentials",
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
    "session_token",
    "security_token",
    "X-Amz-Security-Token",
    "AWSSecretAccessKey",
    "api_key",
    "apiKey",
    "x-api-key",
    "Authorization",
    "cookie",
    "private_key",
    "private_key_id",
    "client_secret",
    "refresh_token",
    "sas_token",
    "account_key",
    "connection_string",
    "ConnectionString",
    "passphrase",
    "passwd",
    "db_pass",
    "auth",
)

#: Keys that look close to credential names but hold none; their values must stay.
HARMLESS = {
    "key_prefix": "runs/",
    "api_key_env": "JUDGE_API_KEY",
    "max_tokens": 64,
    "tokenizer": "/models/tok",
    "endpoint_url": "http://127.0.0.1:9000",
    "region_name": "eu-west-1",
    "anon": False,
    "client_id": "app-1",
    "account_name": "acct",
    "use_ssl": True,
    "session": "named-profile",
    "profile": "default",
    "requester_pays": True,
}


def _minimal_job() -> dict:
    return {
        "input": {"uri": "/data/in.parquet", "storage_options": {}},
        "output": {"uri": "/data/out", "storage_options": {}},
        "metrics": [{"name": "faithfulness", "engine": "judge"}],
        "engines": {
            "judge": {"type": "vllm", "model": "/models/j", "engine_kwargs": {}},
            "remote": {"type": "openai", "model": "m", "base_url": "http://h/v1"},
        },
        "cache": {"uri": "/data/cache", "storage_options": {}},
        "calibration": {
            "uri": "/data/cal",
            "storage_options": {},
            "min_agreement": {"faithfulness": {"accuracy": 0.5}},
        },
    }


#: Where a free-form mapping sits in a job config: path of keys (ints index lists).
JOB_PLACES = {
    "input.storage_options": ("input", "storage_options"),
    "input.storage_options.config_kwargs": ("input", "storage_options", "config_kwargs"),
    "output.storage_options": ("output", "storage_options"),
    "output.storage_options.client_kwargs": ("output", "storage_options", "client_kwargs"),
    "cache.storage_options": ("cache", "storage_options"),
    "calibration.storage_options": ("calibration", "storage_options"),
    "calibration.storage_options.client_kwargs.headers": (
        "calibration",
        "storage_options",
        "client_kwargs",
        "headers",
    ),
    "engines.judge.engine_kwargs": ("engines", "judge", "engine_kwargs"),
    "metrics[0].params": ("metrics", 0, "params"),
}


def _place(data: dict, path: tuple, key: str, value) -> None:
    node = data
    for part in path:
        if isinstance(node, dict):
            node = node.setdefault(part, {})
        else:
            node = node[part]
    node[key] = value


def _at(data, path: tuple):
    for part in path:
        data = data[part]
    return data


@pytest.mark.parametrize("key", CREDENTIAL_KEYS)
@pytest.mark.parametrize("place", list(JOB_PLACES))
def test_every_credential_key_is_redacted_in_every_job_section(place, key):
    secret = f"SEED-{uuid.uuid4().hex}"
    data = _minimal_job()
    _place(data, JOB_PLACES[place], key, secret)
    dumped = JobConfig.from_dict(data).model_dump(mode="json", by_alias=True)
    assert secret in json.dumps(dumped)

    out = redact(dumped)

    assert _at(out, JOB_PLACES[place])[key] == REDACTED
    assert secret not in json.dumps(out)
    assert secret in json.dumps(dumped), "redact must not modify its input"
    # every other value is as it was
    _place(dumped, JOB_PLACES[place], key, REDACTED)
    assert out == dumped
    JobConfig.from_dict(out)  # the redacted config is still a valid config


#: Where a free-form mapping sits in a calibration config.
CAL_PLACES = {
    "input.storage_options": ("input", "storage_options"),
    "output.storage_options.client_kwargs": ("output", "storage_options", "client_kwargs"),
    "cache.storage_options": ("cache", "storage_options"),
    "engines.j.engine_kwargs": ("engines", "j", "engine_kwargs"),
}


@pytest.mark.parametrize("key", CREDENTIAL_KEYS)
@pytest.mark.parametrize("place", list(CAL_PLACES))
def test_every_credential_key_is_redacted_in_every_calibration_section(place, key):
    secret = f"SEED-{uuid.uuid4().hex}"
    data = {
        "name": "c",
        "input": {"uri": "/l.parquet", "columns": {"question": "q"}},
        "output": {"uri": "/o"},
        "engines": {"j": {"type": "vllm", "model": "/m"}},
        "judges": ["j"],
        "metrics": [{"name": "context_relevancy"}],
        "labels": {"context_relevancy": {"column": "lab", "type": "binary"}},
    }
    _place(data, CAL_PLACES[place], key, secret)
    dumped = CalibrationConfig.model_validate(data).model_dump(mode="json")

    out = redact(dumped)

    assert _at(out, CAL_PLACES[place])[key] == REDACTED
    assert secret not in json.dumps(out)
    CalibrationConfig.model_validate(out)


@pytest.mark.parametrize("key", CREDENTIAL_KEYS)
def test_credential_key_names(key):
    assert is_credential_key(key)


@pytest.mark.parametrize("key", list(HARMLESS))
def test_harmless_key_names(key):
    assert not is_credential_key(key)


def test_a_config_without_credentials_is_unchanged():
    data = _minimal_job()
    for path in JOB_PLACES.values():
        for key, value in HARMLESS.items():
            _place(data, path, key, value)
    data["engines"]["remote"]["api_key_env"] = "JUDGE_API_KEY"
    dumped = JobConfig.from_dict(data).model_dump(mode="json", by_alias=True)
    assert redact(dumped) == dumped


URLS = [
    ("http://user:s3cr3t@127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
    ("https://user:s3cr3t@judge.example.com/v1", "https://judge.example.com/v1"),
    ("https://tok3n@judge.example.com/v1", "https://judge.example.com/v1"),
    ("https://us%40er:p%3As%2Fs@judge.example.com:443/v1/", "https://judge.example.com:443/v1/"),
    ("http://user:s3cr3t@[::1]:8000/v1", "http://[::1]:8000/v1"),
    ("http://user:s3cr3t@[::ffff:10.0.0.1]/v1", "http://[::ffff:10.0.0.1]/v1"),
    (
        "sftp://deploy:s3cr3t@files.example.com/traces/*.jsonl",
        "sftp://files.example.com/traces/*.jsonl",
    ),
    (
        "https://acct.blob.core.windows.net/c/x.parquet?sv=2022&sig=s3cr3t&se=2030",
        "https://acct.blob.core.windows.net/c/x.parquet?sv=2022&se=2030",
    ),
    (
        "https://b.s3.amazonaws.com/x?X-Amz-Credential=AKIA&X-Amz-Signature=s3cr3t&X-Amz-Expires=60",
        "https://b.s3.amazonaws.com/x?X-Amz-Expires=60",
    ),
    (
        "simplecache::https://user:s3cr3t@h.example.com/x.csv",
        "simplecache::https://h.example.com/x.csv",
    ),
]
#: URLs without credentials: returned exactly as they are.
CLEAN_URLS = [
    "http://127.0.0.1:8000/v1",
    "http://[::1]:8000/v1/",
    "s3://bucket/key@v1/x.parquet",
    "https://h/v1?model=a&x=",
    "simplecache::s3://b/x",
    "relative/path",
    "user@host:path",
    "http://h/v1?b=2&a=1",
]


@pytest.mark.parametrize("url, expected", URLS)
def test_url_credentials_are_removed(url, expected):
    assert redact_url(url) == expected
    assert redact({"base_url": url, "nested": [{"uri": url}]}) == {
        "base_url": expected,
        "nested": [{"uri": expected}],
    }
    assert redact_text(f"cannot reach {url}: refused; is '{url}' right?") == (
        f"cannot reach {expected}: refused; is '{expected}' right?"
    )


@pytest.mark.parametrize("url", CLEAN_URLS)
def test_urls_without_credentials_are_unchanged(url):
    assert redact_url(url) == url


def test_nested_values_lists_and_name_keyed_mappings():
    value = {
        "client_kwargs": {
            "headers": {"Authorization": "Bearer s3cr3t", "Accept": "x"},
            "proxies": ["http://p:s3cr3t@proxy:3128", "http://proxy2:3128"],
        },
        "token": {
            "type": "authorized_user",
            "client_id": "c",
            "client_secret": "s3cr3t",
            "refresh_token": "s3cr3t",
        },
        "api_keys": ["s3cr3t", "s3cr3t2"],
        "pin": 1234,
        "password": 1234,
        "session_token": None,
        "sas_token": "",
        "use_token": True,
        # mappings keyed by names the user chose keep their entries
        "engines": {"api_key": {"type": "vllm", "model": "/m"}},
        "min_agreement": {"token_f1": {"accuracy": 0.5}},
        "tuple": ("http://u:s3cr3t@h/x", 3),
    }
    assert redact(value) == {
        "client_kwargs": {
            "headers": {"Authorization": REDACTED, "Accept": "x"},
            "proxies": ["http://proxy:3128", "http://proxy2:3128"],
        },
        "token": {
            "type": "authorized_user",
            "client_id": "c",
            "client_secret": REDACTED,
            "refresh_token": REDACTED,
        },
        "api_keys": REDACTED,
        "pin": 1234,
        "password": REDACTED,
        "session_token": None,
        "sas_token": "",
        "use_token": True,
        "engines": {"api_key": {"type": "vllm", "model": "/m"}},
        "min_agreement": {"token_f1": {"accuracy": 0.5}},
        "tuple": ("http://h/x", 3),
    }


def test_drop_redacted_leaves_what_can_reopen_storage():
    options = {
        "endpoint_url": "http://127.0.0.1:9000",
        "key": "AKIA",
        "secret": "s",
        "client_kwargs": {"aws_secret_access_key": "s", "region_name": "eu-west-1"},
        "config_kwargs": {"retries": {"max_attempts": 3}},
    }
    assert drop_redacted(redact(options)) == {
        "endpoint_url": "http://127.0.0.1:9000",
        "client_kwargs": {"region_name": "eu-west-1"},
        "config_kwargs": {"retries": {"max_attempts": 3}},
    }


def test_log_filter_redacts_message_and_arguments():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter())
    log = logging.getLogger("test_secrets.filter")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("engine %s at %s failed", "j", "http://u:s3cr3t@h:1/v1")
        log.warning("plain http://u:s3cr3t@h:2/v1 %d", 5)
    finally:
        log.removeHandler(handler)
    assert stream.getvalue() == "engine j at http://h:1/v1 failed\nplain http://h:2/v1 5\n"


def test_manifest_of_a_planned_run_holds_no_secret(tmp_path):
    """The run manifest, built from a plan whose every section holds a seeded secret (no
    Ray, no server: the plan is only built)."""
    import datetime as dt

    from ragbatch.io.write import OutputLayout, RunCheck
    from ragbatch.pipeline.manifest import build_manifest
    from ragbatch.pipeline.plan import build_plan

    secrets = [f"SEED{i}-{uuid.uuid4().hex}" for i in range(9)]
    pq.write_table(pa.table({"q": ["a?"], "ctx": [["a"]], "ans": ["a"]}), tmp_path / "in.parquet")

    def nested(i: int) -> dict:
        return {"key": secrets[i], "client_kwargs": {"aws_secret_access_key": secrets[i + 1]}}

    config = JobConfig.from_dict(
        {
            "input": {
                "uri": str(tmp_path / "in.parquet"),
                "storage_options": nested(0),
                "columns": {"question": "q", "contexts": "ctx", "answer": "ans"},
            },
            "output": {"uri": str(tmp_path / "out"), "storage_options": nested(2)},
            "cache": {"uri": str(tmp_path / "cache"), "storage_options": nested(4)},
            "calibration": {
                "uri": str(tmp_path / "cal"),
                "storage_options": nested(6),
                "min_agreement": {"retrieval_precision": {"accuracy": 0.5}},
            },
            "engines": {
                "j": {
                    "type": "openai",
                    "model": "m",
                    "base_url": f"http://user:{secrets[8]}@127.0.0.1:9/v1",
                }
            },
            "metrics": [{"name": "retrieval_precision", "engine": "j"}],
        }
    )
    plan = build_plan(config)
    layout = OutputLayout.for_run(config.output, dt.date(2024, 1, 2), "r1")
    manifest = build_manifest(
        plan,
        layout,
        RunCheck(1, 1, {}, {}),
        timings={},
        started=dt.datetime.now(dt.timezone.utc),
        ray_info={},
    )
    text = json.dumps(manifest.to_json_dict())
    assert [s for s in secrets if s in text] == []
    assert manifest.config["engines"]["j"]["base_url"] == "http://127.0.0.1:9/v1"
    for section in ("input", "output", "cache", "calibration"):
        assert manifest.config[section]["storage_options"] == {
            "key": REDACTED,
            "client_kwargs": {"aws_secret_access_key": REDACTED},
        }


def test_cli_error_naming_a_url_shows_it_without_credentials(tmp_path, capsys):
    from ragbatch.cli import main

    port = _free_port()  # nothing listens there: reading the input fails at once
    config = tmp_path / "job.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "input": {
                    "uri": f"http://reader:s3cr3t-pw@127.0.0.1:{port}/traces.jsonl",
                    "columns": {"answer": "a", "reference": "r"},  # a sound config
                },
                "output": {"uri": str(tmp_path / "out")},
                "metrics": [{"name": "exact_match"}],
            }
        )
    )

    code = main(["validate", str(config)])

    err = capsys.readouterr().err
    assert code == 2
    assert f"http://127.0.0.1:{port}/traces.jsonl" in err
    assert "s3cr3t-pw" not in err


# ---------------------------------------------------------------- end to end


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def instant_judge():
    """The stand-in judge of benchmarks/instant_judge.py on a free loopback port; yields
    ``127.0.0.1:<port>``. It answers every request at once, whatever the credentials."""
    pytest.importorskip("aiohttp")
    pytest.importorskip("openai")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "benchmarks" / "instant_judge.py"), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the instant judge did not start") from None
                time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_openai_model_id_has_no_credentials(instant_judge):
    from ragbatch.engines.openai import OpenAIEngine
    from ragbatch.engines.openai import load_openai_engine

    with_password = OpenAIEngine(
        type="openai", model="instant", base_url=f"http://user:s3cr3t@{instant_judge}/v1"
    )
    plain = OpenAIEngine(type="openai", model="instant", base_url=f"http://{instant_judge}/v1/")
    engines = [load_openai_engine(with_password), load_openai_engine(plain)]
    try:
        assert [e.model_id for e in engines] == [f"instant@http://{instant_judge}/v1"] * 2
        # the password is still what the client sends
        assert engines[0].base_url == f"http://user:s3cr3t@{instant_judge}/v1"
    finally:
        for e in engines:
            e.close()


def _seeded() -> dict[str, str]:
    names = (
        "in_key",
        "in_secret",
        "out_key_id",
        "out_secret",
        "cache_key",
        "cache_secret",
        "cache_token",
        "cal_key",
        "cal_secret",
        "guard_key",
        "guard_secret",
        "url_password",
    )
    return {n: f"SEED{n.replace('_', '')}{uuid.uuid4().hex[:12]}" for n in names}


def _configs(
    tmp: Path, endpoint: str, bucket: str, judge: str, s: dict[str, str]
) -> tuple[Path, Path]:
    engine = {
        "kind": "openai",
        "model": "instant",
        "concurrency": 1,
        "batch_size": 8,
        "max_concurrency": 4,
        "base_url": f"http://judge:{s['url_password']}@{judge}/v1",
    }
    data_input = {
        "uri": f"s3://{bucket}/in/traces.parquet",
        "storage_options": {"endpoint_url": endpoint, "key": s["in_key"], "secret": s["in_secret"]},
        "columns": {"question": "q", "contexts": "ctx", "answer": "ans"},
    }
    cache = {
        "uri": f"s3://{bucket}/cache",
        "storage_options": {
            "endpoint_url": endpoint,
            "key": s["cache_key"],
            "secret": s["cache_secret"],
            "token": s["cache_token"],
        },
    }
    metrics = [{"name": "retrieval_precision"}]
    cal = {
        "name": "cal",
        "input": data_input,
        "engines": {"j": engine},
        "judges": ["j"],
        "output": {
            "uri": f"s3://{bucket}/cal",
            "storage_options": {
                "endpoint_url": endpoint,
                "key": s["cal_key"],
                "secret": s["cal_secret"],
            },
        },
        "metrics": metrics,
        "cache": cache,
        "labels": {"retrieval_precision": {"column": "lab", "type": "binary"}},
        "bootstrap": {"resamples": 20, "seed": 0, "confidence": 0.9},
    }
    job = {
        "run": {"name": "nightly"},
        "input": data_input,
        "engines": {"j": engine},
        "output": {
            "uri": f"s3://{bucket}/out",
            "storage_options": {
                "endpoint_url": endpoint,
                "client_kwargs": {
                    "aws_access_key_id": s["out_key_id"],
                    "aws_secret_access_key": s["out_secret"],
                },
            },
        },
        "metrics": [{**m, "engine": "j"} for m in metrics],
        "cache": cache,
        "calibration": {
            "uri": f"s3://{bucket}/cal",
            "proceed": True,
            "storage_options": {
                "endpoint_url": endpoint,
                "key": s["guard_key"],
                "secret": s["guard_secret"],
            },
            "min_agreement": {"retrieval_precision": {"accuracy": 0.1}},
        },
    }
    (tmp / "config").mkdir()
    paths = tmp / "config" / "cal.yaml", tmp / "config" / "job.yaml"
    paths[0].write_text(yaml.safe_dump(cal))
    paths[1].write_text(yaml.safe_dump(job))
    return paths


def _written(tmp: Path, bucket: str, storage_options: dict) -> dict[str, bytes]:
    """Every file under ``tmp`` but the configs, every object in ``bucket``, and the logs
    of this Ray session's processes."""
    import ray
    import s3fs

    out = {
        str(p): p.read_bytes() for p in tmp.rglob("*") if p.is_file() and p.parent.name != "config"
    }
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **storage_options)
    out.update({f"s3://{p}": fs.cat(p) for p in fs.find(bucket)})
    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"
    out.update({str(p): p.read_bytes() for p in logs.rglob("*") if p.is_file()})
    return out


@pytest.mark.slow
def test_no_secret_reaches_any_output(
    ray_local,
    s3_endpoint,
    s3_storage_options,
    s3_bucket,
    instant_judge,
    tmp_path,
    capfd,
    caplog,
    monkeypatch,
):
    """Calibrate, validate, dry-run, run and report with secrets in every place a config
    holds them; none appears in any file, object, printed line or log record."""
    from ragbatch.analysis.runs import find_run, load_scores
    from ragbatch.cli import main
    import s3fs

    secrets = _seeded()
    table = pa.table(
        {
            "q": ["what is a?", "what is b?", "what is c?"],
            "ctx": [["a is 1"], ["b is 2"], ["c is 3"]],
            "ans": ["1", "2", "3"],
            "lab": [1, 0, 1],
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink)
    s3fs.S3FileSystem(skip_instance_cache=True, **s3_storage_options).pipe(
        f"{s3_bucket}/in/traces.parquet", sink.getvalue()
    )
    cal_path, job_path = _configs(tmp_path, s3_endpoint, s3_bucket, instant_judge, secrets)
    # The report opens the output root and the run's input from the environment's
    # credentials (the manifest keeps none); moto accepts any.
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "env-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    # As in a process started with these credentials: an S3 filesystem another test
    # cached for the same endpoint (fsspec keeps instances by their options) resolved
    # its credentials when it was made, without these.
    s3fs.S3FileSystem.clear_instance_cache()
    # every record at the level the CLI logs at, and ragbatch's own debug records too
    # (botocore's debug records carry the signed request headers, as designed)
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="ragbatch")
    report = tmp_path / "report.html"

    for argv in (
        ["calibrate", str(cal_path), "--run-id", "cal1"],
        ["validate", str(job_path)],
        ["run", str(job_path), "--dry-run"],
        ["run", str(job_path), "--run-id", "r1"],
        ["report", "--output", f"s3://{s3_bucket}/out", "r1", "-o", str(report)],
    ):
        assert main(argv) == 0, argv

    captured = capfd.readouterr()
    texts = {
        "stdout": captured.out.encode(),
        "stderr": captured.err.encode(),
        "log records": caplog.text.encode(),
    }
    texts.update(_written(tmp_path, s3_bucket, s3_storage_options))
    # the scan sees what was written: scores, manifests, caches, calibration, report
    assert any("/out/runs/" in k and k.endswith("/run_id=r1/manifest.json") for k in texts)
    assert {"agreement.parquet", "manifest.json", "report.html"} <= {Path(k).name for k in texts}
    assert any("/cache/" in k for k in texts)
    leaks = {
        name: [where for where, data in texts.items() if value.encode() in data]
        for name, value in secrets.items()
    }
    assert leaks == {name: [] for name in secrets}

    run = find_run(f"s3://{s3_bucket}/out", "r1", s3_storage_options)
    models = set(load_scores(run)["model"].drop_nulls().to_list())
    assert models == {f"instant@http://{instant_judge}/v1"}
    assert run.manifest.config["output"]["storage_options"] == {
        "endpoint_url": s3_endpoint,
        "client_kwargs": {"aws_access_key_id": REDACTED, "aws_secret_access_key": REDACTED},
    }
    assert run.manifest.config["engines"]["j"]["base_url"] == f"http://{instant_judge}/v1"
    # the report read the run's input and the calibration again, with the redacted
    # options dropped and the environment's credentials used instead
    html = report.read_text(encoding="utf-8")
    assert "what is b?" in html
    assert f"from calibration <code>cal1</code> under\ns3://{s3_bucket}/cal " in html
