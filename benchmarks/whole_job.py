"""Whole-job benchmark: ``ragbatch run`` with six expression metrics, timed as whole
processes, against a Polars read-and-write floor and Tonic Validate's metric classes.

Usage (from the repository root, in the project's virtual environment)::

    python benchmarks/whole_job.py [--rows 100000,1000000] [--repeat 3]
                                   [--shape pg|short|long] [--contexts json|list]
                                   [--writer polars|pyarrow] [--profile] [--workdir DIR]

What it does:

1. Input, one Parquet file per row count under ``<workdir>/<shape>_.../input/``.

   * ``pg`` (the default): the rows of the six Tonic Validate Paul Graham runs shipped
     in ``examples/data/tonic_validate_paul_graham`` (330 rows: answers of 270-1,180
     characters on average per run, references of 150, and in two runs of the six five
     retrieved contexts of about 1,340 characters each), repeated in order to the row
     count, each with its own ``trace_id``, a seeded log-normal ``latency_s`` and the
     run's name as the slice column ``system``. Contexts are the shipped JSON text
     (``--contexts json``, the default) or lists of strings (``list``). The file is
     written by Polars' ``write_parquet`` (``--writer polars``, the default: zstd, its
     own row groups) or PyArrow's ``write_table`` (``pyarrow``: snappy, one row group up
     to 1,048,576 rows), each with its defaults, as a user's script would.
   * ``long``: the rows of ``benchmarks/expression_stage.py``'s :func:`generate` (3-5
     contexts of 500-1,500 characters, answers of 300-1,500; no two texts alike), one
     row group per 100,000 rows. ``short``: those rows cut, seeded, to 3 contexts of
     40-120 words and answers and references of 5-80 words.

2. For each row count, ``--repeat`` rounds, each running every contestant in turn
   (interleaved, so that a change of the machine's load falls on every contestant alike):

   * ``ragbatch``: ``ragbatch run`` of a generated config with the six metrics Tonic
     Validate also has (``expression_stage.METRIC_SETS["tonic6"]``), as a subprocess,
     default settings (these metrics run in the ``ragbatch`` process), wall time of the
     whole process;
   * ``floor``: :data:`FLOOR_SCRIPT` in a subprocess, what an analyst's minimal Polars
     script does for the same output: scan the input lazily and stream the long table
     (one row per row and metric: ``row_id``, ``metric``, ``score``, ``status``,
     ``reason``, ``details``, ``model`` and the slice columns) to Parquet, with varied
     float scores, statuses (``ok``, ``missing_input``, ``error``) and reasons, as real
     cells have. Its scores come from hashes of the row id, so Polars reads only the
     row ids and the slice columns;
   * ``floor_inputs``: the same script, its scores also derived from the columns the
     six metrics read (the answer's and the contexts' sizes, the latency), so that it
     decodes them too;
   * ``tonic``: Tonic Validate 6.2.0's six metric classes in one process
     (:func:`tonic_worker`, in its own environment, created on first use): rows to
     Python, JSON contexts decoded with ``json.loads``, one ``LLMResponse`` per row and
     every metric's ``score``, timed inside the process (no start-up counted).

3. Minimum of the rounds per contestant and row count; then the marginal cost between
   the smallest and largest row count, ``(n_large - n_small) / (t_large - t_small)`` rows
   per second, and the fixed cost, the time the line gives at 0 rows. Ratios:
   ragbatch's marginal seconds per row over each floor's (target at most 3), and
   ragbatch's marginal rows per second over Tonic's rows per second at the largest row
   count (target at least 3), Tonic counted without its ``json.loads`` (the stricter
   figure; with it as well).

``--profile`` then times ragbatch's own steps in this process over the largest input,
one read task after another: read, normalize, the expression stage, the long table,
the Parquet write, and the conservation check and summary over the files written (CPU
seconds of every thread, and wall seconds).

It prints a table, with the load average before and after every measurement, and writes
``<workdir>/whole_job.json``. Nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import expression_stage as es  # noqa: E402  (the sibling benchmark: rows, peers, runs)

DEFAULT_WORKDIR = ROOT / "benchmarks" / "_data" / "whole_job"
METRICS = es.METRIC_SETS["tonic6"]
SHORT_SEED = 7
PG_SOURCE = ROOT / "examples" / "data" / "tonic_validate_paul_graham"
PG_SEED = 11
#: The columns the six metrics read (besides the row id), as the benchmark's files name them.
METRIC_INPUTS = ("answer", "contexts", "latency_s")


def _load() -> list[float] | None:
    return es._load()


# --------------------------------------------------------------------------- inputs


def ensure_input(
    rows: int, shape: str, workdir: Path, contexts: str = "json", writer: str = "polars"
) -> dict:
    """The input file for ``rows`` rows of ``shape``, made when missing (``contexts`` and
    ``writer`` apply to ``pg``)."""
    if shape == "pg":
        return ensure_pg(rows, workdir / f"pg_{contexts}_{writer}_{rows}", contexts, writer)
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


def ensure_pg(rows: int, folder: Path, contexts: str, writer: str) -> dict:
    """The ``pg`` input of ``rows`` rows under ``folder``, written when missing."""
    path = folder / "input" / "traces.parquet"
    done = path.with_suffix(".json")
    if done.exists() and path.exists():
        meta = json.loads(done.read_text())
        if (meta.get("rows"), meta.get("contexts"), meta.get("writer")) == (rows, contexts, writer):
            return meta
    print(f"writing {rows:,} Paul Graham rows ({contexts}, {writer}) to {path} ...", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_pg(rows, path, contexts, writer)
    meta = describe_pg(path)
    meta.update(contexts=contexts, writer=writer, seed=PG_SEED)
    done.write_text(json.dumps(meta, indent=2))
    return meta


def pg_rows():
    """The shipped Paul Graham runs as one Polars frame: ``question``, ``contexts`` (the
    JSON text), ``answer``, ``reference``, ``system``; in the order of the folders."""
    import polars as pl

    frames = []
    for folder in sorted(PG_SOURCE.glob("system=*")):
        for csv in sorted(folder.glob("*.csv")):
            frame = pl.read_csv(csv, infer_schema=False)
            frames.append(
                frame.select(
                    question="reference_question",
                    contexts="llm_context",
                    answer="llm_answer",
                    reference="reference_answer",
                    system=pl.lit(folder.name.split("=", 1)[1]),
                )
            )
    return pl.concat(frames)


def write_pg(rows: int, path: Path, contexts: str, writer: str) -> None:
    """Write ``rows`` rows of :func:`pg_rows`, repeated in order (see the module notes)."""
    import numpy as np
    import polars as pl
    import pyarrow.parquet as pq

    base = pg_rows()
    if contexts == "list":
        base = base.with_columns(pl.col("contexts").str.json_decode(pl.List(pl.String)))
    rng = np.random.default_rng(PG_SEED)
    index = pl.Series(np.arange(rows) % base.height)
    frame = base.select(pl.all().gather(index)).select(
        trace_id=pl.format(
            "pg-{}", pl.int_range(rows, dtype=pl.Int64).cast(pl.String).str.zfill(9)
        ),
        question="question",
        contexts="contexts",
        answer="answer",
        reference="reference",
        latency_s=pl.Series(np.round(rng.lognormal(np.log(2.0), 0.6, rows), 3)),
        system="system",
    )
    if writer == "polars":
        frame.write_parquet(path)
    else:
        pq.write_table(frame.to_arrow(), path)


def describe_pg(path: Path) -> dict:
    """Rows, row groups, bytes and mean sizes of a ``pg`` input file."""
    import polars as pl
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    scan = pl.scan_parquet(path)
    contexts = scan.collect_schema()["contexts"]
    if contexts == pl.String:
        n_contexts = pl.col("contexts").str.json_decode(pl.List(pl.String)).list.len()
    else:
        n_contexts = pl.col("contexts").list.len()
    means = scan.select(
        question=pl.col("question").str.len_chars().mean(),
        answer=pl.col("answer").str.len_chars().mean(),
        reference=pl.col("reference").str.len_chars().mean(),
        contexts_per_row=n_contexts.mean(),
        contexts_chars_per_row=pl.col("contexts").cast(pl.String).str.len_chars().mean()
        if contexts == pl.String
        else pl.col("contexts").list.eval(pl.element().str.len_chars()).list.sum().mean(),
    ).collect()
    return {
        "path": str(path),
        "rows": meta.num_rows,
        "row_groups": meta.num_row_groups,
        "file_bytes": path.stat().st_size,
        "uncompressed_bytes": sum(
            meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)
        ),
        "mean_chars": {k: round(v, 1) for k, v in means.row(0, named=True).items()},
    }


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


# --------------------------------------------------------------------------- contestants


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
    kept = {
        k: figures[k] for k in ("wall_s", "timings_s", "read_tasks", "cells", "files", "config")
    }
    return {**kept, "failed_attempts": failed}


#: Attempts of one timed ``ragbatch run`` before the benchmark gives up.
RUN_ATTEMPTS = 4


#: The floor: an analyst's minimal Polars script writing the long scores table of the
#: input's rows. Arguments: input, output, metric ids, row-id column, slice columns and
#: the columns its scores are derived from besides the row id (comma-separated; may be
#: empty). Prints its own seconds and the score rows written.
FLOOR_SCRIPT = r"""
import sys, time
t0 = time.perf_counter()
import polars as pl
src, dst = sys.argv[1], sys.argv[2]
metrics, row_id = sys.argv[3].split(","), sys.argv[4]
slices, reads = [c for c in sys.argv[5].split(",") if c], [c for c in sys.argv[6].split(",") if c]
scan = pl.scan_parquet(src)
schema = scan.collect_schema()

