"""The run's error budget, checked over the written scores before the run commits."""

from __future__ import annotations

from ragbatch.core.errors import RunError
from ragbatch.io.write import OutputLayout, connect, file_list
from ragbatch.core.status import ERROR


def check_error_budget(layout: OutputLayout, files: list[str], n_rows: int, budget: float) -> None:
    """Stop the run when more than ``budget`` x ``n_rows`` rows have an ``error`` cell.

    Parameters
    ----------
    layout : OutputLayout
        The run's output layout (its filesystem opens ``files``).
    files : list of str
        The run's score files.
    n_rows : int
        Input rows of the run.
    budget : float
        ``run.error_budget``, a fraction in [0, 1].

    Raises
    ------
    RunError
        Too many rows have status ``error`` on some metric; the message gives the count,
        the share, the budget and the most common reasons with a row id each.
    """
    if not files or n_rows == 0:
        return
    con = connect(layout)
    source = f"read_parquet({file_list(layout, files)}, hive_partitioning=false)"
    n_error = con.execute(
        f"SELECT count(DISTINCT row_id) FROM {source} WHERE status = '{ERROR}'"
    ).fetchone()[0]
    if n_error <= budget * n_rows:
        return
    reasons = con.execute(
        f"SELECT metric, reason, count(*) n, min(row_id) FROM {source} WHERE status = '{ERROR}' "
        "GROUP BY ALL ORDER BY n DESC, metric LIMIT 3"
    ).fetchall()
    listed = "\n".join(
        f"  - {n} x {metric}: {reason} (e.g. row {row})" for metric, reason, n, row in reasons
    )
    raise RunError(
        f"run {layout.run_id} is not committed: {n_error} of {n_rows} rows ({n_error / n_rows:.1%}) "
        f"have status error on some metric, over run.error_budget = {budget:g}. Most common:\n"
        f"{listed}\nFix the cause and run again with the same --run-id (rows with an error "
        "are scored again, the rest are kept), or raise run.error_budget to commit them as errors."
    )
