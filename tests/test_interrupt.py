"""Ctrl-C during ``ragbatch run``: a real SIGINT to a real run once it has staged scores.

It exits 130 without a traceback, says that nothing was committed, where the staged
scores are kept and which command resumes the run; that command then resumes it (the
staged rows are not scored again) and commits every cell.
"""

from __future__ import annotations

import json
import shlex
import shutil
import signal
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from support.cli_process import REPO, run_ragbatch, start_ragbatch

pytestmark = pytest.mark.slow

N_FILES, ROWS_PER_FILE = 12, 40


def _job(root: Path) -> Path:
    src = root / "in"
    src.mkdir()
    for f in range(N_FILES):
        answers = [f"answer {i}" if i % 4 else "no digits here" for i in range(ROWS_PER_FILE)]
        table = pa.table({"q": [f"q{f}-{i}" for i in range(ROWS_PER_FILE)], "a": answers})
        pq.write_table(table, src / f"part-{f:02d}.parquet")
    # the callback module beside the config: 0.6 s per batch keeps the run scoring
    shutil.copy(REPO / "tests" / "support" / "binary_callbacks.py", root / "binary_callbacks.py")
    config = root / "job.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "run": {"name": "interrupt"},
                "input": {"uri": str(src), "columns": {"question": "q", "answer": "a"}},
                "output": {"uri": str(root / "out")},
                "metrics": [
                    {
                        "name": "binary",
                        "id": "digit",
                        "params": {"callback": "binary_callbacks:slow_digit"},
                    }
                ],
            }
        ),
        encoding="utf-8",
    )
    return config


def _wait_for_staged_scores(out: Path, run_id: str, proc, limit_s: float = 300) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and proc.poll() is None:
        if list(out.glob(f"_staging/run_id={run_id}/scores/attempt=*/*.parquet")):
            return True
        time.sleep(0.05)
    return False


def test_ctrl_c_keeps_staged_scores_and_says_how_to_resume(tmp_path):
    config = _job(tmp_path)
    out = tmp_path / "out"
    proc = start_ragbatch(["run", str(config), "--run-id", "ctrlc"], cwd=tmp_path)
    assert _wait_for_staged_scores(out, "ctrlc", proc), proc.communicate()[1][-3000:]
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    staging = out / "_staging" / "run_id=ctrlc"
    assert "ragbatch: interrupted: run ctrlc was not committed." in stderr
    assert f"scores staged so far are kept under {staging}/" in stderr
    assert not list(out.glob("runs/**/manifest.json"))
    assert list(staging.glob("scores/attempt=1/*.parquet"))

    command = stderr.split("resume it (rows already scored are not scored again): ", 1)[
        1
    ].splitlines()[0]
    assert command == f"ragbatch run {config} --run-id ctrlc"
    again = run_ragbatch(shlex.split(command)[1:], cwd=tmp_path, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    manifest = json.loads(next(out.glob("runs/**/run_id=ctrlc/manifest.json")).read_text())
    assert manifest["resume"]["attempt"] == 2 and manifest["resume"]["rows_reused"] > 0
    scores = pq.read_table(out / "scores").to_pylist()
    assert len(scores) == N_FILES * ROWS_PER_FILE
    # every fourth answer has no digit: 0.0; the others 1.0
    assert sorted(r["score"] for r in scores) == sorted(
        [0.0] * (N_FILES * ROWS_PER_FILE // 4) + [1.0] * (N_FILES * ROWS_PER_FILE * 3 // 4)
    )
    assert not staging.exists()
