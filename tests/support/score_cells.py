"""Hand-made score files and reference intervals shared by the run-check and summary tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ragbatch.analysis.intervals import mean_ci
from ragbatch.analysis.summary_types import SummarySettings


def write_cells(path: Path, row_ids: list, metrics: list) -> str:
    """Write one ``ok`` cell of score 1.0 per (row id, metric) pair at ``path`` (the
    columns ``verify_run`` reads); return the path as a string."""
    n = len(row_ids)
    pq.write_table(
        pa.table(
            {
                "row_id": pa.array(row_ids, pa.string()),
                "metric": pa.array(metrics, pa.string()),
                "score": pa.array(np.ones(n)),
                "status": pa.array(["ok"] * n),
                "model": pa.nulls(n, pa.string()),
            }
        ),
        path,
    )
    return str(path)


def mean_ci_as_set(values: np.ndarray, settings: SummarySettings) -> tuple:
    """``mean_ci`` of ``values`` with the interval settings of ``settings``."""
    return mean_ci(
        values,
        confidence=settings.confidence,
        n_resamples=settings.n_resamples,
        seed=settings.seed,
        max_resample_n=settings.max_resample_n,
        max_distinct=settings.max_distinct,
    )
