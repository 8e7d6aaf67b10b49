"""A run's report and its comparison with the previous committed run, written next to
its outputs (``ragbatch run --report``).

Layout under the output root (beside ``scores/``, ``summary/`` and ``runs/``)::

    reports/run_date=YYYY-MM-DD/run_id=<id>/report.html        always
    reports/run_date=YYYY-MM-DD/run_id=<id>/comparison.json    when a previous run exists
    reports/run_date=YYYY-MM-DD/run_id=<id>/comparison.txt     the same, as ``ragbatch compare`` prints it

The *previous committed run* is the latest committed run under the same output root that
sorts before this one by run date, then start time, then run id
(:func:`ragbatch.analysis.runs.previous_run`). The first run under a root gets a report
without a comparison. The files are written after the run has committed: a failure here
leaves the run committed and is reported as such.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ragbatch.analysis.compare import Comparison, compare_runs
from ragbatch.analysis.multiple_testing import DEFAULT_FDR
from ragbatch.analysis.compare_text import format_comparison
from ragbatch.analysis.report import CalibrationSection, build_report
from ragbatch.analysis.runs import CommittedRun, find_run, previous_run

REPORT_FILE = "report.html"
COMPARISON_JSON = "comparison.json"
COMPARISON_TEXT = "comparison.txt"


@dataclass
class NightlyReport:
    """What :func:`write_run_report` wrote.

    Attributes
    ----------
    run : CommittedRun
    report : str
        URI (or local path) of ``report.html``.
    baseline : CommittedRun or None
        The previous committed run, when there is one.
    comparison : Comparison or None
    comparison_json, comparison_text : str or None
        Where the comparison went (None without a previous run).
    """

    run: CommittedRun
    report: str
    baseline: CommittedRun | None = None
    comparison: Comparison | None = None
    comparison_json: str | None = None
    comparison_text: str | None = None


def _uri(run: CommittedRun, path: str) -> str:
    protocol = run.fs.protocol
    protocol = protocol[0] if isinstance(protocol, (tuple, list)) else protocol
    return path if protocol in ("file", "local") else run.fs.unstrip_protocol(path)


def _write_text(run: CommittedRun, path: str, text: str) -> None:
    run.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with run.fs.open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def compare_with_previous(
    root: str,
    run_id: str,
    storage_options: dict[str, Any] | None = None,
    threshold: float | None = None,
    fdr: float | None = DEFAULT_FDR,
) -> tuple[CommittedRun, CommittedRun | None, Comparison | None]:
    """Committed run ``run_id`` under ``root``, the previous committed run and their
    comparison (both None for the first run under ``root``); nothing is written.

    Parameters
    ----------
    threshold : float, optional
        Regression threshold recorded on the comparison (:meth:`Comparison.regressions`).
    fdr : float or None
        False discovery rate across the comparison's lines (None: no control).

    Raises
    ------
    InputError
        ``run_id`` is not committed under ``root``, ``threshold`` is negative, or
        ``fdr`` is outside (0, 1).
    """
    run = find_run(root, run_id, storage_options)
    baseline = previous_run(run, storage_options)
    comparison = (
        compare_runs(baseline, run, threshold=threshold, fdr=fdr) if baseline is not None else None
    )
    return run, baseline, comparison


def write_run_report(
    root: str,
    run_id: str,
    storage_options: dict[str, Any] | None = None,
    threshold: float | None = None,
    fdr: float | None = DEFAULT_FDR,
    calibration_options: dict[str, Any] | None = None,
    calibration_section: CalibrationSection | None = None,
) -> NightlyReport:
    """Write the report of committed run ``run_id`` under ``root`` and, when there is a
    previous committed run, the comparison with it (see the module notes for paths).

    Parameters
    ----------
    root, run_id : str
        Output root and committed run id.
    storage_options : dict, optional
        fsspec options for ``root``; the previous run and the calibration under the
        same root are looked up with them too.
    threshold : float, optional
        Regression threshold recorded in ``comparison.json`` (``ragbatch nightly
        --fail-on-regression``).
    fdr : float or None
        False discovery rate of the comparison (``ragbatch nightly --fdr``).
    calibration_options : dict, optional
        fsspec options of a calibration root other than ``root`` (the job config's
        ``calibration.storage_options``); see
        :func:`ragbatch.calibrate.report.calibration_section`.
    calibration_section : callable, optional
        Builds the report's calibration section
        (:data:`ragbatch.analysis.report.CalibrationSection`); without it, none.

    Returns
    -------
    NightlyReport

    Raises
    ------
    InputError
        ``run_id`` is not committed under ``root``.
    OSError
        A file cannot be written.
    """
    run, baseline, comparison = compare_with_previous(root, run_id, storage_options, threshold, fdr)
    html = build_report(
        run,
        baseline,
        comparison=comparison,
        calibration_options=calibration_options,
        calibration_section=calibration_section,
    )
    out = NightlyReport(run, _uri(run, f"{run.reports_path}/{REPORT_FILE}"), baseline, comparison)
    _write_text(run, f"{run.reports_path}/{REPORT_FILE}", html)
    if comparison is not None:
        json_path = f"{run.reports_path}/{COMPARISON_JSON}"
        text_path = f"{run.reports_path}/{COMPARISON_TEXT}"
        _write_text(run, json_path, comparison.to_json() + "\n")
        _write_text(run, text_path, format_comparison(comparison) + "\n")
        out.comparison_json, out.comparison_text = _uri(run, json_path), _uri(run, text_path)
    return out
