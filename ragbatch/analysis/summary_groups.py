"""The summary's grouped DuckDB queries over table ``coded`` (the cells with their slice
values coded, :func:`ragbatch.analysis.summary.summarize_view`): counts by status and
pass, the number of distinct ``ok`` scores, the interval streams of each group (counted
or sorted, :class:`~ragbatch.analysis.intervals.MeanCIStream`) and the moments of the
judge scores and human labels that label-corrected means need.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from ragbatch.analysis.intervals import MeanCIStream
from ragbatch.analysis.ppi import Moments, PairMoments
from ragbatch.analysis.summary_types import SummarySettings
from ragbatch.core.columns import internal
from ragbatch.core.errors import OutputError
from ragbatch.core.status import OK, STATUSES

#: Largest number of result rows a summary query may group the cells into at once: the
#: slice columns are coded together (one scan for all of them) while their kept values
#: (plus the pooled one) multiplied together, times the rows per combination, stay under
#: it, and one at a time otherwise.
MAX_GROUP_ROWS: int = 1 << 16


def groupings(kept: Sequence[Sequence[Any]], per_combination: int) -> list[list[int]]:
    """The slice indexes each summary query groups by: all slice columns in one query
    when their value combinations times ``per_combination`` are at most
    :data:`MAX_GROUP_ROWS`, else one query per slice column (at least one query)."""
    combinations = math.prod(len(values) + 1 for values in kept) * max(1, per_combination)
    if len(kept) <= 1 or combinations <= MAX_GROUP_ROWS:
        return [list(range(len(kept)))]
    return [[i] for i in range(len(kept))]


def group_keys(metric: str, query: int, group: list[int], codes: Sequence[int]) -> list[tuple]:
    """The summary keys one result row of a grouping query adds to: the overall key
    (from the first query only) and ``(metric, i, code)`` per slice column grouped."""
    overall = [(metric, None, None)] if query == 0 else []
    return overall + [(metric, i, int(c)) for i, c in zip(group, codes)]


def counts(
    con: duckdb.DuckDBPyConnection, kept: Sequence[Sequence[Any]], n_metrics: int = 1
) -> dict:
    """(metric, slice index or None, code or None) -> n_total, n_<status>, n_pass.

    Counted by status and pass (``ok`` with score 1) over every slice column's codes
    at once where :func:`groupings` allows for ``n_metrics`` metrics, and added up here
    per key."""
    out: dict[tuple, dict[str, int]] = {}
    per_combination = (len(STATUSES) + 1) * 2 * max(1, n_metrics)
    for query, group in enumerate(groupings(kept, per_combination)):
        codes = "".join(f", {code_column(i)}" for i in group)
        cursor = con.execute(
            f"SELECT metric, status, coalesce(status = '{OK}' AND score = 1, false) AS pass"
            f"{codes}, count(*) FROM coded GROUP BY ALL"
        )
        for metric, status, passed, *rest in cursor.fetchall():
            n = int(rest[-1])
            for key in group_keys(metric, query, group, rest[:-1]):
                record = out.setdefault(
                    key, {"n_total": 0, **{f"n_{x}": 0 for x in STATUSES}, "n_pass": 0}
                )
                record["n_total"] += n
                if status in STATUSES:
                    record[f"n_{status}"] += n
                if passed:
                    record["n_pass"] += n
    return out


def distinct_ok_scores(con: duckdb.DuckDBPyConnection, metric_ids: Sequence[str]) -> dict:
    """Metric id -> number of distinct ``ok`` scores, in one scan of view ``s``.

    Raises
    ------
    OutputError
        An ``ok`` score of a metric is NaN, infinite or null (first such metric in
        ``metric_ids`` order).
    """
    rows = con.execute(
        f"SELECT metric, count(DISTINCT score), "
        f"count(*) FILTER (WHERE score IS NULL OR NOT isfinite(score)) "
        f"FROM s WHERE status = '{OK}' GROUP BY metric"
    ).fetchall()
    bad = {metric: int(n) for metric, _, n in rows if n}
    for metric_id in metric_ids:
        if metric_id in bad:
            raise not_finite(metric_id, bad[metric_id])
    return {metric: int(n) for metric, n, _ in rows}


def not_finite(metric_id: str, bad: int) -> OutputError:
    """The error for ``bad`` ``ok`` cells of ``metric_id`` holding NaN or an infinite score."""
    return OutputError(
        f"metric {metric_id!r}: {bad} cells with status ok hold NaN or an infinite score, "
        "so the summary cannot be computed; the metric must give such rows an error status"
    )


def counted_streams(
    con: duckdb.DuckDBPyConnection,
    metric_ids: Sequence[str],
    kept: Sequence[Sequence[Any]],
    settings: SummarySettings,
) -> dict[str, dict[tuple, MeanCIStream]]:
    """:func:`ok_streams` of every metric in ``metric_ids``, each of at most
    ``settings.max_distinct`` distinct ``ok`` scores: DuckDB counts each score per metric
    and group, and each group's stream gets its distinct scores with their counts
    (:meth:`MeanCIStream.add_counts`), so neither a sort nor the scores themselves leave
    DuckDB. The metrics share each query (one scan of the cells per grouping of
    :func:`groupings`, not one per metric); a metric's groups get the same counts, in the
    same order, as a query of its own would give them."""
    out: dict[str, dict[tuple, MeanCIStream]] = {m: {} for m in metric_ids}
    con.register(internal("counted"), pa.table({"id": pa.array(list(metric_ids), pa.string())}))
    for query, group in enumerate(groupings(kept, settings.max_distinct)):
        codes = "".join(f", {code_column(i)}" for i in group)
        table = con.sql(
            f"SELECT metric, score{codes}, count(*) AS n FROM coded "
            f"WHERE status = '{OK}' AND metric IN (SELECT id FROM {internal('counted')}) "
            "GROUP BY ALL"
        ).to_arrow_table()
        metrics = table.column(0).to_numpy(zero_copy_only=False)
        for metric_id in metric_ids:
            mine = table.filter(pa.array(metrics == metric_id))
            add_counted(out[metric_id], mine, query, group, settings)
    con.unregister(internal("counted"))
    return out


def add_counted(
    streams: dict[tuple, MeanCIStream],
    table: pa.Table,
    query: int,
    group: list[int],
    settings: SummarySettings,
) -> None:
    """Feed one metric's rows of a counting query (``metric``, ``score``, a code column
    per slice index of ``group``, ``n``) to its groups' streams in ``streams``."""
    scores = table.column(1).to_numpy().astype(np.float64)
    n = table.column(table.num_columns - 1).to_numpy().astype(np.int64)
    keyed: list[tuple[tuple, np.ndarray]] = []
    if query == 0:
        keyed.append(((None, None), np.ones(scores.size, dtype=bool)))
    for j, i in enumerate(group):
        column = table.column(j + 2).to_numpy().astype(np.int64)
        keyed += [((i, int(c)), column == c) for c in np.unique(column)]
    for key, mask in keyed:
        values, inverse = np.unique(scores[mask], return_inverse=True)
        counts = np.bincount(inverse, weights=n[mask], minlength=values.size)
        stream = streams.setdefault(
            key,
            MeanCIStream(
                max_resample_n=settings.max_resample_n, max_distinct=settings.max_distinct
            ),
        )
        stream.add_counts(values, counts.astype(np.int64))


