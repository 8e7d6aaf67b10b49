"""Agreement of an aligned judge before and after its examples, on the held-out rows:
the ``alignment`` table's rows and the console text (docs/calibration.md, "Aligning a
judge")."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from ragbatch.calibrate.agreement import label_column_in
from ragbatch.calibrate.config import LabelSpec
from ragbatch.calibrate.labels import label_values
from ragbatch.calibrate.measures import BINARY_MEASURES, Bootstrap, paired_difference
from ragbatch.core.status import OK


def usable_scores(scores: pl.DataFrame, metric_id: str, spec: LabelSpec) -> pl.DataFrame:
    """``row_id``, ``score`` and ``label`` (float64) of the cells of ``metric_id`` in a
    scores table that are ``ok``, scored and labelled, in row-id order."""
    cells = scores.filter(pl.col("metric") == metric_id)
    labels = label_values(cells[label_column_in(cells, spec.column)], spec, cells["row_id"])
    return (
        cells.with_columns(labels.alias("label"))
        .filter(
            (pl.col("status") == OK) & pl.col("label").is_not_null() & pl.col("score").is_not_null()
        )
        .select("row_id", pl.col("score").cast(pl.Float64), "label")
        .sort("row_id")
    )


def paired_scores(before: pl.DataFrame, after: pl.DataFrame) -> pl.DataFrame:
    """The rows both :func:`usable_scores` tables hold: ``row_id``, ``label``, ``before``
    and ``after`` (the two scores), in row-id order."""
    return (
        before.rename({"score": "before"})
        .join(after.select("row_id", pl.col("score").alias("after")), on="row_id", how="inner")
        .sort("row_id")
    )


def alignment_rows(
    agreement: list[dict[str, Any]],
    before_run: str,
    after_run: str,
    paired: pl.DataFrame,
    spec: LabelSpec,
    boot: Bootstrap,
    probabilities: bool,
) -> list[dict[str, Any]]:
    """One ``alignment`` row per binary measure: the value and interval before and after
    (the ``agreement`` rows of the two runs) and their paired difference.

    Parameters
    ----------
    agreement : list of dict
        ``agreement`` table rows holding those of ``before_run`` and ``after_run``
        (their ``scores_run_id``), for one judge and metric.
    before_run, after_run : str
        The run ids of the judge's scores without and with the examples.
    paired : polars.DataFrame
        :func:`paired_scores` of the two runs.
    spec : LabelSpec
        The binary label (its ``judge_threshold`` makes the verdicts).
    boot : Bootstrap
    probabilities : bool
        The scores are probabilities: Brier and ECE differences are computed too.

    Returns
    -------
    list of dict
        In the order of :data:`~ragbatch.calibrate.measures.BINARY_MEASURES`; a measure
        missing from either run's rows is left out. ``difference`` is ``after - before``
        on the rows both runs scored ``ok`` (``n_paired``), null with the reason when
        either side is undefined there.
    """
    runs = {r["scores_run_id"]: r for r in agreement}
    before_rows = {r["measure"]: r for r in agreement if r["scores_run_id"] == before_run}
    after_rows = {r["measure"]: r for r in agreement if r["scores_run_id"] == after_run}
    ident = runs.get(after_run) or runs.get(before_run) or {}
    before, after, human = (
        paired[c].to_numpy().astype(np.float64) for c in ("before", "after", "label")
    )
    out = []
    for name in BINARY_MEASURES:
        b, a = before_rows.get(name), after_rows.get(name)
        if b is None or a is None:
            continue
        if name in ("brier", "ece") and not probabilities:
            diff_value, low, high, why = None, None, None, a["reason"]
        else:
            d = paired_difference(name, before, after, human, spec.judge_threshold, boot)
            diff_value, low, high, why = d.value, d.ci_low, d.ci_high, d.reason
        out.append(
            {
                "judge": ident.get("judge"),
                "model": ident.get("model"),
                "metric": ident.get("metric"),
                "metric_name": ident.get("metric_name"),
                "prompt_version_before": b["prompt_version"],
                "prompt_version_after": a["prompt_version"],
                "measure": name,
                "n_before": b["n"],
                "before": b["value"],
                "before_low": b["ci_low"],
                "before_high": b["ci_high"],
                "n_after": a["n"],
                "after": a["value"],
                "after_low": a["ci_low"],
                "after_high": a["ci_high"],
                "n_paired": paired.height,
                "difference": diff_value,
                "difference_low": low,
                "difference_high": high,
                "reason": why,
            }
        )
    return out


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _interval(low: float | None, high: float | None) -> str:
    return "" if low is None or high is None else f"[{_num(low)}, {_num(high)}]"


def alignment_text(rows: list[dict[str, Any]], confidence: float) -> str:
    """The console table of ``alignment`` rows: per judge and measure, the value and
    interval before, after, and of the difference (``after - before``), then the reason
    of a null.

    Parameters
    ----------
    rows : list of dict
        Rows of the ``alignment`` table (:func:`alignment_rows`).
    confidence : float
        The intervals' coverage, for the header.
    """
    ci = f"{confidence:.0%} CI"
    jw = max([5, *(len(str(r["judge"])) for r in rows)])
    header = (
        f"{'judge':<{jw}}  {'measure':<9} {'n':>4}  {'before':>7} {ci:<17} "
        f"{'after':>7} {ci:<17} {'change':>7} {ci:<17} note"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['judge']:<{jw}}  {r['measure']:<9} {r['n_paired']:>4}  "
            f"{_num(r['before']):>7} {_interval(r['before_low'], r['before_high']):<17} "
            f"{_num(r['after']):>7} {_interval(r['after_low'], r['after_high']):<17} "
            f"{_signed(r['difference']):>7} "
            f"{_interval(r['difference_low'], r['difference_high']):<17} "
            f"{r['reason'] or ''}".rstrip()
        )
    return "\n".join(lines)


def _signed(x: float | None) -> str:
    return "-" if x is None else f"{x:+.3f}"
