"""Resume after a crash and atomic publish, with real crashes.

``ragbatch run`` runs in a subprocess and its driver is killed with SIGKILL while it
scores (a ``binary`` callback that sleeps makes each batch take a while, as an expensive
metric would); the same run id is then run again. Every completed run must equal a
reference run of the same input made without interruption, with each (row_id, metric)
once, and a killed run must leave nothing a reader of committed runs can see.

``RAGBATCH_SOAK_RUNS`` sets how many runs the soak test kills at random. It is a release
check, skipped by default to keep the suite inside CI's time (a killed run and its
resume are tested on every run by ``test_killed_run_resumes_without_rescoring``); before
a release run it with 20:
``RAGBATCH_SOAK_RUNS=20 .venv/bin/python -m pytest tests/test_resume.py -k soak``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from ragbatch.config.job import JobConfig
from ragbatch.core.errors import OutputError
from ragbatch.pipeline.runner import run_job

TESTS = Path(__file__).resolve().parent
N_FILES, ROWS_PER_FILE = 12, 40
METRICS = [
    {"name": "response_length", "params": {"min_chars": 1, "max_chars": 30}},
    {"name": "contains_text", "params": {"text": "7"}},
    {
        "name": "binary",
        "id": "slow_digit",
        "params": {"callback": "support.binary_callbacks:slow_digit"},
    },
]


def write_input(root: Path) -> Path:
    """12 Parquet files (one read task each) with duplicate and unicode rows."""
    src = root / "in"
    src.mkdir()
    for f in range(N_FILES):
        answers = [f"answer {f}-{i} 数据🚀" if i % 5 else "dup row" for i in range(ROWS_PER_FILE)]
        pq.write_table(
            pa.table({"q": [f"q{i}" for i in range(ROWS_PER_FILE)], "a": answers}),
            src / f"part-{f:02d}.parquet",
        )
    return src


def config_dict(src: Path, out: Path) -> dict:
    return {
        "run": {"name": "resume"},
        "input": {"uri": str(src), "columns": {"question": "q", "answer": "a"}},
        "output": {"uri": str(out)},
        "metrics": METRICS,
    }


def start(config_path: Path, run_id: str) -> subprocess.Popen:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    )
    ragbatch = Path(sys.executable).with_name("ragbatch")
    return subprocess.Popen(
        [str(ragbatch), "run", str(config_path), "--run-id", run_id],
        env=env,
        cwd=config_path.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def committed_scores(out: Path, run_id: str | None = None) -> list[tuple]:
    """(run_id, row_id, metric, score, status, reason) of committed runs, as a reader
    keyed on manifests sees them."""
    if not list(out.glob("runs/**/manifest.json")):
        return []
    where = f"AND s.run_id = '{run_id}'" if run_id else ""
    return duckdb.sql(
        f"SELECT s.run_id, row_id, metric, score, status, reason FROM read_parquet("
        f"'{out}/scores/**/*.parquet', hive_partitioning=true) s WHERE s.run_id IN ("
        f"SELECT run_id FROM read_json('{out}/runs/**/manifest.json', hive_partitioning=true)) "
        f"{where} ORDER BY ALL"
    ).fetchall()


def strip_run(rows: list[tuple]) -> list[tuple]:
    return [r[1:] for r in rows]


def manifest(out: Path, run_id: str) -> dict:
    (path,) = out.glob(f"runs/*/run_id={run_id}/manifest.json")
    return json.loads(path.read_text())


def wait_for_staged_file(
    out: Path, run_id: str, proc: subprocess.Popen, limit_s: float = 120
) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and proc.poll() is None:
        if list(out.glob(f"_staging/run_id={run_id}/scores/attempt=*/*.parquet")):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Input, config and the scores of one uninterrupted run (in a subprocess, as the
    interrupted runs are). A second run, ``twin``, writes into the same output root at the
    same time (see test_two_runs_into_one_root_at_the_same_time)."""
    root = tmp_path_factory.mktemp("resume")
    src = write_input(root)
    out = root / "out"
    config_path = root / "job.yaml"
    config_path.write_text(yaml.safe_dump(config_dict(src, out)))
    procs = {rid: start(config_path, rid) for rid in ("reference", "twin")}
    for proc in procs.values():
        assert proc.wait(timeout=600) == 0, proc.stderr.read()[-3000:]
    rows = committed_scores(out, "reference")
    assert len(rows) == N_FILES * ROWS_PER_FILE * len(METRICS)
    return root, config_path, out, strip_run(rows)