def size(column):
    kind = schema[column]
    if kind == pl.String:
        value = pl.col(column).str.len_bytes()
    elif isinstance(kind, pl.List):
        value = pl.col(column).list.len()
    else:
        value = pl.col(column)
    return value.cast(pl.Float64).fill_null(0.0)

signal = pl.lit(0.0)
for column in reads:
    signal = signal + size(column) / 997.0
draws = [
    ((pl.col(row_id).hash(seed=i) % 1_000_003).cast(pl.Float64) / 1_000_003 + signal) % 1.0
    for i in range(len(metrics))
]
wide = scan.select(pl.col(row_id).alias("row_id"), *slices, *[d.alias(m) for d, m in zip(draws, metrics)])
u = pl.col("u")
long = wide.unpivot(
    index=["row_id", *slices], on=metrics, variable_name="metric", value_name="u"
).select(
    "row_id",
    "metric",
    score=pl.when(u >= 0.03).then(u.round(4)),
    status=pl.when(u < 0.01).then(pl.lit("error")).when(u < 0.03).then(pl.lit("missing_input"))
    .otherwise(pl.lit("ok")),
    reason=pl.when(u < 0.01).then(pl.format("scoring failed at draw {}", u.round(5)))
    .when(u < 0.03).then(pl.lit("answer is null"))
    .when(u < 0.5).then(pl.format("{} below 0.5", u.round(4))),
    details=pl.lit(None, pl.String),
    model=pl.lit(None, pl.String),
    *slices,
)
long.sink_parquet(dst)
t1 = time.perf_counter()
print(f"{t1 - t0:.3f} {pl.scan_parquet(dst).select(pl.len()).collect().item()}")
"""


def measure_floor(input_path: str, rows: int, workdir: Path, reads: tuple[str, ...] = ()) -> dict:
    """:data:`FLOOR_SCRIPT` in a subprocess over ``input_path``; its wall time."""
    import pyarrow.parquet as pq

    names = pq.ParquetFile(input_path).schema_arrow.names
    mapped = set(es.COLUMNS.values())
    slices = [n for n in names if n not in mapped]
    out = workdir / "floor"
    out.mkdir(parents=True, exist_ok=True)
    dst = out / "scores.parquet"
    metric_ids = [es._metric_id(m) for m in METRICS]
    command = [
        sys.executable,
        "-c",
        FLOOR_SCRIPT,
        input_path,
        str(dst),
        ",".join(metric_ids),
        es.COLUMNS["row_id"],
        ",".join(slices),
        ",".join(reads),
    ]
    t0 = time.perf_counter()
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    inside, written = done.stdout.split()
    return {
        "wall_s": wall,
        "script_s": float(inside),
        "rows_written": int(written),
        "file_bytes": dst.stat().st_size,
    }


def measure_floor_inputs(input_path: str, rows: int, workdir: Path) -> dict:
    """:func:`measure_floor`, the scores also derived from :data:`METRIC_INPUTS`."""
    return measure_floor(input_path, rows, workdir, reads=METRIC_INPUTS)


def tonic_worker(input_path: str, out_dir: str) -> None:
    """Runs inside the Tonic Validate environment (no ragbatch, Polars or NumPy there):
    the six metric classes over every row of ``input_path``, one row group at a time;
    timings to ``<out_dir>/tonic_timings.json``."""
    import asyncio
    import platform
    from importlib import metadata

    import pyarrow as pa
    import pyarrow.parquet as pq
    from tonic_validate.classes.benchmark import BenchmarkItem
    from tonic_validate.classes.llm_response import LLMResponse

    metrics = es.tonic_metrics()
    columns = ["question", "answer", "reference", "contexts", "latency_s"]

    async def score_all(responses: list) -> int:
        # One event loop for the whole batch; every score coroutine is awaited directly
        # (none of these metrics suspends), so no task or loop is created per row.
        scored = 0
        for response in responses:
            for metric in metrics:
                await metric.score(response, None)
                scored += 1
        return scored

    def responses(cols: dict[str, list]) -> list:
        return [
            LLMResponse(
                llm_answer=a,
                llm_context_list=c,
                benchmark_item=BenchmarkItem(question=q, answer=r),
                run_time=lat,
            )
            for q, a, r, c, lat in zip(
                cols["question"],
                cols["answer"],
                cols["reference"],
                cols["contexts"],
                cols["latency_s"],
            )
        ]

    parquet = pq.ParquetFile(input_path)
    as_json = pa.types.is_string(parquet.schema_arrow.field("contexts").type) or (
        pa.types.is_large_string(parquet.schema_arrow.field("contexts").type)
    )

    def convert(table: pa.Table) -> tuple[dict[str, list], float]:
        cols = {c: table.column(c).to_pylist() for c in columns}
        t0 = time.perf_counter()
        if as_json:
            cols["contexts"] = [None if c is None else json.loads(c) for c in cols["contexts"]]
        return cols, time.perf_counter() - t0

    # Warm-up on 2,000 rows, untimed.
    warm, _ = convert(parquet.read_row_group(0, columns=columns).slice(0, 2000))
    asyncio.run(score_all(responses(warm)))
    timings = {"convert_s": 0.0, "parse_s": 0.0, "construct_s": 0.0, "score_s": 0.0}
    timings.update(cpu_s=0.0, rows=0, cells=0)
    for group in range(parquet.num_row_groups):
        table = parquet.read_row_group(group, columns=columns)
        t0, c0 = time.perf_counter(), time.process_time()
        cols, parse = convert(table)
        t1 = time.perf_counter()
        built = responses(cols)
        t2 = time.perf_counter()
        timings["cells"] += asyncio.run(score_all(built))
        t3 = time.perf_counter()
        timings["convert_s"] += t1 - t0 - parse
        timings["parse_s"] += parse
        timings["construct_s"] += t2 - t1
        timings["score_s"] += t3 - t2
        timings["cpu_s"] += time.process_time() - c0
        timings["rows"] += table.num_rows
        del cols, built, table
    timings["versions"] = {
        p: metadata.version(p) for p in ("tonic-validate", "pydantic", "pyarrow")
    }
    timings["python"] = platform.python_version()
    (Path(out_dir) / "tonic_timings.json").write_text(json.dumps(timings, indent=2))


def measure_tonic(input_path: str, rows: int, workdir: Path) -> dict:
    """:func:`tonic_worker` in Tonic Validate's environment; its timings, and rows per
    second with and without the JSON decoding of the contexts."""
    python = es.ensure_tonic_venv()
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", TONIC_VALIDATE_DO_NOT_TRACK="true")
    env.pop("PYTHONPATH", None)
    t0 = time.perf_counter()
    command = [str(python), __file__, "--tonic-worker", "--input", input_path]
    subprocess.run([*command, "--workdir", str(workdir)], check=True, env=env)
    wall = time.perf_counter() - t0
    figures = json.loads((workdir / "tonic_timings.json").read_text())
    n = figures["rows"]
    figures["process_wall_s"] = wall
    figures["total_s"] = figures["convert_s"] + figures["construct_s"] + figures["score_s"]
    figures["with_parse_s"] = figures["total_s"] + figures["parse_s"]
    figures["rows_per_s"] = n / figures["total_s"]
    figures["rows_per_s_with_parse"] = n / figures["with_parse_s"]
    return figures


def measure_run_on_ray(input_path: str, rows: int, workdir: Path) -> dict:
    """As :func:`measure_run`, with ``run.executor: ray``: the same job on a local Ray."""
    return measure_run(input_path, rows, workdir, executor="ray")


#: ``ragbatch``: the default executor (``auto``, which runs these expression metrics in
#: the process); ``ragbatch_ray``: the same job on a local Ray (``run.executor: ray``).
CONTESTANTS = {
    "ragbatch": measure_run,
    "ragbatch_ray": measure_run_on_ray,
    "floor": measure_floor,
    "floor_inputs": measure_floor_inputs,
    "tonic": measure_tonic,
}
#: Contestants skipped unless named in ``--only`` or ``--baseline`` is given.
OPTIONAL = ("ragbatch_ray",)
SECONDS = {
    "ragbatch": "wall_s",
    "ragbatch_ray": "wall_s",
    "floor": "wall_s",
    "floor_inputs": "wall_s",
    "tonic": "total_s",
    "baseline": "wall_s",
}
#: Contestants that are ``ragbatch run`` processes (ratios, manifest timings).
RUNS = ("ragbatch", "ragbatch_ray", "baseline")
FLOORS = ("floor", "floor_inputs")


# --------------------------------------------------------------------------- profile


def profile_components(config_path: str, workdir: Path) -> dict:
    """ragbatch's steps over the read tasks of ``config_path``'s input, as the in-process
    executor takes them (text columns as string views, tasks in slices) but one slice
    after another in this process, then the conservation check and summary over the files
    written: CPU seconds (every thread) and wall seconds per step."""
    import datetime as dt
    import shutil

    sys.path.insert(0, str(ROOT))
    from ragbatch.analysis.summary import summarize_run, summary_settings
    from ragbatch.config.job import load_config
    from ragbatch.core.allocator import prefer_jemalloc
    from ragbatch.io.read import read_task
    from ragbatch.io.schema import normalize
    from ragbatch.io.write import OutputLayout, verify_run
    from ragbatch.pipeline.in_process import _slices, view_columns
    from ragbatch.pipeline.plan import build_plan
    from ragbatch.pipeline.projection import project_input
    from udfs.expressions import expression_stage
    from udfs.scores import to_long

    prefer_jemalloc()  # as the `ragbatch` command does
    config = load_config(config_path)
    plan = build_plan(config)
    out = workdir / "profile"
    shutil.rmtree(out, ignore_errors=True)
    layout = OutputLayout.for_run(
        config.output.model_copy(update={"uri": str(out)}), dt.date.today(), "profile"
    )
    steps: dict[str, list[float]] = {}

    def timed(name, fn, *args, **kwargs):
        w, c = time.perf_counter(), time.process_time()
        value = fn(*args, **kwargs)
        spent = steps.setdefault(name, [0.0, 0.0])
        spent[0] += time.process_time() - c
        spent[1] += time.perf_counter() - w
        return value

    files, n_rows = [], 0
    views = view_columns(plan)
    projection = project_input(plan)
    for task in plan.read_tasks:
        raw = timed("read", read_task, task, config.input, views, projection.columns)
        for rows, piece in _slices(raw, task):
            table = timed(
                "normalize",
                normalize,
                rows,
                projection.input,
                piece,
                slices=plan.slices,
                views=bool(views),
            )
            n_rows += table.num_rows
            for stage in plan.stages:
                table = timed("expression_stage", expression_stage, table, metrics=stage.metrics)
            scores = timed("to_long", to_long, table, plan.metric_ids, plan.slice_names)
            files.append(f"{layout.scores_path}/part-{len(files):05d}.parquet")
            timed("write", layout.write_table, files[-1], scores)
            del table, scores
        del raw
    timed("verify", verify_run, layout, files, plan.metric_ids, n_rows)
    timed(
        "summary",
        summarize_run,
        layout,
        files,
        plan.metrics,
        plan.summary_slice_names,
        summary_settings(config),
    )
    shutil.rmtree(out, ignore_errors=True)
    return {
        "rows": n_rows,
        "read_tasks": len(plan.read_tasks),
        "cpu_s": {k: round(v[0], 3) for k, v in steps.items()},
        "wall_s": {k: round(v[1], 3) for k, v in steps.items()},
    }


# --------------------------------------------------------------------------- report


def marginal(small: tuple[int, float], large: tuple[int, float]) -> dict:
    """Rows per second between two (rows, seconds) points, and the seconds at 0 rows."""
    (n0, t0), (n1, t1) = small, large
    per_row = (t1 - t0) / (n1 - n0)
    return {
        "rows_per_s": 1 / per_row if per_row > 0 else float("inf"),
        "fixed_s": t0 - per_row * n0,
    }


def summarize(best: dict[str, dict[int, float]], counts: list[int], tonic: dict | None) -> dict:
    """Marginal rows per second and fixed seconds of every whole-process contestant
    between the smallest and largest row count; Tonic's rate at the largest; the ratios.

    ``tonic`` is Tonic's fastest run at the largest row count (for its rate with the JSON
    decoding of the contexts counted)."""
    small, large = counts[0], counts[-1]
    out: dict = {}
    for name in best:
        if name == "tonic":
            out[name] = {"rows_per_s": large / best[name][large]}
            if tonic is not None:
                out[name]["rows_per_s_with_parse"] = tonic["rows_per_s_with_parse"]
        elif len(counts) > 1:
            out[name] = marginal((small, best[name][small]), (large, best[name][large]))
    for name in RUNS:
        if name not in out or "rows_per_s" not in out[name]:
            continue
        for floor in FLOORS:
            if floor in out:
                out[f"{name}_vs_{floor}"] = out[floor]["rows_per_s"] / out[name]["rows_per_s"]
        if "tonic" in out:
            out[f"{name}_vs_tonic"] = out[name]["rows_per_s"] / out["tonic"]["rows_per_s"]
            if "rows_per_s_with_parse" in out["tonic"]:
                out[f"{name}_vs_tonic_with_parse"] = (
                    out[name]["rows_per_s"] / out["tonic"]["rows_per_s_with_parse"]
                )
    return out


def report(results: dict) -> str:
    counts = results["rows"]
    lines = [
        f"{'rows':>10s} {'contestant':>13s} {'best s':>8s} {'all s':>26s}  load (1 min) before/after"
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
                f"{n:10,d} {name:>13s} {min(times):8.2f} "
                f"{', '.join(f'{t:.2f}' for t in times):>26s}  {loads}"
            )
    s = results.get("summary", {})
    lines += ["", f"marginal ({counts[0]:,} -> {counts[-1]:,} rows):"]
    for name in (*RUNS, *FLOORS):
        if name in s and "fixed_s" in s[name]:
            lines.append(
                f"  {name:13s} {s[name]['rows_per_s']:>12,.0f} rows/s, fixed {s[name]['fixed_s']:.2f} s"
            )
    if "tonic" in s:
        parse = s["tonic"].get("rows_per_s_with_parse")
        lines.append(
            f"  {'tonic':13s} {s['tonic']['rows_per_s']:>12,.0f} rows/s (in-process, "
            f"{counts[-1]:,} rows"
            + (f"; {parse:,.0f} with json.loads of the contexts)" if parse else ")")
        )
    for name in RUNS:
        for floor in FLOORS:
            if f"{name}_vs_{floor}" in s:
                lines.append(
                    f"  {name} / {floor}, marginal time: {s[f'{name}_vs_{floor}']:.2f}x "
                    "(target <= 3)"
                )
        if f"{name}_vs_tonic" in s:
            extra = s.get(f"{name}_vs_tonic_with_parse")
            lines.append(
                f"  {name} / Tonic, rows per second: {s[f'{name}_vs_tonic']:.2f}x (target >= 3)"
                + (f"; {extra:.2f}x against Tonic with json.loads" if extra else "")
            )
    for n in counts:
        for name in RUNS:
            runs = results["runs"][str(n)].get(name)
            if runs:
                fastest = min(runs, key=lambda r: r["wall_s"])
                phases = ", ".join(f"{k} {v:.2f}" for k, v in fastest["timings_s"].items())
                lines.append(f"  {name} at {n:,} rows, manifest timings (s): {phases}")
    profile = results.get("profile")
    if profile:
        lines.append(
            f"profile, {profile['rows']:,} rows in {profile['read_tasks']} read tasks, one at a time:"
        )
        for step, cpu in profile["cpu_s"].items():
            lines.append(f"  {step:18s} cpu {cpu:7.2f} s  wall {profile['wall_s'][step]:7.2f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="100000,1000000", help="row counts, comma-separated")
    parser.add_argument("--with-3m", action="store_true", help="add 3,000,000 rows")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--shape", choices=("pg", "short", "long"), default="pg")
    parser.add_argument("--contexts", choices=("json", "list"), default="json")
    parser.add_argument("--writer", choices=("polars", "pyarrow"), default="polars")
    parser.add_argument(
        "--skip",
        default="",
        help="contestants to leave out, comma-separated (ragbatch,floor,floor_inputs,tonic)",
    )
    parser.add_argument(
        "--with-ray", action="store_true", help="add ragbatch_ray (the same job on Ray)"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout (say, an earlier commit's `git archive`) whose `ragbatch run` "
        "is timed in the same rounds, as contestant 'baseline'",
    )
    parser.add_argument(
        "--profile", action="store_true", help="time ragbatch's steps over the largest input"
    )
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    parser.add_argument("--tonic-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    workdir = args.workdir.resolve()
    if args.tonic_worker:
        tonic_worker(args.input, str(workdir))
        return 0
    counts = sorted(
        {int(x) for x in args.rows.split(",") if x} | ({3_000_000} if args.with_3m else set())
    )
    skip = {x for x in args.skip.split(",") if x}
    if not args.with_ray:
        skip |= set(OPTIONAL)
    contestants = {k: v for k, v in CONTESTANTS.items() if k not in skip}
    if args.baseline is not None:
        baseline = args.baseline.resolve()
        contestants = {
            "baseline": lambda path, n, place: measure_run(path, n, place, checkout=baseline),
            **contestants,
        }
    inputs = {n: ensure_input(n, args.shape, workdir, args.contexts, args.writer) for n in counts}
    results: dict = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": es.machine(),
        "versions": es.versions(),
        "shape": args.shape,
        "contexts": args.contexts if args.shape == "pg" else None,
        "writer": args.writer if args.shape == "pg" else None,
        "inputs": {str(n): inputs[n] for n in counts},
        "metrics": METRICS,
        "rows": counts,
        "repeat": args.repeat,
        "baseline": str(args.baseline) if args.baseline else None,
        "runs": {str(n): {name: [] for name in contestants} for n in counts},
    }
    partial = workdir / "whole_job.partial.json"
    if any(name in contestants for name in RUNS):
        # A warm-up run (page cache, imports, compiled bytecode), untimed.
        print("warm-up run ...", flush=True)
        (workdir / "warm_up").mkdir(parents=True, exist_ok=True)
        measure_run(inputs[counts[0]]["path"], counts[0], workdir / "warm_up")
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
                partial.write_text(json.dumps(results, indent=2, default=str))
    best = {
        name: {n: min(r[SECONDS[name]] for r in results["runs"][str(n)][name]) for n in counts}
        for name in contestants
    }
    tonic = None
    if "tonic" in contestants:
        tonic = min(results["runs"][str(counts[-1])]["tonic"], key=lambda r: r["total_s"])
    results["best_s"] = best
    results["summary"] = summarize(best, counts, tonic)
    if args.profile:
        largest = results["runs"][str(counts[-1])].get("ragbatch") or []
        config = largest[0]["config"] if largest else None
        if config is None:
            config = es.measure_run(
                inputs[counts[-1]]["path"], "profile_config", METRICS, workdir / "warm_up"
            )["config"]
        print("profile ...", flush=True)
        results["profile"] = profile_components(config, workdir)
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    (workdir / "whole_job.json").write_text(json.dumps(results, indent=2, default=str))
    print()
    print(report(results))
    print(f"\nresults: {workdir / 'whole_job.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
