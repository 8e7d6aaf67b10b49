"""A worker process killed while it scores a batch: Ray Data replaces the actor and runs
the batch again, and the run commits exactly one cell per (row, metric), equal to what
an undisturbed stage computes.

The faults are real: a stage's actor process is found by its process title and killed
with SIGKILL while it runs a batch.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable

import duckdb
import psutil
import pyarrow as pa
import pytest

from ragbatch.config import JobConfig
from ragbatch.runner import LEDGER_NAMESPACE, LEDGER_PREFIX, run_job
from udfs.pii import PiiStage

DATA = Path(__file__).resolve().parent.parent / "examples" / "data" / "pii_presidio_synthetic"
TONIC = (Path(__file__).resolve().parent.parent / "examples" / "data" / "tonic_validate_paul_graham"
         / "system=titan")


def kill_busy_actor(marker: str, killed: list[int], limit_s: float = 300, times: int = 1,
                    started: Callable[[], int] | None = None) -> None:
    """SIGKILL, ``times`` times, a process whose title names ``marker`` while it runs a
    batch (Ray titles an actor process after the task it runs: ``....submit``), each time
    a different one. Only this test
    session's Ray processes are candidates: the local Ray instance is started by this
    process, so its workers descend from it. With ``started`` (a count of batch starts),
    a kill waits until a start has been recorded since the last kill: the actor is then
    inside the batch, not still fetching it."""
    me = psutil.Process(os.getpid())
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and len(killed) < times:
        if started is not None and started() <= len(killed):
            time.sleep(0.02)
            continue
        for proc in me.children(recursive=True):
            try:
                title = " ".join(proc.cmdline()).strip()
            except psutil.Error:
                continue
            if (marker in title and title.startswith("ray::") and title.endswith(".submit")
                    and proc.pid not in killed):
                os.kill(proc.pid, signal.SIGKILL)
                killed.append(proc.pid)
                break
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
    # The killed actor and its replacement both ran on this session's one node.
    placed = result.manifest["placement"]["pii:pii"]
    assert placed["node_ids"] == [ray_local.get_runtime_context().get_node_id()]
    assert placed["actors"] == 1  # Ray restarts a pool actor under the same id
    assert placed["actor_starts"] == 1 + len(killed)
    assert placed["bundles"] == [{"CPU": 1.0}] and placed["min_actors"] == placed["max_actors"] == 1

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


@pytest.mark.slow
def test_batch_whose_actors_keep_dying_is_marked_error(ray_local, tmp_path):
    """The model stage's actor is killed twice while it holds the only batch: the third
    actor marks the batch's rows error instead of scoring it again, and the run, whose
    error budget allows it, commits them with the reason; the manifest counts the lost
    actors. (That rows with an error are scored again on a resume, and that the budget
    stops a run, is tested in test_bad_inputs.py and test_batch_guard.py.)"""
    config = JobConfig.from_dict({
        "run": {"error_budget": 1.0},
        "input": {"uri": str(TONIC), "format": "csv",
                  "columns": {"answer": "llm_answer", "reference": "reference_answer"}},
        "output": {"uri": str(tmp_path / "out")},
        "engines": {"minilm": {"type": "embedding", "batch_size": 64}},
        "metrics": [{"name": "semantic_similarity", "engine": "minilm"}, {"name": "exact_match"}],
    })
    killed: list[int] = []

    def started() -> int:  # batch starts the run's ledger has recorded so far
        import ray

        try:
            ledger = ray.get_actor(f"{LEDGER_PREFIX}poison", namespace=LEDGER_NAMESPACE)
        except ValueError:
            return 0
        return ray.get(ledger.faults.remote()).get("engine minilm", {}).get("batch_starts", 0)

    killer = threading.Thread(target=kill_busy_actor, args=("ModelStage", killed),
                              kwargs={"times": 2, "started": started}, daemon=True)
    killer.start()
    result = run_job(config, run_id="poison")
    killer.join(timeout=1)
    assert len(killed) == 2
    scores = duckdb.sql(
        f"SELECT row_id, metric, score, status, reason FROM read_parquet('{tmp_path}/out/scores/**/*.parquet', "
        "hive_partitioning=true)").fetchall()
    assert len(scores) == len({(r[0], r[1]) for r in scores}) == 110
    reason = ("engine minilm: the worker died 2 times while scoring this batch of 55 rows; "
              "its rows are not scored again")
    assert {(r[3], r[4]) for r in scores if r[1] == "semantic_similarity"} == {("error", reason)}
    assert {r[3] for r in scores if r[1] == "exact_match"} == {"ok"}  # other stages unharmed
    faults = result.manifest["faults"]
    assert faults["error_budget"] == 1.0
    assert faults["stages"]["engine minilm"] == {
        "batches": 1, "batch_starts": 3, "batch_retries": 0, "actors_lost": 2,
        "failed_batches": 1, "failed_rows": 55}
    assert result.manifest["counts"]["semantic_similarity"] == {"error": 55}
