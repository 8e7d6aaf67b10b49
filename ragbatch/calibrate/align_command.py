"""``ragbatch calibrate CONFIG --align METRIC``: choose few-shot examples for one judge
metric from a training split of the labelled rows, write them as an examples file, and
measure the judge on the held-out rows without and with them (docs/calibration.md,
"Aligning a judge").

Every check of the options, the metric and the labelled rows runs before anything is
written or any judge is asked.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from ragbatch.calibrate.align import Split, choose_examples, examples_record, split_rows
from ragbatch.calibrate.align_measures import alignment_rows, paired_scores, usable_scores
from ragbatch.calibrate.align_replies import example_reply, metric_problem, row_problem
from ragbatch.calibrate.agreement import scores_are_probabilities
from ragbatch.calibrate.command import (
    CalibrationResult,
    add_agreement,
    base_manifest,
    committed_judge_run,
    judge_job,
    judge_run_id,
    row_texts,
    start_calibration,
    write_input,
)
from ragbatch.calibrate.config import CalibrationConfig, LabelSpec
from ragbatch.calibrate.labels import label_values
from ragbatch.calibrate.measures import Bootstrap
from ragbatch.calibrate.output import write_calibration
from ragbatch.calibrate.prepare import LabelledInput, read_labelled
from ragbatch.config.job import MetricSpec
from ragbatch.core.errors import ConfigError
from ragbatch.core.ids import check_id
from ragbatch.io.fs import resolve
from ragbatch.judge.aligned import write_examples
from ragbatch.judge.metric import JudgeMetric

#: The two judge runs of each judge, in the order they run.
STAGES = ("before", "after")


@dataclass(frozen=True)
class AlignOptions:
    """The ``--align`` options: the metric id, ``shots`` (>= 1), ``train_fraction`` (in
    (0, 1)) and the ``seed`` of the split and of the choice of examples."""

    metric: str
    shots: int = 4
    train_fraction: float = 0.5
    seed: int = 0


@dataclass
class AlignPlan:
    """What an alignment will do, settled before anything runs.

    Attributes
    ----------
    spec : MetricSpec
        The metric's entry in the calibration config.
    metric : JudgeMetric
        The metric as built from it.
    label : LabelSpec
    split : Split
        Of the labelled rows (rows with a null label take no part).
    record : dict
        The examples file's record (:func:`~ragbatch.calibrate.align.examples_record`).
    held_out : polars.DataFrame
        The held-out rows of the labelled input, the only rows the judges score.
    """

    spec: MetricSpec
    metric: JudgeMetric
    label: LabelSpec
    split: Split
    record: dict[str, Any]
    held_out: pl.DataFrame


def _option(opts: AlignOptions) -> str:
    return f"--align {opts.metric}"


def aligned_metric(cal: CalibrationConfig, opts: AlignOptions) -> tuple[MetricSpec, JudgeMetric]:
    """The calibration's metric of id ``opts.metric``, built, once it is known to be
    one that can be aligned.

    Raises
    ------
    ConfigError
        Bad options; no metric of the config has that id (the message lists the ids, and
        says when the name is a registered metric, and whether a judge metric); the
        metric is not a judge metric, its first step's reply is not decided by a binary
        label (:func:`~ragbatch.calibrate.align_replies.metric_problem`), its label is
        graded, or the config has ``pairs``.
    """
    from ragbatch.scoring.registry import get_metric

    _check_options(opts)
    specs = {m.metric_id: (i, m) for i, m in enumerate(cal.metrics)}
    if opts.metric not in specs:
        raise ConfigError(_unknown(cal, opts))
    i, spec = specs[opts.metric]
    cls = get_metric(spec.name, where=f"metrics[{i}].name")
    if not issubclass(cls, JudgeMetric):
        raise ConfigError(
            f"{_option(opts)}: {spec.name!r} is not a judge metric; only judge metrics take "
            "examples: align one of the config's judge metrics"
        )
    metric = cls.from_params(
        spec.params, metric_id=spec.metric_id, engine=cal.judges[0], where=f"metrics[{i}].params"
    )
    assert isinstance(metric, JudgeMetric)
    problem = metric_problem(metric)
    if problem:
        raise ConfigError(
            f"{_option(opts)}: {spec.name} cannot be aligned: {problem}; align a metric "
            "whose first step gives one verdict for the row (docs/calibration.md, "
            '"Aligning a judge")'
        )
    if cal.labels[spec.metric_id].type != "binary":
        raise ConfigError(
            f"{_option(opts)}: labels.{spec.metric_id} is graded; example replies are "
            "built from binary labels only: give it type: binary (with a threshold)"
        )
    if cal.pairs is not None:
        raise ConfigError(
            f"{_option(opts)}: a config with `pairs` cannot be aligned: the answers of a "
            "pair share their question, so a split by row would show held-out questions "
            "as examples; calibrate it without --align"
        )
    return spec, metric


def _check_options(opts: AlignOptions) -> None:
    if opts.shots < 1:
        raise ConfigError(f"--shots must be at least 1, got {opts.shots}")
    if not 0.0 < opts.train_fraction < 1.0:
        raise ConfigError(
            f"--train-fraction must be between 0 and 1 (exclusive), got {opts.train_fraction}"
        )


def _unknown(cal: CalibrationConfig, opts: AlignOptions) -> str:
    """The message for a metric id that is not one of the config's."""
    from ragbatch.scoring.registry import get_metric

    ids = [m.metric_id for m in cal.metrics]
    head = f"{_option(opts)}: no metric of the calibration config has id {opts.metric!r}"
    try:
        cls = get_metric(opts.metric)
    except ConfigError:
        return f"{head}; its metric ids: {ids}"
    if not issubclass(cls, JudgeMetric):
        return (
            f"{head}, and {opts.metric!r} is not a judge metric (only judge metrics take "
            f"examples); its metric ids: {ids}"
        )
    return (
        f"{head}; add {opts.metric} under `metrics` and `labels` of the config, or align "
        f"one of its metric ids: {ids}"
    )