#: Rows per Arrow batch fetched from DuckDB while streaming a metric's ``ok`` scores.
CHUNK_ROWS: int = 1 << 20


def ok_streams(
    con: duckdb.DuckDBPyConnection, metric_id: str, n_slices: int, settings: SummarySettings
) -> dict[tuple, MeanCIStream]:
    """One :class:`MeanCIStream` per group of a metric's ``ok`` scores: key
    ``(None, None)`` for all of them, ``(i, code)`` per slice column ``i`` and value code.

    The scores arrive in ascending order in batches of :data:`CHUNK_ROWS` (DuckDB sorts,
    spilling to disk when it must), so each group also receives its scores in ascending
    order, and memory does not depend on the number of rows.

    Raises
    ------
    OutputError
        An ``ok`` score is NaN or infinite.
    """
    columns = ", ".join(["score", *(code_column(i) for i in range(n_slices))])
    reader = con.sql(
        f"SELECT {columns} FROM coded WHERE metric = ? AND status = '{OK}' ORDER BY score",
        params=[metric_id],
    ).to_arrow_reader(CHUNK_ROWS)
    streams: dict[tuple, MeanCIStream] = {}

    def add(key: tuple, scores: np.ndarray) -> None:
        if key not in streams:
            streams[key] = MeanCIStream(
                max_resample_n=settings.max_resample_n, max_distinct=settings.max_distinct
            )
        streams[key].add(scores)

    bad = 0
    for batch in reader:
        scores = np.asarray(batch.column(0).to_numpy(zero_copy_only=False), dtype=np.float64)
        finite = np.isfinite(scores)
        if not finite.all():
            bad += int((~finite).sum())
            continue
        add((None, None), scores)
        for i in range(n_slices):
            codes = np.asarray(batch.column(i + 1).to_numpy(zero_copy_only=False), dtype=np.int64)
            for code in np.unique(codes):
                add((i, int(code)), scores[codes == code])
    if bad:
        raise not_finite(metric_id, bad)
    return streams


