"""Memory of the similarity model stage called in one process, batch after batch.

Runs ``udfs.similarity.ModelStage`` (packaged all-MiniLM-L6-v2, one torch thread) on
64-row batches of the scale script's similarity input and prints the process's RSS and
USS (GiB) every 640 rows, as JSON lines. ``--trim-interval S`` sets how often the stage
calls glibc's ``malloc_trim(0)`` (``ragbatch.core.heap``): after a batch once S seconds have
passed since the last trim (0: every batch), ``never`` for not at all; the default is the
stage's own (``TRIM_INTERVAL_S``). Comparing ``never`` with ``0`` tells memory the stage
holds from freed memory the allocator keeps.

    python benchmarks/scale.py --stage similarity --sizes 100000 --generate-only
    python benchmarks/model_stage_memory.py --rows 6400 --trim-interval never
    python benchmarks/model_stage_memory.py --rows 6400 --trim-interval 0
    python benchmarks/model_stage_memory.py --rows 6400
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

DEFAULT_INPUT = Path(__file__).parent / "_data" / "scale" / "similarity_100000"


def _interval(text: str) -> float | str:
    """``--trim-interval``: ``never`` or seconds >= 0."""
    if text == "never":
        return text
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected seconds >= 0 or 'never', got {text!r}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    parser.add_argument("--rows", type=int, default=6400)
    parser.add_argument("--offset", type=int, default=20_000, help="first input row used")
    parser.add_argument(
        "--trim-interval",
        default=None,
        type=_interval,
        help="least seconds between malloc_trim(0) calls, 0 = every batch, "
        "'never'; default: the stage's",
    )
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import psutil
    import pyarrow.dataset as ds
    import torch

    from ragbatch.core.heap import HeapTrimmer
    from udfs.similarity import ModelStage

    torch.set_num_threads(1)
    table = ds.dataset(args.input, format="parquet", partitioning="hive").to_table()
    table = table.slice(args.offset, args.rows)
    stage = ModelStage(
        "minilm",
        {"type": "embedding", "num_gpus": 0, "batch_size": 64},
        [{"name": "semantic_similarity", "id": "semantic_similarity", "params": {}}],
    )
    if args.trim_interval is not None:
        stage.heap = HeapTrimmer(None if args.trim_interval == "never" else args.trim_interval)
    proc = psutil.Process()
    start = time.perf_counter()
    for i in range(0, table.num_rows, 64):
        stage(table.slice(i, 64))
        if (i // 64) % 10 == 9:
            mem = proc.memory_full_info()
            print(
                json.dumps(
                    {
                        "rows": i + 64,
                        "rss_gib": round(mem.rss / 2**30, 3),
                        "uss_gib": round(mem.uss / 2**30, 3),
                        "s": round(time.perf_counter() - start, 1),
                        "trims": stage.heap.trims,
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
