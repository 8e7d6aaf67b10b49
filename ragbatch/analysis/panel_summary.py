"""The judge panels' part of a run summary: which summary rows are a judge's, and each
panel's inter-judge agreement read from the score files (docs/panels.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import duckdb
import numpy as np

from ragbatch.analysis.panel_agreement import panel_agreement
from ragbatch.core.status import OK
from ragbatch.judge.panel import PanelMetric


def member_judges(metrics: Sequence[Any]) -> dict[str, str]:
    """Member key -> judge engine of every judge of the panels among ``metrics``
    (``Metric`` or ``MetricInfo`` instances; only :class:`PanelMetric` ones count)."""
    return {
        key: judge
        for m in metrics
        if isinstance(m, PanelMetric)
        for key, judge in zip(m.plan().member_keys, m.judges)
    }


def panel_matrix(
    con: duckdb.DuckDBPyConnection, source: str, metric: str, judges: Sequence[str]
) -> np.ndarray:
    """Each row's ``ok`` score per judge of panel ``metric``.

    Parameters
    ----------
    con : duckdb connection
    source : str
        A ``read_parquet(...)`` call (or view) of score rows with a ``judge`` column.
    metric : str
        The panel's metric id.
    judges : sequence of str

    Returns
    -------
    ndarray of float64, shape (rows with a member cell, len(judges))
        NaN where the judge's cell of the row is not ``ok``; rows in no particular order.
    """
    columns = ", ".join(
        f"max(score) FILTER (WHERE judge = ${i + 2}) AS j{i}" for i in range(len(judges))
    )
    rows = con.execute(
        f"SELECT {columns} FROM {source} WHERE metric = $1 AND judge IS NOT NULL "
        f"AND status = '{OK}' GROUP BY row_id",
        [metric, *judges],
    ).fetchall()
    if not rows:
        return np.empty((0, len(judges)))
    return np.array([[np.nan if v is None else v for v in r] for r in rows], dtype=float)


def panel_agreements(
    con: duckdb.DuckDBPyConnection, source: str, metrics: Sequence[Any], settings: Any
) -> dict[str, dict[str, Any]]:
    """Panel metric id -> its agreement (:func:`ragbatch.analysis.panel_agreement.
    panel_agreement`, as a dict), for each :class:`PanelMetric` among ``metrics``, with
    the summary ``settings``' confidence, resamples and seed. Empty when there is no
    panel or the scores have no ``judge`` column."""
    panels = [m for m in metrics if isinstance(m, PanelMetric)]
    if not panels:
        return {}
    columns = {d[0] for d in con.execute(f"SELECT * FROM {source} LIMIT 0").description}
    if "judge" not in columns:
        return {}
    out = {}
    for panel in panels:
        matrix = panel_matrix(con, source, panel.id, panel.judges)
        result = panel_agreement(
            panel.id,
            panel.judges,
            matrix,
            bool(panel.members[0].boolean),
            settings.confidence,
            settings.n_resamples,
            settings.seed,
        )
        out[panel.id] = {**result.to_dict(), "combine": panel.combine}
    return out


def _num(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def agreement_rows(panels: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    """One display row per judge panel (the report's "Judge panels" table, the run
    command's lines), from the manifest's ``summary.panels``: ``metric``, ``combine``,
    ``alpha`` (with its level and the pairable rows), ``interval`` (``[low, high]``),
    ``pairwise`` (``a~b 0.950 (n=19)``, ``;``-joined), ``means`` (``a 0.400``, ...) and
    ``note``. Values are text; an undefined one is ``n/a``."""
    rows = []
    for metric, p in panels.items():
        measure = "agreement" if p.get("alpha_level") == "nominal" else "mean_abs_diff"
        pairs = "; ".join(
            f"{a}~{b} {_num(q.get(measure))} (n={q['n']})"
            for q in p.get("pairwise", [])
            for a, b in [q["judges"]]
        )
        means = ", ".join(
            f"{judge} {_num(m.get('mean'))}" for judge, m in (p.get("judge_means") or {}).items()
        )
        rows.append(
            {
                "metric": metric,
                "combine": str(p.get("combine") or ""),
                "alpha": f"{_num(p.get('alpha'))} ({p.get('alpha_level')}, {p.get('n_units')} rows)",
                "interval": f"[{_num(p.get('alpha_ci_low'))}, {_num(p.get('alpha_ci_high'))}]",
                "pairwise_measure": "agreement" if measure == "agreement" else "mean |difference|",
                "pairwise": pairs,
                "means": means,
                "note": str(p.get("note") or ""),
            }
        )
    return rows


def agreement_text(panels: dict[str, dict[str, Any]]) -> list[str]:
    """The run command's lines about its judge panels (none without panels)."""
    lines = []
    for r in agreement_rows(panels):
        lines.append(
            f"judge panel {r['metric']} ({r['combine']}): Krippendorff's alpha {r['alpha']} "
            f"{r['interval']}; pairwise {r['pairwise_measure']}: {r['pairwise']}; "
            f"judge means: {r['means']}"
        )
        if r["note"]:
            lines.append(f"  {r['note']}")
    return lines
