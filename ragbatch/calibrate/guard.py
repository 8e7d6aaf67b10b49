"""The run's calibration guard: judge metrics need recorded agreement with humans.

A job config's ``calibration`` section names a committed calibration and a minimum per
metric and measure. Before a run starts, each such metric is looked up in the
calibration's ``agreement`` table by its judge model id (as the run's engine will report
it) and its prompt version (:func:`ragbatch.calibrate.agreement.prompt_version`).
"""

from __future__ import annotations

import logging
from typing import Any

import polars as pl

from ragbatch.calibrate.agreement import prompt_version
from ragbatch.calibrate.output import find_calibration
from ragbatch.core.errors import ConfigError, InputError
from ragbatch.judge.metric import JudgeMetric

log = logging.getLogger("ragbatch")

#: Measures a minimum may name.
MEASURES = (
    "accuracy",
    "precision",
    "recall",
    "f1",
    "kappa",
    "roc_auc",
    "spearman",
    "kendall",
    "pairwise_agreement",
)


def engine_model_ids(engine_name: str, spec: Any) -> tuple[set[str], str]:
    """The model ids a judge engine will report, worked out without loading it
    (:mod:`ragbatch.judge.cache_probe`); and why none could be, when the set is empty."""
    from ragbatch.judge.cache_probe import engine_identities

    identities, why = engine_identities(engine_name, spec)
    return {i.model_id for i in identities}, why


def calibration_problems(plan: Any) -> list[str]:
    """What the guard finds wrong, one sentence per metric and measure (empty: all good).

    Parameters
    ----------
    plan : ragbatch.pipeline.plan.Plan
        The run's plan; ``plan.config.calibration`` must be set.

    Raises
    ------
    ConfigError
        ``min_agreement`` names a metric the config does not have, a metric that is not
        a judge metric, or an unknown measure.
    """
    guard = plan.config.calibration
    by_id = {m.id: m for m in plan.metrics}
    bad = _config_problems(guard.min_agreement, by_id)
    if bad:
        raise ConfigError(bad)
    try:
        calibration = find_calibration(guard.uri, guard.run_id, guard.storage_options)
    except InputError as exc:
        return [f"{mid}: {exc}" for mid in guard.min_agreement]
    table = calibration.table("agreement")
    ids_cache: dict[str, tuple[set[str], str]] = {}
    problems = []
    for mid, minimums in guard.min_agreement.items():
        metric = by_id[mid]
        if metric.engine not in ids_cache:
            ids_cache[metric.engine] = engine_model_ids(metric.engine, plan.engines[metric.engine])
        models, why = ids_cache[metric.engine]
        if not models:
            problems += [
                f"{mid}: the judge model of engine {metric.engine!r} cannot be "
                f"identified ({why}), so no calibration can be matched"
            ] * len(minimums)
            continue
        problems += _metric_problems(metric, minimums, table, models, calibration.run_id)
    return problems


def _config_problems(
    min_agreement: dict[str, dict[str, float]], by_id: dict[str, Any]
) -> list[str]:
    """``calibration.min_agreement`` entries that name no metric, a metric that is not a
    judge metric, or an unknown measure; one sentence each."""
    bad = []
    for mid, minimums in min_agreement.items():
        if mid not in by_id:
            bad.append(
                f"calibration.min_agreement.{mid}: no metric has this id; ids: {sorted(by_id)}"
            )
        elif not isinstance(by_id[mid], JudgeMetric):
            bad.append(f"calibration.min_agreement.{mid}: {by_id[mid].name} is not a judge metric")
        bad += [
            f"calibration.min_agreement.{mid}.{measure}: unknown measure; use one of "
            f"{', '.join(MEASURES)}"
            for measure in minimums
            if measure not in MEASURES
        ]
    return bad


def _metric_problems(
    metric: JudgeMetric,
    minimums: dict[str, float],
    table: pl.DataFrame,
    models: set[str],
    calibration_run_id: str,
) -> list[str]:
    """The measures of one judge metric whose recorded agreement (rows of the
    ``agreement`` table for the metric's prompt version and any of ``models``) is
    missing, undefined or below its minimum; one sentence each."""
    version = prompt_version(metric)
    rows = table.filter((pl.col("prompt_version") == version) & pl.col("model").is_in(list(models)))
    where = (
        f"{metric.id} (judge model {sorted(models)[0]}, prompt version {version}) in "
        f"calibration {calibration_run_id}"
    )
    problems = []
    for measure, minimum in minimums.items():
        problem = _measure_problem(rows.filter(pl.col("measure") == measure), measure, minimum)
        if problem is not None:
            problems.append(f"{where}: {problem}")
    return problems


def _measure_problem(found: pl.DataFrame, measure: str, minimum: float) -> str | None:
    """What is wrong with the ``found`` agreement rows of one measure (``value``,
    ``reason``), or None when the smallest value reaches ``minimum``."""
    if found.height == 0:
        return f"no recorded {measure}; calibrate this judge model and prompt version first"
    values = found["value"].drop_nulls()
    if values.len() == 0:
        reason = found["reason"].drop_nulls()
        return (
            f"{measure} is undefined ({reason[0] if reason.len() else 'no value'}); "
            f"minimum {minimum}"
        )
    if values.min() < minimum:
        return f"{measure} {values.min():.3f} is below the minimum {minimum}"
    return None


def check_calibration(plan: Any, allow: bool = False) -> list[str]:
    """Refuse a run whose judge metrics lack the agreement its config demands.

    Parameters
    ----------
    plan : ragbatch.pipeline.plan.Plan
    allow : bool
        ``--allow-uncalibrated``: warn instead of refusing (as ``calibration.proceed``).

    Returns
    -------
    list of str
        The problems that were allowed (logged as warnings); empty when none.

    Raises
    ------
    ConfigError
        Some metric's recorded agreement is missing or below its minimum, and neither
        ``allow`` nor ``calibration.proceed`` is set; the message names each metric,
        measure, value and minimum, and how to proceed anyway.
    """
    if plan.config.calibration is None:
        return []
    problems = calibration_problems(plan)
    if not problems:
        return []
    if allow or plan.config.calibration.proceed:
        for p in problems:
            log.warning("calibration guard (proceeding anyway): %s", p)
        return problems
    raise ConfigError(
        [
            *problems,
            "the run uses judge metrics without the agreement with human "
            "labels that calibration.min_agreement asks for; calibrate them "
            "(`ragbatch calibrate`), lower the minimum, or pass --allow-uncalibrated "
            "(or set calibration.proceed: true) to run anyway",
        ]
    )
