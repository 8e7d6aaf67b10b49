"""Each metric's series over the last committed runs under one output root, and the
shifts that have lasted several nights.

A run's report shows, per metric, the mean and its interval of every committed run up to
and including the run, over the last :data:`TREND_NIGHTS` runs under the same output
root (oldest first), overall and per slice value. The values come from each run's own
``summary.parquet`` (docs/output.md, "Summary table"); nothing is recomputed.

A *shift* is a move that has lasted: over the last :data:`SHIFT_NIGHTS` runs of a series,
every run's interval lies entirely above (or entirely below) the reference level, the
median of the means of the earlier runs in the window (at least
:data:`MIN_REFERENCE_NIGHTS` of them). One night outside the band is common noise; an
interval of 95 % excluding a fixed level on three nights running is not. The rule is a
run rule of the kind control charts use (Western Electric's rules, 1956: several points
in a row on one side of the centre line), applied to each run's interval instead of to
its point estimate so that a small sample's wide interval cannot raise it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import polars as pl

from ragbatch.analysis.runs import CommittedRun, list_runs, load_summary

#: Committed runs a report's trend shows by default (the run itself and those before).
TREND_NIGHTS = 14
#: How many of the latest runs must all sit on one side of the reference for a shift.
SHIFT_NIGHTS = 3
#: Fewest earlier runs the reference level needs.
MIN_REFERENCE_NIGHTS = 3

#: Columns of :func:`trend_series`.
SERIES_SCHEMA = {
    "night": pl.Int64,
    "run_id": pl.String,
    "run_date": pl.Date,
    "metric": pl.String,
    "slice_column": pl.String,
    "slice_value": pl.String,
    "mean": pl.Float64,
    "mean_ci_low": pl.Float64,
    "mean_ci_high": pl.Float64,
    "n_ok": pl.Int64,
}


def trend_runs(run: CommittedRun, nights: int = TREND_NIGHTS) -> list[CommittedRun]:
    """``run`` and the committed runs before it under its output root, oldest first, at
    most ``nights`` of them (the latest). Runs sort by run date, start time, then run id
    (:meth:`CommittedRun.sort_key`).

    Raises
    ------
    ValueError
        ``nights`` is below 1.
    InputError
        The root cannot be listed.
    """
    if nights < 1:
        raise ValueError(f"nights must be at least 1, got {nights}")
    earlier = [
        r
        for r in list_runs(run.root, run.storage_options)
        if r.run_id != run.run_id and r.sort_key() < run.sort_key()
    ]
    return [*earlier, run][-nights:]


def trend_series(runs: list[CommittedRun]) -> pl.DataFrame:
    """The summary rows of ``runs`` stacked into one long table, columns
    :data:`SERIES_SCHEMA`: ``night`` is the run's position (0 = oldest), ``slice_column``
    and ``slice_value`` null on a metric's all-rows line; ``mean`` and its interval
    ``[mean_ci_low, mean_ci_high]`` in the metric's units (null without ``ok`` cells).
    Pooled slice values ("other values") are left out. A run whose summary is missing
    or predates intervals contributes its means without intervals.

    Raises
    ------
    InputError
        A run's summary file is missing.
    """
    frames = []
    for night, run in enumerate(runs):
        summary = load_summary(run)
        missing = [c for c in SERIES_SCHEMA if c not in summary.columns]
        summary = summary.with_columns(
            pl.lit(None, SERIES_SCHEMA[c]).alias(c)
            for c in missing
            if c not in ("night", "run_id", "run_date")
        )
        if "slice_other" in summary.columns:
            summary = summary.filter(~pl.col("slice_other").fill_null(False))
        frames.append(
            summary.with_columns(
                pl.lit(night, pl.Int64).alias("night"),
                pl.lit(run.run_id, pl.String).alias("run_id"),
                pl.lit(run.run_date, pl.Date).alias("run_date"),
            ).select(pl.col(c).cast(t) for c, t in SERIES_SCHEMA.items())
        )
    if not frames:
        return pl.DataFrame(schema=SERIES_SCHEMA)
    return pl.concat(frames)


@dataclass(frozen=True)
class Shift:
    """A series whose last :data:`SHIFT_NIGHTS` intervals all lie on one side of its
    reference level.

    Attributes
    ----------
    metric : str
    slice_column, slice_value : str or None
        None on a metric's all-rows series.
    direction : str
        ``"up"`` (every interval above the reference) or ``"down"``.
    reference : float
        Median of the earlier runs' means in the window, in the metric's units.
    latest : tuple of float
        The last runs' means, oldest first.
    nights : int
        How many runs in a row lie on that side (at least :data:`SHIFT_NIGHTS`).
    """

    metric: str
    slice_column: str | None
    slice_value: str | None
    direction: str
    reference: float
    latest: tuple[float, ...]
    nights: int


def find_shifts(
    series: pl.DataFrame,
    shift_nights: int = SHIFT_NIGHTS,
    min_reference: int = MIN_REFERENCE_NIGHTS,
) -> list[Shift]:
    """Every series of ``series`` (:func:`trend_series`) with a shift (see the module
    notes), in the order the series first appear.

    A series needs ``shift_nights + min_reference`` runs with an interval. The reference
    is the median mean of the runs before the last ``shift_nights``; the shift's
    ``nights`` counts back from the latest run while intervals stay on the same side.

    Raises
    ------
    ValueError
        ``shift_nights`` or ``min_reference`` is below 1.
    """
    if shift_nights < 1 or min_reference < 1:
        raise ValueError("shift_nights and min_reference must be at least 1")
    keys = ["metric", "slice_column", "slice_value"]
    shifts = []
    usable = series.filter(
        pl.col("mean").is_not_null()
        & pl.col("mean_ci_low").is_not_null()
        & pl.col("mean_ci_high").is_not_null()
    )
    for key, group in usable.sort("night").group_by(keys, maintain_order=True):
        means = group["mean"].to_list()
        lows, highs = group["mean_ci_low"].to_list(), group["mean_ci_high"].to_list()
        if len(means) < shift_nights + min_reference:
            continue
        reference = statistics.median(means[:-shift_nights])
        for direction, beyond in (
            ("up", [low > reference for low in lows]),
            ("down", [high < reference for high in highs]),
        ):
            if all(beyond[-shift_nights:]):
                run_length = 0
                for flag in reversed(beyond):
                    if not flag:
                        break
                    run_length += 1
                metric, column, value = key
                shifts.append(
                    Shift(
                        str(metric),
                        None if column is None else str(column),
                        None if value is None else str(value),
                        direction,
                        float(reference),
                        tuple(float(m) for m in means[-shift_nights:]),
                        run_length,
                    )
                )
    return shifts
