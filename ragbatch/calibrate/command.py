"""``ragbatch calibrate``: run each judge over the labelled data, then measure agreement."""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import polars as pl

from ragbatch import __version__
from ragbatch.calibrate.agreement import metric_agreement
from ragbatch.calibrate.config import CalibrationConfig
from ragbatch.calibrate.measures import Bootstrap
from ragbatch.calibrate.output import write_calibration
from ragbatch.calibrate.prepare import PAIR_ID, PAIR_MEMBER, LabelledInput, read_labelled
from ragbatch.config.job import ColumnMapping, InputSection, JobConfig
from ragbatch.core.ids import check_id
from ragbatch.io.fs import resolve
from ragbatch.core.redact import redact
from ragbatch.core.run_date import choose_run_date

if TYPE_CHECKING:
    from ragbatch.io.write import OutputLayout
    from ragbatch.judge.metric import JudgeMetric

log = logging.getLogger("ragbatch")


@dataclass
class CalibrationResult:
    """A committed calibration: where it is and what it holds (plain-dict rows)."""

    run_id: str
    run_date: dt.date
    path: str
    scores_run_ids: dict[str, str]
    tables: dict[str, list[dict[str, Any]]]
    manifest: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)


def judge_job(
    cal: CalibrationConfig, judge: str, input_uri: str, row_id: str, answer: str | None
) -> JobConfig:
    """The job config one judge runs: the labelled Parquet as input (every column kept as
    a slice column), the calibration's metrics on engine ``judge``, its engines, output
    root and judgment cache."""
    columns = cal.input.columns.model_dump()
    columns.update(row_id=row_id, answer=answer)
    slices = cal.input.slice_columns
    if slices is not None:
        # the labels (and the pair columns) must reach the scores table
        extra = [spec.column for spec in cal.labels.values()]
        if cal.pairs is not None:
            extra += [PAIR_ID, PAIR_MEMBER]
        slices = list(dict.fromkeys([*slices, *extra]))
    data = {
        "run": {"name": f"{cal.name}:{judge}", "error_budget": 1.0},
        "input": InputSection(
            uri=input_uri,
            format="parquet",
            columns=ColumnMapping(**columns),
            contexts_format=cal.input.contexts_format,
            contexts_field=cal.input.contexts_field,
            slice_columns=slices,
            latency_unit=cal.input.latency_unit,
            storage_options=cal.output.storage_options,
        ).model_dump(),
        "output": cal.output.model_dump(),
        "metrics": [{**m.model_dump(), "engine": judge} for m in cal.metrics],
        "engines": {k: v.model_dump() for k, v in cal.engines.items()},
        "cache": cal.cache.model_dump(),
    }
    return JobConfig.from_dict(data, source=f"calibration job of judge {judge}")


@dataclass(frozen=True)
class CalibrationStart:
    """When and as what a calibration starts (:func:`start_calibration`).

    Attributes
    ----------
    run_id : str
        The calibration id, checked (:func:`ragbatch.core.ids.check_id`).
    run_date : datetime.date
        The date given, else the UTC date of ``started``.
    started : datetime.datetime
        The start time, timezone-aware UTC (the manifest's ``started_at``).
    clock : float
        :func:`time.perf_counter` at the start, for the ``total_s`` timing.
    """

    run_id: str
    run_date: dt.date
    started: dt.datetime
    clock: float


def start_calibration(run_id: str | None, run_date: dt.date | None) -> CalibrationStart:
    """The start of a calibration run (``ragbatch calibrate``, with or without
    ``--align``): the start time, the calibration id (``run_id``, else a new one from the
    start time, :func:`ragbatch.pipeline.runner.new_run_id`) and the run date
    (``run_date``, else today in UTC, :func:`ragbatch.core.run_date.choose_run_date`).
    The ids of the judge runs differ between the two commands; each checks its own.

    Raises
    ------
    ConfigError
        ``run_id`` is not a valid id (:func:`ragbatch.core.ids.check_id`).
    """
    from ragbatch.pipeline.runner import new_run_id

    started = dt.datetime.now(dt.timezone.utc)
    clock = time.perf_counter()
    run_id = check_id(new_run_id(started) if run_id is None else run_id, "calibration id")
    return CalibrationStart(run_id, choose_run_date(run_date, now=started), started, clock)