def plan_alignment(
    cal: CalibrationConfig, labelled: LabelledInput, opts: AlignOptions, run_id: str
) -> AlignPlan:
    """Split the labelled rows, choose the examples and build their replies.

    Parameters
    ----------
    cal : CalibrationConfig
    labelled : LabelledInput
        The rows :func:`~ragbatch.calibrate.prepare.read_labelled` read.
    opts : AlignOptions
    run_id : str
        The calibration id (the examples file's ``created_by``).

    Returns
    -------
    AlignPlan

    Raises
    ------
    ConfigError
        As :func:`aligned_metric`; a label value with fewer than 2 rows, or one whose
        rows would all fall in one part of the split (naming ``--train-fraction``); row
        ids that repeat; fewer training rows that can be examples than ``--shots``.
    """
    spec, metric = aligned_metric(cal, opts)
    label = cal.labels[spec.metric_id]
    frame = labelled.frame.with_columns(pl.col(labelled.row_id).cast(pl.String))
    labels = label_values(frame[label.column], label, frame[labelled.row_id])
    frame = frame.filter(labels.is_not_null())
    ids = frame[labelled.row_id].to_list()
    values = labels.drop_nulls().to_list()
    split = _split(ids, values, opts)
    rows = _canonical_rows(cal, labelled, frame)
    label_of = dict(zip(ids, values))
    chosen = _choose(metric, split, rows, label_of, opts)
    replies = [example_reply(metric, rows[i], label_of[i], label.judge_threshold) for i in chosen]
    examples = [{**rows[i], "row_id": i, "label": label_of[i]} for i in chosen]
    record = examples_record(metric.name, run_id, split, examples, replies)
    record["metric_id"] = spec.metric_id
    held = set(split.held_out)
    held_out = frame.filter(pl.col(labelled.row_id).is_in(list(held)))
    return AlignPlan(spec, metric, label, split, record, held_out)


def _split(ids: list[str], labels: list[float], opts: AlignOptions) -> Split:
    """:func:`split_rows` of the labelled rows, every label value in both parts."""
    counts = {v: labels.count(v) for v in sorted(set(labels))}
    few = {v: n for v, n in counts.items() if n < 2}
    if few:
        raise ConfigError(
            f"{_option(opts)}: too few labelled rows to split: "
            + ", ".join(f"label {v:g} has {n} row" for v, n in few.items())
            + "; each label needs at least 2 rows (one to train on, one held out): "
            "add labelled rows, or calibrate without --align"
        )
    try:
        split = split_rows(ids, labels, opts.train_fraction, opts.seed)
    except ValueError as exc:
        raise ConfigError(f"{_option(opts)}: cannot split the labelled rows: {exc}") from None
    label_of = dict(zip(ids, labels))
    for value, n in counts.items():
        train = sum(1 for i in split.train if label_of[i] == value)
        if train == 0 or train == n:
            raise ConfigError(
                f"--train-fraction {opts.train_fraction}: {train} of the {n} rows of label "
                f"{value:g} would be training rows; each label needs rows in both parts: "
                "move --train-fraction towards 0.5, or add labelled rows"
            )
    return split


