"""Per-batch fault isolation for the actor stages (model, PII and judge stages).

:class:`BatchGuard` wraps a stage's scoring of one batch:

* A batch whose scoring raises an engine fault (:func:`is_engine_fault`: an
  :class:`~ragbatch.core.errors.EngineError`, a time limit, an engine that died or ran
  out of memory) is tried again in the same actor, :data:`BATCH_ATTEMPTS` times in all;
  if every attempt raises, its rows get status ``error`` with the exception as the
  reason, and the run goes on.
* Any other exception is a bug in ragbatch's own code (a ``TypeError``,
  ``AttributeError``, ``KeyError``, ``AssertionError``, ``NotImplementedError``...): it
  is not retried and no cells are made; the run fails with a
  :class:`~ragbatch.core.errors.StageBugError` naming the stage, the exception and its
  traceback.
* An actor that dies holding a batch (its process killed, out of memory, a crashed
  engine) is replaced by Ray Data, which runs the batch again on the new actor. A batch
  whose earlier starts ended with a dead actor :data:`MAX_LOST_STARTS` times is not
  scored again: its rows get status ``error`` ("the worker died ... times while scoring
  this batch"), so one poisonous batch cannot use up Ray's task retries and fail the run.
* An exception that says the actor's engine is dead (vLLM's ``EngineDeadError``) ends the
  actor process, so that Ray Data replaces it as above instead of every later batch
  failing on the dead engine.
* Every start and finish is reported to the run's :class:`udfs.ledger.RunLedger`, which
  counts retries and lost actors for the manifest and stops the run (raising
  :class:`ragbatch.core.errors.RunError`) once the rows marked ``error`` exceed
  ``run.error_budget``.

Configuration, input and output errors (the other
:class:`ragbatch.core.errors.RagbatchError` classes) are not batch faults either: they
propagate and stop the run.

The guard is a coroutine (:meth:`BatchGuard.run`): the judge stage awaits it on its
actor's event loop; the model and PII stages, which score one batch at a time, call it
through :func:`ragbatch.judge.protocol.run_sync`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import traceback
import uuid
from typing import Any, AsyncContextManager, Awaitable, Callable

import pyarrow as pa

from ragbatch.core.columns import CELL_TYPE
from ragbatch.core.errors import (
    EngineError,
    RagbatchError,
    RunError,
    StageBugError,
    exception_chain,
)
from ragbatch.core.status import ERROR

log = logging.getLogger(__name__)

#: Attempts at one batch inside one actor before its rows are marked ``error``.
BATCH_ATTEMPTS = 2
#: Earlier starts of a batch that ended with a dead actor, after which its rows are
#: marked ``error`` instead of scoring it again. Ray Data runs such a batch again on a
#: replacement actor without limit (its default for actor pools), so this is the bound
#: that lets the run survive a batch that kills every actor it reaches.
MAX_LOST_STARTS = 2
#: Exception class names that mean the engine inside the actor cannot recover.
ENGINE_DEAD = ("EngineDeadError",)
#: Exception class names of a device or host out of memory (``torch.OutOfMemoryError``,
#: ``torch.cuda.OutOfMemoryError``), recognised without importing torch.
OUT_OF_MEMORY = ("OutOfMemoryError",)
#: Exception classes that are engine faults wherever they come from: the engine
#: adapters raise :class:`~ragbatch.core.errors.EngineError` for a backend failure.
ENGINE_FAULTS: tuple[type[BaseException], ...] = (EngineError, TimeoutError, MemoryError)


def is_engine_fault(exc: BaseException) -> bool:
    """Whether ``exc`` is a fault of the engine rather than a bug in ragbatch's code: an
    instance of :data:`ENGINE_FAULTS`, or an exception whose chain of causes holds one of
    them or a class named in :data:`ENGINE_DEAD` or :data:`OUT_OF_MEMORY`."""
    names = ENGINE_DEAD + OUT_OF_MEMORY
    return any(
        isinstance(e, ENGINE_FAULTS) or any(c.__name__ in names for c in type(e).__mro__)
        for e in exception_chain(exc)
    )


def bug_error(stage: str, exc: BaseException) -> StageBugError:
    """The error that fails the run when stage ``stage`` (``<kind>:<engine>``) raised
    ``exc`` from ragbatch's own code; its message ends with the traceback."""
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return StageBugError(
        f"stage {stage} failed with a bug in ragbatch's own code: "
        f"{type(exc).__name__}: {exc} (traceback follows)\n{trace}"
    )


def batch_key(batch: pa.Table) -> str:
    """sha1 of the batch's row ids, joined with NUL characters: the same rows give the
    same key on every retry. The ids are joined in Polars (no Python string per row)."""
    import polars as pl

    ids = pl.Series(batch.column("row_id").cast(pa.string()))
    joined = ids.fill_null("").str.join("\0").item() if len(ids) else ""
    return hashlib.sha1(joined.encode("utf-8", "surrogatepass")).hexdigest()


def error_columns(batch: pa.Table, columns: list[tuple[str, pa.DataType]], reason: str) -> pa.Table:
    """``batch`` with ``columns`` appended: cells (:data:`CELL_TYPE`) with status
    ``error`` and ``reason`` in every row; columns of any other type all null."""
    n = batch.num_rows
    out = batch
    for name, type_ in columns:
        if type_ == CELL_TYPE:
            cell = {
                "score": None,
                "status": ERROR,
                "reason": reason,
                "details": None,
                "model": None,
            }
            array = pa.array([cell] * n, type=CELL_TYPE)
        else:
            array = pa.nulls(n, type=type_)
        out = out.append_column(name, array)
    return out


