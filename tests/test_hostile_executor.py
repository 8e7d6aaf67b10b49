"""``run.executor: in_process`` on a job that needs Ray: refused by ``validate`` and by
``run`` before any engine is contacted or any staging is written."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from ragbatch.cli import main

REFUSAL = (
    "ragbatch: error: run.executor: in_process cannot run this job: stages judge:judge run "
    "on Ray actor pools; use run.executor: auto or ray"
)


def _job(tmp_path: Path) -> Path:
    pq.write_table(pa.table({"q": ["q1"], "a": ["a1"]}), tmp_path / "in.parquet")
    config = {
        "run": {"name": "needs-ray", "executor": "in_process"},
        "input": {"uri": str(tmp_path / "in.parquet"), "columns": {"question": "q", "answer": "a"}},
        "output": {"uri": str(tmp_path / "out")},
        # nothing listens on port 9: contacting the engine would fail with another message
        "engines": {"judge": {"type": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}},
        "metrics": [
            {
                "name": "rubric",
                "engine": "judge",
                "params": {
                    "criteria": "The answer answers the question.",
                    "inputs": ["question", "answer"],
                    "scale": {"min": 1, "max": 5},
                },
            }
        ],
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("command", ["validate", "run"])
def test_in_process_for_a_judge_job_is_refused_before_the_engine_and_the_staging(
    tmp_path, capsys, command
):
    path = _job(tmp_path)
    assert main([command, str(path)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == REFUSAL
    assert not (tmp_path / "out" / "_staging").exists()
