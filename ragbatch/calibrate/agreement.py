"""Agreement of one judge's committed scores with the human labels, per metric."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from ragbatch.calibrate.config import LabelSpec
from ragbatch.calibrate.labels import label_values
from ragbatch.calibrate.measures import (
    Bootstrap,
    Measure,
    binary_measures,
    confusion,
    graded_measures,
    pairwise_agreement,
    reliability_bins,
)
from ragbatch.calibrate.prepare import PAIR_ID
from ragbatch.core.columns import internal
from ragbatch.judge.metric import JudgeMetric
from ragbatch.core.status import OK

#: Characters of question, answer and judge reply kept in the disagreement list.
TEXT_LIMIT = 2000
#: Scratch columns, in the pipeline's namespace: the scores table holds user columns.
_LABEL, _DISTANCE = internal("label"), internal("distance")


def prompt_version(metric: JudgeMetric) -> str:
    """``<name>/v<version>/<12 hex digits>``: the metric's name and version and a SHA-256
    of its calibration identity (:meth:`~ragbatch.judge.metric.JudgeMetric.calibration_identity`:
    name, version, params, scoring params that are not at their defaults): what
    determines its prompts apart from the row, and how their replies are scored. A
    calibration is valid for a run whose metric has the same value."""
    identity = json.dumps(metric.calibration_identity(), sort_keys=True, default=str)
    digest = hashlib.sha256(identity.encode("utf-8")).hexdigest()[:12]
    return f"{metric.name}/v{metric.version}/{digest}"


@dataclass
class MetricAgreement:
    """What one (judge, metric) pair produced: measure rows, confusion counts and the
    rows of largest disagreement (each a list of plain dicts)."""

    measures: list[dict[str, Any]] = field(default_factory=list)
    confusion: list[dict[str, Any]] = field(default_factory=list)
    disagreements: list[dict[str, Any]] = field(default_factory=list)
    reliability: list[dict[str, Any]] = field(default_factory=list)


def label_column_in(scores: pl.DataFrame, column: str) -> str:
    """The scores table's name for input column ``column`` (the writer prefixes a name
    that clashes with an output column with ``input_``)."""
    if column in scores.columns:
        return column
    if f"input_{column}" in scores.columns:
        return f"input_{column}"
    raise KeyError(f"label column {column!r} is not in the scores table")


def metric_agreement(
    scores: pl.DataFrame,
    metric: JudgeMetric,
    spec: LabelSpec,
    *,
    judge: str,
    scores_run_id: str,
    boot: Bootstrap,
    top: int,
    texts: pl.DataFrame | None = None,
    pairs: bool = False,
) -> MetricAgreement:
    """Measures, confusion matrix and largest disagreements of one metric.

    Parameters
    ----------
    scores : polars.DataFrame
        The run's long scores table (every metric); its label column(s) are slice columns.
    metric : JudgeMetric
        The metric as the run built it (id, name, version, params, score range).
    spec : LabelSpec
    judge : str
        The engine name.
    scores_run_id : str
        Run id of the scores (recorded with every row).
    boot : Bootstrap
    top : int
        Rows kept in the disagreement list.
    texts : polars.DataFrame, optional
        ``row_id``, ``question``, ``answer`` of the labelled input, for the list.
    pairs : bool
        Whether the rows carry :data:`~ragbatch.calibrate.prepare.PAIR_ID`: pairwise
        agreement is added.

    Returns
    -------
    MetricAgreement
    """
    cells = scores.filter(pl.col("metric") == metric.id)
    label_col = label_column_in(cells, spec.column)
    cells = cells.with_columns(label_values(cells[label_col], spec, cells["row_id"]).alias(_LABEL))
    # in row-id order, so that the resamples do not depend on the order of score files
    usable = cells.filter(
        (pl.col("status") == OK) & pl.col(_LABEL).is_not_null() & pl.col("score").is_not_null()
    ).sort("row_id")
    models = cells["model"].drop_nulls()
    base = {
        "judge": judge,
        "model": models.mode().sort()[0] if models.len() else None,
        "metric": metric.id,
        "metric_name": metric.name,
        "metric_version": metric.version,
        "prompt_version": prompt_version(metric),
        "label_column": spec.column,
        "label_type": spec.type,
        "scores_run_id": scores_run_id,
        "n_cells": cells.height,
        "n_ok": int((cells["status"] == OK).sum()),
        "n_labelled": int(cells[_LABEL].is_not_null().sum()),
    }
    score = usable["score"].to_numpy().astype(np.float64)
    human = usable[_LABEL].to_numpy().astype(np.float64)
    out = MetricAgreement()
    if spec.type == "binary":
        probabilities = scores_are_probabilities(metric)
        found = binary_measures(score, human, spec.judge_threshold, boot, probabilities)
        if probabilities and score.size:
            out.reliability = [{**_ident(base), **b} for b in reliability_bins(score, human)]
        counts = confusion(score, human, spec.judge_threshold)
        for human_value, judge_value, key in (
            (0, 0, "tn"),
            (0, 1, "fp"),
            (1, 0, "fn"),
            (1, 1, "tp"),
        ):
            out.confusion.append(
                {
                    **_ident(base),
                    "human": human_value,
                    "judge_verdict": judge_value,
                    "n": counts[key],
                    "judge_threshold": spec.judge_threshold,
                }
            )
    else:
        found = graded_measures(score, human, boot)
    if pairs and PAIR_ID in cells.columns:
        found.append(_pairwise(usable, cells, boot))
    out.measures = [{**base, **_measure_row(m)} for m in found]
    out.disagreements = _disagreements(usable, metric, spec, base, top, texts)
    return out


def scores_are_probabilities(metric: JudgeMetric) -> bool:
    """Whether ``metric``'s scores are probabilities of a positive verdict: ``score:
    probability`` on a metric scored in [0, 1]."""
    return metric.probability_score and tuple(metric.score_range) == (0.0, 1.0)


def _ident(base: dict[str, Any]) -> dict[str, Any]:
    return {
        k: base[k]
        for k in ("judge", "model", "metric", "metric_name", "prompt_version", "scores_run_id")
    }


def _measure_row(m: Measure) -> dict[str, Any]:
    return {
        "measure": m.name,
        "n": m.n,
        "value": m.value,
        "ci_low": m.ci_low,
        "ci_high": m.ci_high,
        "reason": m.reason,
    }


def _pairwise(usable: pl.DataFrame, cells: pl.DataFrame, boot: Bootstrap) -> Measure:
    """Every two ok members of one pair with different labels, higher label first."""
    ok = usable.select(PAIR_ID, "row_id", "score", _LABEL)
    joined = ok.join(ok, on=PAIR_ID, suffix="_r").filter(pl.col(_LABEL) > pl.col(f"{_LABEL}_r"))
    joined = joined.sort(PAIR_ID, "row_id", "row_id_r")
    return pairwise_agreement(joined["score"].to_numpy(), joined["score_r"].to_numpy(), boot)


def _disagreements(
    usable: pl.DataFrame,
    metric: JudgeMetric,
    spec: LabelSpec,
    base: dict[str, Any],
    top: int,
    texts: pl.DataFrame | None,
) -> list[dict[str, Any]]:
    """The ``top`` rows whose score (scaled to [0, 1] by the metric's range) is farthest
    from the label (binary: as is; graded: scaled by the labels' observed range)."""
    if top == 0 or usable.height == 0:
        return []
    low, high = metric.score_range
    scaled = (pl.col("score") - low) / (high - low)
    if spec.type == "binary":
        target = pl.col(_LABEL)
    else:
        lmin, lmax = usable[_LABEL].min(), usable[_LABEL].max()
        target = ((pl.col(_LABEL) - lmin) / (lmax - lmin)) if lmax > lmin else pl.lit(0.5)
    ranked = (
        usable.with_columns((scaled - target).abs().alias(_DISTANCE))
        .sort([_DISTANCE, "row_id"], descending=[True, False])
        .head(top)
    )
    if texts is not None:
        ranked = ranked.join(texts, on="row_id", how="left")
    rows = []
    for rank, r in enumerate(ranked.iter_rows(named=True), start=1):
        rows.append(
            {
                **_ident(base),
                "rank": rank,
                "row_id": r["row_id"],
                "pair_id": r.get(PAIR_ID),
                "label": r[_LABEL],
                "score": r["score"],
                "distance": r[_DISTANCE],
                "reason": r.get("reason"),
                "judge_reply": _cut(r.get("judge_reply")),
                "question": _cut(r.get("question")),
                "answer": _cut(r.get("answer")),
            }
        )
    return rows


def _cut(text: Any) -> str | None:
    if text is None:
        return None
    text = str(text)
    return text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT] + "..."
