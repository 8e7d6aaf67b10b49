"""Whole-job benchmark: ``ragbatch run`` with six expression metrics, timed as whole
processes, against a bare Polars I/O floor and Tonic Validate's metric classes.

Usage (from the repository root, in the project's virtual environment)::

    python benchmarks/whole_job.py [--rows 30000,300000] [--with-3m] [--repeat 2]
                                   [--shape short|long] [--workdir DIR]

What it does:

1. Input. ``long`` rows are those of ``benchmarks/expression_stage.py`` (its
   :func:`generate`: 3-5 contexts of 500-1,500 characters, answers of 300-1,500).
   ``short`` rows (the default) are cut from them, seeded: the first 3 contexts, each cut
   to 40-120 words, the answer and the reference cut to 5-80 words; question, latency
   and the two slice columns as they are. One file per row count, one row group per
   100,000 rows, under ``<workdir>/<shape>_<rows>/input/traces.parquet``.
2. For each row count, ``--repeat`` rounds, each running in turn (interleaved, so that a
   change of the machine's load falls on every contestant alike):

   * ``ragbatch run`` of a generated config with the six metrics Tonic Validate also has
     (``expression_stage.METRIC_SETS["tonic6"]``), as a subprocess (local Ray, started
     and stopped by the run), wall time of the whole process;
   * (a) the floor: ``expression_stage.FLOOR_SCRIPT`` in a subprocess, reading the same
     Parquet and writing as many score rows of the scores table's shape;
   * (b) Tonic Validate 6.2.0's six metric classes in one process
     (``expression_stage.measure_tonic``: conversion, ``LLMResponse`` construction and
     ``score`` calls, timed inside the process; its environment is created on first
     use).

3. Minimum of the rounds per contestant and row count; then the marginal cost between
   the smallest and largest row count, ``(t_large - t_small) / (n_large - n_small)``,
   as rows per second, and the fixed cost, the time the fit gives at 0 rows. Ratios:
   ragbatch's marginal seconds per row over the floor's, and ragbatch's marginal rows per
   second over Tonic's rows per second (Tonic has no fixed cost worth the name: its
   rate is taken at the largest row count).

It prints a table, with the load average before and after every measurement, and writes
``<workdir>/whole_job.json``. Nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import expression_stage as es  # noqa: E402  (the sibling benchmark: rows, peers, floor)

DEFAULT_WORKDIR = ROOT / "benchmarks" / "_data" / "whole_job"
METRICS = es.METRIC_SETS["tonic6"]
SHORT_SEED = 7


def _load() -> list[float] | None:
    return es._load()


def ensure_input(rows: int, shape: str, workdir: Path) -> dict:
    """The input file for ``rows`` rows of ``shape``, made when missing."""
    long_dir = workdir / f"long_{rows}"
    meta = es.ensure_input(rows, long_dir)
    if shape == "long":
        return meta
    path = workdir / f"short_{rows}" / "input" / "traces.parquet"
    done = path.with_suffix(".json")
    if done.exists() and json.loads(done.read_text()).get("rows") == rows:
        return json.loads(done.read_text())
    print(f"cutting {rows:,} short traces into {path} ...", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    shorten(meta["path"], path, SHORT_SEED)
    described = es.describe_input(path, SHORT_SEED)
    done.write_text(json.dumps(described, indent=2))
    return described


def shorten(src: str | Path, dst: Path, seed: int) -> None:
    """Write ``src``'s rows with short texts to ``dst`` (see the module notes), one row
    group at a time."""
    import numpy as np
    import polars as pl
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    source = pq.ParquetFile(src)
    with pq.ParquetWriter(dst, source.schema_arrow) as writer:
        for group in range(source.num_row_groups):
            frame = pl.from_arrow(source.read_row_group(group))
            assert isinstance(frame, pl.DataFrame)
            n = frame.height

            def cut(column: str, low: int, high: int, n: int = n) -> pl.Expr:
                words = pl.Series(rng.integers(low, high + 1, n), dtype=pl.Int64)
                return (
                    pl.col(column).str.split(" ").list.head(pl.lit(words)).list.join(" ")
                ).alias(column)

            contexts = (
                frame.select(pl.int_range(n).alias("i"), pl.col("contexts").list.head(3))
                .explode("contexts")
                .with_columns(cut("contexts", 40, 120, 3 * n))
                .group_by("i", maintain_order=True)
                .agg(pl.col("contexts"))
            )
            frame = frame.with_columns(
                cut("answer", 5, 80), cut("reference", 5, 80), contexts=contexts["contexts"]
            )
            writer.write_table(frame.to_arrow().cast(source.schema_arrow))


def measure_run(
    input_path: str,
    rows: int,
    workdir: Path,
    checkout: Path = ROOT,
    executor: str | None = None,
) -> dict:
    """One whole-process ``ragbatch run`` of the code in ``checkout`` (this one unless
    told), with ``run.executor`` set to ``executor`` when given (default: the config's
    default, ``auto``); its wall time and the manifest's timings."""
    saved = os.environ.get("PYTHONPATH")
    others = [p for p in (saved or "").split(os.pathsep) if p and Path(p) not in (ROOT, checkout)]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(checkout), *others])
    failed = 0
    try:
        while True:
            try:
                figures = es.measure_run(
                    input_path, f"run_{rows}", METRICS, workdir, executor=executor
                )
                break
            except SystemExit:
                # On a loaded machine Ray's own start can time out (its raylet has 30 s
                # to register): count it and run again.
                failed += 1
                if failed >= RUN_ATTEMPTS:
                    raise
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    kept = {k: figures[k] for k in ("wall_s", "timings_s", "read_tasks", "cells", "files")}
    return {**kept, "failed_attempts": failed}


