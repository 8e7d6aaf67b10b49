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
counts in one grouping while their value combinations are few, :data:`MAX_GROUP_ROWS`).
A metric whose ``ok`` scores take at most ``max_distinct`` distinct values (pass/fail and
graded metrics) has each score counted per group by DuckDB, and each group's
:class:`~ragbatch.analysis.intervals.MeanCIStream` gets the distinct scores with their
counts. Any other metric's ``ok`` scores are read once, sorted by DuckDB (which spills to
disk under the memory cap of :func:`ragbatch.io.write.connect`), in batches of
:data:`CHUNK_ROWS` that feed one stream per group. The mean and standard deviation are
combined across counts or batches, so they can differ from numpy's over the whole group
in the last digits; the bootstrap draws are the same.

For judge metrics every row also carries the judge health measures of
:mod:`ragbatch.analysis.diagnostics` and, under the thresholds of the config's
``diagnostics`` section, ``degenerate`` with the reasons why (null for other metrics).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from ragbatch.analysis.diagnostics import MEASURES, degenerate_reasons, health_measures
from ragbatch.analysis.intervals import (
    BOOTSTRAP_MAX_N,
    CONFIDENCE,
    MAX_DISTINCT,
    N_RESAMPLES,
    SEED,
    MeanCIStream,
    wilson_interval,
)
from ragbatch.analysis.ppi import DEFAULT_ESTIMATOR, Moments, PairMoments, ppi_from_moments
from ragbatch.config.job import DiagnosticsSection
from ragbatch.core.columns import identifier_key, internal
from ragbatch.core.errors import OutputError
from ragbatch.judge.health import HealthFields
from ragbatch.io.write import OutputLayout, connect, file_list
from ragbatch.core.status import OK, STATUSES

#: Default cap on the slice values of one slice column that get their own summary rows.
MAX_SLICE_VALUES: int = 50

#: Schema of ``summary.parquet``, in column order.
SUMMARY_SCHEMA = pa.schema(
    [
        ("metric", pa.string()),
        ("metric_name", pa.string()),
        ("slice_column", pa.string()),
        ("slice_value", pa.string()),
        ("slice_other", pa.bool_()),
        ("n_total", pa.int64()),
    ]
    + [(f"n_{s}", pa.int64()) for s in STATUSES]
    + [
        ("mean", pa.float64()),
        ("mean_ci_low", pa.float64()),
        ("mean_ci_high", pa.float64()),
        ("mean_ci_method", pa.string()),
        ("pass_rate", pa.float64()),
        ("pass_rate_ci_low", pa.float64()),
        ("pass_rate_ci_high", pa.float64()),
        ("label_column", pa.string()),
        ("n_labelled", pa.int64()),
        ("labels_mean", pa.float64()),
        ("labels_ci_low", pa.float64()),
        ("labels_ci_high", pa.float64()),
        ("ppi_mean", pa.float64()),
        ("ppi_ci_low", pa.float64()),
        ("ppi_ci_high", pa.float64()),
        ("ppi_lambda", pa.float64()),
        ("ppi_reason", pa.string()),
    ]
    + [(m, pa.float64()) for m in MEASURES]
    + [
        ("degenerate", pa.bool_()),
        ("degenerate_reasons", pa.string()),
    ]
)

#: The summary columns of the label-corrected estimates (null for a metric without labels).
PPI_COLUMNS: tuple[str, ...] = tuple(
    SUMMARY_SCHEMA.names[SUMMARY_SCHEMA.names.index("label_column") :]
)


@dataclass(frozen=True)
class MetricInfo:
    """What the summary needs to know of a metric: its id, registry name, whether its
    ``ok`` scores are 0/1 (``Metric.boolean``), their range (None: unbounded), and for a
    judge metric where its cells record what the health diagnostics read
    (``JudgeMetric.health``; None for other metrics, which get no diagnostics)."""

    id: str
    name: str
    boolean: bool
    score_range: tuple[float, float] | None = None
    health: HealthFields | None = None

    @classmethod
    def of(cls, metric: Any) -> "MetricInfo":
        """From a :class:`ragbatch.scoring.base.Metric` instance."""
        health = metric.health if getattr(metric, "kind", None) == "judge" else None
        low, high = metric.score_range
        return cls(metric.id, metric.name, bool(metric.boolean), (float(low), float(high)), health)


