"""BatchGuard and RunLedger: a batch failing with engine faults is retried, then its rows
marked error; a bug fails at once; a batch whose actors keep dying is not scored again;
the error budget stops the run.

The guard runs here in the test process against a real ledger actor on local Ray. The
scoring functions that raise stand in for a stage whose engine throws (a fault that
cannot be caused on demand with a real model); the killed-actor case is caused for real
in tests/test_worker_faults.py.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from ragbatch.core.columns import CELL_TYPE, JUDGE_TYPE, cell_column, judge_column
from ragbatch.core.errors import ConfigError, EngineError, RunError, StageBugError
from ragbatch.judge.protocol import run_sync
from udfs.guard import BATCH_ATTEMPTS, MAX_LOST_STARTS, BatchGuard, batch_key, is_engine_fault
from udfs.ledger import RunLedger

COLUMNS = [(cell_column("m"), CELL_TYPE), (judge_column("m"), JUDGE_TYPE)]


def _batch(ids):
    return pa.table({"row_id": ids, "answer": [f"a{i}" for i in range(len(ids))]})


def _scored(batch):
    cells = [
        {"score": 1.0, "status": "ok", "reason": None, "details": None, "model": "x"}
    ] * batch.num_rows
    return batch.append_column(cell_column("m"), pa.array(cells, CELL_TYPE)).append_column(
        judge_column("m"), pa.nulls(batch.num_rows, JUDGE_TYPE)
    )


class FlakyScorer:
    """Raises on its first ``failures`` calls (an engine fault stand-in: ``fault``, an
    EngineError by default), then scores."""

    def __init__(self, failures, fault=EngineError):
        self.failures, self.calls, self.fault = failures, 0, fault

    async def __call__(self, batch):
        self.calls += 1
        if self.calls <= self.failures:
            raise self.fault(f"engine hiccup {self.calls}")
        return _scored(batch)


def _run(guard, batch, scorer):
    return run_sync(guard.run(batch, scorer))


@pytest.fixture
def ledger(ray_local):
    handle = ray_local.remote(num_cpus=0)(RunLedger).remote(1, 0.5)
    ray_local.get(handle.record.remote(0, 10))  # the input has 10 rows
    yield handle
    ray_local.kill(handle)


def test_batch_key_depends_on_the_row_ids_only():
    a = _batch(["r1", "r2", "中文", "👍"])
    assert batch_key(a) == batch_key(a.append_column("x", pa.array([1, 2, 3, 4])))
    assert batch_key(a) != batch_key(_batch(["r1", "r2", "中文"]))
    assert batch_key(_batch(["ab", "c"])) != batch_key(_batch(["a", "bc"]))


def test_a_batch_that_fails_once_is_retried_in_the_actor(ray_local, ledger):
    scorer = FlakyScorer(1)
    out = _run(BatchGuard("engine e", COLUMNS, ledger), _batch(["r1", "r2"]), scorer)
    assert scorer.calls == 2
    assert [c["status"] for c in out.column(cell_column("m")).to_pylist()] == ["ok", "ok"]
    faults = ray_local.get(ledger.faults.remote())["engine e"]
    assert faults == {
        "batches": 1,
        "batch_starts": 1,
        "batch_retries": 1,
        "actors_lost": 0,
        "failed_batches": 0,
        "failed_rows": 0,
    }


def test_a_batch_that_keeps_failing_gets_error_cells_and_the_run_goes_on(ray_local, ledger):
    batch = _batch(["r1", "r2", "r3"])
    scorer = FlakyScorer(99)
    out = _run(BatchGuard("engine e", COLUMNS, ledger), batch, scorer)
    assert scorer.calls == BATCH_ATTEMPTS == 2
    assert out.column_names == ["row_id", "answer", cell_column("m"), judge_column("m")]
    assert out.select(["row_id", "answer"]) == batch
    reason = "engine e: batch failed 2 times: EngineError: engine hiccup 2"
    assert (
        out.column(cell_column("m")).to_pylist()
        == [{"score": None, "status": "error", "reason": reason, "details": None, "model": None}]
        * 3
    )
    assert out.column(judge_column("m")).null_count == 3
    faults = ray_local.get(ledger.faults.remote())["engine e"]
    assert (faults["failed_batches"], faults["failed_rows"], faults["batch_retries"]) == (1, 3, 1)


def test_a_batch_whose_actors_died_twice_is_not_scored_again(ray_local, ledger):
    batch = _batch(["r1", "r2"])
    key = batch_key(batch)
    for dead_actor in ("actor-a", "actor-b"):  # started, never finished: the actor died
        ray_local.get(ledger.batch_started.remote("engine e", key, dead_actor))
    scorer = FlakyScorer(0)
    out = _run(BatchGuard("engine e", COLUMNS, ledger), batch, scorer)
    assert scorer.calls == 0 and MAX_LOST_STARTS == 2
    assert {c["reason"] for c in out.column(cell_column("m")).to_pylist()} == {
        "engine e: the worker died 2 times while scoring this batch of 2 rows; "
        "its rows are not scored again"
    }
    faults = ray_local.get(ledger.faults.remote())["engine e"]
    assert (faults["batch_starts"], faults["actors_lost"], faults["failed_rows"]) == (3, 2, 2)


def test_failed_rows_past_the_error_budget_stop_the_run(ray_local, ledger):
    guard = BatchGuard("engine e", COLUMNS, ledger)  # budget 0.5 of 10 rows: 5 may fail
    _run(guard, _batch(["r1", "r2", "r3", "r4", "r5"]), FlakyScorer(99))
    with pytest.raises(
        RunError,
        match=r"6 of 10 rows \(60.0%\) are marked error by failed "
        r"batches, over run.error_budget = 0.5; first reason: "
        r"engine e: batch failed 2 times",
    ):
        _run(guard, _batch(["r6"]), FlakyScorer(99))


def test_budget_waits_until_every_read_task_has_reported(ray_local):
    ledger = ray_local.remote(num_cpus=0)(RunLedger).remote(2, 0.0)
    ray_local.get(ledger.record.remote(0, 3))  # task 1 not read yet: the total is unknown
    out = _run(BatchGuard("engine e", COLUMNS, ledger), _batch(["r1"]), FlakyScorer(99))
    assert out.column(cell_column("m"))[0]["status"].as_py() == "error"
    ray_local.get(ledger.record.remote(1, 4))
    assert ray_local.get(ledger.over_budget.remote()).startswith("1 of 7 rows (14.3%)")
    ray_local.kill(ledger)


def test_config_errors_are_not_batch_faults(ray_local, ledger):
    async def broken(batch):
        raise ConfigError("engines.e.params: unknown field")

    with pytest.raises(ConfigError, match="unknown field"):
        _run(BatchGuard("engine e", COLUMNS, ledger), _batch(["r1"]), broken)


@pytest.mark.parametrize(
    "bug", [TypeError, AttributeError, KeyError, AssertionError, NotImplementedError]
)
def test_a_bug_fails_at_once_naming_the_stage(ray_local, ledger, bug):
    """Test-only fault injection: the scoring raises what a bug in ragbatch's own code
    raises. It is not retried, makes no error cells and fails with the stage's name."""
    scorer = FlakyScorer(99, fault=bug)
    guard = BatchGuard("engine e", COLUMNS, ledger, label="model:e")
    with pytest.raises(StageBugError) as caught:
        _run(guard, _batch(["r1", "r2"]), scorer)
    assert scorer.calls == 1
    message = str(caught.value)
    assert message.startswith(
        f"stage model:e failed with a bug in ragbatch's own code: {bug.__name__}: "
    )
    assert "engine hiccup 1" in message and "Traceback (most recent call last)" in message
    faults = ray_local.get(ledger.faults.remote())["engine e"]
    assert (faults["failed_batches"], faults["failed_rows"]) == (0, 0)


