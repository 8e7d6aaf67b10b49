"""Static charts for the HTML report, drawn with matplotlib and returned as SVG text.

Every function builds a :class:`matplotlib.figure.Figure` directly (no pyplot, so no
global figure state and no GUI backend) and returns the SVG document as a string. Text
stays text in the SVG (``svg.fonttype: none``), so a chart is small and searchable, and
the output is deterministic (fixed ``svg.hashsalt``, no date in the metadata).

Every chart is drawn inside ``matplotlib.rc_context(_RC)``, whose ``text.parse_math: False``
makes all text literal: a slice value or metric id such as ``$\\frac{a}{b}$`` is shown as
written, never parsed as mathtext (which renders valid TeX as math and raises on invalid
TeX).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from ragbatch.core.status import STATUSES

_RC = {
    "svg.fonttype": "none",
    "svg.hashsalt": "ragbatch-report",
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "text.parse_math": False,
}

#: One colour per status, in :data:`ragbatch.core.status.STATUSES` order (ok first).
STATUS_COLOURS = dict(
    zip(
        STATUSES,
        ("#4c9f70", "#b8b8b8", "#e0a030", "#d0605e", "#a05195", "#665191", "#2f4b7c", "#8c2d04"),
    )
)


def data_uri(svg: str) -> str:
    """An SVG document as a ``data:image/svg+xml;base64,...`` URI (for an ``img``)."""
    import base64

    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


def _svg(fig: Figure, tight: bool = True) -> str:
    """The figure as SVG text; ``tight`` crops to the drawn area (costs a second draw)."""
    buffer = io.StringIO()
    fig.savefig(
        buffer, format="svg", bbox_inches="tight" if tight else None, metadata={"Date": None}
    )
    return buffer.getvalue()


def score_distribution(
    scores: Sequence[float],
    *,
    title: str,
    boolean: bool,
    value_range: tuple[float, float] | None = None,
) -> str:
    """Histogram of one metric's ``ok`` scores.

    Parameters
    ----------
    scores : sequence of float
        The ``ok`` scores (finite).
    title : str
        Chart title (the metric id).
    boolean : bool
        Scores are 0/1: draw two bars (0 and 1) with their counts.
    value_range : (float, float), optional
        The metric's range, for the bins of a continuous metric (default: the data's).

    Returns
    -------
    str
        An SVG document, about 4.5 x 2.4 inches.
    """
    x = np.asarray(list(scores), dtype=np.float64)
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(4.5, 2.4))
        ax = fig.add_subplot()
        if x.size == 0:
            ax.text(0.5, 0.5, "no ok scores", ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
        elif boolean:
            counts = [int((x == 0).sum()), int((x == 1).sum())]
            bars = ax.bar([0, 1], counts, color=["#d0605e", "#4c9f70"], width=0.6)
            ax.set_xticks([0, 1], ["0", "1"])
            ax.bar_label(bars, labels=[str(c) for c in counts], padding=2)
            ax.margins(y=0.15)
            ax.set_ylabel("cells")
        else:
            low, high = value_range if value_range else (float(x.min()), float(x.max()))
            if high <= low:
                low, high = low - 0.5, high + 0.5
            ax.hist(x, bins=20, range=(low, high), color="#4c72b0", edgecolor="white")
            ax.set_ylabel("cells")
            ax.set_xlabel("score")
        ax.set_title(f"{title} (n={x.size})")
        return _svg(fig)


def status_breakdown(counts: dict[str, dict[str, int]]) -> str:
    """Horizontal stacked bars: per metric, its cells by status.

    Parameters
    ----------
    counts : dict
        Metric id -> status -> number of cells (statuses absent count 0), in display order.

    Returns
    -------
    str
        An SVG document with a legend of the statuses that occur.
    """
    metrics = list(counts)
    present = [s for s in STATUSES if any(counts[m].get(s, 0) for m in metrics)]
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(7, 0.4 * max(len(metrics), 2) + 0.8))
        ax = fig.add_subplot()
        left = np.zeros(len(metrics))
        y = np.arange(len(metrics))
        for status in present:
            widths = np.array([counts[m].get(status, 0) for m in metrics], dtype=float)
            ax.barh(y, widths, left=left, color=STATUS_COLOURS[status], label=status)
            left += widths
        ax.set_yticks(y, metrics)
        ax.invert_yaxis()
        ax.set_xlabel("cells")
        if present:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        ax.set_title("cells by status")
        return _svg(fig)


def interval_dots(
    labels: Sequence[str],
    estimates: Sequence[float | None],
    lows: Sequence[float | None],
    highs: Sequence[float | None],
    *,
    title: str,
    xlabel: str,
    zero_line: bool = False,
) -> str:
    """One dot per label with a horizontal error bar from ``low`` to ``high``.

    Used for per-slice means (with their confidence intervals) and for a comparison's
    paired differences (``zero_line=True`` draws x = 0). Labels whose estimate is None are
    listed without a dot.

    Returns
    -------
    str
        An SVG document; height grows with the number of labels.
    """
    n = len(labels)
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(6, 0.3 * max(n, 2) + 0.9), layout="constrained")
        ax = fig.add_subplot()
        y = np.arange(n)
        _dots(ax, y, estimates, lows, highs)
        if zero_line:
            ax.axvline(0.0, color="#d0605e", linewidth=1)
        ax.set_yticks(y, [_clip(label, 40) for label in labels])
        ax.set_ylim(n - 0.5, -0.5)
        ax.set_xlabel(xlabel)
        ax.set_title(title)
        return _svg(fig)


def _dots(
    ax: Any,
    y: np.ndarray,
    estimates: Sequence[float | None],
    lows: Sequence[float | None],
    highs: Sequence[float | None],
) -> None:
    """Draw a dot at each estimate (at height ``y``) with a horizontal error bar from its
    low to its high (none where a bound is None; no dot where the estimate is None)."""
    est = np.array([np.nan if v is None else v for v in estimates], dtype=float)
    lo = np.array([np.nan if v is None else v for v in lows], dtype=float)
    hi = np.array([np.nan if v is None else v for v in highs], dtype=float)
    ok = ~np.isnan(est)
    err = np.vstack([np.where(np.isnan(lo), 0, est - lo), np.where(np.isnan(hi), 0, hi - est)])
    ax.errorbar(
        est[ok],
        y[ok],
        xerr=err[:, ok],
        fmt="o",
        color="#4c72b0",
        ecolor="#7f7f7f",
        capsize=3,
        markersize=4,
    )


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def slice_panel(
    labels: Sequence[str],
    estimates: dict[str, Sequence[float | None]],
    lows: dict[str, Sequence[float | None]],
    highs: dict[str, Sequence[float | None]],
    *,
    title: str,
    ranges: dict[str, tuple[float, float] | None] | None = None,
) -> str:
    """Small multiples: one panel per metric, one dot with its interval per slice value.

    Parameters
    ----------
    labels : sequence of str
        Slice values, top to bottom (shared by every panel).
    estimates, lows, highs : dict
        Metric id -> one value per label (None: no ``ok`` cell; drawn without a dot).
    title : str
    ranges : dict, optional
        Metric id -> the metric's score range, used as the panel's x limits (padded by 5 %).

    Returns
    -------
    str
        An SVG document, up to three panels per row.
    """
    metrics = list(estimates)
    n = max(len(metrics), 1)
    ncols = min(3, n)
    nrows = -(-n // ncols)
    rows = len(labels)
    shown = [_clip(label, 30) for label in labels]
    # Margins in inches, laid out by hand: one draw instead of a layout engine's several.
    left_in = 0.3 + 0.065 * max([len(t) for t in shown] + [4])
    panel_h = 0.25 * max(rows, 2) + 0.2
    width, height = left_in + 3.0 * ncols + 0.3 * (ncols - 1) + 0.2, nrows * (panel_h + 0.75) + 0.4
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(width, height))
        fig.subplots_adjust(
            left=left_in / width,
            right=1 - 0.2 / width,
            top=1 - 0.75 / height,
            bottom=0.45 / height,
            wspace=0.3 / 3.0,
            hspace=0.75 / panel_h,
        )
        axes = fig.subplots(nrows, ncols, squeeze=False, sharey=True)
        y = np.arange(rows)
        for index, ax in enumerate(axes.flat):
            if index >= len(metrics):
                ax.set_visible(False)
                continue
            mid = metrics[index]
            _dots(ax, y, estimates[mid], lows[mid], highs[mid])
            ax.set_title(_clip(mid, 30))
            span = (ranges or {}).get(mid)
            if span is not None:
                pad = 0.05 * (span[1] - span[0])
                ax.set_xlim(span[0] - pad, span[1] + pad)
            ax.set_yticks(y, shown)
            ax.set_ylim(rows - 0.5, -0.5)
        fig.suptitle(title)
        return _svg(fig, tight=False)


def reliability_diagram(
    mean_p: Sequence[float], observed: Sequence[float], counts: Sequence[int], *, title: str
) -> str:
    """Reliability diagram of a judge's probabilities against human labels.

    Parameters
    ----------
    mean_p, observed : sequence of float
        Per non-empty probability bin (:func:`ragbatch.calibrate.measures.reliability_bins`),
        the mean stated probability of label 1 and the share of rows labelled 1, each in
        [0, 1].
    counts : sequence of int
        Rows per bin (written next to each point).
    title : str
        Chart title (the metric id and judge), shown as written.

    Returns
    -------
    str
        An SVG document, about 3.2 x 3.0 inches: the points joined in bin order, and the
        diagonal a calibrated judge lies on.
    """
    x = np.asarray(list(mean_p), dtype=np.float64)
    y = np.asarray(list(observed), dtype=np.float64)
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(3.2, 3.0))
        ax = fig.add_subplot()
        ax.plot([0, 1], [0, 1], color="#b8b8b8", linestyle="--", linewidth=1)
        ax.plot(x, y, marker="o", color="#4c72b0")
        for xi, yi, n in zip(x, y, counts):
            ax.annotate(
                str(int(n)), (xi, yi), textcoords="offset points", xytext=(4, -10), fontsize=7
            )
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("judge's probability of 1")
        ax.set_ylabel("share labelled 1")
        ax.set_title(_clip(title, 48))
        return _svg(fig)


def trend_chart(
    ticks: Sequence[str],
    panels: Sequence[
        tuple[str, dict[str, tuple[list[float | None], list[float | None], list[float | None]]]]
    ],
    *,
    title: str,
    marked: set[tuple[str, str]] | None = None,
    score_range: tuple[float, float] | None = None,
) -> str:
    """Series over runs: one panel per entry of ``panels``, one line per series, each
    point with its interval as an error bar.

    Parameters
    ----------
    ticks : sequence of str
        One x label per run, oldest first (the x axis is the run's position).
    panels : sequence of (str, dict)
        Panel title -> series label -> ``(means, lows, highs)``, each one value per run
        (None: no value that run; the line breaks there).
    title : str
    marked : set of (str, str), optional
        ``(panel title, series label)`` pairs drawn with a heavier line and a ring on the
        last points: the series with a shift (:mod:`ragbatch.analysis.trends`).
    score_range : tuple of float, optional
        The metric's score range, used as the y limits (padded by 5 %).

    Returns
    -------
    str
        An SVG document, panels stacked top to bottom.
    """
    marked = marked or set()
    n = max(len(panels), 1)
    x = np.arange(len(ticks))
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(7, 2.1 * n + 0.6), layout="constrained")
        axes = fig.subplots(n, 1, squeeze=False)[:, 0]
        for ax, (name, series) in zip(axes, panels):
            for label, (means, lows, highs) in series.items():
                est = np.array([np.nan if v is None else v for v in means], dtype=float)
                lo = np.array([np.nan if v is None else v for v in lows], dtype=float)
                hi = np.array([np.nan if v is None else v for v in highs], dtype=float)
                err = np.vstack(
                    [np.where(np.isnan(lo), 0, est - lo), np.where(np.isnan(hi), 0, hi - est)]
                )
                shifted = (name, label) in marked
                bars = ax.errorbar(
                    x,
                    est,
                    yerr=err,
                    fmt="-o",
                    capsize=2,
                    markersize=3,
                    linewidth=2.2 if shifted else 1.0,
                    label=_clip(label, 30) + (" (shift)" if shifted else ""),
                )
                if shifted:
                    last = ~np.isnan(est)
                    ax.plot(
                        x[last][-3:],
                        est[last][-3:],
                        "o",
                        markersize=9,
                        markerfacecolor="none",
                        markeredgecolor="#d0605e",
                        color=bars[0].get_color(),
                    )
            ax.set_title(_clip(name, 60))
            ax.set_xticks(x, [_clip(t, 12) for t in ticks], rotation=30, ha="right")
            if score_range is not None:
                pad = 0.05 * (score_range[1] - score_range[0])
                ax.set_ylim(score_range[0] - pad, score_range[1] + pad)
            if len(series) > 1 or any(key[0] == name for key in marked):
                ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
        fig.suptitle(title)
        return _svg(fig, tight=False)
