"""A stage that moves no block for longer than Ray Data's no-progress watchdog still
commits: the run's time limits are the engines' own (``request_timeout_s``,
``batch_timeout_s``), not Ray Data's ``execution_no_progress_timeout_s``.

The watchdog's 1,800 s default failed a calibration whose judge took longer than that
over one block on a CPU. Here the watchdog is set to 2 s through Ray Data's own
environment variable and one batch takes 6 s (``binary_callbacks.sleepy_digit``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from support.cli_process import REPO, run_ragbatch

pytestmark = pytest.mark.slow


def test_a_stage_slower_than_ray_datas_watchdog_commits(tmp_path: Path):
    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(
        pa.table({"q": ["q1", "q2", "q3"], "a": ["answer 1", "no digits", "答 2 😀"]}),
        src / "part-0.parquet",
    )
    shutil.copy(REPO / "tests" / "support" / "binary_callbacks.py", tmp_path)
    config = tmp_path / "job.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "run": {"name": "slow", "executor": "ray"},  # Ray Data's watchdog
                "input": {"uri": str(src), "columns": {"question": "q", "answer": "a"}},
                "output": {"uri": str(tmp_path / "out")},
                "metrics": [
                    {
                        "name": "binary",
                        "id": "digit",
                        "params": {"callback": "binary_callbacks:sleepy_digit"},
                    }
                ],
            }
        ),
        encoding="utf-8",
    )
    proc = run_ragbatch(
        ["run", str(config), "--run-id", "slow1"],
        cwd=tmp_path,
        extra_env={"RAY_DATA_EXECUTION_NO_PROGRESS_TIMEOUT_S": "2"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    scores = pq.read_table(next((tmp_path / "out").glob("scores/**/*.parquet"))).to_pylist()
    assert len({r["row_id"] for r in scores}) == 3
    assert sorted(r["score"] for r in scores) == [0.0, 1.0, 1.0]
