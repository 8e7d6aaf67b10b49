"""The judgment cache across whole runs (``ragbatch run`` and ``ragbatch nightly`` on Ray,
the ``openai`` engine against a real OpenAI-compatible server on loopback,
``tests/support/canned_judge_server.py``):

* a judge server that returned malformed replies, then was fixed: a rerun without
  rejudge keeps the cells ``parse_failure`` with no call; the next night (``nightly``
  asks ``parse_failure`` again by default) asks exactly the failed requests again;
* a damaged cache (a bucket file cut short, a journal file of other bytes): the night
  finishes and commits (exit 0), the two files are set aside, and only the requests whose
  replies were in the bucket file are asked again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from ragbatch.cli import main
from support.canned_judge_server import SERVED_NAME, CannedJudgeServer
from support.degenerate_judge import ares_tsv_input

pytest.importorskip("openai", reason="the openai engine needs the openai package")
pytestmark = pytest.mark.slow

ROWS = 8
MALFORMED = "I think it is fine."
GOOD = '{"reason": "The answer is polite.", "verdict": false}'


def _config(tmp_path: Path, base_url: str) -> Path:
    """hate_speech (one judge request a row, one parse retry) on the first ROWS ARES rows."""
    config = {
        "input": ares_tsv_input(tmp_path, ROWS),
        "output": {"uri": str(tmp_path / "out")},
        "engines": {
            "judge": {
                "type": "openai",
                "base_url": base_url,
                "model": SERVED_NAME,
                "max_retries": 0,
            }
        },
        "metrics": [{"name": "hate_speech", "engine": "judge"}],
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _statuses(tmp_path: Path, run_id: str) -> dict[str, int]:
    """Cells per status of hate_speech in run ``run_id``'s summary (all rows)."""
    [path] = (tmp_path / "out" / "summary").glob(f"run_date=*/run_id={run_id}/summary.parquet")
    (row,) = [
        r
        for r in pq.read_table(path).to_pylist()
        if r["slice_column"] is None and r["metric"] == "hate_speech"
    ]
    return {k[2:]: v for k, v in row.items() if k.startswith("n_") and k != "n_total" and v}


def test_a_fixed_judge_is_asked_again_by_the_next_night(tmp_path, ray_local):
    with CannedJudgeServer(MALFORMED) as server:
        config = str(_config(tmp_path, server.base_url))
        nightly = ["nightly", config, "--no-report", "--run-date"]
        assert main([*nightly, "2024-06-01"]) == 0
        assert _statuses(tmp_path, "nightly-2024-06-01") == {"parse_failure": ROWS}
        assert server.chat_calls == 2 * ROWS  # a try and its parse retry per row

        server.reply = GOOD  # the server is fixed
        assert main(["run", config, "--run-id", "again", "--run-date", "2024-06-01"]) == 0
        assert _statuses(tmp_path, "again") == {"parse_failure": ROWS}
        assert server.chat_calls == 2 * ROWS  # served from the cache: no call

        assert main([*nightly, "2024-06-02"]) == 0
        assert _statuses(tmp_path, "nightly-2024-06-02") == {"ok": ROWS}
        assert server.chat_calls == 3 * ROWS  # the failed requests, once each

        assert main([*nightly, "2024-06-03"]) == 0
        assert _statuses(tmp_path, "nightly-2024-06-03") == {"ok": ROWS}
        assert server.chat_calls == 3 * ROWS


def _manifest(tmp_path: Path, run_id: str) -> dict:
    [path] = (tmp_path / "out" / "runs").glob(f"run_date=*/run_id={run_id}/manifest.json")
    return json.loads(path.read_text())


def test_a_night_over_a_damaged_cache_finishes_and_asks_only_what_was_lost(
    tmp_path, ray_local, caplog
):
    with CannedJudgeServer(GOOD) as server:
        config = str(_config(tmp_path, server.base_url))
        nightly = ["nightly", config, "--no-report", "--run-date"]
        assert main([*nightly, "2024-06-01"]) == 0
        assert server.chat_calls == ROWS
        root = tmp_path / "out" / "judge_cache" / "v2"
        bucket_file = sorted((root / "buckets").glob("bucket=*/part-*.parquet"))[0]
        lost = pq.read_table(bucket_file).column("key").unique().to_pylist()
        bucket_file.write_bytes(bucket_file.read_bytes()[:100])  # cut short
        (root / "journal").mkdir(exist_ok=True)
        journal_file = root / "journal" / "part-garbage.parquet"
        journal_file.write_bytes(b"not parquet at all")

        assert main([*nightly, "2024-06-02"]) == 0
        assert _statuses(tmp_path, "nightly-2024-06-02") == {"ok": ROWS}
        assert server.chat_calls == ROWS + len(lost)
        relative = bucket_file.relative_to(root)
        assert sorted(p.relative_to(root) for p in (root / "damaged").rglob("*.parquet")) == [
            Path("damaged") / relative,
            Path("damaged/journal/part-garbage.parquet"),
        ]
        assert not bucket_file.exists() and not journal_file.exists()
        # the driver says which files this run set aside, in its log and the manifest
        damaged = sorted(
            f"file://{root / 'damaged' / part}"
            for part in (relative, Path("journal/part-garbage.parquet"))
        )
        assert _manifest(tmp_path, "nightly-2024-06-02")["judge"]["cache_files_set_aside"] == (
            damaged
        )
        assert _manifest(tmp_path, "nightly-2024-06-01")["judge"]["cache_files_set_aside"] == []
        (warning,) = [r for r in caplog.records if "were set aside" in r.getMessage()]
        assert warning.levelname == "WARNING" and all(d in warning.getMessage() for d in damaged)
        assert main(["cache", "check", "--uri", str(root.parent)]) == 0
        assert main([*nightly, "2024-06-03"]) == 0  # nothing new set aside
        assert _manifest(tmp_path, "nightly-2024-06-03")["judge"]["cache_files_set_aside"] == []
