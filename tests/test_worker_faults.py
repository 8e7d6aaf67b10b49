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

from ragbatch.core.columns import cell_column
from ragbatch.config.job import JobConfig
from ragbatch.pipeline.runner import LEDGER_NAMESPACE, LEDGER_PREFIX, run_job
from udfs.pii import PiiStage

DATA = Path(__file__).resolve().parent.parent / "examples" / "data" / "pii_presidio_synthetic"
#: The 100 sentences of the smaller Presidio file, 8 to a batch: 13 batches keep the PII
#: actor busy long enough to be killed inside one.
PII_INPUT = DATA / "tests__data__generated_small.json"
PII_ROWS = 100
TONIC = (
    Path(__file__).resolve().parent.parent
    / "examples"
    / "data"
    / "tonic_validate_paul_graham"
    / "system=titan"
)


def _title(proc: psutil.Process) -> str | None:
    """The process title (Ray sets it as the command line), or None once it is gone."""
    try:
        return " ".join(proc.cmdline()).strip()
    except psutil.Error:
        return None


#: Seconds between looks through all of this session's processes for new actors named by
#: the marker (a look costs about 10 ms of CPU, which the run under test needs); known
#: actors are checked every :data:`POLL_S`.
SCAN_S, POLL_S = 0.2, 0.02


def kill_busy_actor(
    marker: str,
    killed: list[int],
    limit_s: float = 300,
    times: int = 1,
    started: Callable[[], int] | None = None,
) -> None:
    """SIGKILL, ``times`` times, a process whose title names ``marker`` while it runs a
    batch (Ray titles an actor process after the task it runs: ``....submit``), each time
    a different one. Only this test
    session's Ray processes are candidates: the local Ray instance is started by this
    process, so its workers descend from it. With ``started`` (a count of batch starts),
    a kill waits until a start has been recorded since the last kill: the actor is then
    inside the batch, not still fetching it.

    Actor processes are found by a look through all descendants every :data:`SCAN_S`
    seconds (an actor loads its model for seconds before its first batch, so it is known
    by then); the known ones are watched every :data:`POLL_S` seconds."""
    me = psutil.Process(os.getpid())
    deadline = time.monotonic() + limit_s
    known: dict[int, psutil.Process] = {}
    next_scan = 0.0
    while time.monotonic() < deadline and len(killed) < times:
        if started is not None and started() <= len(killed):
            time.sleep(POLL_S)
            continue
        if time.monotonic() >= next_scan:
            for proc in me.children(recursive=True):
                if proc.pid not in known and marker in (_title(proc) or ""):
                    known[proc.pid] = proc
            next_scan = time.monotonic() + SCAN_S
        for pid, proc in list(known.items()):
            title = _title(proc)
            if title is None or pid in killed:
                del known[pid]
            elif title.startswith("ray::") and title.endswith(".submit"):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                break
        time.sleep(POLL_S)