@pytest.mark.release
@pytest.mark.slow
def test_killed_run_resumes_without_rescoring(reference, ray_local):
    """A run killed after it staged scores: nothing of it is committed; its staging refuses
    a resume with another config, and refuses to run an already committed run id again;
    the same config resumes it, reusing the staged rows, and commits the reference's
    scores. (One killed run serves the refusals and the resume: each killed run costs a
    process and a Ray start.)"""
    root, config_path, out, want = reference
    proc = start(config_path, "killed")
    assert wait_for_staged_file(out, "killed", proc), (
        "no score file was staged before the run ended"
    )
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert committed_scores(out, "killed") == []
    assert not list(out.glob("scores/*/run_id=killed")) or not list(
        out.glob("scores/*/run_id=killed/*")
    )

    # Refused before any scoring (so in this process, on the session's Ray).
    changed = config_dict(root / "in", out)
    changed["metrics"] = METRICS[:2]
    with pytest.raises(OutputError, match="different config or input"):
        run_job(JobConfig.from_dict(changed), run_id="killed")
    with pytest.raises(OutputError, match="already committed"):
        run_job(JobConfig.from_dict(config_dict(root / "in", out)), run_id="reference")

    again = start(config_path, "killed")
    assert again.wait(timeout=600) == 0, again.stderr.read()[-3000:]
    assert strip_run(committed_scores(out, "killed")) == want
    info = manifest(out, "killed")["resume"]
    assert info["resumed"] and info["attempt"] == 2
    assert 0 < info["rows_reused"] < N_FILES * ROWS_PER_FILE
    assert not (out / "_staging" / "run_id=killed").exists()


@pytest.mark.release
def test_two_runs_into_one_root_at_the_same_time(reference):
    """The fixture's two `ragbatch run` processes wrote to one output root at once: both
    committed, each with exactly the same scores, and neither left staging behind."""
    root, config_path, out, want = reference
    assert strip_run(committed_scores(out, "twin")) == want
    for rid in ("reference", "twin"):
        info = manifest(out, rid)
        assert info["rows"]["scores"] == len(want) and info["resume"]["attempt"] == 1
        assert not (out / "_staging" / f"run_id={rid}").exists()
    started = sorted(
        (manifest(out, r)["run"]["started_at"], manifest(out, r)["run"]["finished_at"])
        for r in ("reference", "twin")
    )
    assert started[1][0] < started[0][1], "the two runs did not overlap in time"


@pytest.mark.release
@pytest.mark.slow
def test_soak_random_kills(reference):
    root, config_path, out, want = reference
    rng = random.Random(int(os.environ.get("RAGBATCH_SOAK_SEED", "11")))
    runs = int(os.environ.get("RAGBATCH_SOAK_RUNS", "0"))
    if runs < 1:
        pytest.skip("release check: set RAGBATCH_SOAK_RUNS=20 to kill 20 runs at random moments")
    for n in range(runs):
        run_id = f"soak-{n}"
        attempts = 0
        while True:
            attempts += 1
            proc = start(config_path, run_id)
            if attempts <= 2:  # kill the first two attempts at a random moment
                try:
                    proc.wait(timeout=rng.uniform(2.0, 14.0))
                except subprocess.TimeoutExpired:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait()
                    assert committed_scores(out, run_id) == []
                    continue
            else:
                assert proc.wait(timeout=600) == 0, proc.stderr.read()[-3000:]
            if proc.returncode == 0 or manifest_exists(out, run_id):
                break
        assert strip_run(committed_scores(out, run_id)) == want, (run_id, attempts)


def manifest_exists(out: Path, run_id: str) -> bool:
    return bool(list(out.glob(f"runs/*/run_id={run_id}/manifest.json")))


def test_fingerprint_ignores_credentials_and_cache_but_not_metrics():
    from ragbatch.io.staging import run_fingerprint

    base = {
        "run": {"run_id": "a", "run_date": "2026-11-30"},
        "input": {"uri": "s3://t/in", "storage_options": {"key": "old"}},
        "output": {"uri": "s3://t/out", "storage_options": {"secret": "old"}},
        "metrics": [{"name": "latency"}],
        "cache": {"enabled": True},
    }
    rotated = {
        **base,
        "run": {"run_id": "b", "tasks_in_flight": 1, "executor": "in_process"},
        "cache": {"enabled": False},
        "calibration": {"uri": "out/cal", "min_agreement": {"faithfulness": 0.5}},
        "input": {"uri": "s3://t/in", "storage_options": {"key": "new"}},
        "output": {"uri": "s3://t/out", "storage_options": {}},
    }
    assert run_fingerprint(base, "f1") == run_fingerprint(rotated, "f1")
    assert run_fingerprint(base, "f1") != run_fingerprint(base, "f2")
    assert run_fingerprint(base, "f1") != run_fingerprint(
        {**base, "metrics": [{"name": "regex"}]}, "f1"
    )
