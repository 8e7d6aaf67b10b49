"""A worker process killed while it scores a batch: Ray Data replaces the actor and runs
the batch again, and the run commits exactly one cell per (row, metric), equal to what
an undisturbed stage computes.

The fault is real: the PII stage's actor process is found by its process title and
killed with SIGKILL as soon as it has finished loading (its title no longer ends in
``__init__``), which in this job is while it holds its first batches.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import duckdb
import psutil
import pyarrow as pa
import pytest

from ragbatch.config import JobConfig
from ragbatch.runner import run_job
from udfs.pii import PiiStage

DATA = Path(__file__).resolve().parent.parent / "examples" / "data" / "pii_presidio_synthetic"


def kill_busy_actor(marker: str, killed: list[int], limit_s: float = 300) -> None:
    """SIGKILL the first process whose title names ``marker`` once it has loaded (its
    title no longer ends in ``__init__``). Only this test session's Ray processes are
    candidates: the local Ray instance is started by this process, so its workers
    descend from it."""
    me = psutil.Process(os.getpid())
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        for proc in me.children(recursive=True):
            try:
                title = " ".join(proc.cmdline()).strip()
            except psutil.Error:
                continue
            if marker in title and title.startswith("ray::") and not title.endswith("__init__"):
                os.kill(proc.pid, signal.SIGKILL)
                killed.append(proc.pid)
                return
        time.sleep(0.02)


@pytest.mark.slow
def test_killed_actor_is_replaced_and_its_batch_retried(ray_local, tmp_path):
    config = JobConfig.from_dict({
        "input": {"uri": str(DATA / "*.json"), "format": "json",
                  "columns": {"answer": "full_text"}, "slice_columns": ["template_id"]},
        "output": {"uri": str(tmp_path / "out")},
        "engines": {"pii": {"type": "presidio", "batch_size": 32}},
        "metrics": [{"name": "answer_contains_pii"}],
    })
    killed: list[int] = []
    killer = threading.Thread(target=kill_busy_actor, args=("PiiStage", killed), daemon=True)
    killer.start()
    result = run_job(config, run_id="worker-fault")
    killer.join(timeout=1)
    assert killed, "the PII actor was never seen working on a batch"
    assert result.check.n_rows == 1600

    scores = duckdb.sql(
        f"SELECT row_id, score, status FROM read_parquet('{tmp_path}/out/scores/**/*.parquet', "
        "hive_partitioning=true)").fetchall()
    assert len(scores) == len({r[0] for r in scores}) == 1600
    assert {r[2] for r in scores} == {"ok"}
    # The same scores as the stage computes undisturbed, row by row.
    import json

    texts = {}
    for name in sorted(DATA.glob("*.json")):
        for i, row in enumerate(json.loads(name.read_text(encoding="utf-8"))):
            texts[f"{name.name}:{i}"] = row["full_text"]
    ids = sorted(texts)
    stage = PiiStage("pii", {"type": "presidio"}, [{"name": "answer_contains_pii", "id": "m", "params": {}}])
    direct = stage(pa.table({"row_id": ids, "answer": [texts[i] for i in ids]}))
    want = dict(zip(ids, (c["score"] for c in direct.column("cell::m").to_pylist())))
    assert {r[0]: r[1] for r in scores} == want
