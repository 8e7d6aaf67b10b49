"""The run ledger: one small Ray actor per run that the stages report to.

It counts the input rows of each read task, and the batches of the actor stages: how
often each batch was started, by which actor, and which batches ended with their rows
marked ``error`` (:mod:`udfs.guard`). From these it knows which batches were started again
after their actor died (the actor was replaced), and whether the rows marked ``error`` so
far already exceed the run's error budget. Wrapped with ``ray.remote(num_cpus=0)`` by the
runner; every method is idempotent for a retried read task.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ragbatch.io.manifest_model import FAULT_COUNTERS


@dataclass
class _Batch:
    starts: list[str] = field(default_factory=list)  # actor key per start, in order
    finished_by: set[str] = field(default_factory=set)
    retries: int = 0  # in-process attempts after the first, summed over starts
    failed_rows: int = 0  # rows marked error by the last finish (0 when scored)
    reason: str | None = None


class RunLedger:
    """Rows read and batch faults of one run.

    Parameters
    ----------
    n_read_tasks : int
        How many read tasks the plan has; once all have reported, the input's row count
        is known.
    error_budget : float
        ``run.error_budget``: the largest fraction of input rows, in [0, 1], that may be
        marked ``error``.
    """

    def __init__(self, n_read_tasks: int = 0, error_budget: float = 1.0) -> None:
        self._rows: dict[int, int] = {}
        self._n_read_tasks = n_read_tasks
        self._budget = error_budget
        self._batches: dict[tuple[str, str], _Batch] = {}
        self._failed_rows = 0  # sum of failed_rows over batches, kept as they finish
        self._first_reason: str | None = None
        self._actors: dict[str, dict[str, list[str]]] = {}  # stage -> actor id -> node per start

    # -- rows ----------------------------------------------------------------------------------

    def record(self, task_index: int, n_rows: int) -> None:
        """Read task ``task_index`` produced ``n_rows`` rows (a retry overwrites)."""
        self._rows[task_index] = n_rows

    def totals(self) -> tuple[int, int]:
        """(rows, read tasks recorded)."""
        return sum(self._rows.values()), len(self._rows)

    # -- placement -----------------------------------------------------------------------------

    def actor_placed(self, stage: str, actor_id: str, node_id: str) -> None:
        """An actor of ``stage`` (re)started on node ``node_id`` (Ray's hex ids). Ray
        restarts a dead pool actor under the same actor id."""
        self._actors.setdefault(stage, {}).setdefault(actor_id, []).append(node_id)

    def placement(self) -> dict[str, dict[str, Any]]:
        """Per actor stage: ``actors`` (distinct actor ids), ``actor_starts`` (restarts
        of a dead actor included) and ``node_ids`` (sorted, distinct) of the nodes they
        ran on."""
        return {
            stage: {
                "actors": len(actors),
                "actor_starts": sum(len(nodes) for nodes in actors.values()),
                "node_ids": sorted({n for nodes in actors.values() for n in nodes}),
            }
            for stage, actors in sorted(self._actors.items())
        }

    # -- batches -------------------------------------------------------------------------------

    def batch_started(self, stage: str, key: str, actor: str) -> int:
        """Record a start of batch ``key`` of ``stage`` by ``actor``; return how many
        earlier starts of it ended without a finish (their actor died holding it)."""
        batch = self._batches.setdefault((stage, key), _Batch())
        lost = sum(1 for a in batch.starts if a not in batch.finished_by)
        batch.starts.append(actor)
        return lost

    def batch_finished(
        self, stage: str, key: str, actor: str, retries: int, failed_rows: int, reason: str | None
    ) -> str | None:
        """Record that ``actor`` finished batch ``key``: scored (``failed_rows`` 0) or with
        ``failed_rows`` rows marked ``error`` for ``reason``. Return a message when the
        rows marked ``error`` so far exceed the error budget of the input's row count
        (known once every read task has reported), else None."""
        batch = self._batches.setdefault((stage, key), _Batch())
        batch.finished_by.add(actor)
        batch.retries += retries
        self._failed_rows += failed_rows - batch.failed_rows  # a batch finished again replaces
        if failed_rows and self._first_reason is None:
            self._first_reason = reason
        batch.failed_rows, batch.reason = failed_rows, reason
        return self.over_budget()

    def over_budget(self) -> str | None:
        """The stop message when the rows marked ``error`` by failed batches exceed
        ``error_budget`` x input rows; None while within it or while the input's row
        count is not yet known."""
        if len(self._rows) < self._n_read_tasks or self._n_read_tasks == 0:
            return None
        n_rows = sum(self._rows.values())
        n_failed = self._failed_rows
        if not n_failed or n_failed <= self._budget * n_rows:
            return None
        return (
            f"{n_failed} of {n_rows} rows ({n_failed / n_rows:.1%}) are marked error by "
            f"failed batches, over run.error_budget = {self._budget:g}; first reason: "
            f"{self._first_reason}"
        )

    def faults(self) -> dict[str, dict[str, int]]:
        """Per stage, the counters of :data:`ragbatch.io.manifest_model.FAULT_COUNTERS`:
        ``batches`` (distinct), ``batch_starts``, ``batch_retries`` (in-process attempts
        after the first), ``actors_lost`` (starts that ended with the actor dead while
        holding the batch; Ray Data replaced each), ``failed_batches`` and
        ``failed_rows`` (rows marked ``error``)."""
        out: dict[str, dict[str, int]] = {}
        for (stage, _), batch in self._batches.items():
            s = out.setdefault(
                stage,
                dict.fromkeys(FAULT_COUNTERS, 0),
            )
            s["batches"] += 1
            s["batch_starts"] += len(batch.starts)
            s["batch_retries"] += batch.retries
            s["actors_lost"] += sum(1 for a in batch.starts if a not in batch.finished_by)
            s["failed_batches"] += int(batch.failed_rows > 0)
            s["failed_rows"] += batch.failed_rows
        return out


def describe_faults(faults: dict[str, dict[str, Any]]) -> str:
    """One line per stage with faults, for the log; empty when there were none."""
    lines = []
    for stage, f in sorted(faults.items()):
        if f["actors_lost"] or f["batch_retries"] or f["failed_batches"]:
            lines.append(
                f"{stage}: {f['actors_lost']} actors lost mid-batch, "
                f"{f['batch_retries']} in-process retries, {f['failed_batches']} "
                f"batches ({f['failed_rows']} rows) marked error"
            )
    return "\n".join(lines)


def report_placement(ledger: Any, stage: str) -> None:
    """Tell the run's ledger (if any) which node this actor of ``stage`` runs on; called
    from an actor stage's constructor. Does not wait for the ledger."""
    if ledger is None:
        return
    import ray

    ctx = ray.get_runtime_context()
    ledger.actor_placed.remote(stage, ctx.get_actor_id() or "driver", ctx.get_node_id())
