"""The run summary: counts, means and confidence intervals per metric and slice value.

``summary.parquet`` holds, for every metric of a run (in config order), one *overall* row
(``slice_column`` null) and then, for every slice column of the run (in scores-table
order), one row per slice value. Each row counts the row's cells by status, and over its
``ok`` cells gives the mean score with a confidence interval (:func:`ragbatch.analysis.
intervals.mean_ci`) and, for boolean metrics (``Metric.boolean``), the pass rate (share
of ``ok`` cells scoring 1) with a Wilson score interval.

Slice values are grouped by their text (DuckDB's ``CAST(value AS VARCHAR)``: ``0.5``,
``true``, ``2024-06-01``, ``[a, b]``); a null slice value is a group of its own, with
``slice_value`` null. A slice column with more than ``max_slice_values`` distinct values
(null counted as one) gets rows for its ``max_slice_values`` most frequent values (ties
broken by the value's text in byte order, null last) and one row with ``slice_other``
true that pools the remaining values. Every metric scores every row, so the values kept
are the same for every metric.

A metric with a label column (config ``labels.columns``) also gets, per row of the
summary, the mean of its human labels and the judge's mean corrected by them
(prediction-powered inference, :mod:`ragbatch.analysis.ppi`), each with its interval, over
the group's ``ok`` cells: labelled cells (label not null) and unlabelled ones. A metric
whose labels come from another run (``labels.calibration``) gets them on its overall row
only, with every ``ok`` cell of this run unlabelled. A metric without labels has these
columns null. Label columns are never slice columns of the summary.

The intervals do not depend on the order of the score files: each group's ``ok`` scores
are sorted before resampling, and every group uses the same seed, so a row's interval is
``mean_ci(sorted(scores))`` with the run's settings.

Memory does not grow with the run: counts are DuckDB aggregates (every slice column's
counts in one grouping while their value combinations are few,
:data:`ragbatch.analysis.summary_groups.MAX_GROUP_ROWS`). A metric whose ``ok`` scores
take at most ``max_distinct`` distinct values (pass/fail and graded metrics) has each
score counted per group by DuckDB, and each group's
:class:`~ragbatch.analysis.intervals.MeanCIStream` gets the distinct scores with their
counts. Any other metric's ``ok`` scores are read once, sorted by DuckDB (which spills to
disk under the memory cap of :func:`ragbatch.io.write.connect`), in batches of
:data:`ragbatch.analysis.summary_groups.CHUNK_ROWS` that feed one stream per group. The
mean and standard deviation are combined across counts or batches, so they can differ
from numpy's over the whole group in the last digits; the bootstrap draws are the same.

For judge metrics every row also carries the judge health measures of
:mod:`ragbatch.analysis.diagnostics` and, under the thresholds of the config's
``diagnostics`` section, ``degenerate`` with the reasons why (null for other metrics).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import duckdb
import pyarrow as pa

from ragbatch.analysis import summary_groups as grouped
from ragbatch.analysis.diagnostics import MEASURES, degenerate_reasons, health_measures
from ragbatch.analysis.intervals import MeanCIStream, wilson_interval
from ragbatch.analysis.ppi import Moments, PairMoments, ppi_from_moments
from ragbatch.analysis.summary_groups import GroupKey
from ragbatch.analysis.summary_types import (
    PPI_COLUMNS,
    SUMMARY_SCHEMA,
    MetricInfo,
    RunSummary,
    SummarySettings,
)
from ragbatch.config.job import DiagnosticsSection
from ragbatch.core.columns import identifier_key, internal
from ragbatch.core.errors import OutputError
from ragbatch.io.write import OutputLayout, connect, file_list, metric_key_sql
from ragbatch.analysis.panel_summary import member_judges, panel_agreements
from ragbatch.core.status import OK, STATUSES


def summary_settings(config: Any) -> SummarySettings:
    """The summary settings of a :class:`ragbatch.config.job.JobConfig` (its ``labels``
    section picks the PPI estimator)."""
    if config.labels is None:
        return SummarySettings()
    return SummarySettings(ppi_estimator=config.labels.estimator)


def summarize_run(
    layout: OutputLayout,
    files: list[str],
    metrics: Sequence[Any],
    slices: Sequence[str],
    settings: SummarySettings | None = None,
    diagnostics: DiagnosticsSection | None = None,
    labels: dict[str, str] | None = None,
    labelled_runs: dict[str, tuple[str, PairMoments]] | None = None,
) -> RunSummary:
    """Summarize the score files ``files`` (paths on ``layout.fs``) of one run.

    Parameters
    ----------
    layout
        The run's output layout (gives the filesystem).
    files
        Score Parquet files holding ``metric``, ``status``, ``score``, ``details`` and
        the slice columns.
    metrics
        :class:`MetricInfo` or ``Metric`` instances, in the order rows are written.
    slices
        Slice column names, in the order their rows are written.
    settings
        Interval and slicing settings (default :class:`SummarySettings`).
    diagnostics
        Thresholds of the judge health checks (default: those of
        :class:`~ragbatch.config.job.DiagnosticsSection`).
    labels
        Metric id -> column of the score files holding its human labels (numbers or
        booleans, null where unlabelled); not among ``slices``.
    labelled_runs
        Metric id -> (description, moments of (score, label) pairs) of a labelled sample
        taken from another run (:mod:`ragbatch.analysis.labelled_run`): every ``ok`` cell
        of this run is unlabelled. Only the overall row gets an estimate; slice rows say
        why not.

    Raises
    ------
    OutputError
        An ``ok`` score is NaN or infinite (no interval can be computed), or a slice or
        label column is one column to DuckDB with another the summary reads
        (:func:`_check_names`).
    """
    labels = labels or {}
    _check_names(slices, labels.values())
    con = connect(layout)
    read = list(dict.fromkeys([*slices, *labels.values()]))
    columns = ", ".join(
        ["metric", "status", "score", "details", *(grouped.quote_identifier(c) for c in read)]
    )
    if files:
        source = (
            f"read_parquet({file_list(layout, files)}, hive_partitioning=false, union_by_name=true)"
        )
        # A judge panel's member cells are summarized under their member keys.
        columns = columns.replace("metric", f"{metric_key_sql(con, source)} AS metric", 1)
        con.execute(f"CREATE VIEW s AS SELECT {columns} FROM {source}").fetchall()
    else:
        empty = ", ".join(
            [
                "NULL::VARCHAR metric",
                "NULL::VARCHAR status",
                "NULL::DOUBLE score",
                "NULL::VARCHAR details",
                *(f"NULL::VARCHAR {grouped.quote_identifier(c)}" for c in read),
            ]
        )
        con.execute(f"CREATE VIEW s AS SELECT {empty} WHERE false").fetchall()
    summary = summarize_view(
        con,
        metrics,
        slices,
        settings,
        diagnostics,
        labels,
        labelled_runs,
        materialize=None if layout.on_local_disk else True,
    )
    if files:
        summary.panels = panel_agreements(con, source, metrics, summary.settings)
    return summary


def summarize_view(
    con: duckdb.DuckDBPyConnection,
    metrics: Sequence[Any],
    slices: Sequence[str],
    settings: SummarySettings | None = None,
    diagnostics: DiagnosticsSection | None = None,
    labels: dict[str, str] | None = None,
    labelled_runs: dict[str, tuple[str, PairMoments]] | None = None,
    materialize: bool | None = None,
) -> RunSummary:
    """:func:`summarize_run` over a DuckDB view ``s`` of the scores already defined on
    ``con`` (columns ``metric``, ``status``, ``score``, ``slices``, the label columns of
    ``labels`` and, for the judge health measures, ``details``: without it they count no
    extraction, reason or verdict).

    ``materialize`` says whether the coded cells are written out once as a table (True)
    or read again through ``s`` by each query (False); None (the default) writes them out
    only when judge health measures or labels will read them again (:func:`_code_cells`).
    :func:`summarize_run` always writes them out for scores on an object store, where each
    read of ``s`` is a download."""
    settings = settings or SummarySettings()
    diagnostics = diagnostics or DiagnosticsSection()
    labels = labels or {}
    _check_names(slices, labels.values())
    labelled_runs = labelled_runs or {}
    infos = [m if isinstance(m, MetricInfo) else MetricInfo.of(m) for m in metrics]
    kept, slice_info = _slice_values(con, slices, settings.max_slice_values)
    judged = [i.id for i in infos if i.health is not None]
    label_columns = list(dict.fromkeys(labels.values()))
    _code_cells(
        con,
        slices,
        kept,
        settings.max_slice_values,
        judged,
        label_columns,
        materialize=bool(judged or label_columns) if materialize is None else materialize,
    )
    counts = grouped.counts(con, kept, len(infos))
    distinct = grouped.distinct_ok_scores(con, [i.id for i in infos])
    groupings = [(None, "NULL::INTEGER")] + [
        (i, grouped.code_column(i)) for i in range(len(slices))
    ]
    few = [i.id for i in infos if distinct.get(i.id, 0) <= settings.max_distinct]
    counted = grouped.counted_streams(con, few, kept, settings) if few else {}
    judge_of = member_judges(metrics)
    rows = []
    for info in infos:
        if info.id in counted:
            streams = counted[info.id]
        else:
            streams = grouped.ok_streams(con, info.id, len(slices), settings)
        health = (
            {}
            if info.health is None
            else health_measures(con, "coded", info.id, info.health, groupings)
        )
        corrected = _corrected_fields(
            con,
            info,
            labels.get(info.id),
            labelled_runs.get(info.id),
            len(slices),
            settings,
            coded=grouped.label_column(label_columns.index(labels[info.id]))
            if info.id in labels
            else None,
        )

        def row(column: str | None, value: str | None, other: bool | None, key: tuple) -> dict:
            out = _row(
                info, column, value, other, counts.get((info.id, *key)), streams.get(key), settings
            )
            out["judge"] = judge_of.get(info.id)
            return {**out, **corrected(key), **_health_columns(info, health.get(key), diagnostics)}

        rows.append(row(None, None, None, (None, None)))
        for i, column in enumerate(slices):
            groups = list(enumerate(kept[i]))
            if slice_info[column]["pooled_values"]:
                groups.append((settings.max_slice_values, None))
            for code, value in groups:
                rows.append(row(column, value, code == settings.max_slice_values, (i, code)))
    table = pa.Table.from_pylist(rows, schema=SUMMARY_SCHEMA)
    return RunSummary(
        table,
        settings,
        slice_info,
        diagnostics,
        dict(labels),
        {m: d for m, (d, _) in labelled_runs.items()},
    )


def _health_columns(
    info: MetricInfo, measures: dict[str, Any] | None, thresholds: DiagnosticsSection
) -> dict[str, Any]:
    """The health columns of one summary row: null for a metric without diagnostics;
    for a judge metric's group without cells, null measures and ``degenerate`` false."""
    if info.health is None:
        return {**dict.fromkeys(MEASURES), "degenerate": None, "degenerate_reasons": None}
    measures = measures or {}
    reasons = degenerate_reasons(measures, info.health, thresholds)
    return {
        **{m: measures.get(m) for m in MEASURES},
        "degenerate": bool(reasons),
        "degenerate_reasons": "; ".join(reasons) or None,
    }