#: Attempts of one timed ``ragbatch run`` before the benchmark gives up.
RUN_ATTEMPTS = 4


def measure_floor(input_path: str, rows: int, workdir: Path) -> dict:
    return es.measure_floor(input_path, [es._metric_id(m) for m in METRICS], workdir)


def measure_tonic(input_path: str, rows: int, workdir: Path) -> dict:
    figures, _ = es.measure_tonic(input_path, rows, workdir)
    keep = ("rows", "total_s", "rows_per_s", "cpu_s", "process_wall_s")
    return {k: figures[k] for k in keep}


def measure_run_on_ray(input_path: str, rows: int, workdir: Path) -> dict:
    """As :func:`measure_run`, with ``run.executor: ray``: the same job on a local Ray."""
    return measure_run(input_path, rows, workdir, executor="ray")


#: ``ragbatch``: the default executor (``auto``, which runs these expression metrics in
#: the process); ``ragbatch_ray``: the same job on a local Ray (``run.executor: ray``).
CONTESTANTS = {
    "ragbatch": measure_run,
    "ragbatch_ray": measure_run_on_ray,
    "floor": measure_floor,
    "tonic": measure_tonic,
}
SECONDS = {
    "ragbatch": "wall_s",
    "ragbatch_ray": "wall_s",
    "floor": "wall_s",
    "tonic": "total_s",
    "baseline": "wall_s",
}
#: Contestants that are ``ragbatch run`` processes (ratios, manifest timings).
RUNS = ("ragbatch", "ragbatch_ray", "baseline")


def marginal(small: tuple[int, float], large: tuple[int, float]) -> dict:
    """Rows per second between two (rows, seconds) points, and the seconds at 0 rows."""
    (n0, t0), (n1, t1) = small, large
    per_row = (t1 - t0) / (n1 - n0)
    return {
        "rows_per_s": 1 / per_row if per_row > 0 else float("inf"),
        "fixed_s": t0 - per_row * n0,
    }


def summarize(best: dict[str, dict[int, float]], counts: list[int]) -> dict:
    """Marginal rows per second and fixed seconds of every whole-process contestant
    between the smallest and largest row count; Tonic's rate at the largest; the ratios."""
    small, large = counts[0], counts[-1]
    out: dict = {}
    for name in best:
        if name == "tonic":
            out[name] = {"rows_per_s": large / best[name][large]}
        elif len(counts) > 1:
            out[name] = marginal((small, best[name][small]), (large, best[name][large]))
    for name in RUNS:
        if name in out and "rows_per_s" in out[name]:
            if "floor" in out:
                out[f"{name}_vs_floor"] = out["floor"]["rows_per_s"] / out[name]["rows_per_s"]
            if "tonic" in out:
                out[f"{name}_vs_tonic"] = out[name]["rows_per_s"] / out["tonic"]["rows_per_s"]
    return out


