"""The query ``ragbatch run`` prints at the end works as printed: the DuckDB query of a
local run from another folder, the Polars snippet of a run on S3-compatible storage (a
real endpoint on loopback) once its credential placeholders are filled in. No credential
is printed.
"""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pytest
import yaml

from support.nightly_runs import run_cli
from support.s3_fixtures import S3_KEY, S3_SECRET

pytestmark = pytest.mark.slow

#: Answers scored by response_length in [1, 5]: 1, 0, 1 -> mean 2/3 over 3 ok cells.
ANSWERS = ["abc", "far too long", "hi"]
EXPECTED = [("response_length", "ok", 3, pytest.approx(2 / 3))]


def _config(folder: Path, output: dict) -> Path:
    data = folder / "in.csv"
    data.write_text(
        "q,a\n" + "".join(f"q{i},{a}\n" for i, a in enumerate(ANSWERS)), encoding="utf-8"
    )
    path = folder / "job.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "input": {"uri": str(data), "columns": {"question": "q", "answer": "a"}},
                "output": output,
                "metrics": [
                    {"name": "response_length", "params": {"min_chars": 1, "max_chars": 5}}
                ],
            }
        ),
        encoding="utf-8",
    )
    return path


def test_duckdb_query_of_a_relative_output_works_from_another_folder(
    ray_local, tmp_path, monkeypatch
):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    config = _config(tmp_path / "a", {"uri": "out"})  # relative to where the run starts
    monkeypatch.chdir(tmp_path / "a")
    code, out, err = run_cli(["run", str(config), "--run-id", "hint-local"])
    assert code == 0, err[-3000:]
    sql = next(line.strip() for line in out.splitlines() if line.strip().startswith("SELECT "))
    assert f"read_parquet('{tmp_path / 'a' / 'out'}/scores/**/*.parquet'" in sql
    monkeypatch.chdir(tmp_path / "b")
    assert duckdb.connect().execute(sql).fetchall() == EXPECTED


def test_polars_snippet_for_s3_output_runs_and_prints_no_secret(
    ray_local, tmp_path, s3_endpoint, s3_bucket
):
    options = {
        "endpoint_url": s3_endpoint,
        "key": S3_KEY,
        "secret": "s3cr3t-" + S3_SECRET,
        "client_kwargs": {"region_name": "us-east-1"},
    }
    config = _config(tmp_path, {"uri": f"s3://{s3_bucket}/out", "storage_options": options})
    code, out, err = run_cli(["run", str(config), "--run-id", "hint-s3"])
    assert code == 0, err[-3000:]
    assert "s3cr3t" not in out and "DuckDB" not in out
    lines = out.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("query it with Polars")))
    snippet = "\n".join(line.strip() for line in lines[start + 1 : start + 4])
    assert (
        f'"aws_endpoint_url": "{s3_endpoint}"' in snippet and '"aws_region": "us-east-1"' in snippet
    )
    assert '"aws_access_key_id": "..."' in snippet and '"aws_secret_access_key": "..."' in snippet
    filled = snippet.replace(
        '"aws_access_key_id": "..."', f'"aws_access_key_id": "{S3_KEY}"'
    ).replace('"aws_secret_access_key": "..."', f'"aws_secret_access_key": "s3cr3t-{S3_SECRET}"')
    assert "..." not in filled
    namespace: dict = {}
    exec(re.sub(r"^(scores\.filter)", r"result = \1", filled, flags=re.M), namespace)
    assert namespace["result"].rows() == EXPECTED