def _slice_values(
    con: duckdb.DuckDBPyConnection, slices: Sequence[str], cap: int
) -> tuple[list[list[str | None]], dict[str, dict[str, int]]]:
    """Per slice column, the values that get their own rows (most frequent first) and
    the counts for the manifest."""
    kept: list[list[str | None]] = []
    info: dict[str, dict[str, int]] = {}
    value, count = internal("v"), internal("n")
    groups = internal("groups")
    for column in slices:
        text = f"CAST({grouped.quote_identifier(column)} AS VARCHAR)"
        # One scan: the values with their counts, and how many there are (null counts
        # as a value of its own, as a group of the GROUP BY).
        ranked = con.execute(
            f"SELECT {value}, {count}, count(*) OVER () AS {groups} FROM ("
            f"SELECT {text} AS {value}, count(*) AS {count} FROM s GROUP BY {value}) "
            f"ORDER BY {count} DESC, {value} ASC NULLS LAST LIMIT {cap + 1}"
        ).fetchall()
        distinct = ranked[0][2] if ranked else 0
        values = [v for v, _, _ in ranked[:cap]]
        kept.append(values)
        info[column] = {"values": int(distinct), "pooled_values": int(distinct) - len(values)}
    return kept, info


def _code_cells(
    con: duckdb.DuckDBPyConnection,
    slices: Sequence[str],
    kept: list[list[str | None]],
    cap: int,
    judged: Sequence[str] = (),
    labels: Sequence[str] = (),
    materialize: bool = True,
) -> None:
    """Table ``coded``: metric, status, score, ``details`` (of the metrics in ``judged``
    only; null for the others), per slice column ``i`` the column :func:`code_column` ``(i)``,
    the index of the cell's slice value among the kept values (``cap`` for a pooled
    value), and per label column ``j`` of ``labels`` the column :func:`label_column` ``(j)``,
    its values as DOUBLE (booleans 0/1). The slice and label columns' own names never
    appear in ``coded``, so no user column name can stand for one of its columns.

    With ``materialize`` false, ``coded`` is a view, computed again by each query: for a
    summary without judge health measures or labels, whose three scans of it cost less
    than writing it out once (measured in docs/benchmarks/whole-job.md)."""
    joins, codes = [], []
    for i, column in enumerate(slices):
        kept_i = internal(f"kept{i}")
        con.register(
            kept_i,
            pa.table(
                {
                    "v": pa.array(kept[i], pa.string()),
                    "code": pa.array(range(len(kept[i])), pa.int32()),
                }
            ),
        )
        joins.append(
            f"LEFT JOIN {kept_i} ON CAST(s.{grouped.quote_identifier(column)} AS VARCHAR) "
            f"IS NOT DISTINCT FROM {kept_i}.v"
        )
        codes.append(f"coalesce({kept_i}.code, {cap})::INTEGER AS {grouped.code_column(i)}")
    has_details = "details" in {d[0] for d in con.execute("SELECT * FROM s LIMIT 0").description}
    details = "NULL::VARCHAR"
    if has_details and judged:
        con.register("judged_ids", pa.table({"id": pa.array(list(judged), pa.string())}))
        details = "CASE WHEN s.metric IN (SELECT id FROM judged_ids) THEN s.details END"
    label_columns = [
        f"CAST(s.{grouped.quote_identifier(c)} AS DOUBLE) AS {grouped.label_column(j)}"
        for j, c in enumerate(labels)
    ]
    select = ", ".join(
        ["s.metric", "s.status", "s.score", f"{details} AS details", *codes, *label_columns]
    )
    kind = "TABLE" if materialize else "VIEW"
    con.execute(f"CREATE TEMP {kind} coded AS SELECT {select} FROM s {' '.join(joins)}").fetchall()


