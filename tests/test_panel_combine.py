"""The combine step of judge panels (udfs/panels.py) over whole Arrow batches, against
hand-worked tables: every combine rule, ties, judges that did not score (a failing
status, a null score), rows no judge scored, and batches of over 1,000 rows built by
repeating each table, so every row goes through the column-wise combination."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from ragbatch.core.columns import CELL_TYPE, cell_column
from ragbatch.core.errors import StageBugError
from ragbatch.judge.panel import PanelPlan, combine_cells
from udfs.panels import combine_panels

JUDGES = ("a", "b", "c")
Cell = tuple  # (score, status, reason)


def _plan(combine: str, judges: tuple[str, ...] = JUDGES, panel: str = "hs") -> PanelPlan:
    return PanelPlan(panel, judges, tuple(f"{panel}[{j}]" for j in judges), combine)


def _batch(plan: PanelPlan, rows: list[tuple[Cell, ...]], repeat: int = 1) -> pa.Table:
    """``rows`` (one cell per judge each) repeated ``repeat`` times, with row ids
    ``r0, r1, ...`` and a slice column, as the last judge stage hands them on."""
    rows = rows * repeat
    columns: dict[str, pa.Array] = {
        "row_id": pa.array([f"r{i}" for i in range(len(rows))]),
        "team": pa.array(["x" if i % 2 else "y" for i in range(len(rows))]),
    }
    for j, key in enumerate(plan.member_keys):
        columns[cell_column(key)] = pa.array(
            [
                {"score": r[j][0], "status": r[j][1], "reason": r[j][2], "model": f"m{j}"}
                for r in rows
            ],
            CELL_TYPE,
        )
    return pa.table(columns)


def _combined(plan: PanelPlan, batch: pa.Table) -> list[tuple]:
    out = combine_panels(batch, [plan])
    assert out.column_names == [*batch.column_names, cell_column(plan.id)]
    assert out.select(batch.column_names).equals(batch)
    return [
        (c["score"], c["status"], c["reason"], c["model"])
        for c in out.column(cell_column(plan.id)).to_pylist()
    ]


def _check(plan: PanelPlan, rows: list[tuple[Cell, ...]], expected: list[tuple]) -> None:
    """The combined cells of ``rows``, and of ``rows`` repeated past 1,000 rows, are
    ``expected`` (score, status, reason) row for row; so are :func:`combine_cells`'s."""
    assert len(rows) == len(expected)
    repeat = 1000 // len(rows) + 1
    got = _combined(plan, _batch(plan, rows, repeat))
    assert len(got) == len(rows) * repeat > 1000
    for i, cell in enumerate(got):
        score, status, reason = expected[i % len(rows)]
        assert cell == (score, status, reason, None), (i, rows[i % len(rows)])
    for row, want in zip(rows, expected):
        assert combine_cells(plan, list(row))[:3] == want


OK1, OK0 = (1.0, "ok", None), (0.0, "ok", None)


def test_majority():
    rows = [
        (OK1, OK1, OK0),
        (OK0, OK0, OK0),
        (OK1, (None, "parse_failure", "bad json"), OK0),  # tie once b is left out
        (OK1, (None, "judge_error", "HTTP 500"), OK1),
        (OK0, OK1, (1.0, "timeout", None)),  # a score beside a failing status: not counted
        ((None, "ok", None), OK1, OK0),  # ok with a null score: not counted
        ((0.5, "ok", None), OK1, OK1),  # not 1: counts as a 0
    ]
    expected = [
        (1.0, "ok", "judges split 2-1: a=1, b=1, c=0"),
        (0.0, "ok", None),
        (
            None,
            "not_applicable",
            "judges tied 1-1: a=1, c=0; b parse_failure, not counted; "
            "a majority needs an odd count",
        ),
        (1.0, "ok", "b judge_error, not counted"),
        (
            None,
            "not_applicable",
            "judges tied 1-1: a=0, b=1; c timeout, not counted; a majority needs an odd count",
        ),
        (
            None,
            "not_applicable",
            "judges tied 1-1: b=1, c=0; a ok, not counted; a majority needs an odd count",
        ),
        (1.0, "ok", "judges split 2-1: a=0.5, b=1, c=1"),
    ]
    _check(_plan("majority"), rows, expected)


