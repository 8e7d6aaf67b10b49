"""What the trend section costs a run's HTML report.

Writes ``--nights`` committed runs of an expression job (``--rows`` rows of the shipped
Paul Graham rows repeated, six metrics, two slice columns) under one output root,
then builds the last run's report with the trend over all of them and without it
(``trend_nights=0``), alternating in one process, ``--repeat`` rounds. Prints each
round's seconds and the ratio of the medians.

    python benchmarks/report_trend.py --nights 14 --rows 100000 --repeat 3
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import tempfile
import time
from pathlib import Path

import polars as pl

from ragbatch.analysis.report import build_report
from ragbatch.analysis.runs import find_run
from ragbatch.cli import main as ragbatch

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "examples/data/tonic_validate_paul_graham"


def _input(path: Path, rows: int, night: int) -> Path:
    base = pl.concat(
        pl.read_csv(f).select("reference_question", "llm_answer", "reference_answer")
        for f in sorted(SOURCE.glob("system=*/*.csv"))
    )
    repeated = pl.concat([base] * (rows // base.height + 1)).head(rows)
    shard = repeated.with_columns(
        (pl.int_range(pl.len()) % 10).cast(pl.String).alias("shard"),
        pl.lit(f"night-{night % 3}").alias("variant"),
    )
    shard.write_parquet(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nights", type=int, default=14)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ragbatch-trend-"))
    out = work / "out"
    ids = []
    for night in range(args.nights):
        config = work / f"night{night}.yaml"
        config.write_text(
            f"""run: {{name: trend, executor: in_process, run_date: 2026-11-{night + 1:02d}}}
input:
  uri: {_input(work / f"in{night}.parquet", args.rows, night)}
  columns: {{question: reference_question, answer: llm_answer, reference: reference_answer}}
  slice_columns: [shard, variant]
output: {{uri: {out}}}
metrics:
  - {{name: exact_match}}
  - {{name: response_length, params: {{min_chars: 1, max_chars: 400}}}}
  - {{name: contains_text, params: {{text: [Paul]}}}}
  - {{name: regex, params: {{pattern: "[0-9]"}}}}
  - {{name: json_valid}}
  - {{name: answer_match, params: {{text: "I don't know"}}}}
"""
        )
        with contextlib.redirect_stdout(io.StringIO()):
            code = ragbatch(["run", str(config)])
        if code != 0:
            raise SystemExit(f"night {night} exited {code}")
        ids.append(sorted(p.name.split("=", 1)[1] for p in (out / "runs").glob("*/run_id=*"))[-1])
    last = find_run(str(out), ids[-1])
    times: dict[str, list[float]] = {"with trend": [], "without": []}
    for _ in range(args.repeat):
        for label, nights in (("with trend", args.nights), ("without", 0)):
            start = time.perf_counter()
            build_report(last, trend_nights=nights)
            times[label].append(time.perf_counter() - start)
    print(f"{args.nights} committed runs of {args.rows:,} rows x 6 metrics, 2 slice columns")
    for label, values in times.items():
        print(f"  {label:<11} " + "  ".join(f"{v:.2f} s" for v in values))
    ratio = statistics.median(times["with trend"]) / statistics.median(times["without"])
    print(f"with / without (medians): {ratio:.3f}x")


if __name__ == "__main__":
    main()
