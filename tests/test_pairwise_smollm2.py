"""``ragbatch pairwise`` with a real judge: SmolLM2-135M-Instruct through the ``vllm``
engine on CPU (the ``smollm2_model`` fixture), on 2 Paul Graham questions x 3 systems
(3 pairs a question, 12 judge calls). A 135M model cannot judge, so the test checks what
must hold whatever it says: every (pair, order) has a row, every reply parses under
structured outputs, the counts and token totals add up, and the statistics are those of
the verdict table written. The command runs in a process of its own, as a user runs it:
vLLM loads its engine in the calling process, and the test session's process holds
modules (the S3 stand-in's web framework) whose module-level proxies vLLM's start-up
trips over.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

from support.vllm_server import SMOLLM2_DTYPE

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def test_smollm2_judges_every_pair_in_both_orders(smollm2_model, tmp_path):
    config = yaml.safe_load((REPO / "jobs" / "pairwise_paul_graham.yaml").read_text())
    config["input"]["uri"] = str(REPO / "examples" / "data" / "tonic_validate_paul_graham")
    config["pairwise"]["systems"] = ["chatbees", "openai", "vertex"]
    config["pairwise"]["max_questions"] = 2
    config["engines"]["judge"]["model"] = str(smollm2_model)
    config["engines"]["judge"]["dtype"] = SMOLLM2_DTYPE
    config["output"]["uri"] = str(tmp_path / "out")
    path = tmp_path / "pairwise.yaml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [sys.executable, "-m", "ragbatch", "pairwise", str(path), "--run-id", "smol"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [run] = (tmp_path / "out" / "pairwise").glob("run_date=*/run_id=smol")
    verdicts = pl.read_parquet(run / "verdicts")
    assert verdicts.height == 12
    assert verdicts["status"].to_list() == ["ok"] * 12
    assert set(verdicts["verdict"].to_list()) <= {"first", "second", "tie"}
    assert verdicts.group_by("pair_id").len()["len"].to_list() == [2] * 6
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    assert summary["counts"]["pairs"] == 6 and summary["counts"]["questions"] == 2
    assert summary["judge_calls"] == 12 and summary["cache_hits"] == 0
    assert summary["prompt_tokens"] == verdicts["prompt_tokens"].sum() > 0
    assert summary["position_consistency"]["n"] == 6
    decided = verdicts.filter(pl.col("verdict") != "tie")
    assert summary["position_bias"]["n"] == decided.height
    assert summary["position_bias"]["value"] == pytest.approx(
        (decided["verdict"] == "first").mean() if decided.height else None
    )
    ratings = pl.read_parquet(run / "ratings.parquet")
    assert sorted(ratings["system"].to_list()) == ["chatbees", "openai", "vertex"]