def _corrected_fields(
    con: duckdb.DuckDBPyConnection,
    info: MetricInfo,
    label: str | None,
    labelled_run: tuple[str, PairMoments] | None,
    n_slices: int,
    settings: SummarySettings,
    coded: str | None = None,
) -> Callable[[GroupKey], dict[str, Any]]:
    """Group key -> the :data:`PPI_COLUMNS` of that summary row: from the label column
    ``label`` of this run's scores (column ``coded`` of table ``coded``), from
    ``labelled_run``'s pairs (overall row only), or all null."""

    def fields(description: str, unlabelled: Moments, labelled: PairMoments) -> dict[str, Any]:
        r = ppi_from_moments(
            unlabelled,
            labelled,
            estimator=settings.ppi_estimator,
            confidence=settings.confidence,
            bounds=info.score_range,
        )
        return {
            "label_column": description,
            "n_labelled": r.n_labelled,
            "labels_mean": r.labels_mean,
            "labels_ci_low": r.labels_ci_low,
            "labels_ci_high": r.labels_ci_high,
            "ppi_mean": r.ppi_mean,
            "ppi_ci_low": r.ppi_ci_low,
            "ppi_ci_high": r.ppi_ci_high,
            "ppi_lambda": r.ppi_lambda,
            "ppi_reason": r.reason,
        }

    if label is not None:
        groups = grouped.label_moments(con, info.id, coded, n_slices)
        return lambda key: fields(label, *(groups.get(key) or (Moments(), PairMoments())))
    if labelled_run is not None:
        description, pairs = labelled_run
        unlabelled = grouped.label_moments(con, info.id, None, 0).get((None, None), (Moments(),))[0]
        overall = fields(description, unlabelled, pairs)
        per_slice = {
            **dict.fromkeys(PPI_COLUMNS),
            "label_column": description,
            "ppi_reason": "labels from another run correct the overall mean only",
        }
        return lambda key: overall if key == (None, None) else per_slice
    return lambda key: dict.fromkeys(PPI_COLUMNS)


