"""Cost of verify_run's row-id fingerprint: a prefixed row id against a remixed hash.

``ragbatch.io.write._FINGERPRINT`` sums two 64-bit hashes of each metric's row ids. The
second was ``hash(row_id, 'ragbatch-row-id')``, which DuckDB computes from
``hash(row_id)`` alone (so two row ids of equal hash agree on both); it is now
``hash('ragbatch-row-id:' || row_id)``. This times :func:`ragbatch.io.write.verify_run`
over the same score files with each expression, interleaved (baseline, candidate,
baseline, ...), and prints each wall time and CPU time (every thread of the process: less
sensitive to other work on a shared machine), the medians, their ratios and the load
average before and after.

Run: .venv/bin/python benchmarks/row_id_fingerprint.py [rows] [metrics] [repeats]
"""

from __future__ import annotations

import datetime as dt
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ragbatch.config.job import OutputSection
from ragbatch.io import write

#: The fingerprint before the prefixed row id (the baseline).
REMIXED = "sum(hash(row_id)::HUGEINT) AS h1, sum(hash(row_id, 'ragbatch-row-id')::HUGEINT) AS h2"


def main(n_rows: int = 1_000_000, n_metrics: int = 6, repeats: int = 5) -> None:
    folder = tempfile.mkdtemp(prefix="ragbatch-fingerprint-")
    layout = write.OutputLayout.for_run(
        OutputSection(uri=os.path.join(folder, "out")), dt.date(2026, 1, 2), "bench"
    )
    ids = pc.binary_join_element_wise(
        "input/part-00017.parquet:", pa.array(np.arange(n_rows).astype(str)), ""
    )
    metrics = [f"m{i}" for i in range(n_metrics)]
    files = []
    for metric in metrics:
        path = os.path.join(folder, f"{metric}.parquet")
        pq.write_table(
            pa.table(
                {
                    "row_id": ids,
                    "metric": pa.array(np.full(n_rows, metric)),
                    "score": pa.array(np.ones(n_rows)),
                    "status": pa.array(np.full(n_rows, "ok")),
                    "model": pa.nulls(n_rows, pa.string()),
                }
            ),
            path,
        )
        files.append(path)
    prefixed = write._FINGERPRINT
    print(f"load before: {os.getloadavg()}")
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(repeats):
        for name, expression in (("remixed", REMIXED), ("prefixed", prefixed)):
            write._FINGERPRINT = expression
            wall, cpu = time.perf_counter(), time.process_time()
            write.verify_run(layout, files, metrics, n_rows)
            times.setdefault((name, "wall"), []).append(time.perf_counter() - wall)
            times.setdefault((name, "CPU"), []).append(time.process_time() - cpu)
    write._FINGERPRINT = prefixed
    print(f"load after: {os.getloadavg()}")
    for (name, clock), values in times.items():
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"{name} {clock}: {shown} s; median {statistics.median(values):.2f} s")
    for clock in ("wall", "CPU"):
        ratio = statistics.median(times[("prefixed", clock)]) / statistics.median(
            times[("remixed", clock)]
        )
        print(
            f"{n_rows} rows x {n_metrics} metrics, {clock}: prefixed / remixed median {ratio:.3f}"
        )


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