def _choose(
    metric: JudgeMetric,
    split: Split,
    rows: dict[str, dict[str, Any]],
    label_of: dict[str, float],
    opts: AlignOptions,
) -> tuple[str, ...]:
    """:func:`choose_examples` among the training rows that can be examples."""
    problems = {i: row_problem(metric, rows[i]) for i in split.train}
    usable = [i for i, problem in problems.items() if problem is None]
    if opts.shots > len(usable):
        left = [f"row {i!r}: {p}" for i, p in problems.items() if p is not None]
        note = f"; {len(left)} cannot be examples ({'; '.join(left[:3])})" if left else ""
        raise ConfigError(
            f"--shots {opts.shots} is more than the {len(usable)} training rows that can be "
            f"examples of {metric.name} (of {len(split.train)} training rows{note}): lower "
            "--shots, or raise --train-fraction"
        )
    return choose_examples(usable, [label_of[i] for i in usable], opts.shots, opts.seed)


def _canonical_rows(
    cal: CalibrationConfig, labelled: LabelledInput, frame: pl.DataFrame
) -> dict[str, dict[str, Any]]:
    """The canonical values (``question``, ``contexts``, ``answer``, ``reference``) of
    each row of ``frame``, by row id, as the judge runs read them."""
    from ragbatch.io.read import ReadTask
    from ragbatch.io.schema import normalize

    job = judge_job(cal, cal.judges[0], "labelled.parquet", labelled.row_id, labelled.answer)
    task = ReadTask("labelled.parquet", "labelled.parquet", "parquet")
    table = normalize(frame.to_arrow(), job.input, task, slices=[])
    keys = ("question", "contexts", "answer", "reference")
    return {
        r["row_id"]: {k: r[k] for k in keys} for r in table.select(["row_id", *keys]).to_pylist()
    }


def examples_path(cal: CalibrationConfig, metric_id: str, run_id: str) -> str:
    """The local path of the examples file: ``<output root>/aligned/<metric id>/<run
    id>.json``, absolute.

    Raises
    ------
    ConfigError
        The output root is not on the local filesystem (judge metrics read examples
        files from local paths).
    """
    fs, base = resolve(cal.output.uri, cal.output.storage_options)
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    if not {"file", "local"} & set(protocols):
        raise ConfigError(
            f"--align: output.uri {cal.output.uri!r} is not a local path, and judge metrics "
            "read examples files from local paths: pass --output ./a/local/folder"
        )
    check_id(metric_id, "metric id of --align")
    return os.path.abspath(os.path.join(base, "aligned", metric_id, f"{run_id}.json"))


def _stage_config(
    cal: CalibrationConfig, plan: AlignPlan, examples: str | None
) -> CalibrationConfig:
    """``cal`` with the aligned metric alone, given ``examples`` as its examples file."""
    params = dict(plan.spec.params)
    if examples is not None:
        params["examples_file"] = examples
    spec = plan.spec.model_copy(update={"params": params})
    return cal.model_copy(update={"metrics": [spec], "labels": {plan.spec.metric_id: plan.label}})


