"""Hostile values in the ranking columns: each becomes a null value with a note on its
row (the metrics then say ``missing_input``), never an exception that loses the batch."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from ragbatch.config.job import InputSection
from ragbatch.core import columns as C
from ragbatch.core.errors import ConfigError, InputError
from ragbatch.scoring.registry import get_metric
from ragbatch.io import ReadTask, normalize, plan_read, read_task
from ragbatch.io.read import peek_schema
from support.metric_frames import run_metric

TASK = ReadTask("/data/f.csv", "f.csv", "csv")


def _normalize(**columns: pa.Array) -> pa.Table:
    raw = pa.table({f"in_{name}": values for name, values in columns.items()})
    mapping = {name: f"in_{name}" for name in columns}
    return normalize(raw, InputSection(uri="unused", columns=mapping), TASK)


def _issues(table: pa.Table, column: str) -> list:
    return table.column(C.ISSUES).combine_chunks().field(column).to_pylist()


def test_an_integer_grade_past_the_float_range_is_a_grade_that_is_not_finite():
    huge = "9" * 400  # JSON allows it; no float64 holds it
    out = _normalize(relevance=pa.array(['{"d1": ' + huge + "}", '{"d1": 2}']))
    assert out["relevance"].to_pylist() == [None, [{"id": "d1", "grade": 2.0}]]
    note = _issues(out, "relevance")[0]
    assert note.startswith("relevance: a grade is null, NaN or infinite")


def test_a_json_integer_of_more_digits_than_python_parses_is_a_note_not_a_crash():
    # Python refuses to parse integers of more than 4300 digits (a ValueError that is
    # not a JSONDecodeError)
    huge = "1" * 5000
    out = _normalize(
        context_ids=pa.array(["[" + huge + "]", '["d1"]']),
        relevance=pa.array(['{"d1": ' + huge + "}", '[{"id": ' + huge + ', "grade": 1}]']),
    )
    assert out["context_ids"].to_pylist() == [None, ["d1"]]
    assert out["relevance"].to_pylist() == [None, None]
    ids_note = _issues(out, "context_ids")[0]
    assert ids_note.startswith("context_ids: not a JSON list of ids: '[1111")
    assert all(
        note.startswith("relevance: not a JSON object of id -> grade: ")
        for note in _issues(out, "relevance")
    )


def _graded(id_type: pa.DataType, grade_type: pa.DataType, rows: list) -> pa.Array:
    entry = pa.struct([("id", id_type), ("grade", grade_type)])
    return pa.array(rows, pa.list_(entry))


def test_structs_of_a_type_validate_refuses_are_not_cast_when_a_later_file_has_them():
    # validate checks the first file's schema; a later Parquet file may hold booleans,
    # strings or float ids where the first held numbers: no silent cast to 1.0 / "1.5"
    booleans = _graded(pa.string(), pa.bool_(), [[{"id": "d1", "grade": True}]])
    strings = _graded(pa.string(), pa.string(), [[{"id": "d1", "grade": "2"}]])
    float_ids = _graded(pa.float64(), pa.int64(), [[{"id": 1.5, "grade": 2}]])
    notes = []
    for values in (booleans, strings, float_ids):
        out = _normalize(relevance=values)
        assert out["relevance"].to_pylist() == [None]
        notes += _issues(out, "relevance")
    assert notes == [
        "relevance: the grade of 'd1' is a boolean (true); grades must be numbers",
        "relevance: the grade of 'd1' is a string ('2'); grades must be numbers",
        "relevance: id 1.5 is a float; ids must be strings or integers",
    ]


def test_structs_of_usable_types_still_take_the_arrow_path():
    values = _graded(pa.int32(), pa.float32(), [[{"id": 7, "grade": 0.5}], None, []])
    out = _normalize(relevance=values)
    assert out["relevance"].to_pylist() == [[{"id": "7", "grade": 0.5}], None, []]


HUGE = "[" + "1" * 5000 + "]"
DEEP = "[" * 100_000 + "]" * 100_000
TOO_LONG = "an integer of more than 4300 digits, which Python does not read; write it as a string"
TOO_DEEP = "lists or objects nested too deeply to read; fix or remove that value"


@pytest.mark.parametrize(
    "suffix,text,message",
    [
        (".jsonl", '{"ids": ["d1"]}\n{"ids": ' + HUGE + "}\n", ", line 2: " + TOO_LONG),
        (".json", '[{"ids": ["d1"]}, {"ids": ' + HUGE + "}]", ": " + TOO_LONG),
        (".jsonl", '{"ids": ["d1"]}\n{"ids": ' + DEEP + "}\n", ", line 2: " + TOO_DEEP),
        (".json", '[{"ids": ["d1"]}, {"ids": ' + DEEP + "}]", ": " + TOO_DEEP),
    ],
)
def test_json_input_python_cannot_read_is_an_input_error_naming_the_line(
    tmp_path, suffix, text, message
):
    # valid JSON that json.loads refuses with a ValueError or RecursionError, not a
    # JSONDecodeError: a huge id or a hostile nesting in one record
    path = tmp_path / f"in{suffix}"
    path.write_text(text)
    config = InputSection(uri=str(path), columns={"context_ids": "ids"})
    with pytest.raises(InputError) as info:
        read_task(plan_read(config)[0], config)
    assert str(info.value).startswith(f"{path}{message}")


def test_a_null_id_or_grade_in_a_json_list_gets_the_note_of_the_other_forms():
    entry = pa.struct([("id", pa.string()), ("grade", pa.float64())])
    as_structs = pa.array(
        [[{"id": None, "grade": 1.0}], [{"id": "a", "grade": None}]], pa.list_(entry)
    )
    as_json = pa.array(['[{"id": null, "grade": 1}]', '[{"id": "a", "grade": null}]'])
    notes = [
        'relevance: an entry has a null id (\'{"null": 1.0}\')',
        'relevance: a grade is null, NaN or infinite; grades must be finite numbers (\'{"a": null}\')',
    ]
    for values in (as_structs, as_json):
        out = _normalize(relevance=values)
        assert out["relevance"].to_pylist() == [None, None]
        assert _issues(out, "relevance") == notes


@pytest.mark.parametrize("k", [True, "5", 5.0])
def test_k_is_an_integer_as_written_not_a_boolean_or_text_taken_for_one(k):
    # YAML `k: yes` is True, which a lax integer takes for k = 1
    with pytest.raises(ConfigError, match="params.k: Input should be a valid integer"):
        get_metric("precision_at_k").from_params({"k": k})


def test_a_row_judging_a_million_ids_is_matched_without_comparing_every_pair():
    # pairwise comparison of 1,000,000 judged ids (and of 3,000 ranked ones, a third of
    # them repeats) would not finish; the wide rows are sorted by key instead
    judged = [f"r{i}" for i in range(1_000_000)]
    ranking = [f"r{i * 997}" for i in range(2000)] + [f"r{i * 997}" for i in range(1000)]
    rows = [{"context_ids": [], "relevant_ids": ["x"]} for _ in range(2000)]
    rows.append({"context_ids": ranking, "relevant_ids": judged})
    hits = sum(1 for i in range(2000) if i * 997 < 1_000_000)  # 1,004 of the 2,000
    cells = run_metric(get_metric("recall_at_k").from_params({}), rows)
    assert [c["score"] for c in cells[:2000]] == [0.0] * 2000
    assert cells[-1]["score"] == pytest.approx(hits / 1_000_000)
    assert json.loads(cells[-1]["details"]) == {
        "retrieved": 3000,
        "relevant": 1_000_000,
        "hits": hits,
    }


def test_relevance_objects_of_json_lines_stay_json_text_not_a_struct_of_every_id(tmp_path):
    # each query judges its own documents: as a struct the column would hold one field per
    # id of the whole file in every row (rows x ids), minutes and gigabytes on a real file
    path = tmp_path / "in.jsonl"
    lines = [{"ids": [f"d{r}-0", f"d{r}-1"], "rel": {f"d{r}-0": 2, f"d{r}-1": 0}} for r in range(3)]
    lines.append({"ids": ["x"], "rel": None})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    config = InputSection(uri=str(path), columns={"context_ids": "ids", "relevance": "rel"})
    task = plan_read(config)[0]
    raw = read_task(task, config)
    assert raw.schema.field("rel").type == pa.string()
    assert peek_schema(config).field("rel").type == pa.string()
    out = normalize(raw, config, task)
    assert out["relevance"].to_pylist() == [
        [{"id": f"d{r}-0", "grade": 2.0}, {"id": f"d{r}-1", "grade": 0.0}] for r in range(3)
    ] + [None]
    assert _issues(out, "relevance") == [None] * 4
    # a slice column of objects is still a struct
    slices = InputSection(uri=str(path), columns={"context_ids": "ids"})
    assert pa.types.is_struct(read_task(plan_read(slices)[0], slices).schema.field("rel").type)