def test_a_two_judge_majority_ties_on_every_disagreement():
    plan = _plan("majority", ("a", "b"))
    rows = [(OK1, OK0), (OK0, OK1), (OK1, OK1), (OK0, (None, "parse_failure", "x"))]
    expected = [
        (None, "not_applicable", "judges tied 1-1: a=1, b=0; a majority needs an odd count"),
        (None, "not_applicable", "judges tied 1-1: a=0, b=1; a majority needs an odd count"),
        (1.0, "ok", None),
        (0.0, "ok", "b parse_failure, not counted"),
    ]
    _check(plan, rows, expected)


def test_unanimous():
    rows = [
        (OK1, OK1, OK1),
        (OK1, OK1, OK0),
        (OK1, (None, "timeout", None), OK1),
        (OK0, OK0, OK0),
        ((None, "missing_input", "answer is empty"), OK1, OK0),
    ]
    expected = [
        (1.0, "ok", None),
        (0.0, "ok", "judges split 2-1: a=1, b=1, c=0"),
        (1.0, "ok", "b timeout, not counted"),
        (0.0, "ok", None),
        (0.0, "ok", "judges split 1-1: b=1, c=0; a missing_input, not counted"),
    ]
    _check(_plan("unanimous"), rows, expected)


def test_mean():
    rows = [
        ((0.8, "ok", None), (0.6, "ok", None), (0.5, "ok", None)),
        (OK1, OK1, OK0),
        ((0.75, "ok", None), (None, "parse_failure", "x"), (0.25, "ok", None)),
        ((0.5, "ok", "fine"), (0.5, "ok", None), (0.5, "ok", None)),
        (
            (0.123456, "ok", None),
            (None, "missing_input", "answer is empty"),
            (None, "missing_input", "answer is empty"),
        ),
        ((2 / 3, "ok", None), (1 / 3, "ok", None), (None, "ok", None)),
        ((12345.678, "ok", None), (0.0001, "ok", None), (-0.0, "ok", None)),
    ]
    expected = [
        # Python adds left to right: (0.8 + 0.6) + 0.5
        ((0.8 + 0.6 + 0.5) / 3, "ok", "judges split: a=0.8, b=0.6, c=0.5"),
        (2 / 3, "ok", "judges split 2-1: a=1, b=1, c=0"),
        (0.5, "ok", "judges split 1-1: a=0.75, c=0.25; b parse_failure, not counted"),
        (0.5, "ok", None),
        (0.123456, "ok", "b missing_input, not counted; c missing_input, not counted"),
        (0.5, "ok", "judges split 1-1: a=0.6667, b=0.3333; c ok, not counted"),
        ((12345.678 + 0.0001) / 3, "ok", "judges split: a=1.235e+04, b=0.0001, c=0"),
    ]
    _check(_plan("mean"), rows, expected)
    assert expected[0][0] == 0.6333333333333333 and expected[5][0] == 0.5


@pytest.mark.parametrize("combine", ["majority", "mean", "unanimous"])
def test_rows_no_judge_scored(combine):
    """The status most judges share (the earliest among equals), and the judges' own
    reason when they all gave the same one; the same under every rule."""
    rows = [
        ((None, "missing_input", "answer is empty"),) * 3,
        ((None, "judge_error", "boom"), (None, "timeout", None), (None, "judge_error", "boom")),
        ((None, "timeout", None), (None, "judge_error", None), (None, "parse_failure", "")),
        ((None, "parse_failure", "p"), (None, "parse_failure", "q"), (None, "parse_failure", "")),
        ((None, "ok", None),) * 3,  # ok without a score is counted as an error
        ((None, "timeout", None), (None, "ok", None), (None, "ok", "")),
        ((None, "judge_error", ""),) * 3,
    ]
    expected = [
        (None, "missing_input", "answer is empty"),
        (
            None,
            "judge_error",
            "no judge scored the row: a judge_error (boom); b timeout; c judge_error (boom)",
        ),
        (
            None,
            "timeout",
            "no judge scored the row: a timeout; b judge_error; c parse_failure",
        ),
        (
            None,
            "parse_failure",
            "no judge scored the row: a parse_failure (p); b parse_failure (q); c parse_failure",
        ),
        (None, "error", "every judge: error"),
        (None, "error", "no judge scored the row: a timeout; b error; c error"),
        (None, "judge_error", "every judge: judge_error"),
    ]
    _check(_plan(combine), rows, expected)


