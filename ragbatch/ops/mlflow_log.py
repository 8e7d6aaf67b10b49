"""Log a committed run to MLflow (``output.mlflow``; ``pip install 'ragbatch[mlflow]'``).

After a run commits, :func:`log_run` records it as one MLflow run, named after the
ragbatch run id, in the experiment ``output.mlflow.experiment`` (default ``run.name``):

* metrics: for each metric, over all rows, ``<metric>/mean``, ``<metric>/mean_ci_low``,
  ``<metric>/mean_ci_high`` (the summary's interval bounds), ``<metric>/pass_rate`` for a
  0/1 metric, and the counts ``<metric>/n_total`` and ``<metric>/n_<status>``;
* tags: ``ragbatch.run_id``, ``ragbatch.run_date``, ``ragbatch.output`` (the run's
  output root), ``ragbatch.slice_columns`` (comma-separated) and, per slice column,
  ``slice.<column>``: its distinct values, comma-separated (at most 4,000 characters);
* artifacts: ``manifest.json``, ``report.html`` (the run's HTML report, as ``ragbatch
  report`` writes it without a baseline) and, where the installed MLflow has
  ``MlflowClient.log_table``, the scores as the evaluation table ``scores.json`` (row_id,
  metric, score, status, reason).

Everything is read back from the committed run under ``output.uri``, so what MLflow holds
is what the output root holds. A run id already logged to the experiment is not logged
again. Any failure here leaves the ragbatch run committed; the caller says so.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ragbatch.config.job import JobConfig
from ragbatch.core.status import STATUSES

__all__ = ["MlflowLogged", "log_run"]

#: The longest tag value MLflow keeps is 8,000 characters; slice values are cut shorter.
_TAG_CHARS = 4000


@dataclass(frozen=True)
class MlflowLogged:
    """Where a run was logged: the tracking URI, experiment name and id, the MLflow run
    id, and whether it was logged now (False: an earlier call logged it)."""

    tracking_uri: str
    experiment: str
    experiment_id: str
    mlflow_run_id: str
    logged_now: bool


def log_run(config: JobConfig, run_id: str) -> MlflowLogged:
    """Log committed run ``run_id`` of ``config`` to ``config.output.mlflow``.

    Parameters
    ----------
    config : JobConfig
        As run (URIs rendered); ``output.mlflow`` must be set.
    run_id : str
        A run committed under ``config.output.uri``.

    Returns
    -------
    MlflowLogged

    Raises
    ------
    ValueError
        ``output.mlflow`` is not set.
    Exception
        Whatever MLflow or reading the committed run raises (an unreachable tracking
        server, a store that cannot be written, a run that is not committed): the
        caller reports it beside the committed run.
    """
    settings = config.output.mlflow
    if settings is None:
        raise ValueError("output.mlflow is not set")
    from mlflow import MlflowClient

    from ragbatch.analysis.report import build_report
    from ragbatch.analysis.runs import find_run, load_scores, load_summary

    run = find_run(config.output.uri, run_id, config.output.storage_options)
    experiment = settings.experiment or config.run.name
    with _file_store_allowed(settings.tracking_uri):
        client = MlflowClient(settings.tracking_uri)
        found = client.get_experiment_by_name(experiment)
        experiment_id = (
            found.experiment_id if found is not None else client.create_experiment(experiment)
        )
        earlier = client.search_runs(
            [experiment_id], filter_string=f"tags.`ragbatch.run_id` = '{run_id}'"
        )
        if earlier:
            return MlflowLogged(
                settings.tracking_uri, experiment, experiment_id, earlier[0].info.run_id, False
            )
        summary = load_summary(run)
        scores = load_scores(run, ["row_id", "metric", "score", "status", "reason"])
        report = build_report(run)
        from mlflow.entities import Metric, RunTag

        created = client.create_run(experiment_id, run_name=run_id)
        mlflow_run_id = created.info.run_id
        now = int(time.time() * 1000)
        client.log_batch(
            mlflow_run_id,
            metrics=[Metric(k, v, now, 0) for k, v in _metrics(summary.to_dicts()).items()],
            tags=[RunTag(k, v) for k, v in _tags(run, summary).items()],
        )
        client.log_dict(mlflow_run_id, run.manifest.to_json_dict(), "manifest.json")
        client.log_text(mlflow_run_id, report, "report.html")
        if hasattr(client, "log_table"):
            client.log_table(mlflow_run_id, data=scores.to_pandas(), artifact_file="scores.json")
        client.set_terminated(mlflow_run_id)
        return MlflowLogged(settings.tracking_uri, experiment, experiment_id, mlflow_run_id, True)


@contextlib.contextmanager
def _file_store_allowed(tracking_uri: str) -> Iterator[None]:
    """MLflow 3 refuses its file store unless ``MLFLOW_ALLOW_FILE_STORE`` is set; the
    embedded default is one, so it is set while logging to a local folder."""
    local = "://" not in tracking_uri or tracking_uri.startswith("file:")
    if not local or "MLFLOW_ALLOW_FILE_STORE" in os.environ:
        yield
        return
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        yield
    finally:
        os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)


def _name(text: str) -> str:
    """``text`` with the characters MLflow refuses in a metric or tag key as ``_``."""
    return re.sub(r"[^A-Za-z0-9_\-. /]", "_", text)


def _metrics(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Metric key -> value from the summary rows over all rows (no slice)."""
    out: dict[str, float] = {}
    for row in rows:
        if row.get("slice_column") is not None:
            continue
        metric = _name(str(row["metric"]))
        for field in ("mean", "mean_ci_low", "mean_ci_high", "pass_rate", "n_total"):
            if row.get(field) is not None:
                out[f"{metric}/{field}"] = float(row[field])
        for status in STATUSES:
            if row.get(f"n_{status}") is not None:
                out[f"{metric}/n_{status}"] = float(row[f"n_{status}"])
    return out


def _tags(run: Any, summary: Any) -> dict[str, str]:
    """The run's tags (see the module notes)."""
    slices = [s.output for s in run.manifest.input.slice_columns]
    tags = {
        "ragbatch.run_id": run.run_id,
        "ragbatch.run_date": run.run_date.isoformat(),
        "ragbatch.output": str(run.root),
        "ragbatch.slice_columns": ",".join(slices),
    }
    for column in slices:
        values = sorted(
            {
                str(v)
                for v in summary.filter(summary["slice_column"] == column)["slice_value"]
                if v is not None
            }
        )
        tags[f"slice.{_name(column)}"] = ",".join(values)[:_TAG_CHARS]
    return tags
