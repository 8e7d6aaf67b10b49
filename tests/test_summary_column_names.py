"""Slice and label columns whose names the summary's own SQL could mistake for its columns.

DuckDB reads identifiers without regard to ASCII case, so ``Score`` names the column
``score``, and its Parquet reader renames the later of two such columns of a file
(``Score`` -> ``Score_1``). The summary's working columns (value codes, label values) live
under ``__ragbatch_``, and a run renames an input column that DuckDB could not tell apart
from another ``input_<name>``. Every figure here is worked out in plain Python from the
input rows, not taken from the summary code.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from support.score_cells import write_cells
from ragbatch.analysis.summary import summarize_run
from ragbatch.analysis.summary_types import MetricInfo
from ragbatch.config.job import InputSection, JobConfig, OutputSection
from ragbatch.core.errors import OutputError
from ragbatch.io.budget import check_error_budget
from ragbatch.io.schema import slice_columns
from ragbatch.io.write import OutputLayout, verify_run
from ragbatch.pipeline.runner import run_job

QUOTED = 'a "b c'

#: Input slice column -> (its name in the scores table, its values to draw from).
SLICES = {
    "score": ("input_score", ["lo", "hi", None]),
    "G0": ("G0", ["x", "y"]),
    QUOTED: (QUOTED, ["é", "日本", "q'"]),
    "v": ("v", ["p", "q"]),
    "Status": ("input_Status", ["s1", "s2"]),
    "region": ("region", ["n", "s"]),
    "Region": ("input_Region", ["e", "w"]),
}

#: Metric id -> (input label column, its name in the scores table).
LABELS = {"exact_match": ("metric", "input_metric"), "length": ("g1", "g1")}


def _rows(n: int = 60) -> dict[str, list]:
    rng = np.random.default_rng(5)
    refs = [["a", "b", "c"][i] for i in rng.integers(0, 3, n)]
    kinds = rng.integers(0, 3, n)
    answers = [
        r if k == 0 else ("zz" if k == 1 else "a longer answer") for r, k in zip(refs, kinds)
    ]
    data: dict[str, list] = {"question": [f"q{i}" for i in range(n)], "answer": answers}
    data["reference"] = refs
    for column, (_, values) in SLICES.items():
        data[column] = [values[i] for i in rng.integers(0, len(values), n)]
    for column, _ in LABELS.values():
        data[column] = [[0.0, 1.0, None][i] for i in rng.integers(0, 3, n)]
    return data


def _expected(data: dict[str, list]) -> dict[tuple, dict]:
    """(metric, scores-table slice column or None, slice value) -> the figures of that
    summary row, from the input rows: exact_match is answer == reference, length is
    1 <= len(answer) <= 2; every cell is ok."""
    scores = {
        "exact_match": [float(a == r) for a, r in zip(data["answer"], data["reference"])],
        "length": [float(1 <= len(a) <= 2) for a in data["answer"]],
    }
    n = len(data["answer"])
    groups: list[tuple[str | None, str | None, list[int]]] = [(None, None, list(range(n)))]
    for column, (out, values) in SLICES.items():
        for value in dict.fromkeys(data[column]):
            groups.append((out, value, [i for i in range(n) if data[column][i] == value]))
    out = {}
    for metric, f in scores.items():
        label_column, label_out = LABELS[metric]
        for column, value, rows in groups:
            labels = [data[label_column][i] for i in rows if data[label_column][i] is not None]
            out[(metric, column, value)] = {
                "n_total": len(rows),
                "n_ok": len(rows),
                "mean": sum(f[i] for i in rows) / len(rows),
                "pass_rate": sum(f[i] for i in rows) / len(rows),
                "label_column": label_out,
                "n_labelled": len(labels),
                "labels_mean": sum(labels) / len(labels) if labels else None,
            }
    return out


def test_slice_and_label_columns_named_like_the_summarys_own(tmp_path):
    # Slices `score`, `G0`, `a "b c`, `v`, `Status`, `region` and `Region`; labels in
    # columns `metric` and `g1`. Before, `Status` and `Region` were summarized with the
    # values of `status` and `region`, the labels in `g1` were read as slice codes, and a
    # slice named `v` stopped the summary with a binder error.
    data = _rows()
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table(data), source)
    config = JobConfig.from_dict(
        {
            "run": {"name": "names", "run_date": "2026-02-01", "executor": "in_process"},
            "input": {
                "uri": str(source),
                "columns": {"question": "question", "answer": "answer", "reference": "reference"},
                "slice_columns": list(SLICES),
            },
            "output": {"uri": str(tmp_path / "out")},
            "metrics": [
                {"name": "exact_match"},
                {"name": "response_length", "id": "length", "params": {"max_chars": 2}},
            ],
            "labels": {"columns": {m: c for m, (c, _) in LABELS.items()}},
        }
    )
    result = run_job(config, run_id="names")
    summary = pq.read_table(result.layout.summary_path).to_pylist()
    got = {(r["metric"], r["slice_column"], r["slice_value"]): r for r in summary}
    want = _expected(data)
    assert set(got) == set(want)
    for key, figures in want.items():
        row = {k: got[key][k] for k in figures}
        for k in ("mean", "pass_rate", "labels_mean"):
            if figures[k] is not None:
                assert row[k] == pytest.approx(figures[k], rel=1e-12), (key, k)
                row[k] = figures[k]
        assert row == figures, key


def test_slice_columns_that_duckdb_cannot_tell_apart_are_renamed():
    # DuckDB folds ASCII case only: `É` and `é` stay two columns. `input_METRIC` would be
    # `input_metric` to DuckDB, so METRIC takes the prefix twice.
    names = ["q", "Score", "region", "Region", "G0", "É", "é", "METRIC", "input_metric"]
    config = InputSection(uri="unused", columns={"question": "q"})
    schema = pa.schema([(n, pa.string()) for n in names])
    assert slice_columns(config, schema) == [
        ("Score", "input_Score"),
        ("region", "region"),
        ("Region", "input_Region"),
        ("G0", "G0"),
        ("É", "É"),
        ("é", "é"),
        ("METRIC", "input_input_METRIC"),
        ("input_metric", "input_metric"),
    ]


@pytest.fixture
def layout(tmp_path):
    return OutputLayout.for_run(OutputSection(uri=str(tmp_path / "out")), dt.date(2026, 1, 2), "r")


def test_scores_written_before_the_renaming_are_refused_not_misread(layout, tmp_path):
    # A slice `Score` beside `score`: DuckDB would hand the summary the scores as its
    # values. The run check and the error budget read the cells' own columns, which come
    # first in a scores file, so decoys after them change nothing.
    path = write_cells(tmp_path / "s.parquet", ["a", "b", "a", "b"], ["m1", "m1", "m2", "m2"])
    table = pq.read_table(path).append_column("details", pa.nulls(4, pa.string()))
    for name, value in [("Score", "x"), ("STATUS", "error"), ("Row_ID", "z"), ("Metric", "m3")]:
        table = table.append_column(name, pa.array([value] * 4))
    pq.write_table(table, path)
    assert verify_run(layout, [path], ["m1", "m2"], 2).counts == {
        "m1": {"ok": 2},
        "m2": {"ok": 2},
    }
    check_error_budget(layout, [path], 2, 0.0)
    with pytest.raises(OutputError, match="column 'Score' of the scores differs from column "):
        summarize_run(layout, [path], [MetricInfo("m1", "exact_match", True)], ["Score"])
