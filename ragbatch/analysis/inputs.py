"""The input rows behind a committed run, read again from the run's input.

The scores table holds no question, contexts or answer, only ``row_id``. Reports and
comparisons that show inputs, or pair rows by content, read them again from the input
the manifest names, with the same reader and normalization as the run
(:func:`ragbatch.io.read.read_task`, :func:`ragbatch.io.schema.normalize`), so row ids
come out the same. The input must be unchanged: its fingerprint (file paths, sizes,
ETags or modification times) must equal the manifest's, otherwise the texts are not
used and the caller gets a note saying why.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import polars as pl

from ragbatch.core import columns as C
from ragbatch.analysis.runs import CommittedRun, recorded_storage_options
from ragbatch.config.job import InputSection
from ragbatch.core.errors import RagbatchError

#: Canonical columns returned by :func:`load_inputs`.
INPUT_COLUMNS: tuple[str, ...] = (C.ROW_ID, C.QUESTION, C.CONTEXTS, C.ANSWER, C.REFERENCE)


@dataclass
class RunInputs:
    """Result of :func:`load_inputs`.

    Attributes
    ----------
    rows : polars.DataFrame or None
        Columns :data:`INPUT_COLUMNS` (``contexts`` is ``list[str]``), one row per
        requested row id found; None when the input could not be used.
    note : str or None
        Why ``rows`` is None (input moved, changed or unreadable), else None.
    """

    rows: pl.DataFrame | None
    note: str | None = None


def _input_section(run: CommittedRun) -> InputSection:
    section = dict(run.manifest.config.get("input") or {})
    # Credentials are redacted in the manifest: drop them so that the filesystem falls
    # back to the environment's credentials.
    section["storage_options"] = recorded_storage_options(section.get("storage_options"))
    return InputSection.model_validate(section)


def load_inputs(run: CommittedRun, row_ids: Iterable[str] | None = None) -> RunInputs:
    """Read the canonical input columns of ``run``'s rows again.

    Parameters
    ----------
    run : CommittedRun
    row_ids : iterable of str, optional
        Keep only these rows (default: every row). The whole input is still read.

    Returns
    -------
    RunInputs
        ``rows`` with :data:`INPUT_COLUMNS`, or ``rows=None`` and a ``note`` when the
        manifest has no input section, the input cannot be read (a relative ``input.uri``
        is resolved against the current directory), or its fingerprint differs from the
        manifest's (the input changed after the run). Never raises for those cases.

    Notes
    -----
    Cost: one read of the whole input on this process (no Ray), about what the run's
    read stage does; use it for reports and comparisons, not on hot paths.
    """
    from ragbatch.io.read import input_fingerprint, plan_read, read_task
    from ragbatch.io.schema import normalize

    recorded = run.manifest.input.fingerprint.get("sha256")
    try:
        section = _input_section(run)
        tasks = plan_read(section)
        current = input_fingerprint(section, tasks)["sha256"]
        if recorded and current != recorded:
            return RunInputs(
                None,
                f"the input {section.uri} changed after run {run.run_id} "
                "(its fingerprint differs from the manifest's), so its "
                "texts are not shown",
            )
        tables = [normalize(read_task(task, section), section, task, slices=[]) for task in tasks]
    except (RagbatchError, ValueError) as exc:
        return RunInputs(None, f"the input of run {run.run_id} could not be read again: {exc}")
    frames = [pl.from_arrow(t.select(list(INPUT_COLUMNS))) for t in tables]
    rows = (
        pl.concat(frames, how="vertical_relaxed")
        if frames
        else pl.DataFrame(
            schema={
                c: (pl.List(pl.String) if c == C.CONTEXTS else pl.String) for c in INPUT_COLUMNS
            }
        )
    )
    if row_ids is not None:
        rows = rows.filter(pl.col(C.ROW_ID).is_in(list(row_ids)))
    return RunInputs(rows)
