"""notebooks/ run top to bottom (nbclient, a real IPython kernel) on the ARES nights that
tests/support/nightly_runs.py writes; their last cell prints one JSON line, checked here against
values worked out from the raw TSV and the replaced answers."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from support.nightly_runs import (
    ALTERED,
    ALTERED_NIGHT,
    NEW_SOURCES,
    NIGHTS,
    REEXPORTED,
    altered_answer,
    expected_answer_cells,
    read_ares,
)

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def _execute(name: str, output: Path, monkeypatch) -> dict:
    """Run notebooks/<name>.ipynb with RAGBATCH_OUTPUT=output; the JSON its last cell prints."""
    monkeypatch.setenv("RAGBATCH_OUTPUT", str(output))
    monkeypatch.delenv("RAGBATCH_RUN_ID", raising=False)
    notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    ).execute()
    text = "".join(
        o.get("text", "") for o in notebook.cells[-1].outputs if o.get("name") == "stdout"
    )
    return json.loads(text.strip().splitlines()[-1])


def _night_means(reexported_order: list[int]) -> dict[str, list[float]]:
    """Per answer metric, the mean over ok cells of each night, from the raw TSV."""
    header, rows = read_ares()
    answer = header.index("Answer")
    answers = {
        NIGHTS[0]: [r[answer] for r in rows],
        REEXPORTED: [rows[i][answer] for i in reexported_order if i >= 0]
        + [rows[i][answer] for i in NEW_SOURCES],
        ALTERED_NIGHT: [
            altered_answer(i) if i in ALTERED else r[answer] for i, r in enumerate(rows)
        ],
    }
    means: dict[str, list[float]] = {}
    for night in NIGHTS:
        cells: dict[str, list[float]] = {}
        for text in answers[night]:
            for metric, (status, score) in expected_answer_cells(text).items():
                if status == "ok":
                    cells.setdefault(metric, []).append(score)
        for metric, scores in cells.items():
            means.setdefault(metric, []).append(sum(scores) / len(scores))
    return means


def test_notebooks_are_committed_without_outputs():
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        notebook = nbformat.read(path, as_version=4)
        nbformat.validate(notebook)
        assert any("parameters" in c.metadata.get("tags", []) for c in notebook.cells), path.name
        for cell in notebook.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, path.name


@pytest.mark.slow
def test_single_night_notebook(ares_nights, monkeypatch):
    found = _execute("single_night", ares_nights.nightly, monkeypatch)
    assert found["run_id"] == ares_nights.run_ids[ALTERED_NIGHT]  # the latest committed run
    empty = sum(1 for i in ALTERED if altered_answer(i) == "")
    assert found["cells"] == 200 * 6
    # 4 answer metrics are missing_input and the callback not_applicable on empty answers
    assert found["status"] == {
        "ok": 1200 - 5 * empty,
        "missing_input": 4 * empty,
        "not_applicable": empty,
    }
    # 10 worst ok cells for each of 6 metrics, plus the failed cells (up to 10) of the 4
    assert found["worst_rows"] == 6 * 10 + 4 * empty


@pytest.mark.slow
def test_trend_notebook(ares_nights, monkeypatch):
    found = _execute("trend", ares_nights.nightly, monkeypatch)
    assert found["runs"] == [ares_nights.run_ids[n] for n in NIGHTS]
    for metric, means in _night_means(ares_nights.reexported_order).items():
        assert found["means"][metric] == pytest.approx(means), metric
    assert found["means"]["context_length"][0] == found["means"]["context_length"][2]
    assert "not_a_refusal" in found["flagged"] and "context_length" not in found["flagged"]
