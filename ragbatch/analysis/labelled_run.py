"""The labelled sample of a run taken from another committed run (config
``labels.calibration``): a judge run of ``ragbatch calibrate``, or an earlier run whose
scores table holds human labels.

Its ``ok`` cells with a label give the (score, label) pairs of
:func:`ragbatch.analysis.ppi.ppi_from_moments`; every ``ok`` cell of the new run is then
unlabelled. That is the classic PPI setting, and it holds only when the labelled run
scored rows of the same distribution with the same metric: same registered name and
params, and for a judge metric the same judge model. :func:`labelled_run_moments` checks
the metric and the labels before the new run starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from ragbatch.analysis.ppi import PairMoments
from ragbatch.analysis.runs import CommittedRun, find_run, load_scores
from ragbatch.core.errors import ConfigError, InputError
from ragbatch.core.status import OK


def labelled_run_moments(plan: Any) -> dict[str, tuple[str, PairMoments]]:
    """Per metric id of ``plan.config.labels.calibration.columns``: a description of the
    labels (``<column> of run <run id>``) and the moments of its (score, label) pairs.

    Parameters
    ----------
    plan : ragbatch.pipeline.plan.Plan
        The new run's plan.

    Returns
    -------
    dict
        Empty when the config takes no labels from another run.

    Raises
    ------
    InputError
        The run is not committed under ``uri``, or its scores have no such column, or a
        label is not a number or lies outside the metric's range.
    ConfigError
        The labelled run lacks the metric, or computed it with another name, params or
        judge model.
    """
    labels = plan.config.labels
    section = labels.calibration if labels is not None else None
    if section is None:
        return {}
    run = find_run(section.uri, section.run_id, section.storage_options)
    by_id = {m.id: m for m in plan.metrics}
    columns = list(dict.fromkeys(section.columns.values()))
    missing = [c for c in columns if c not in run.slice_columns]
    if missing:
        raise InputError(
            f"labels.calibration.columns: run {run.run_id} has no column "
            f"{', '.join(map(repr, missing))}; its columns: "
            f"{', '.join(run.slice_columns) or 'none'}"
        )
    scores = load_scores(run, ["metric", "score", "status", "model", *columns])
    out = {}
    for metric_id, column in section.columns.items():
        metric = by_id[metric_id]
        _check_same_metric(run, metric, scores.filter(pl.col("metric") == metric_id), plan)
        cells = scores.filter(
            (pl.col("metric") == metric_id)
            & (pl.col("status") == OK)
            & pl.col(column).is_not_null()
        )
        y = _labels(cells[column], metric_id, column, metric.score_range, run.run_id)
        pairs = PairMoments()
        pairs.add(cells["score"].cast(pl.Float64).to_numpy(), y)
        out[metric_id] = (f"{column} of run {run.run_id}", pairs)
    return out


def _labels(
    column: pl.Series, metric_id: str, name: str, bounds: Sequence[float], run_id: str
) -> np.ndarray:
    """The labels as float64, checked to be numbers in ``bounds``."""
    where = f"labels.calibration.columns.{metric_id}: column {name!r} of run {run_id}"
    if column.dtype == pl.Boolean:
        column = column.cast(pl.Float64)
    if not column.dtype.is_numeric():
        raise InputError(
            f"{where} has type {column.dtype}; labels need numbers or booleans "
            "on the metric's scale"
        )
    y = column.cast(pl.Float64).to_numpy()
    low, high = bounds
    bad = ~((y >= low) & (y <= high))
    if bad.any():
        raise InputError(
            f"{where} holds {int(bad.sum())} label(s) outside {metric_id}'s range "
            f"[{low:g}, {high:g}] (first: {float(y[bad][0])!r}); labels are on the "
            "metric's own scale"
        )
    return y


def _check_same_metric(run: CommittedRun, metric: Any, cells: pl.DataFrame, plan: Any) -> None:
    """Refuse labels of a metric the labelled run computed differently."""
    where = f"labels.calibration.columns.{metric.id}"
    entry = run.manifest.metric_info(metric.id)
    if entry is None:
        raise ConfigError(
            f"{where}: run {run.run_id} has no metric {metric.id!r}; its metrics: "
            f"{', '.join(run.metric_names) or 'none'}"
        )
    mine = metric.manifest_info()
    for key in ("name", "params"):
        if entry.get(key) != mine[key]:
            raise ConfigError(
                f"{where}: run {run.run_id} computed {metric.id!r} with {key} "
                f"{entry.get(key)!r}, this run with {mine[key]!r}; labels correct "
                "only the same metric"
            )
    if metric.engine is None or metric.kind != "judge":
        return
    from ragbatch.judge.cache_probe import engine_identities

    identities, why = engine_identities(metric.engine, plan.engines[metric.engine])
    models = {i.model_id for i in identities}
    theirs = set(cells["model"].drop_nulls().unique().to_list())
    if not models:
        raise ConfigError(
            f"{where}: the judge model of engine {metric.engine!r} cannot be "
            f"identified ({why}), so it cannot be matched with run {run.run_id}'s"
        )
    if not theirs or not theirs <= models:
        raise ConfigError(
            f"{where}: run {run.run_id} judged {metric.id!r} with "
            f"{sorted(theirs) or 'no model'}, this run with {sorted(models)}; "
            "labels correct only the same judge"
        )
