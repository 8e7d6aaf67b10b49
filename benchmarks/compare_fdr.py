"""What false discovery rate control costs a comparison of two large runs.

Two long scores tables of ``--rows`` cells each (``--metrics`` metrics, half 0/1 and half
continuous, over rows / metrics questions in ``--slices`` slices) are compared with
:func:`ragbatch.analysis.compare.compare_scores` as ``ragbatch compare --by app`` does:
once with the default control (``fdr=0.05``: a paired test per line, then
Benjamini-Hochberg over all lines) and once without it (``fdr=None``: the interval
alone), alternating, in the same process. Prints each round's seconds and the ratio of
the medians.

    python benchmarks/compare_fdr.py --rows 1000000 --repeat 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import polars as pl

from ragbatch.analysis.compare import compare_scores
from ragbatch.analysis.pairing import Pairing, pair_by_row_id


def _scores(rng: np.random.Generator, n_rows: int, n_metrics: int, slices: int) -> pl.DataFrame:
    frames = []
    ids = [f"q{i}" for i in range(n_rows)]
    app = [f"app-{i % slices}" for i in range(n_rows)]
    for m in range(n_metrics):
        level = rng.uniform(0.0, 1.0, n_rows)
        if m % 2:
            score = level + rng.normal(0.0, 0.15, n_rows)
        else:
            score = (rng.random(n_rows) < level).astype(float)
        frames.append(
            pl.DataFrame(
                {"row_id": ids, "metric": f"m{m}", "score": score, "status": "ok", "app": app}
            ).with_columns(pl.lit(None, pl.String).alias("reason"))
        )
    return pl.concat(frames)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="cells per run")
    parser.add_argument("--metrics", type=int, default=8)
    parser.add_argument("--slices", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    n_rows = args.rows // args.metrics
    rng = np.random.default_rng(0)
    baseline = _scores(rng, n_rows, args.metrics, args.slices)
    candidate = _scores(rng, n_rows, args.metrics, args.slices)
    ids = baseline.filter(pl.col("metric") == "m0")["row_id"].to_list()
    pairs, left_b, left_c = pair_by_row_id(ids, ids)
    pairing = Pairing(pairs, left_b, left_c)
    times: dict[str, list[float]] = {"fdr 0.05": [], "no control": []}
    lines = 0
    for _ in range(args.repeat):
        for label, fdr in (("fdr 0.05", 0.05), ("no control", None)):
            start = time.perf_counter()
            result = compare_scores(baseline, candidate, pairing, {}, by=["app"], fdr=fdr)
            times[label].append(time.perf_counter() - start)
            lines = result.metrics.height
    print(
        f"{baseline.height:,} cells a run, {n_rows:,} rows x {args.metrics} metrics, {lines} lines"
    )
    for label, values in times.items():
        print(f"  {label:<11} " + "  ".join(f"{v:.2f} s" for v in values))
    ratio = statistics.median(times["fdr 0.05"]) / statistics.median(times["no control"])
    print(f"control / no control (medians): {ratio:.3f}x")


if __name__ == "__main__":
    main()