def _row(
    info: MetricInfo,
    column: str | None,
    value: str | None,
    other: bool | None,
    counts: dict[str, int] | None,
    stream: MeanCIStream | None,
    settings: SummarySettings,
) -> dict[str, Any]:
    """One summary row; ``stream`` holds the group's ``ok`` scores (None: there are none)."""
    counts = counts or {"n_total": 0, "n_pass": 0, **{f"n_{s}": 0 for s in STATUSES}}
    stream = stream or MeanCIStream()
    mean, low, high, method = stream.result(
        confidence=settings.confidence, n_resamples=settings.n_resamples, seed=settings.seed
    )
    rate = rate_low = rate_high = None
    if info.boolean:
        rate, rate_low, rate_high = wilson_interval(
            int(counts["n_pass"]), int(counts[f"n_{OK}"]), settings.confidence
        )
    return {
        "metric": info.id,
        "metric_name": info.name,
        "slice_column": column,
        "slice_value": value,
        "slice_other": other,
        **{k: int(v) for k, v in counts.items() if k != "n_pass"},
        "mean": mean,
        "mean_ci_low": low,
        "mean_ci_high": high,
        "mean_ci_method": method,
        "pass_rate": rate,
        "pass_rate_ci_low": rate_low,
        "pass_rate_ci_high": rate_high,
    }


#: The columns of the scores the summary reads besides the slice and label columns.
CELL_COLUMNS: tuple[str, ...] = ("metric", "status", "score", "details")


def _check_names(slices: Sequence[str], labels: Iterable[str]) -> None:
    """Refuse slice and label columns that DuckDB cannot tell apart from another column
    the summary reads: names that differ only in ASCII case
    (:func:`ragbatch.core.columns.identifier_key`), such as ``Score`` beside ``score``,
    which DuckDB's SQL reads as one column (a run renames such input columns
    ``input_<name>``, :func:`ragbatch.io.schema.slice_columns`; scores written before it
    did can still hold them).

    Raises
    ------
    OutputError
        Names the two columns and the fix.
    """
    seen = {identifier_key(c): c for c in CELL_COLUMNS}
    for name in dict.fromkeys([*slices, *labels]):
        other = seen.setdefault(identifier_key(name), name)
        if other != name:
            raise OutputError(
                f"summary: column {name!r} of the scores differs from column {other!r} only "
                "in case, and DuckDB reads the two as one column, so its summary would hold "
                f"the wrong values; run the job again to have it written as 'input_{name}', "
                "or rename it in the input"
            )