def test_details_name_each_judges_score_and_status():
    plan = _plan("majority")
    rows = [
        (OK1, (None, "parse_failure", "x"), (0.25, "ok", None)),
        ((-0.0, "ok", None), (1.0, "timeout", None), (None, "ok", None)),
    ]
    out = combine_panels(_batch(plan, rows), [plan]).column(cell_column("hs")).to_pylist()
    assert [c["details"] for c in out] == [
        '{"combine":"majority","scores":{"a":1.0,"b":null,"c":0.25},'
        '"statuses":{"a":"ok","b":"parse_failure","c":"ok"}}',
        '{"combine":"majority","scores":{"a":-0.0,"b":1.0,"c":null},'
        '"statuses":{"a":"ok","b":"timeout","c":"ok"}}',
    ]
    assert json.loads(out[0]["details"])["scores"] == {"a": 1.0, "b": None, "c": 0.25}


def test_several_panels_and_an_empty_batch():
    majority, mean = _plan("majority"), _plan("mean", panel="sim")
    rows = [(OK1, OK1, OK0)]
    batch = _batch(majority, rows)
    for key in mean.member_keys:
        batch = batch.append_column(cell_column(key), batch.column(cell_column("hs[a]")))
    out = combine_panels(batch, [majority, mean])
    assert out.column(cell_column("hs"))[0]["score"].as_py() == 1.0
    assert out.column(cell_column("sim"))[0]["score"].as_py() == 1.0  # three 1s
    empty = combine_panels(batch.slice(0, 0), [majority, mean])
    assert empty.num_rows == 0 and empty.schema.field(cell_column("sim")).type == CELL_TYPE


def test_a_missing_judge_column_is_a_stage_bug():
    plan = _plan("majority")
    batch = _batch(plan, [(OK1, OK1, OK0)])
    batch = batch.drop_columns([cell_column("hs[b]")])
    with pytest.raises(StageBugError) as err:
        combine_panels(batch, [plan])
    assert str(err.value) == (
        "panel 'hs': judge 'b' computed no cells (no column for 'hs[b]'); "
        "every judge of a panel gives one cell per row"
    )


def test_a_null_cell_or_status_is_a_stage_bug_naming_the_row():
    plan = _plan("majority")
    batch = _batch(plan, [(OK1, OK1, OK0)] * 5)
    cells = batch.column(cell_column("hs[c]")).to_pylist()
    cells[3] = None
    broken = batch.set_column(
        batch.column_names.index(cell_column("hs[c]")),
        cell_column("hs[c]"),
        pa.array(cells, CELL_TYPE),
    )
    with pytest.raises(StageBugError) as err:
        combine_panels(broken, [plan])
    assert str(err.value) == (
        "panel 'hs': judge 'c' gave no cell for row_id 'r3'; "
        "every judge of a panel gives one cell with a status per row"
    )
    cells = batch.column(cell_column("hs[a]")).to_pylist()
    cells[1] = {**cells[1], "status": None}
    broken = batch.set_column(
        batch.column_names.index(cell_column("hs[a]")),
        cell_column("hs[a]"),
        pa.array(cells, CELL_TYPE),
    )
    with pytest.raises(
        StageBugError, match="judge 'a' gave a cell without a status for row_id 'r1'"
    ):
        combine_panels(broken, [plan])
