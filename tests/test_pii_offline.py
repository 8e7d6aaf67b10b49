"""A PII job with the network unavailable: ``ragbatch run`` in a subprocess whose sockets
(and those of every Ray process it starts) refuse any destination but loopback
(``tests/support/offline.py``). The job must finish, score every row, and make no network attempt
of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
import yaml

from support.offline import offline_env, read_blocked
from ragbatch.core.columns import cell_column
from udfs.pii import PiiStage

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "examples" / "data" / "pii_presidio_synthetic" / "tests__data__generated_small.json"


def ray_cloud_probe(entry: dict) -> bool:
    """Ray's dashboard process asks cloud metadata endpoints which cloud it runs on
    (``usage_lib.get_cloud_from_metadata_requests``), even with usage stats off; that is
    Ray's, not the job's, and a machine without network answers it with a refusal."""
    return (
        entry["argv0"].endswith("ray/dashboard/dashboard.py")
        and any("get_cloud_from_metadata_requests" in frame for frame in entry["stack"])
        and any(t in entry["target"] for t in ("169.254.169.254", "metadata.google.internal"))
    )


@pytest.mark.release
@pytest.mark.slow
def test_pii_job_runs_without_network(tmp_path):
    rows = json.loads(DATA.read_text(encoding="utf-8"))[:40]
    texts = [r["full_text"] for r in rows]
    records = [
        {"id": f"r{i}", "answer": t, "contexts": [texts[(i + 1) % 40], texts[(i + 2) % 40]]}
        for i, t in enumerate(texts)
    ]
    data = tmp_path / "traces.jsonl"
    data.write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8"
    )
    config = {
        "input": {
            "uri": str(data),
            "columns": {"row_id": "id", "answer": "answer", "contexts": "contexts"},
        },
        "output": {"uri": str(tmp_path / "out")},
        "metrics": [{"name": "answer_contains_pii"}, {"name": "context_contains_pii"}],
    }
    config_path = tmp_path / "job.yaml"
    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")

    env, log = offline_env(tmp_path / "net")
    ragbatch = Path(sys.executable).with_name("ragbatch")
    done = subprocess.run(
        [str(ragbatch), "run", str(config_path), "--run-id", "offline"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-4000:]

    own = [e for e in read_blocked(log) if not ray_cloud_probe(e)]
    assert own == [], json.dumps(own, indent=1)[:4000]

    scores = duckdb.sql(
        f"SELECT row_id, metric, status, score FROM read_parquet('{tmp_path}/out/scores/**/*.parquet', "
        "hive_partitioning=true) ORDER BY metric, row_id"
    ).fetchall()
    assert len(scores) == 80 and {s[2] for s in scores} == {"ok"}
    # The run agrees with the stage called directly in this process.
    stage = PiiStage(
        "p",
        {"type": "presidio"},
        [
            {"name": "answer_contains_pii", "id": "a", "params": {}},
            {"name": "context_contains_pii", "id": "c", "params": {}},
        ],
    )
    table = pa.table(
        {
            "row_id": [r["id"] for r in records],
            "answer": texts,
            "contexts": pa.array([r["contexts"] for r in records], pa.list_(pa.string())),
        }
    )
    direct = stage(table)
    expected = {
        (r["id"], metric): cell["score"]
        for metric, column in (("answer_contains_pii", "a"), ("context_contains_pii", "c"))
        for r, cell in zip(records, direct.column(cell_column(column)).to_pylist())
    }
    assert {(s[0], s[1]): s[3] for s in scores} == expected
    assert 0 < sum(v for (_, m), v in expected.items() if m == "answer_contains_pii") < 40