def report(results: dict) -> str:
    counts = results["rows"]
    lines = [
        f"{'rows':>10s} {'contestant':>12s} {'best s':>8s} {'all s':>20s}  load (1 min) before/after"
    ]
    for n in counts:
        for name, runs in results["runs"][str(n)].items():
            if not runs:
                continue
            times = [r[SECONDS[name]] for r in runs]
            loads = "; ".join(
                f"{r['load_before'][0]:.1f}/{r['load_after'][0]:.1f}"
                for r in runs
                if r["load_before"]
            )
            lines.append(
                f"{n:10,d} {name:>12s} {min(times):8.2f} {', '.join(f'{t:.2f}' for t in times):>20s}  {loads}"
            )
    s = results.get("summary", {})
    lines += ["", f"marginal ({counts[0]:,} -> {counts[-1]:,} rows):"]
    for name in (*RUNS, "floor"):
        if name in s and "fixed_s" in s[name]:
            lines.append(
                f"  {name:12s} {s[name]['rows_per_s']:>12,.0f} rows/s, fixed {s[name]['fixed_s']:.2f} s"
            )
    if "tonic" in s:
        lines.append(
            f"  {'tonic':10s} {s['tonic']['rows_per_s']:>12,.0f} rows/s (in-process, {counts[-1]:,} rows)"
        )
    for name in RUNS:
        if f"{name}_vs_floor" in s:
            lines.append(
                f"  {name} / floor, marginal time:     {s[f'{name}_vs_floor']:.2f}x (target <= 3)"
            )
        if f"{name}_vs_tonic" in s:
            lines.append(
                f"  {name} / Tonic, rows per second:   {s[f'{name}_vs_tonic']:.2f}x (target >= 3)"
            )
    for n in counts:
        for name in RUNS:
            runs = results["runs"][str(n)].get(name)
            if runs:
                fastest = min(runs, key=lambda r: r["wall_s"])
                phases = ", ".join(f"{k} {v:.2f}" for k, v in fastest["timings_s"].items())
                lines.append(f"  {name} at {n:,} rows, manifest timings (s): {phases}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="30000,300000", help="row counts, comma-separated")
    parser.add_argument("--with-3m", action="store_true", help="add 3,000,000 rows")
    parser.add_argument("--repeat", type=int, default=2, help="interleaved rounds (default 2)")
    parser.add_argument("--shape", choices=("short", "long"), default="short")
    parser.add_argument(
        "--skip",
        default="",
        help="contestants to leave out, comma-separated (ragbatch,ragbatch_ray,floor,tonic)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout (say, an earlier commit's `git archive`) whose `ragbatch run` "
        "is timed in the same rounds, as contestant 'baseline'",
    )
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    args = parser.parse_args(argv)
    workdir = args.workdir.resolve()
    counts = sorted(
        {int(x) for x in args.rows.split(",") if x} | ({3_000_000} if args.with_3m else set())
    )
    skip = {x for x in args.skip.split(",") if x}
    contestants = {k: v for k, v in CONTESTANTS.items() if k not in skip}
    if args.baseline is not None:
        baseline = args.baseline.resolve()
        contestants = {
            "baseline": lambda path, n, place: measure_run(path, n, place, checkout=baseline),
            **contestants,
        }
    inputs = {n: ensure_input(n, args.shape, workdir) for n in counts}
    results: dict = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": es.machine(),
        "versions": es.versions(),
        "shape": args.shape,
        "inputs": {str(n): inputs[n] for n in counts},
        "metrics": METRICS,
        "rows": counts,
        "repeat": args.repeat,
        "baseline": str(args.baseline) if args.baseline else None,
        "runs": {str(n): {name: [] for name in contestants} for n in counts},
    }
    if any(name in contestants for name in RUNS):
        # A warm-up run (page cache, imports, compiled bytecode), untimed.
        print("warm-up run ...", flush=True)
        (workdir / "warm_up").mkdir(parents=True, exist_ok=True)
        measure_run(inputs[counts[0]]["path"], counts[0], workdir / "warm_up")
        if "ragbatch_ray" in contestants:
            measure_run_on_ray(inputs[counts[0]]["path"], counts[0], workdir / "warm_up")
    for rep in range(args.repeat):
        for n in counts:
            for name, measure in contestants.items():
                print(f"round {rep + 1}/{args.repeat}: {name} at {n:,} rows ...", flush=True)
                place = workdir / f"{name}_{n}"
                place.mkdir(parents=True, exist_ok=True)
                before = _load()
                figures = measure(inputs[n]["path"], n, place)
                figures.update(load_before=before, load_after=_load())
                results["runs"][str(n)][name].append(figures)
                # What is measured so far, should a later run fail.
                (workdir / "whole_job.partial.json").write_text(
                    json.dumps(results, indent=2, default=str)
                )
    best = {
        name: {n: min(r[SECONDS[name]] for r in results["runs"][str(n)][name]) for n in counts}
        for name in contestants
    }
    results["best_s"] = best
    results["summary"] = summarize(best, counts)
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    (workdir / "whole_job.json").write_text(json.dumps(results, indent=2, default=str))
    print()
    print(report(results))
    print(f"\nresults: {workdir / 'whole_job.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