#: Key of a group's label moments: ``(None, None)`` for all rows, ``(i, code)`` per slice.
GroupKey = tuple


def label_moments(
    con: duckdb.DuckDBPyConnection, metric_id: str, label: str | None, n_slices: int
) -> dict[GroupKey, tuple[Moments, PairMoments]]:
    """Per group of a metric's ``ok`` cells: moments of the judge scores of unlabelled
    cells, and of (score, label) over labelled ones (``label``: the column of ``coded``
    holding the labels, :func:`label_column`; None: every cell is unlabelled), read in batches
    of :data:`CHUNK_ROWS`."""
    label_sql = "NULL::DOUBLE" if label is None else label
    columns = ", ".join(["score", label_sql, *(code_column(i) for i in range(n_slices))])
    reader = con.sql(
        f"SELECT {columns} FROM coded WHERE metric = ? AND status = '{OK}' AND isfinite(score)",
        params=[metric_id],
    ).to_arrow_reader(CHUNK_ROWS)
    out: dict[GroupKey, tuple[Moments, PairMoments]] = {}

    def add(key: GroupKey, f: np.ndarray, y: np.ndarray) -> None:
        unlabelled, labelled = out.setdefault(key, (Moments(), PairMoments()))
        known = ~np.isnan(y)
        unlabelled.add(f[~known])
        labelled.add(f[known], y[known])

    for batch in reader:
        f = np.asarray(batch.column(0).to_numpy(zero_copy_only=False), dtype=np.float64)
        y = np.asarray(batch.column(1).to_numpy(zero_copy_only=False), dtype=np.float64)
        add((None, None), f, y)
        for i in range(n_slices):
            codes = np.asarray(batch.column(i + 2).to_numpy(zero_copy_only=False), dtype=np.int64)
            for code in np.unique(codes):
                mask = codes == code
                add((i, int(code)), f[mask], y[mask])
    return out


def quote_identifier(name: str) -> str:
    """``name`` as a DuckDB identifier."""
    return '"' + name.replace('"', '""') + '"'


def code_column(i: int) -> str:
    """Column of table ``coded`` holding the value codes of slice column ``i``."""
    return internal(f"g{i}")


def label_column(j: int) -> str:
    """Column of table ``coded`` holding the values of label column ``j``."""
    return internal(f"label{j}")