class OutOfMemoryError(RuntimeError):
    """Named as torch's ``torch.OutOfMemoryError`` is (torch is not imported here)."""


def test_engine_faults_are_the_engines_errors_time_limits_and_lost_memory():
    assert is_engine_fault(EngineError("server gone"))
    assert is_engine_fault(TimeoutError())
    assert is_engine_fault(MemoryError())
    assert is_engine_fault(OutOfMemoryError("CUDA out of memory"))
    try:
        try:
            raise EngineError("backend failed")
        except EngineError as inner:
            raise RuntimeError("while scoring") from inner
    except RuntimeError as outer:
        assert is_engine_fault(outer)
    for bug in (TypeError("x"), AttributeError("x"), KeyError("x"), RuntimeError("x")):
        assert not is_engine_fault(bug)


def test_without_a_ledger_the_guard_still_isolates(ray_local):
    out = _run(BatchGuard("engine e", COLUMNS), _batch(["r1"]), FlakyScorer(99))
    assert out.column(cell_column("m"))[0]["status"].as_py() == "error"


def test_a_second_attempt_of_a_running_run_id_is_refused(ray_local, tmp_path):
    # The ledger actor that a running attempt holds (made here directly: it stands for a
    # run started by another driver on this cluster).
    from ragbatch.config.job import JobConfig
    from ragbatch.core.errors import OutputError
    from ragbatch.pipeline.runner import LEDGER_NAMESPACE, LEDGER_PREFIX, run_job

    src = tmp_path / "in.csv"
    src.write_text("a,ref\nyes,yes\nno,yes\n", encoding="utf-8")
    config = JobConfig.from_dict(
        {
            "input": {"uri": str(src), "columns": {"answer": "a", "reference": "ref"}},
            "output": {"uri": str(tmp_path / "out")},
            "metrics": [{"name": "exact_match"}],
        }
    )
    holder = (
        ray_local.remote(num_cpus=0)(RunLedger)
        .options(name=f"{LEDGER_PREFIX}busy", namespace=LEDGER_NAMESPACE)
        .remote()
    )
    ray_local.get(holder.totals.remote())
    with pytest.raises(
        OutputError,
        match=r"run 'busy' is already running on this Ray cluster "
        r"\(actor 'ragbatch-ledger:busy'\)",
    ):
        run_job(config, run_id="busy")
    ray_local.kill(holder)
    import time

    for _ in range(50):  # the name is freed once the kill has been processed
        try:
            ray_local.get_actor(f"{LEDGER_PREFIX}busy", namespace=LEDGER_NAMESPACE)
        except ValueError:
            break
        time.sleep(0.1)
    result = run_job(config, run_id="busy")
    assert result.check.n_rows == 2 and result.manifest.faults.total["failed_rows"] == 0
