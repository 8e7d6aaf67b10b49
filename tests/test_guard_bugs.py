"""A bug in ragbatch's own stage code fails a real run: `ragbatch run` in a fresh
process, the model stage in a local Ray actor pool, no error cells and nothing
committed. (The guard's side of it, on its own, is in test_batch_guard.py; engine
faults that do become error cells are in test_batch_guard.py, test_judge_run.py and
test_engine_openai.py.)"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from ragbatch.core.exit_codes import EXIT_FAILED

REPO = Path(__file__).resolve().parents[1]
TONIC = REPO / "examples/data/tonic_validate_paul_graham/system=openai"

#: Test-only fault injection, loaded by every Python process of the run (the driver and
#: Ray's workers inherit PYTHONPATH): once ``udfs.similarity`` is imported, the model
#: stage's :meth:`columns` raises the TypeError a bug in it would raise.
SITECUSTOMIZE = '''
import importlib.util
import sys


class InjectBug:
    """Patches udfs.similarity.ModelStage.columns as the module is loaded."""

    def find_spec(self, name, path=None, target=None):
        if name != "udfs.similarity":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)

            def columns(self, batch, frame):
                raise TypeError("injected bug")

            module.ModelStage.columns = columns

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, InjectBug())
'''


def _rows(path: Path, n: int) -> Path:
    source = next(TONIC.glob("*.csv"))
    with source.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))[:n]
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.mark.slow
def test_a_bug_in_a_stage_fails_the_run_with_the_stage_named(tmp_path):
    """Test-only fault injection (a sitecustomize.py first on PYTHONPATH) makes the model
    stage's own cell building raise TypeError("injected bug") inside the actors. The run
    must fail with the project's exit code for a failed run, name the stage, the
    exception and its traceback, and commit nothing: no error cells."""
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    config = tmp_path / "job.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "run": {"error_budget": 1.0},  # error cells, were they made, would commit
                "input": {
                    "uri": str(_rows(tmp_path / "rows.csv", 4)),
                    "format": "csv",
                    "columns": {"answer": "llm_answer", "reference": "reference_answer"},
                },
                "output": {"uri": str(tmp_path / "out")},
                "engines": {"minilm": {"type": "embedding", "concurrency": 1, "batch_size": 4}},
                "metrics": [
                    {"name": "semantic_similarity", "engine": "minilm"},
                    {"name": "exact_match"},
                ],
            }
        ),
        encoding="utf-8",
    )
    path = [str(inject), str(REPO), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join(p for p in path if p))
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "ragbatch", "run", str(config), "--run-id", "bug"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == EXIT_FAILED, output[-3000:]
    assert (
        "ragbatch: error: stage model:minilm failed with a bug in ragbatch's own code: "
        "TypeError: injected bug (traceback follows)" in proc.stderr
    ), output[-3000:]
    assert 'raise TypeError("injected bug")' in proc.stderr
    assert "committed" not in proc.stdout
    out = tmp_path / "out"
    assert not list(out.rglob("manifest.json"))
    assert not list(out.glob("scores/**/*.parquet"))  # nothing published
    for staged in out.rglob("*.parquet"):  # nor any error cell staged
        table = pq.read_table(staged)
        if "status" in table.column_names:
            assert "error" not in table.column("status").to_pylist(), staged
