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
from ragbatch.errors import ConfigError, InputError
from ragbatch.judge.metric import JudgeMetric

log = logging.getLogger("ragbatch")

#: Measures a minimum may name.
MEASURES = ("accuracy", "precision", "recall", "f1", "kappa", "roc_auc", "spearman", "kendall",
            "pairwise_agreement")


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
    plan : ragbatch.plan.Plan
        The run's plan; ``plan.config.calibration`` must be set.

    Raises
    ------
    ConfigError
        ``min_agreement`` names a metric the config does not have, a metric that is not
        a judge metric, or an unknown measure.
    """
    guard = plan.config.calibration
    by_id = {m.id: m for m in plan.metrics}
    bad = []
    for mid, minimums in guard.min_agreement.items():
        if mid not in by_id:
            bad.append(f"calibration.min_agreement.{mid}: no metric has this id; ids: {sorted(by_id)}")
        elif not isinstance(by_id[mid], JudgeMetric):
            bad.append(f"calibration.min_agreement.{mid}: {by_id[mid].name} is not a judge metric")
        for measure in minimums:
            if measure not in MEASURES:
                bad.append(f"calibration.min_agreement.{mid}.{measure}: unknown measure; use one of "
                           f"{', '.join(MEASURES)}")
    if bad:
        raise ConfigError(bad)
    try:
        calibration = find_calibration(guard.uri, guard.run_id, guard.storage_options)
    except InputError as exc:
        return [f"{mid}: {exc}" for mid in guard.min_agreement]
    table = calibration.table("agreement")
    problems = []
    ids_cache: dict[str, tuple[set[str], str]] = {}
    for mid, minimums in guard.min_agreement.items():
        metric = by_id[mid]
        engine = metric.engine
        if engine not in ids_cache:
            ids_cache[engine] = engine_model_ids(engine, plan.engines[engine])
        models, why = ids_cache[engine]
        version = prompt_version(metric)
        rows = table.filter((pl.col("prompt_version") == version) & pl.col("model").is_in(list(models)))
        for measure, minimum in minimums.items():
            found = rows.filter(pl.col("measure") == measure)
            where = (f"{mid} (judge model {sorted(models)[0] if models else '?'}, prompt version "
                     f"{version}) in calibration {calibration.run_id}")
            if not models:
                problems.append(f"{mid}: the judge model of engine {engine!r} cannot be identified "
                                f"({why}), so no calibration can be matched")
            elif found.height == 0:
                problems.append(f"{where}: no recorded {measure}; calibrate this judge model and "
                                "prompt version first")
            else:
                values = found["value"].drop_nulls()
                if values.len() == 0:
                    reason = found["reason"].drop_nulls()
                    problems.append(f"{where}: {measure} is undefined "
                                    f"({reason[0] if reason.len() else 'no value'}); minimum {minimum}")
                elif values.min() < minimum:
                    problems.append(f"{where}: {measure} {values.min():.3f} is below the minimum "
                                    f"{minimum}")
    return problems


def check_calibration(plan: Any, allow: bool = False) -> list[str]:
    """Refuse a run whose judge metrics lack the agreement its config demands.

    Parameters
    ----------
    plan : ragbatch.plan.Plan
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
    raise ConfigError([*problems, "the run uses judge metrics without the agreement with human "
                       "labels that calibration.min_agreement asks for; calibrate them "
                       "(`ragbatch calibrate`), lower the minimum, or pass --allow-uncalibrated "
                       "(or set calibration.proceed: true) to run anyway"])