def run_calibration(
    cal: CalibrationConfig,
    *,
    run_id: str | None = None,
    run_date: dt.date | None = None,
    address: str | None = None,
    config_dir: str | Path | None = None,
) -> CalibrationResult:
    """Run every judge of ``cal`` over its labelled rows and commit the agreement tables.

    Each judge's scores are an ordinary run (``ragbatch run``'s pipeline, UDFs, judgment
    cache, staging and commit) with run id ``<run_id>-<judge>`` under ``output.uri``; a
    calibration started again with the same ``run_id`` reuses the judge runs that
    committed and resumes the others. The calibration's manifest records its config with
    credentials redacted (:func:`ragbatch.core.redact.redact`).

    Raises
    ------
    ConfigError, InputError
        A problem in the config, the labelled input or its labels; a calibration id, or
        a judge run id ``<run_id>-<judge>``, that is not a valid id
        (:func:`ragbatch.core.ids.check_id`), before anything runs.
    OutputError
        The calibration id is already committed.
    """
    from ragbatch.analysis.runs import load_scores
    from ragbatch.io.write import OutputLayout

    start = start_calibration(run_id, run_date)
    run_id, run_date, started, t0 = start.run_id, start.run_date, start.started, start.clock
    for judge in cal.judges:
        check_id(judge_run_id(run_id, judge), f"judge run id of judge {judge!r}")
    labelled = read_labelled(cal)
    layout = OutputLayout.for_run(cal.output, run_date, run_id)
    input_uri = write_input(cal, layout, run_id, "labelled", labelled.frame)
    boot = Bootstrap(cal.bootstrap.resamples, cal.bootstrap.seed, cal.bootstrap.confidence)
    tables: dict[str, list[dict[str, Any]]] = {
        "agreement": [],
        "confusion": [],
        "disagreements": [],
        "reliability": [],
    }
    scores_ids: dict[str, str] = {}
    timings: dict[str, float] = {}
    texts = row_texts(labelled)
    for judge in cal.judges:
        job = judge_job(cal, judge, input_uri, labelled.row_id, labelled.answer)
        job.run.run_date = run_date
        scores_run_id = judge_run_id(run_id, judge)
        t1 = time.perf_counter()
        committed = committed_judge_run(cal, job, run_id, judge, address, config_dir)
        timings[f"judge_{judge}_s"] = time.perf_counter() - t1
        scores_ids[judge] = scores_run_id
        add_agreement(tables, cal, job, load_scores(committed), judge, scores_run_id, boot, texts)
    timings["total_s"] = time.perf_counter() - t0
    manifest = base_manifest(cal, run_id, run_date, started, input_uri, labelled.frame.height)
    manifest.update(scores_runs=scores_ids, timings=timings)
    path = write_calibration(
        cal.output.uri, cal.output.storage_options, run_date, run_id, tables, manifest
    )
    return CalibrationResult(
        run_id, run_date, layout.uri(path), scores_ids, tables, manifest, timings
    )


def write_input(
    cal: CalibrationConfig, layout: "OutputLayout", run_id: str, name: str, frame: pl.DataFrame
) -> str:
    """Write ``frame`` once as ``calibration_inputs/run_id=<run_id>/<name>.parquet`` under
    the output root (kept when it is there: a calibration started again reads the same
    rows) and return its URI (``layout``: the calibration's output layout)."""
    fs, base = resolve(cal.output.uri, cal.output.storage_options)
    path = f"{base.rstrip('/')}/calibration_inputs/run_id={run_id}/{name}.parquet"
    if not fs.exists(path):
        layout.write_table(path, frame.to_arrow())
    return layout.uri(path)