@dataclass(frozen=True)
class SummarySettings:
    """The settings a summary was computed with (recorded in the manifest).

    Attributes
    ----------
    confidence : float
        Two-sided level of every interval, in (0, 1).
    n_resamples : int
        Bootstrap resamples per interval.
    seed : int
        Seed of every bootstrap (the same for every group).
    max_slice_values : int
        Slice values per slice column with their own rows; the rest are pooled.
    max_resample_n, max_distinct : int
        Thresholds of :func:`ragbatch.analysis.intervals.mean_ci`.
    ppi_estimator : str
        ``ppi`` or ``ppi++``: the estimator of label-corrected means
        (:func:`ragbatch.analysis.ppi.ppi_from_moments`).
    """

    confidence: float = CONFIDENCE
    n_resamples: int = N_RESAMPLES
    seed: int = SEED
    max_slice_values: int = MAX_SLICE_VALUES
    max_resample_n: int = BOOTSTRAP_MAX_N
    max_distinct: int = MAX_DISTINCT
    ppi_estimator: str = DEFAULT_ESTIMATOR

    def __post_init__(self) -> None:
        if self.max_slice_values < 1:
            raise ValueError(f"max_slice_values must be at least 1, got {self.max_slice_values}")


@dataclass
class RunSummary:
    """A computed summary.

    Attributes
    ----------
    table : pyarrow.Table
        The rows of ``summary.parquet`` (schema :data:`SUMMARY_SCHEMA`).
    settings : SummarySettings
    slice_columns : dict
        Slice column -> ``{"values": distinct values (null counted as one),
        "pooled_values": values pooled into the ``slice_other`` row (0 if none)}``.
    labels : dict
        Metric id -> scores-table column of its human labels.
    labelled_runs : dict
        Metric id -> the labels taken from another run.
    """

    table: pa.Table
    settings: SummarySettings
    slice_columns: dict[str, dict[str, int]] = field(default_factory=dict)
    diagnostics: DiagnosticsSection = field(default_factory=DiagnosticsSection)
    #: Metric id -> scores-table column of its human labels.
    labels: dict[str, str] = field(default_factory=dict)
    #: Metric id -> the labels taken from another run (``<column> of run <id>``).
    labelled_runs: dict[str, str] = field(default_factory=dict)

    def manifest_info(self) -> dict[str, Any]:
        """The manifest's ``summary`` section: the settings, the interval methods and the
        slice columns' value counts."""
        return {
            **asdict(self.settings),
            "mean_interval": "percentile bootstrap of the mean (normal approximation for "
            "groups over max_resample_n values with over max_distinct "
            "distinct values; see mean_ci_method)",
            "pass_rate_interval": "Wilson score interval",
            "slice_columns": self.slice_columns,
            "labels": self.labels,
            "labelled_runs": self.labelled_runs,
            "ppi_interval": "central-limit interval of the prediction-powered mean "
            "(docs/ppi.md); labels_ci_*: of the labels' mean",
        }

    def overall(self) -> list[dict[str, Any]]:
        """The overall row of each metric, in metric order."""
        return [r for r in self.table.to_pylist() if r["slice_column"] is None]

    def degenerate(self) -> dict[str, str]:
        """Metric id -> the reasons its all-rows result is degenerate (only such
        metrics), in metric order."""
        return {r["metric"]: r["degenerate_reasons"] for r in self.overall() if r["degenerate"]}

    def diagnostics_info(self) -> dict[str, Any]:
        """The manifest's ``diagnostics`` section: the thresholds, and per judge metric
        its all-rows ``degenerate`` flag, ``reasons`` (a list) and measures."""
        metrics = {}
        for r in self.overall():
            if r["degenerate"] is None:
                continue
            reasons = r["degenerate_reasons"]
            metrics[r["metric"]] = {
                "degenerate": r["degenerate"],
                "reasons": reasons.split("; ") if reasons else [],
                **{m: r[m] for m in MEASURES},
            }
        return {"thresholds": self.diagnostics.model_dump(mode="json"), "metrics": metrics}


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
    columns = ", ".join(["metric", "status", "score", "details", *(_quote(c) for c in read)])
    if files:
        con.execute(
            f"CREATE VIEW s AS SELECT {columns} FROM read_parquet("
            f"{file_list(layout, files)}, hive_partitioning=false, union_by_name=true)"
        ).fetchall()
    else:
        empty = ", ".join(
            [
                "NULL::VARCHAR metric",
                "NULL::VARCHAR status",
                "NULL::DOUBLE score",
                "NULL::VARCHAR details",
                *(f"NULL::VARCHAR {_quote(c)}" for c in read),
            ]
        )
        con.execute(f"CREATE VIEW s AS SELECT {empty} WHERE false").fetchall()
    return summarize_view(
        con,
        metrics,
        slices,
        settings,
        diagnostics,
        labels,
        labelled_runs,
        materialize=None if layout.on_local_disk else True,
    )


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
    counts = _counts(con, kept, len(infos))
    distinct = _distinct_ok_scores(con, [i.id for i in infos])
    groupings = [(None, "NULL::INTEGER")] + [(i, _code(i)) for i in range(len(slices))]
    few = [i.id for i in infos if distinct.get(i.id, 0) <= settings.max_distinct]
    counted = _counted_streams(con, few, kept, settings) if few else {}
    rows = []
    for info in infos:
        if info.id in counted:
            streams = counted[info.id]
        else:
            streams = _ok_streams(con, info.id, len(slices), settings)
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
            coded=_label(label_columns.index(labels[info.id])) if info.id in labels else None,
        )

        def row(column: str | None, value: str | None, other: bool | None, key: tuple) -> dict:
            out = _row(
                info, column, value, other, counts.get((info.id, *key)), streams.get(key), settings
            )
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
        text = f"CAST({_quote(column)} AS VARCHAR)"
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
    only; null for the others), per slice column ``i`` the column :func:`_code` ``(i)``,
    the index of the cell's slice value among the kept values (``cap`` for a pooled
    value), and per label column ``j`` of ``labels`` the column :func:`_label` ``(j)``,
    its values as DOUBLE (booleans 0/1). The slice and label columns' own names never
    appear in ``coded``, so no user column name can stand for one of its columns.

    With ``materialize`` false, ``coded`` is a view, computed again by each query: for a
    summary without judge health measures or labels, whose three scans of it cost less
    than writing it out once (3,000,000 rows x 6 metrics: 2.8 s to materialize, about 1
    s per scan of the view)."""
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
            f"LEFT JOIN {kept_i} ON CAST(s.{_quote(column)} AS VARCHAR) "
            f"IS NOT DISTINCT FROM {kept_i}.v"
        )
        codes.append(f"coalesce({kept_i}.code, {cap})::INTEGER AS {_code(i)}")
    has_details = "details" in {d[0] for d in con.execute("SELECT * FROM s LIMIT 0").description}
    details = "NULL::VARCHAR"
    if has_details and judged:
        con.register("judged_ids", pa.table({"id": pa.array(list(judged), pa.string())}))
        details = "CASE WHEN s.metric IN (SELECT id FROM judged_ids) THEN s.details END"
    label_columns = [f"CAST(s.{_quote(c)} AS DOUBLE) AS {_label(j)}" for j, c in enumerate(labels)]
    select = ", ".join(
        ["s.metric", "s.status", "s.score", f"{details} AS details", *codes, *label_columns]
    )
    kind = "TABLE" if materialize else "VIEW"
    con.execute(f"CREATE TEMP {kind} coded AS SELECT {select} FROM s {' '.join(joins)}").fetchall()


#: Largest number of result rows a summary query may group the cells into at once: the
#: slice columns are coded together (one scan for all of them) while their kept values
#: (plus the pooled one) multiplied together, times the rows per combination, stay under
#: it, and one at a time otherwise.
MAX_GROUP_ROWS: int = 1 << 16


def _groupings(kept: Sequence[Sequence[Any]], per_combination: int) -> list[list[int]]:
    """The slice indexes each summary query groups by: all slice columns in one query
    when their value combinations times ``per_combination`` are at most
    :data:`MAX_GROUP_ROWS`, else one query per slice column (at least one query)."""
    combinations = math.prod(len(values) + 1 for values in kept) * max(1, per_combination)
    if len(kept) <= 1 or combinations <= MAX_GROUP_ROWS:
        return [list(range(len(kept)))]
    return [[i] for i in range(len(kept))]


def _group_keys(metric: str, query: int, group: list[int], codes: Sequence[int]) -> list[tuple]:
    """The summary keys one result row of a grouping query adds to: the overall key
    (from the first query only) and ``(metric, i, code)`` per slice column grouped."""
    overall = [(metric, None, None)] if query == 0 else []
    return overall + [(metric, i, int(c)) for i, c in zip(group, codes)]


def _counts(
    con: duckdb.DuckDBPyConnection, kept: Sequence[Sequence[Any]], n_metrics: int = 1
) -> dict:
    """(metric, slice index or None, code or None) -> n_total, n_<status>, n_pass.

    Counted by status and pass (``ok`` with score 1) over every slice column's codes
    at once where :func:`_groupings` allows for ``n_metrics`` metrics, and added up here
    per key."""
    out: dict[tuple, dict[str, int]] = {}
    per_combination = (len(STATUSES) + 1) * 2 * max(1, n_metrics)
    for query, group in enumerate(_groupings(kept, per_combination)):
        codes = "".join(f", {_code(i)}" for i in group)
        cursor = con.execute(
            f"SELECT metric, status, coalesce(status = '{OK}' AND score = 1, false) AS pass"
            f"{codes}, count(*) FROM coded GROUP BY ALL"
        )
        for metric, status, passed, *rest in cursor.fetchall():
            n = int(rest[-1])
            for key in _group_keys(metric, query, group, rest[:-1]):
                record = out.setdefault(
                    key, {"n_total": 0, **{f"n_{x}": 0 for x in STATUSES}, "n_pass": 0}
                )
                record["n_total"] += n
                if status in STATUSES:
                    record[f"n_{status}"] += n
                if passed:
                    record["n_pass"] += n
    return out


def _distinct_ok_scores(con: duckdb.DuckDBPyConnection, metric_ids: Sequence[str]) -> dict:
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
            raise _not_finite(metric_id, bad[metric_id])
    return {metric: int(n) for metric, n, _ in rows}


def _not_finite(metric_id: str, bad: int) -> OutputError:
    return OutputError(
        f"metric {metric_id!r}: {bad} cells with status ok hold NaN or an infinite score, "
        "so the summary cannot be computed; the metric must give such rows an error status"
    )


def _counted_streams(
    con: duckdb.DuckDBPyConnection,
    metric_ids: Sequence[str],
    kept: Sequence[Sequence[Any]],
    settings: SummarySettings,
) -> dict[str, dict[tuple, MeanCIStream]]:
    """:func:`_ok_streams` of every metric in ``metric_ids``, each of at most
    ``settings.max_distinct`` distinct ``ok`` scores: DuckDB counts each score per metric
    and group, and each group's stream gets its distinct scores with their counts
    (:meth:`MeanCIStream.add_counts`), so neither a sort nor the scores themselves leave
    DuckDB. The metrics share each query (one scan of the cells per grouping of
    :func:`_groupings`, not one per metric); a metric's groups get the same counts, in the
    same order, as a query of its own would give them."""
    out: dict[str, dict[tuple, MeanCIStream]] = {m: {} for m in metric_ids}
    con.register(internal("counted"), pa.table({"id": pa.array(list(metric_ids), pa.string())}))
    for query, group in enumerate(_groupings(kept, settings.max_distinct)):
        codes = "".join(f", {_code(i)}" for i in group)
        table = con.sql(
            f"SELECT metric, score{codes}, count(*) AS n FROM coded "
            f"WHERE status = '{OK}' AND metric IN (SELECT id FROM {internal('counted')}) "
            "GROUP BY ALL"
        ).to_arrow_table()
        metrics = table.column(0).to_numpy(zero_copy_only=False)
        for metric_id in metric_ids:
            mine = table.filter(pa.array(metrics == metric_id))
            _add_counted(out[metric_id], mine, query, group, settings)
    con.unregister(internal("counted"))
    return out


def _add_counted(
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


def _ok_streams(
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
    columns = ", ".join(["score", *(_code(i) for i in range(n_slices))])
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
        raise _not_finite(metric_id, bad)
    return streams


#: Key of a group's label moments: ``(None, None)`` for all rows, ``(i, code)`` per slice.
GroupKey = tuple


def _label_moments(
    con: duckdb.DuckDBPyConnection, metric_id: str, label: str | None, n_slices: int
) -> dict[GroupKey, tuple[Moments, PairMoments]]:
    """Per group of a metric's ``ok`` cells: moments of the judge scores of unlabelled
    cells, and of (score, label) over labelled ones (``label``: the column of ``coded``
    holding the labels, :func:`_label`; None: every cell is unlabelled), read in batches
    of :data:`CHUNK_ROWS`."""
    label_sql = "NULL::DOUBLE" if label is None else label
    columns = ", ".join(["score", label_sql, *(_code(i) for i in range(n_slices))])
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
        groups = _label_moments(con, info.id, coded, n_slices)
        return lambda key: fields(label, *(groups.get(key) or (Moments(), PairMoments())))
    if labelled_run is not None:
        description, pairs = labelled_run
        unlabelled = _label_moments(con, info.id, None, 0).get((None, None), (Moments(),))[0]
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


def _quote(name: str) -> str:
    """``name`` as a DuckDB identifier."""
    return '"' + name.replace('"', '""') + '"'


def _code(i: int) -> str:
    """Column of table ``coded`` holding the value codes of slice column ``i``."""
    return internal(f"g{i}")


def _label(j: int) -> str:
    """Column of table ``coded`` holding the values of label column ``j``."""
    return internal(f"label{j}")


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
