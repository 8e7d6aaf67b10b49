"""The calibration section of a run's HTML report: how far its judge metrics agree with
human labels, as recorded by the calibration that applies to the run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import polars as pl

import logging

from ragbatch.analysis.runs import recorded_storage_options
from ragbatch.calibrate.agreement import prompt_version
from ragbatch.calibrate.output import find_calibration
from ragbatch.core.errors import ConfigError, InputError
from ragbatch.core.redact import redact_url

if TYPE_CHECKING:
    from ragbatch.judge.metric import JudgeMetric

log = logging.getLogger("ragbatch")


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def calibration_section(
    run: Any, storage_options: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """The agreement rows that apply to ``run``'s judge metrics, or None.

    Parameters
    ----------
    run : ragbatch.analysis.runs.CommittedRun
    storage_options : dict, optional
        fsspec options of the calibration's root. Default: when it is the run's own
        output root, the options the run was found with
        (:attr:`~ragbatch.analysis.runs.CommittedRun.storage_options`); otherwise the
        ``calibration.storage_options`` the manifest recorded, without the redacted
        credentials (the environment supplies those).

    Returns
    -------
    dict or None
        ``run_id`` and ``root`` of the calibration and ``rows`` (per metric and measure:
        ``metric``, ``judge``, ``model``, ``measure``, ``n``, ``value``, ``interval``,
        ``minimum``, ``note``, as text) and ``reliability`` (reliability diagrams,
        :func:`_reliability_charts`). The calibration is the one the run's
        ``calibration`` section names (else the latest under the run's own output root).
        When the run is a judge run of that calibration its rows are its own; otherwise
        the rows whose model id and prompt version match the run's metrics. None when
        there is no calibration, no row applies, or the calibration cannot be read (a
        warning says why).
    """
    config = run.manifest.config
    guard = config.get("calibration") or {}
    root = guard.get("uri") or run.root
    if storage_options is None:
        storage_options = (
            run.storage_options
            if root == run.root
            else recorded_storage_options(guard.get("storage_options"))
        )
    try:
        cal = find_calibration(root, guard.get("run_id"), storage_options)
        table = cal.table("agreement")
    except InputError:
        return None
    except Exception as exc:  # noqa: BLE001 - an optional section: the report goes on without it
        log.warning(
            "report of run %s: no calibration section; the calibration under %s "
            "cannot be read: %s: %s",
            run.run_id,
            root,
            type(exc).__name__,
            exc,
        )
        return None
    minimums = guard.get("min_agreement") or {}
    models = run.manifest.models
    own = run.run_id in (cal.manifest.get("scores_runs") or {}).values()
    rows = []
    for m in run.manifest.metrics:
        if m.get("kind") != "judge":
            continue
        if own:
            found = table.filter(
                (pl.col("scores_run_id") == run.run_id) & (pl.col("metric") == m["id"])
            )
        else:
            version = _prompt_version(m)
            if version is None:
                continue
            found = table.filter(
                (pl.col("prompt_version") == version)
                & pl.col("model").is_in(list(models.get(m["id"]) or []))
            )
        for r in found.iter_rows(named=True):
            minimum = (minimums.get(m["id"]) or {}).get(r["measure"])
            below = minimum is not None and (r["value"] is None or r["value"] < minimum)
            rows.append(
                {
                    "metric": m["id"],
                    "judge": r["judge"],
                    "model": r["model"],
                    "measure": r["measure"],
                    "n": r["n"],
                    "value": _num(r["value"]),
                    "interval": (
                        f"[{_num(r['ci_low'])}, {_num(r['ci_high'])}]"
                        if r["ci_low"] is not None
                        else ""
                    ),
                    "minimum": "" if minimum is None else f"{minimum:g}",
                    "below": below,
                    "note": r["reason"] or "",
                }
            )
    if not rows:
        return None
    return {
        "run_id": cal.run_id,
        "root": redact_url(root),
        "rows": rows,
        "reliability": _reliability_charts(cal, rows),
    }


def _reliability_charts(cal: Any, rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    """A reliability diagram (``chart``, an SVG ``data:`` URI, with ``metric`` and
    ``judge``) per (metric, judge)
    of ``rows`` whose calibration recorded probability bins (``score: probability``);
    none for a calibration written before the bins existed."""
    from ragbatch.analysis import plots

    try:
        bins = cal.table("reliability")
    except Exception:  # noqa: BLE001 - an older calibration has no reliability table
        return []
    charts = []
    for metric, judge in dict.fromkeys((r["metric"], r["judge"]) for r in rows):
        found = bins.filter((pl.col("metric") == metric) & (pl.col("judge") == judge)).sort(
            "bin_low"
        )
        if found.height:
            svg = plots.reliability_diagram(
                found["mean_p"].to_list(),
                found["observed"].to_list(),
                found["n"].to_list(),
                title=f"{metric} ({judge})",
            )
            charts.append({"metric": metric, "judge": judge, "chart": plots.data_uri(svg)})
    return charts


def _prompt_version(entry: dict[str, Any]) -> str | None:
    """The prompt version of a manifest's metric entry (None when it no longer builds)."""
    from ragbatch.scoring.registry import get_metric

    try:
        cls = get_metric(entry["name"])
        metric = cls.from_params(
            entry.get("params") or {},
            metric_id=entry["id"],
            engine=entry.get("engine"),
            where="metric",
        )
    except (ConfigError, KeyError):
        return None
    # only entries of kind "judge" come here: their name is a judge metric's
    return prompt_version(cast("JudgeMetric", metric))