def base_manifest(
    cal: CalibrationConfig,
    run_id: str,
    run_date: dt.date,
    started: dt.datetime,
    input_uri: str,
    rows: int,
) -> dict[str, Any]:
    """The manifest keys every calibration has: ids, dates, version, the config (its
    credentials redacted), the labelled input (``uri``, ``rows``) and the bootstrap
    settings; ``finished_at`` is now."""
    return {
        "run_id": run_id,
        "run_date": run_date.isoformat(),
        "name": cal.name,
        "started_at": started.isoformat(),
        "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(),
        "ragbatch_version": __version__,
        "config": redact(cal.model_dump(mode="json")),
        "labelled_input": {"uri": redact(input_uri), "rows": rows},
        "bootstrap": cal.bootstrap.model_dump(),
    }


def committed_judge_run(
    cal: CalibrationConfig,
    job: JobConfig,
    run_id: str,
    judge: str,
    address: str | None,
    config_dir: str | Path | None,
) -> Any:
    """The committed run of ``judge``'s scores in calibration ``run_id``: the one already
    there, else the one ``job`` commits now (:func:`ragbatch.pipeline.runner.run_job`)."""
    from ragbatch.analysis.runs import find_run
    from ragbatch.core.errors import InputError
    from ragbatch.pipeline.runner import run_job

    scores_run_id = judge_run_id(run_id, judge)
    try:
        committed = find_run(cal.output.uri, scores_run_id, cal.output.storage_options)
    except InputError:
        committed = None
    if committed is not None:
        log.info("calibration %s: judge %s reuses committed run %s", run_id, judge, scores_run_id)
        return committed
    # Run outside the handler above: an error of the run would otherwise carry the
    # lookup's "no committed run" as its context, and the runner, which looks through
    # an error's context for the project's own error, would report that instead.
    run_job(job, run_id=scores_run_id, address=address, config_dir=config_dir)
    return find_run(cal.output.uri, scores_run_id, cal.output.storage_options)


def add_agreement(
    tables: dict[str, list[dict[str, Any]]],
    cal: CalibrationConfig,
    job: JobConfig,
    scores: pl.DataFrame,
    judge: str,
    scores_run_id: str,
    boot: Bootstrap,
    texts: pl.DataFrame,
) -> None:
    """Append each metric of ``job`` (one judge's) to the ``agreement``, ``confusion``,
    ``disagreements`` and ``reliability`` rows of ``tables``
    (:func:`ragbatch.calibrate.agreement.metric_agreement` on its ``scores``)."""
    from ragbatch.pipeline.plan import build_metrics

    metrics, _, _ = build_metrics(job)
    pairs = cal.pairs is not None and PAIR_ID in scores.columns
    for metric in metrics:
        found = metric_agreement(
            scores,
            # each metric has the judge's engine, which only judge metrics accept
            cast("JudgeMetric", metric),
            cal.labels[metric.id],
            judge=judge,
            scores_run_id=scores_run_id,
            boot=boot,
            top=cal.top_disagreements,
            texts=texts,
            pairs=pairs,
        )
        tables["agreement"] += found.measures
        tables["confusion"] += found.confusion
        tables["disagreements"] += found.disagreements
        tables["reliability"] += found.reliability


def judge_run_id(calibration_id: str, judge: str) -> str:
    """The run id of judge ``judge``'s scores in calibration ``calibration_id``:
    ``<calibration id>-<judge>``."""
    return f"{calibration_id}-{judge}"


def row_texts(labelled: LabelledInput) -> pl.DataFrame:
    """``row_id``, ``question``, ``answer`` (text) of the labelled rows."""
    frame = labelled.frame
    cols = [pl.col(labelled.row_id).cast(pl.String).alias("row_id")]
    for name, source in (("question", labelled.question), ("answer", labelled.answer)):
        if source is not None and source in frame.columns:
            cols.append(pl.col(source).cast(pl.String).alias(name))
        else:
            cols.append(pl.lit(None, dtype=pl.String).alias(name))
    return frame.select(cols)
