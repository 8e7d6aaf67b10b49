"""Judge calls per pair of ``ragbatch pairwise``: at most 2 (one per order) on a first
run, 0 on a rerun answered by the judgment cache.

Runs :func:`ragbatch.ops.pairwise.run_pairwise` twice on a generated input (``--systems``
systems answering ``--questions`` questions, one null answer among them) against the
scripted pairwise judge of the tests (tests/support/scripted_pairwise_judge.py: a real
OpenAI-compatible HTTP server on loopback that prefers the longer answer), and counts the
requests the server answered, the judge calls and cache hits each run recorded, and the
pairs.

Usage (from the repository root, in the project's virtual environment)::

    python benchmarks/pairwise_calls.py --systems 6 --questions 20
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from ragbatch.ops.pairwise import run_pairwise  # noqa: E402
from ragbatch.ops.pairwise_config import pairwise_from_dict  # noqa: E402
from support.scripted_pairwise_judge import SERVED_NAME, ScriptedPairwiseJudge  # noqa: E402


def _input(folder: Path, systems: int, questions: int) -> Path:
    rows = []
    for q in range(questions):
        for s in range(systems):
            answer = None if (q, s) == (0, 0) else f"answer {q} " + "x" * (s + q % 3)
            rows.append({"question": f"question {q}", "system": f"s{s}", "answer": answer})
    path = folder / "answers.parquet"
    pl.DataFrame(
        rows, schema={"question": pl.String, "system": pl.String, "answer": pl.String}
    ).write_parquet(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", type=int, default=6)
    parser.add_argument("--questions", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, ScriptedPairwiseJudge("longer") as judge:
        folder = Path(tmp)
        cfg = pairwise_from_dict(
            {
                "input": {
                    "uri": str(_input(folder, args.systems, args.questions)),
                    "format": "parquet",
                    "columns": {"question": "question", "answer": "answer"},
                },
                "pairwise": {"engine": "judge"},
                "engines": {
                    "judge": {"type": "openai", "base_url": judge.base_url, "model": SERVED_NAME}
                },
                "output": {"uri": str(folder / "out")},
                "bootstrap": {"resamples": 200},
            }
        )
        results = []
        for name in ("first", "rerun"):
            before = judge.chat_calls
            t0 = time.perf_counter()
            run = run_pairwise(cfg, run_id=name)
            seconds = time.perf_counter() - t0
            pairs = run.summary["counts"]["pairs"]
            served = judge.chat_calls - before
            results.append(
                {
                    "run": name,
                    "pairs": pairs,
                    "verdicts": run.summary["counts"]["verdicts"],
                    "null_answers": run.summary["counts"]["null_answers"],
                    "server_requests": served,
                    "judge_calls": run.summary["judge_calls"],
                    "cache_hits": run.summary["cache_hits"],
                    "calls_per_pair": served / pairs,
                    "seconds": round(seconds, 2),
                }
            )
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
