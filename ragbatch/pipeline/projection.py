"""The input columns an expression-only run reads: only those its metrics, row ids and
slices need.

A trace table often holds more than a run needs: a reference answer or a question that
no metric of the run reads, tool-call logs, embeddings. Decoding a text column costs
about as much as the expression metrics themselves (a 900 MB column of answers took
2.4 CPU-s to decode on the benchmark machine; docs/benchmarks/whole-job.md, round five).
The in-process executor (:mod:`ragbatch.pipeline.in_process`) therefore reads from
Parquet only the columns the run uses, and normalizes the canonical columns no metric
reads as if they were unmapped (all null, without an issue: nothing reads them).

What the metrics read is told by their Polars expressions
(:func:`udfs.expressions.stage_columns`), the same columns the expression stage converts
for them; when that cannot be told (a wildcard in an expression), every column is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ragbatch.config.job import InputSection
from ragbatch.core import columns as C


@dataclass(frozen=True)
class Projection:
    """What an expression-only run reads of its input.

    Attributes
    ----------
    input : InputSection
        The run's ``input`` with every canonical column that no metric reads unmapped
        (``row_id`` stays as it is); the normalizer takes it.
    columns : frozenset of str or None
        The input columns to read from Parquet (row id, the mapped columns the metrics
        read, the slice and label columns); None: every column.
    unread : tuple of str
        The canonical columns the config maps but no metric reads, in canonical order.
    """

    input: InputSection
    columns: frozenset[str] | None
    unread: tuple[str, ...]


def project_input(plan: Any) -> Projection:
    """The :class:`Projection` of ``plan`` (a :class:`ragbatch.pipeline.plan.Plan` whose
    stages are all expression stages).

    Every column is read (``columns`` None, ``input`` unchanged) when the metrics'
    columns cannot be told, or when ``input.filter`` is set (a table input's filter may
    name any column).
    """
    from udfs.expressions import stage_columns

    cfg: InputSection = plan.config.input
    whole = Projection(cfg, None, ())
    if cfg.filter:
        return whole
    metrics = [m for stage in plan.stages for m in stage.metrics]
    reads = stage_columns(metrics)
    if reads is None:
        return whole
    mapping = cfg.columns.model_dump()
    unread = tuple(
        c for c in C.CANONICAL if c != C.ROW_ID and mapping.get(c) is not None and c not in reads
    )
    kept = {c: v for c, v in mapping.items() if v is not None and c not in unread}
    columns = frozenset(kept.values()) | {source for source, _ in plan.slices}
    projected = cfg.model_copy(
        update={"columns": cfg.columns.model_copy(update={c: None for c in unread})}
    )
    return Projection(projected, columns, unread)
