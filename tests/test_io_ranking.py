"""Normalization of the ranking columns (context_ids, relevant_ids, relevance)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragbatch.config.job import InputSection
from ragbatch.core import columns as C
from ragbatch.io import ReadTask, check_columns, normalize, plan_read, read_task
from ragbatch.io.read import _read_row_groups, _read_text_columns_fast

TASK = ReadTask("/data/f.csv", "f.csv", "csv")


def cfg(**columns) -> InputSection:
    return InputSection(uri="unused", columns=columns)


def issues(table: pa.Table, column: str) -> list:
    return table.column(C.ISSUES).combine_chunks().field(column).to_pylist()


def test_a_job_mapping_none_keeps_the_canonical_schema_and_a_relevance_slice():
    raw = pa.table({"q": ["a"], "relevance": ["high"], "context_ids": ["x"]})
    out = normalize(raw, cfg(question="q"), TASK)
    assert out.schema == pa.schema(
        list(C.CANONICAL_SCHEMA) + [("relevance", pa.string()), ("context_ids", pa.string())]
    )


def test_a_job_mapping_one_gets_all_three_after_issues_and_renames_clashing_slices():
    raw = pa.table({"ids": [["a"]], "relevance": ["high"]})
    out = normalize(raw, cfg(context_ids="ids"), TASK)
    names = list(C.CANONICAL_SCHEMA.names) + list(C.RANKING) + ["input_relevance"]
    assert out.schema.names == names
    assert out.schema.field(C.ISSUES).type == C.RANKING_ISSUES_TYPE
    assert out.schema.field(C.RELEVANCE).type == C.RELEVANCE_TYPE
    assert out.to_pylist()[0]["relevant_ids"] is None


@pytest.mark.parametrize(
    "values,type_",
    [
        ([["d1", "7", None], [], None], pa.list_(pa.string())),
        ([["d1", "7", None], [], None], pa.large_list(pa.large_string())),
        (['["d1", 7, null]', "[]", None], pa.string()),
    ],
)
def test_ids_become_lists_of_strings(values, type_):
    out = normalize(pa.table({"i": pa.array(values, type_)}), cfg(relevant_ids="i"), TASK)
    assert out["relevant_ids"].to_pylist() == [["d1", "7", None], [], None]
    assert issues(out, "relevant_ids") == [None, None, None]


def test_integer_ids_become_their_decimal_text():
    raw = pa.table({"i": pa.array([[7, -1, 2**40]], pa.list_(pa.int64()))})
    out = normalize(raw, cfg(context_ids="i"), TASK)
    assert out["context_ids"].to_pylist() == [["7", "-1", str(2**40)]]


def test_unusable_ids_are_null_with_a_note():
    raw = pa.table({"i": ['["a", 1.0]', "[true]", "d1", '{"a": 1}', '["文書", "😀"]']})
    out = normalize(raw, cfg(context_ids="i"), TASK)
    assert out["context_ids"].to_pylist() == [None, None, None, None, ["文書", "😀"]]
    assert issues(out, "context_ids") == [
        "context_ids: item 1 is a float (1.0); ids must be strings or integers",
        "context_ids: item 0 is a boolean (true); ids must be strings or integers",
        "context_ids: not a JSON list of ids: 'd1'",
        "context_ids: expected a JSON list of ids, got an object ({\"a\": 1})",
        None,
    ]


def test_context_ids_of_another_length_than_contexts_are_null_with_a_note():
    raw = pa.table(
        {
            "c": pa.array([["x", "y"], ["x"], None, []], pa.list_(pa.string())),
            "i": pa.array([["a", "b"], ["a", "b"], ["a"], []], pa.list_(pa.string())),
        }
    )
    out = normalize(raw, cfg(contexts="c", context_ids="i"), TASK)
    assert out.num_rows == 4
    assert out["context_ids"].to_pylist() == [["a", "b"], None, ["a"], []]
    assert issues(out, "context_ids") == [
        None,
        "context_ids: 2 ids for 1 contexts; they must align, one id per context in the same order",
        None,
        None,
    ]


WANT = [[{"id": "d1", "grade": 2.0}, {"id": "7", "grade": 0.5}], [], None]


@pytest.mark.parametrize(
    "array",
    [
        pa.array([[("d1", 2), ("7", 0.5)], [], None], pa.map_(pa.string(), pa.float64())),
        pa.array(
            [[{"id": "d1", "grade": 2}, {"id": "7", "grade": 0.5}], [], None],
            pa.list_(pa.struct([("id", pa.string()), ("grade", pa.float32())])),
        ),
        pa.array(['{"d1": 2, "7": 0.5}', "{}", None]),
        pa.array(['[{"id": "d1", "grade": 2}, {"id": 7, "grade": 0.5}]', "[]", None]),
    ],
    ids=["map", "list_of_structs", "json_object", "json_list"],
)
def test_every_relevance_form_gives_the_same_value(array):
    out = normalize(pa.table({"r": array}), cfg(relevance="r"), TASK)
    assert out["relevance"].to_pylist() == WANT
    assert issues(out, "relevance") == [None, None, None]


def test_a_struct_of_ids_as_json_lines_objects_become():
    raw = pa.table({"r": pa.array([{"d1": 1, "d2": None}, {"d1": None, "d2": 3}])})
    out = normalize(raw, cfg(relevance="r"), TASK)
    assert out["relevance"].to_pylist() == [
        [{"id": "d1", "grade": 1.0}],
        [{"id": "d2", "grade": 3.0}],
    ]


def test_unusable_relevance_is_null_with_a_note():
    raw = pa.table(
        {
            "r": [
                '{"a": 1, "a": 2}',
                '[{"id": "a", "grade": 1}, {"id": "a", "grade": 2}]',
                '{"a": NaN}',
                '{"a": true}',
                '{"a": "2"}',
                "[1, 2]",
                "3",
                '{"a": -1}',
            ]
        }
    )
    out = normalize(raw, cfg(relevance="r"), TASK)
    got = out["relevance"].to_pylist()
    assert got[0] == [{"id": "a", "grade": 2.0}]  # a JSON object keeps its last "a"
    assert got[1:7] == [None] * 6 and got[7] == [{"id": "a", "grade": -1.0}]
    notes = issues(out, "relevance")
    assert notes[0] is None
    assert "an id is given more than once" in notes[1]
    assert "grades must be finite numbers" in notes[2]
    assert notes[3] == "relevance: the grade of 'a' is a boolean (true); grades must be numbers"
    assert notes[4] == "relevance: the grade of 'a' is a string ('2'); grades must be numbers"
    assert notes[5].startswith("relevance: item 0 is 1; list items must be objects")
    assert notes[6] == "relevance: expected an object of id -> grade, got an integer (3)"
    assert notes[7] is None


def test_validate_names_the_field_and_the_fix():
    schema = pa.schema(
        [
            ("ids", pa.list_(pa.float64())),
            ("rel", pa.int64()),
            ("good", pa.map_(pa.int32(), pa.int8())),
            ("flag", pa.bool_()),
        ]
    )
    problems = check_columns(
        InputSection(uri="x", columns={"context_ids": "ids", "relevance": "rel"}), schema
    )
    assert problems == [
        "input.columns.context_ids: column 'ids' has type list<item: double>; context_ids "
        "needs a list of string or integer ids, or a JSON list in a string column: map a "
        "column of that kind or convert this one",
        "input.columns.relevance: column 'rel' has type int64; relevance needs a map id -> "
        'grade, a list of {id, grade} structs, or a JSON object ({"d1": 2}) in a string '
        "column: map a column of that kind or convert this one",
    ]
    fine = InputSection(uri="x", columns={"relevance": "good"})
    assert check_columns(fine, schema) == []
    assert check_columns(InputSection(uri="x", columns={"relevant_ids": "flag"}), schema)


def test_json_lines_and_parquet_read_the_same_ranking(tmp_path):
    rows = [
        {"i": ["a", "b"], "r": [{"id": "a", "grade": 1.0}]},
        {"i": [], "r": []},
        {"i": None, "r": None},
    ]
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    parquet = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    tables = []
    for path in (jsonl, parquet):
        config = InputSection(uri=str(path), columns={"context_ids": "i", "relevance": "r"})
        task = plan_read(config)[0]
        tables.append(normalize(read_task(task, config), config, task))
    keep = list(C.RANKING)
    assert tables[0].select(keep).equals(tables[1].select(keep))


def test_parquet_fast_path_reads_string_ids_as_arrow_does(tmp_path):
    path = tmp_path / "ids.parquet"
    table = pa.table({"i": pa.array([["文書", None], [], None], pa.list_(pa.string()))})
    pq.write_table(table, path)
    parquet = pq.ParquetFile(path, memory_map=True)
    task = ReadTask(str(path), "ids.parquet", "parquet")
    fast = _read_text_columns_fast(parquet, task)
    assert fast is not None and fast.equals(_read_row_groups(parquet, task))