def run_alignment(
    cal: CalibrationConfig,
    opts: AlignOptions,
    *,
    run_id: str | None = None,
    run_date: dt.date | None = None,
    address: str | None = None,
    config_dir: str | Path | None = None,
) -> CalibrationResult:
    """Align ``opts.metric`` and commit the calibration of the held-out rows.

    Writes the examples file (:func:`examples_path`), the labelled and held-out rows
    (``calibration_inputs/run_id=<id>/{labelled,held_out}.parquet``), then per judge two
    ordinary runs over the held-out rows, ``<id>-<judge>-before`` (the metric as
    configured) and ``<id>-<judge>-after`` (with ``examples_file``), and commits their
    ``agreement``, ``confusion``, ``disagreements``, ``reliability`` and ``alignment``
    tables with a manifest whose ``align`` key records the options, the split
    (:meth:`~ragbatch.calibrate.align.Split.record`), the examples and the file's path
    and SHA-256. A calibration started again with its id reuses the runs that committed.

    Raises
    ------
    ConfigError
        As :func:`plan_alignment` and :func:`examples_path`, or an invalid id, before
        anything is written or judged.
    InputError
        The labelled input cannot be read.
    OutputError
        The calibration id is already committed.
    """
    from ragbatch.analysis.runs import load_scores
    from ragbatch.io.write import OutputLayout

    start = start_calibration(run_id, run_date)
    run_id, run_date, started, t0 = start.run_id, start.run_date, start.started, start.clock
    for judge in cal.judges:
        for stage in STAGES:
            check_id(judge_run_id(run_id, f"{judge}-{stage}"), f"judge run id of {judge!r}")
    aligned_metric(cal, opts)  # the config's problems before the input is read
    labelled = read_labelled(cal)
    plan = plan_alignment(cal, labelled, opts, run_id)
    path = examples_path(cal, plan.spec.metric_id, run_id)
    written = write_examples(path, plan.record)
    layout = OutputLayout.for_run(cal.output, run_date, run_id)
    input_uri = write_input(cal, layout, run_id, "labelled", labelled.frame)
    held_uri = write_input(cal, layout, run_id, "held_out", plan.held_out)
    boot = Bootstrap(cal.bootstrap.resamples, cal.bootstrap.seed, cal.bootstrap.confidence)
    tables: dict[str, list[dict[str, Any]]] = {
        name: [] for name in ("agreement", "confusion", "disagreements", "reliability")
    }
    tables["alignment"] = []
    runs: dict[str, dict[str, str]] = {}
    timings: dict[str, float] = {}
    texts = row_texts(labelled)
    for judge in cal.judges:
        usable = {}
        for stage in STAGES:
            stage_cal = _stage_config(cal, plan, path if stage == "after" else None)
            job = judge_job(stage_cal, judge, held_uri, labelled.row_id, labelled.answer)
            job.run.run_date = run_date
            t1 = time.perf_counter()
            name = f"{judge}-{stage}"
            scores = load_scores(
                committed_judge_run(stage_cal, job, run_id, name, address, config_dir)
            )
            timings[f"judge_{name}_s"] = time.perf_counter() - t1
            _check_measured(scores, plan.split)
            runs.setdefault(judge, {})[stage] = judge_run_id(run_id, name)
            add_agreement(tables, stage_cal, job, scores, judge, runs[judge][stage], boot, texts)
            usable[stage] = usable_scores(scores, plan.spec.metric_id, plan.label)
        tables["alignment"] += alignment_rows(
            [r for r in tables["agreement"] if r["judge"] == judge],
            runs[judge]["before"],
            runs[judge]["after"],
            paired_scores(usable["before"], usable["after"]),
            plan.label,
            boot,
            scores_are_probabilities(plan.metric),
        )
    timings["total_s"] = time.perf_counter() - t0
    manifest = base_manifest(cal, run_id, run_date, started, input_uri, labelled.frame.height)
    manifest.update(
        scores_runs={f"{j}-{s}": r for j, by in runs.items() for s, r in by.items()},
        timings=timings,
        align=align_record(plan, opts, held_uri, path, written.sha256, runs),
    )
    out = write_calibration(
        cal.output.uri, cal.output.storage_options, run_date, run_id, tables, manifest
    )
    ids = {f"{j}-{s}": r for j, by in runs.items() for s, r in by.items()}
    return CalibrationResult(run_id, run_date, layout.uri(out), ids, tables, manifest, timings)


def _check_measured(scores: pl.DataFrame, split: Split) -> None:
    """Refuse scores of any row that is not held out (the judges read the held-out rows
    only; this guards that promise)."""
    measured = set(scores["row_id"].to_list())
    stray = measured - set(split.held_out)
    if stray:
        raise RuntimeError(f"scores of rows that are not held out: {sorted(stray)[:5]}")


def align_record(
    plan: AlignPlan,
    opts: AlignOptions,
    held_uri: str,
    path: str,
    sha256: str,
    runs: dict[str, dict[str, str]],
) -> dict[str, Any]:
    """The manifest's ``align`` key: the metric, the options, the split's record, the
    example row ids, the held-out input, the examples file and its SHA-256, and each
    judge's ``before`` and ``after`` run ids."""
    from ragbatch.core.redact import redact

    return {
        "metric": plan.spec.metric_id,
        "metric_name": plan.metric.name,
        "shots": opts.shots,
        "train_fraction": opts.train_fraction,
        "seed": opts.seed,
        "split": plan.split.record(),
        "examples": [e["row_id"] for e in plan.record["examples"]],
        "held_out_input": redact(held_uri),
        "examples_file": path,
        "examples_sha256": sha256,
        "runs": runs,
    }