class BatchGuard:
    """Runs one actor stage's batches with fault isolation (see the module docstring).

    Parameters
    ----------
    stage : str
        Name of the stage in reports and reasons, e.g. ``"model stage minilm"``.
    columns : list of (str, pyarrow.DataType)
        The columns the stage appends; a failed batch gets them filled by
        :func:`error_columns`.
    ledger : ray actor handle or None
        The run's :class:`udfs.ledger.RunLedger`; None (a stage used outside a run)
        skips reporting, lost-start counting and the budget.
    label : str, optional
        The stage as a failed run names it, ``<kind>:<engine>`` (for example
        ``"judge:judge"``); ``stage`` when not given.
    """

    def __init__(
        self,
        stage: str,
        columns: list[tuple[str, pa.DataType]],
        ledger: Any = None,
        label: str | None = None,
    ) -> None:
        self.stage = stage
        self.label = label or stage
        self.columns = columns
        self.ledger = ledger
        self.actor = uuid.uuid4().hex

    async def run(
        self,
        batch: pa.Table,
        score: Callable[[pa.Table], Awaitable[pa.Table]],
        gate: Callable[[int], AsyncContextManager[Any]] | None = None,
    ) -> pa.Table:
        """``await score(batch)``, or ``batch`` with its rows marked ``error`` when the
        batch keeps failing with engine faults. The ledger calls are made off the event
        loop, so that the other batches in flight on it go on meanwhile.

        Parameters
        ----------
        batch : pyarrow.Table
        score : coroutine function
            ``batch`` -> the batch with the stage's columns.
        gate : callable, optional
            Called with the number of earlier starts of this batch whose actor died
            (0 normally); the attempts run inside the async context manager it returns.
            An actor stage with several batches in flight uses it to score a batch that
            has lost an actor alone, so that a batch that kills its actor takes no other
            batch's lost starts up with it.

        Raises
        ------
        RagbatchError
            Raised by ``score`` (a config, input or output problem): not a batch fault.
        StageBugError
            ``score`` raised an exception that is not an engine fault
            (:func:`is_engine_fault`): a bug, which fails the run.
        RunError
            The rows marked ``error`` in this run now exceed ``run.error_budget``.
        """
        key = batch_key(batch) if "row_id" in batch.column_names else uuid.uuid4().hex
        lost = await self._call_async("batch_started", key, self.actor) or 0
        if lost >= MAX_LOST_STARTS:
            return await asyncio.to_thread(
                self._fail, batch, key, 0, self._lost_reason(lost, batch)
            )
        last: Exception | None = None
        async with gate(lost) if gate is not None else contextlib.nullcontext():
            for attempt in range(BATCH_ATTEMPTS):
                try:
                    out = await score(batch)
                except Exception as exc:
                    if isinstance(exc, RagbatchError) and not isinstance(exc, EngineError):
                        raise
                    if not is_engine_fault(exc):
                        log.error(
                            "stage %s: a bug in ragbatch's own code", self.label, exc_info=exc
                        )
                        raise bug_error(self.label, exc) from exc
                    last = exc
                    self._attempt_failed(batch, attempt, exc)
                    continue
                await asyncio.to_thread(self._finish, key, attempt, 0, None)
                return out
        return await asyncio.to_thread(
            self._fail, batch, key, BATCH_ATTEMPTS - 1, self._failed_reason(last)
        )

    def _lost_reason(self, lost: int, batch: pa.Table) -> str:
        return (
            f"{self.stage}: the worker died {lost} times while scoring this batch "
            f"of {batch.num_rows} rows; its rows are not scored again"
        )

    def _failed_reason(self, last: Exception | None) -> str:
        return (
            f"{self.stage}: batch failed {BATCH_ATTEMPTS} times: "
            f"{type(last).__name__}: {str(last)[:500]}"
        )

    def _attempt_failed(self, batch: pa.Table, attempt: int, exc: Exception) -> None:
        """Log a failed attempt; end the actor process when the engine is dead."""
        log.warning(
            "%s: batch of %d rows failed (attempt %d of %d): %s: %s",
            self.stage,
            batch.num_rows,
            attempt + 1,
            BATCH_ATTEMPTS,
            type(exc).__name__,
            exc,
        )
        if _engine_dead(exc):
            log.error(
                "%s: the engine is dead; ending this actor so that it is replaced", self.stage
            )
            os._exit(1)

    async def _call_async(self, method: str, *args: Any) -> Any:
        if self.ledger is None:
            return None
        return await asyncio.to_thread(self._call, method, *args)

    def _fail(self, batch: pa.Table, key: str, retries: int, reason: str) -> pa.Table:
        out = error_columns(batch, self.columns, reason)
        self._finish(key, retries, batch.num_rows, reason)
        return out

    def _finish(self, key: str, retries: int, failed_rows: int, reason: str | None) -> None:
        if not failed_rows:
            # A scored batch adds no error rows, so it cannot push the run over its error
            # budget: told without waiting for the answer (a round trip a batch saved).
            # Calls from one actor reach the ledger in order.
            self._send("batch_finished", key, self.actor, retries, failed_rows, reason)
            return
        stop = self._call("batch_finished", key, self.actor, retries, failed_rows, reason)
        if stop:
            raise RunError(
                f"the run stopped: {stop}. Fix the cause, or raise run.error_budget "
                "to let the run commit with these rows marked error"
            )

    def _call(self, method: str, *args: Any) -> Any:
        if self.ledger is None:
            return None
        import ray

        return ray.get(getattr(self.ledger, method).remote(self.stage, *args))

    def _send(self, method: str, *args: Any) -> None:
        if self.ledger is not None:
            getattr(self.ledger, method).remote(self.stage, *args)


def _engine_dead(exc: BaseException) -> bool:
    return any(c.__name__ in ENGINE_DEAD for e in exception_chain(exc) for c in type(e).__mro__)
