"""One night of a job: run it, publish its report and its comparison with the previous
committed run, and tell a scheduler how it went (``ragbatch nightly``,
``python jobs/nightly.py``).

The night is ``run_date`` (``--run-date``), else the config's ``run.run_date``, else
yesterday in UTC (:func:`ragbatch.core.run_date.choose_run_date`); ``{run_date}`` placeholders
in the config's URIs are filled in with it (:mod:`ragbatch.config.templating`). The run id is
``--run-id``, else ``nightly-<YYYY-MM-DD>`` (:func:`nightly_run_id`), one per night, so
that running a night again is safe: an attempt that failed is resumed (rows already
scored are kept), and a night already committed is not run again (its report is written
again and the exit code says what it found).

Exit codes (:data:`ragbatch.core.exit_codes.EXIT_CODES`):

===  ==========================================================================
0    the night is committed, and no metric regressed beyond the threshold
1    the run failed while running, or its report could not be written; running
     the night again may help (it resumes, or only writes the report)
2    a problem in the config or the input that needs a fix (the message names it),
     including an output root that cannot be written ("cannot write": no bucket, a
     path under a file, no permission), found with a probe object before the run
     starts (an unreachable or throttling store is 1); or another attempt of the same
     run id is running now (the message names it)
3    the night is committed, but a metric regressed beyond ``--fail-on-regression``
4    this night's input is not there yet: nothing exists at the rendered
     ``input.uri`` while the folder above the date-dependent part does; try later
5    the night is committed, but a judge metric's all-rows result is degenerate
     (docs/judges.md, "Judge health") and ``--fail-on-degenerate`` (or
     ``diagnostics.fail_on_degenerate``) gates on it; it takes precedence over 3,
     since a degenerate judge's change says nothing
===  ==========================================================================
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ragbatch.analysis.multiple_testing import DEFAULT_FDR
from ragbatch.config.job import InputSection, JobConfig
from ragbatch.core.errors import (
    ConfigError,
    InputError,
    InputNotFoundError,
    OutputError,
    RagbatchError,
    RunInProgressError,
)
from ragbatch.core.exit_codes import (
    EXIT_DEGENERATE,
    EXIT_FAILED,
    EXIT_INPUT_NOT_READY,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_REGRESSION,
)
from ragbatch.core.ids import check_id
from ragbatch.ops.mlflow_log import MlflowLogged
from ragbatch.io.probe import probe_output
from ragbatch.core.run_date import choose_run_date
from ragbatch.config.templating import fixed_prefix, render_config

if TYPE_CHECKING:  # the run and the analysis load Ray and Polars: imported when used
    import polars as pl

    from ragbatch.analysis.compare import Comparison
    from ragbatch.analysis.nightly import NightlyReport
    from ragbatch.analysis.runs import CommittedRun
    from ragbatch.pipeline.runner import RunResult

RUN_ID_PREFIX = "nightly-"


def nightly_run_id(night: dt.date) -> str:
    """The default run id of a night: ``nightly-YYYY-MM-DD``."""
    return f"{RUN_ID_PREFIX}{night.isoformat()}"


@dataclass
class NightlyOutcome:
    """What :func:`run_nightly` did.

    Attributes
    ----------
    exit_code : int
        One of :data:`~ragbatch.core.exit_codes.EXIT_CODES`.
    night : datetime.date
        The run date.
    run_id : str
    message : str
        One line saying why the exit code (empty for a plain success).
    config : JobConfig or None
        The config as run (URIs rendered); None when it could not be rendered.
    result : RunResult or None
        The run, when it ran and committed now.
    already_committed : bool
        The night was committed before; it was not run again.
    run, baseline : CommittedRun or None
        The committed night and the previous committed run under the same root.
    comparison : Comparison or None
    report : NightlyReport or None
        What was written under ``<output>/reports/`` (None with ``report=False``).
    regressions : polars.DataFrame or None
        The all-rows comparison lines that regress beyond ``threshold`` (None without a
        threshold or without a previous run).
    threshold : float or None
    fdr : float or None
        False discovery rate the comparison's lines were flagged at (None: no control).
    compared : bool
        False when no comparison was asked for (``report=False`` without a threshold).
    degenerate : dict
        Metric id -> reasons, for each judge metric whose all-rows result is degenerate
        (filled whether or not the night gates on it).
    mlflow : MlflowLogged or None
        Where the night was logged to MLflow (``output.mlflow``; None without it).
    """

    exit_code: int
    night: dt.date
    run_id: str
    message: str = ""
    config: JobConfig | None = None
    result: RunResult | None = None
    already_committed: bool = False
    run: CommittedRun | None = None
    baseline: CommittedRun | None = None
    comparison: Comparison | None = None
    report: NightlyReport | None = None
    regressions: pl.DataFrame | None = None
    threshold: float | None = None
    fdr: float | None = DEFAULT_FDR
    compared: bool = True
    degenerate: dict[str, str] = field(default_factory=dict)
    mlflow: MlflowLogged | None = None


def run_nightly(
    config: JobConfig,
    *,
    config_dir: str | Path | None = None,
    run_date: dt.date | None = None,
    run_id: str | None = None,
    address: str | None = None,
    fail_on_regression: float | None = None,
    report: bool = True,
    allow_uncalibrated: bool = False,
    fail_on_degenerate: bool | None = None,
    fdr: float | None = DEFAULT_FDR,
) -> NightlyOutcome:
    """Run one night of ``config`` and publish its report; never raises for the failures
    :data:`~ragbatch.core.exit_codes.EXIT_CODES` name (they become the outcome's exit code and
    message).

    Parameters
    ----------
    config : JobConfig
        As loaded, URIs not yet rendered (``--input``/``--output``/``--rejudge``
        overrides applied). ``cache.rejudge`` left unset becomes ``[parse_failure]``
        (:func:`nightly_rejudge`).
    config_dir : path, optional
        Directory of the config file (for ``binary`` callbacks).
    run_date : datetime.date, optional
        The night; default ``config.run.run_date``, else yesterday in UTC
        (:func:`ragbatch.core.run_date.choose_run_date`).
    run_id : str, optional
        Default :func:`nightly_run_id`. A run id fixed in ``config.run.run_id`` is
        refused (every night would reuse it).
    address : str, optional
        Ray address (default ``$RAY_ADDRESS``, else a local Ray).
    fail_on_regression : float, optional
        Threshold >= 0 in the metric's units: exit 3 when a metric's all-rows change
        against the previous committed run is significant, worse and larger than it.
    report : bool
        Write ``report.html`` and the comparison under ``<output>/reports/``; without
        it the comparison is still made (not written) when ``fail_on_regression`` is
        given.
    allow_uncalibrated : bool
        Run judge metrics that the config's ``calibration`` guard would refuse, with a
        warning (as ``ragbatch run --allow-uncalibrated``); without it such a night
        exits 2 before anything starts.
    fail_on_degenerate : bool, optional
        Exit 5 when a judge metric's all-rows result is degenerate; default the
        config's ``diagnostics.fail_on_degenerate``.
    fdr : float or None
        False discovery rate of the comparison with the previous run (default 0.05;
        :mod:`ragbatch.analysis.multiple_testing`); None turns the control off.

    Returns
    -------
    NightlyOutcome
    """
    night = choose_run_date(run_date, config.run.run_date, nightly=True)
    outcome = NightlyOutcome(
        EXIT_OK,
        night,
        nightly_run_id(night) if run_id is None else run_id,
        threshold=fail_on_regression,
        fdr=fdr,
    )
    try:
        check_id(outcome.run_id, "nightly run id" if run_id is None else "--run-id")
        if config.run.run_id and run_id is None:
            raise ConfigError(
                "run.run_id: a nightly config cannot fix the run id (every night "
                "would reuse it); remove it (default: nightly-<run date>) or pass "
                "--run-id"
            )
        if fail_on_regression is not None and fail_on_regression < 0:
            raise ConfigError(
                f"--fail-on-regression {fail_on_regression}: the threshold must "
                "be >= 0 (in the metric's units, e.g. 0.02)"
            )
        # run_job renders the config itself; this copy names the paths beforehand.
        config = config.model_copy(deep=True)
        config.run.run_date = night
        config.cache.rejudge = nightly_rejudge(config.cache.rejudge)
        outcome.config = render_config(config, night)
        probe_output(outcome.config.output.uri, outcome.config.output.storage_options)
        outcome.already_committed = _committed(outcome.config, night, outcome.run_id)
        if not outcome.already_committed:
            from ragbatch.pipeline.runner import run_job

            outcome.result = run_job(
                config,
                run_id=outcome.run_id,
                address=address,
                config_dir=config_dir,
                allow_uncalibrated=allow_uncalibrated,
            )
            outcome.config = outcome.result.config
    except InputNotFoundError as exc:
        ready = outcome.config is not None and _input_root_exists(
            config.input.uri, outcome.config.input
        )
        code = EXIT_INPUT_NOT_READY if ready else EXIT_INVALID
        return _failed(outcome, code, str(exc))
    except (ConfigError, InputError, RunInProgressError) as exc:
        return _failed(outcome, EXIT_INVALID, str(exc))
    except RagbatchError as exc:
        return _failed(outcome, EXIT_FAILED, str(exc))
    gate = (
        config.diagnostics.fail_on_degenerate if fail_on_degenerate is None else fail_on_degenerate
    )
    return _publish(outcome, report, gate)


def nightly_rejudge(configured: list[str] | None) -> list[str]:
    """The statuses a night asks the judge again for (``cache.rejudge`` as run): those
    the config (or ``--rejudge``) names, else
    :data:`~ragbatch.judge.rejudge.NIGHTLY_REJUDGE` (``parse_failure``), so that a night
    after a judge server returned malformed replies re-asks them rather than serving
    them from the judgment cache again (docs/cache.md, "Asking failed replies again")."""
    from ragbatch.judge.rejudge import NIGHTLY_REJUDGE

    return list(NIGHTLY_REJUDGE) if configured is None else list(configured)


def _failed(outcome: NightlyOutcome, code: int, message: str) -> NightlyOutcome:
    outcome.exit_code, outcome.message = code, message
    return outcome


def _committed(config: JobConfig, night: dt.date, run_id: str) -> bool:
    """Whether ``run_id`` is committed for ``night`` under the output root; a transient
    storage failure raises :class:`OutputError` (exit 1, retry), any other an
    :class:`InputError` naming the root (exit 2)."""
    from ragbatch.io.fs import describe_storage_error, is_transient
    from ragbatch.io.write import OutputLayout

    layout = OutputLayout.for_run(config.output, night, run_id)
    try:
        return bool(layout.fs.exists(layout.manifest_path))
    except Exception as exc:  # noqa: BLE001 - storage errors get a message naming the root
        error = describe_storage_error(config.output.uri, exc, section="output")
        raise (OutputError(str(error)) if is_transient(exc) else error) from None


def _input_root_exists(template: str, rendered: InputSection) -> bool:
    """Whether the folder above the date-dependent part of the input URI ``template``
    exists (without a placeholder: the folder holding the rendered ``input.uri``). An
    empty path (the working directory) or a URI with no path counts as existing.

    Parameters
    ----------
    template : str
        ``input.uri`` as written.
    rendered : InputSection
        The input section as run (rendered URI, storage options).
    """
    from ragbatch.io.fs import resolve

    prefix = fixed_prefix(template, "input.uri")
    if prefix is None:
        uri = rendered.uri.rstrip("/")
        prefix = uri.rsplit("/", 1)[0] if "/" in uri else ""
    if not prefix or prefix.endswith((":", ":/")):
        return True
    try:
        fs, path = resolve(prefix, rendered.storage_options)
        return bool(fs.exists(path))
    except Exception:  # noqa: BLE001 - cannot tell: report the input problem as such
        return False


def calibration_options(config: JobConfig) -> dict[str, Any] | None:
    """The fsspec options of the calibration root a job's report looks in: the config's
    ``calibration.storage_options`` when its ``calibration.uri`` is another root, else
    None (the output root's own options apply)."""
    guard = config.calibration
    if guard is None or not guard.uri or guard.uri == config.output.uri:
        return None
    return guard.storage_options


def _publish(outcome: NightlyOutcome, report: bool, fail_on_degenerate: bool) -> NightlyOutcome:
    """Report and compare the committed night; set the exit code from the judge health
    and the comparison."""
    from ragbatch.analysis.diagnostics import degenerate_metrics
    from ragbatch.analysis.nightly import compare_with_previous, write_run_report
    from ragbatch.analysis.runs import find_run, load_summary
    from ragbatch.calibrate.report import calibration_section

    # set before the run started; _publish is reached only after it
    config = cast("JobConfig", outcome.config)
    output = config.output
    try:
        if report:
            written = write_run_report(
                output.uri,
                outcome.run_id,
                output.storage_options,
                threshold=outcome.threshold,
                fdr=outcome.fdr,
                calibration_options=calibration_options(config),
                calibration_section=calibration_section,
            )
            outcome.report = written
            outcome.run, outcome.baseline = written.run, written.baseline
            outcome.comparison = written.comparison
        elif outcome.threshold is not None:
            outcome.run, outcome.baseline, outcome.comparison = compare_with_previous(
                output.uri, outcome.run_id, output.storage_options, outcome.threshold, outcome.fdr
            )
        else:
            outcome.run = find_run(output.uri, outcome.run_id, output.storage_options)
            outcome.compared = False
        outcome.degenerate = degenerate_metrics(load_summary(outcome.run))
    except Exception as exc:  # noqa: BLE001 - the night is committed; say so with the cause
        what = "report" if report else "comparison with the previous run"
        return _failed(
            outcome,
            EXIT_FAILED,
            f"run {outcome.run_id} is committed, but its {what} failed: "
            f"{type(exc).__name__}: {exc}; run the night again to retry (it is not "
            "scored again)",
        )
    if output.table is not None:
        from ragbatch.ops.table_output import write_run_tables

        try:
            write_run_tables(config, outcome.run_id)
        except Exception as exc:  # noqa: BLE001 - the night is committed; say so
            return _failed(
                outcome,
                EXIT_FAILED,
                f"run {outcome.run_id} is committed, but it could not be written to its "
                f"tables: {type(exc).__name__}: {exc}; run the night again to retry (it is "
                "not scored again)",
            )
    if output.mlflow is not None:
        from ragbatch.ops.mlflow_log import log_run

        try:
            outcome.mlflow = log_run(config, outcome.run_id)
        except Exception as exc:  # noqa: BLE001 - the night is committed; say so
            return _failed(
                outcome,
                EXIT_FAILED,
                f"run {outcome.run_id} is committed, but it could not be logged to MLflow: "
                f"{type(exc).__name__}: {exc}; run the night again to retry (it is not "
                "scored again)",
            )
    if outcome.threshold is not None and outcome.comparison is not None:
        outcome.regressions = outcome.comparison.regressions(outcome.threshold)
    if fail_on_degenerate and outcome.degenerate:
        return _failed(
            outcome, EXIT_DEGENERATE, "degenerate judge results: " + ", ".join(outcome.degenerate)
        )
    if outcome.regressions is not None:
        if outcome.regressions.height:
            names = ", ".join(outcome.regressions["metric"].to_list())
            return _failed(
                outcome,
                EXIT_REGRESSION,
                f"regressed beyond {outcome.threshold:g} against run "
                # a comparison, hence regressions, exists only against a baseline
                f"{cast('CommittedRun', outcome.baseline).run_id}: {names}",
            )
    return outcome