@pytest.mark.slow
def test_killed_actor_is_replaced_and_its_batch_retried(ray_local, tmp_path):
    config = JobConfig.from_dict(
        {
            "input": {
                "uri": str(PII_INPUT),
                "format": "json",
                "columns": {"answer": "full_text"},
                "slice_columns": ["template_id"],
            },
            "output": {"uri": str(tmp_path / "out")},
            # One actor holding one CPU, set here: the test is about its replacement.
            "engines": {
                "pii": {"type": "presidio", "batch_size": 8, "concurrency": 1, "num_cpus": 1}
            },
            "metrics": [{"name": "answer_contains_pii"}],
        }
    )
    killed: list[int] = []
    killer = threading.Thread(target=kill_busy_actor, args=("PiiStage", killed), daemon=True)
    killer.start()
    result = run_job(config, run_id="worker-fault")
    killer.join(timeout=1)
    assert killed, "the PII actor was never seen working on a batch"
    assert result.check.n_rows == PII_ROWS
    # The killed actor and its replacement both ran on this session's one node.
    placed = result.manifest.to_json_dict()["placement"]["pii:pii"]
    assert placed["node_ids"] == [ray_local.get_runtime_context().get_node_id()]
    assert placed["actors"] == 1  # Ray restarts a pool actor under the same id
    assert placed["actor_starts"] == 1 + len(killed)
    assert placed["bundles"] == [{"CPU": 1.0}] and placed["min_actors"] == placed["max_actors"] == 1

    scores = duckdb.sql(
        f"SELECT row_id, score, status FROM read_parquet('{tmp_path}/out/scores/**/*.parquet', "
        "hive_partitioning=true)"
    ).fetchall()
    assert len(scores) == len({r[0] for r in scores}) == PII_ROWS
    assert {r[2] for r in scores} == {"ok"}
    # The same scores as the stage computes undisturbed, row by row.
    import json

    texts = {
        f"{PII_INPUT.name}:{i}": row["full_text"]
        for i, row in enumerate(json.loads(PII_INPUT.read_text(encoding="utf-8")))
    }
    ids = sorted(texts)
    stage = PiiStage(
        "pii", {"type": "presidio"}, [{"name": "answer_contains_pii", "id": "m", "params": {}}]
    )
    direct = stage(pa.table({"row_id": ids, "answer": [texts[i] for i in ids]}))
    want = dict(zip(ids, (c["score"] for c in direct.column(cell_column("m")).to_pylist())))
    assert {r[0]: r[1] for r in scores} == want


@pytest.mark.release
@pytest.mark.slow
def test_batch_whose_actors_keep_dying_is_marked_error(ray_local, tmp_path):
    """The model stage's actor is killed twice while it holds the only batch: the third
    actor marks the batch's rows error instead of scoring it again, and the run, whose
    error budget allows it, commits them with the reason; the manifest counts the lost
    actors. (That rows with an error are scored again on a resume, and that the budget
    stops a run, is tested in test_bad_inputs.py and test_batch_guard.py.)"""
    config = JobConfig.from_dict(
        {
            "run": {"error_budget": 1.0},
            "input": {
                "uri": str(TONIC),
                "format": "csv",
                "columns": {"answer": "llm_answer", "reference": "reference_answer"},
            },
            "output": {"uri": str(tmp_path / "out")},
            "engines": {"minilm": {"type": "embedding", "batch_size": 64}},
            "metrics": [
                {"name": "semantic_similarity", "engine": "minilm"},
                {"name": "exact_match"},
            ],
        }
    )
    killed: list[int] = []

    ledgers: list = []

    def started() -> int:  # batch starts the run's ledger has recorded so far
        import ray

        if not ledgers:
            try:
                ledgers.append(ray.get_actor(f"{LEDGER_PREFIX}poison", namespace=LEDGER_NAMESPACE))
            except ValueError:
                return 0
        return ray.get(ledgers[0].faults.remote()).get("engine minilm", {}).get("batch_starts", 0)

    killer = threading.Thread(
        target=kill_busy_actor,
        args=("ModelStage", killed),
        kwargs={"times": 2, "started": started},
        daemon=True,
    )
    killer.start()
    result = run_job(config, run_id="poison")
    killer.join(timeout=1)
    assert len(killed) == 2
    scores = duckdb.sql(
        f"SELECT row_id, metric, score, status, reason FROM read_parquet('{tmp_path}/out/scores/**/*.parquet', "
        "hive_partitioning=true)"
    ).fetchall()
    assert len(scores) == len({(r[0], r[1]) for r in scores}) == 110
    reason = (
        "engine minilm: the worker died 2 times while scoring this batch of 55 rows; "
        "its rows are not scored again"
    )
    assert {(r[3], r[4]) for r in scores if r[1] == "semantic_similarity"} == {("error", reason)}
    assert {r[3] for r in scores if r[1] == "exact_match"} == {"ok"}  # other stages unharmed
    faults = result.manifest.to_json_dict()["faults"]
    assert faults["error_budget"] == 1.0
    assert faults["stages"]["engine minilm"] == {
        "batches": 1,
        "batch_starts": 3,
        "batch_retries": 0,
        "actors_lost": 2,
        "failed_batches": 1,
        "failed_rows": 55,
    }
    assert result.manifest.counts["semantic_similarity"] == {"error": 55}
