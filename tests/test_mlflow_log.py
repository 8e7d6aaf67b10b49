"""Committed runs logged to MLflow (``output.mlflow``, :mod:`ragbatch.ops.mlflow_log`),
read back through MLflow's own client from a local file store.

The run is real (in-process, ``ragbatch run`` in this process); the expected metrics are
the run's own summary rows, and the expected tags and artifacts are worked out from the
config.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from ragbatch.config.job import JobConfig
from ragbatch.core.errors import ConfigError

mlflow = pytest.importorskip("mlflow")


@pytest.fixture(autouse=True)
def _file_store(monkeypatch):
    # the test reads the file store back itself, outside the logging call
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")


def _config(tmp_path: Path, tracking_uri: str) -> JobConfig:
    src = tmp_path / "in.parquet"
    pq.write_table(
        pa.table(
            {
                "id": ["r0", "r1", "r2", "r3"],
                "q": ["q0", "q1", "q2", "q3"],
                "a": ["yes", "no answer here", "yes", None],
                "ref": ["yes", "yes", "no", "yes"],
                "team": ["red", "red", "blue", "blue"],
            }
        ),
        src,
    )
    return JobConfig.from_dict(
        {
            "run": {"name": "nightly-eval", "executor": "in_process"},
            "input": {
                "uri": str(src),
                "columns": {"row_id": "id", "question": "q", "answer": "a", "reference": "ref"},
            },
            "output": {
                "uri": str(tmp_path / "out"),
                "mlflow": {"tracking_uri": tracking_uri},
            },
            "metrics": [
                {"name": "exact_match"},
                {"name": "response_length", "params": {"min_chars": 1, "max_chars": 5}},
            ],
        }
    )


def _cli(tmp_path: Path, cfg: JobConfig, run_id: str) -> tuple[int, str, str]:
    from support.nightly_runs import run_cli

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)))
    return run_cli(["run", str(path), "--run-id", run_id])


def test_a_committed_run_is_logged_and_read_back(tmp_path):
    from mlflow import MlflowClient

    store = tmp_path / "mlruns"
    code, out, err = _cli(tmp_path, _config(tmp_path, str(store)), "night-1")
    assert code == 0, err
    assert "mlflow:     logged as run" in out and "'nightly-eval'" in out

    client = MlflowClient(str(store))
    experiment = client.get_experiment_by_name("nightly-eval")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "night-1"
    tags = run.data.tags
    assert tags["ragbatch.run_id"] == "night-1"
    assert tags["ragbatch.slice_columns"] == "team"
    assert tags["slice.team"] == "blue,red"

    # exact_match: r0 yes=yes (1), r1 (0), r2 yes!=no (0), r3 no answer (missing_input)
    metrics = run.data.metrics
    assert metrics["exact_match/mean"] == pytest.approx(1 / 3)
    assert metrics["exact_match/n_total"] == 4
    assert metrics["exact_match/n_ok"] == 3
    assert metrics["exact_match/n_missing_input"] == 1
    # response_length in [1, 5]: "yes" twice -> 1, "no answer here" -> 0
    assert metrics["response_length/mean"] == pytest.approx(2 / 3)
    summary = duckdb.sql(
        f"SELECT metric, mean_ci_low, mean_ci_high FROM read_parquet("
        f"'{tmp_path}/out/summary/**/*.parquet', hive_partitioning=true) "
        "WHERE slice_column IS NULL ORDER BY metric"
    ).fetchall()
    for metric, low, high in summary:
        assert metrics[f"{metric}/mean_ci_low"] == pytest.approx(low)
        assert metrics[f"{metric}/mean_ci_high"] == pytest.approx(high)
        assert low <= metrics[f"{metric}/mean"] <= high

    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"manifest.json", "report.html", "scores.json"} <= artifacts
    folder = Path(client.download_artifacts(run.info.run_id, "manifest.json", str(tmp_path)))
    assert json.loads(folder.read_text())["run"]["id"] == "night-1"
    table = json.loads(
        Path(client.download_artifacts(run.info.run_id, "scores.json", str(tmp_path))).read_text()
    )
    columns = table["columns"]
    cells = {(r[columns.index("row_id")], r[columns.index("metric")]): r for r in table["data"]}
    assert len(cells) == 8  # 4 rows x 2 metrics
    assert cells[("r3", "exact_match")][columns.index("status")] == "missing_input"
    assert cells[("r0", "exact_match")][columns.index("score")] == 1.0


def test_a_failure_leaves_the_run_committed_and_says_so(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the store should be")
    code, out, err = _cli(tmp_path, _config(tmp_path, str(blocker / "mlruns")), "night-2")
    assert code == 1  # EXIT_FAILED, as for a report that could not be written
    assert "run night-2 committed, but it could not be logged to MLflow" in err
    assert "run night-2 committed" in out
    assert list((tmp_path / "out").glob("runs/*/run_id=night-2/manifest.json"))


def test_a_run_id_is_logged_once(tmp_path):
    from ragbatch.ops.mlflow_log import log_run

    cfg = _config(tmp_path, str(tmp_path / "mlruns"))
    code, _, err = _cli(tmp_path, cfg, "night-3")
    assert code == 0, err
    again = log_run(cfg, "night-3")
    assert not again.logged_now
    from mlflow import MlflowClient

    client = MlflowClient(str(tmp_path / "mlruns"))
    assert len(client.search_runs([again.experiment_id])) == 1


def test_a_missing_package_names_the_extra(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"pip install 'ragbatch\[mlflow\]'"):
        _config(tmp_path, "mlruns")


def test_a_night_is_logged_and_a_night_run_again_is_not_logged_twice(tmp_path):
    import datetime as dt

    from mlflow import MlflowClient

    from ragbatch.ops.nightly_job import run_nightly

    cfg = _config(tmp_path, str(tmp_path / "mlruns"))
    first = run_nightly(cfg, run_date=dt.date(2026, 11, 27), report=False)
    assert first.exit_code == 0, first.message
    assert first.mlflow is not None and first.mlflow.logged_now
    again = run_nightly(cfg, run_date=dt.date(2026, 11, 27), report=False)
    assert again.exit_code == 0, again.message
    assert again.mlflow.mlflow_run_id == first.mlflow.mlflow_run_id
    assert not again.mlflow.logged_now
    client = MlflowClient(str(tmp_path / "mlruns"))
    (run,) = client.search_runs([first.mlflow.experiment_id])
    assert run.data.tags["ragbatch.run_id"] == first.run_id
    assert run.data.tags["ragbatch.run_date"] == "2026-11-27"
