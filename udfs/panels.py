"""The judge panels' combine step: each panel's cell from its judges' cells of the row.

Runs after every metric stage and before the wide-to-long stage
(:func:`ragbatch.pipeline.stage_builders.chain_stages`), as Ray Data tasks: every row of
the batch gets one cell per panel, so no row is lost or added.
"""

from __future__ import annotations

import pyarrow as pa

from ragbatch.core.columns import CELL_TYPE, cell_column
from ragbatch.judge.panel import PanelPlan, combine_cells


def combine_panels(batch: pa.Table, panels: list[PanelPlan]) -> pa.Table:
    """``batch`` with a cell column ``__ragbatch_cell::<panel id>`` appended per panel.

    Parameters
    ----------
    batch : pyarrow.Table
        ``n`` rows holding each panel member's cell column (:data:`CELL_TYPE` structs).
    panels : list of PanelPlan

    Returns
    -------
    pyarrow.Table
        ``batch``'s columns unchanged, then one :data:`CELL_TYPE` column per panel, ``n``
        rows, each cell from :func:`ragbatch.judge.panel.combine_cells` (``model`` null).

    Raises
    ------
    RuntimeError
        A member's cell column is missing or holds a null cell.
    """
    out = batch
    for panel in panels:
        members = []
        for key in panel.member_keys:
            if cell_column(key) not in batch.column_names:
                raise RuntimeError(f"panel {panel.id!r}: no cells were computed for {key!r}")
            members.append(batch.column(cell_column(key)).to_pylist())
        cells = []
        for row in zip(*members):
            if any(cell is None for cell in row):
                raise RuntimeError(f"panel {panel.id!r}: a judge's cell is missing for a row")
            combined = combine_cells(panel, [(c["score"], c["status"], c["reason"]) for c in row])
            score, status, reason, details = combined
            cells.append(
                {
                    "score": score,
                    "status": status,
                    "reason": reason,
                    "details": details,
                    "model": None,
                }
            )
        out = out.append_column(cell_column(panel.id), pa.array(cells, CELL_TYPE))
    return out
