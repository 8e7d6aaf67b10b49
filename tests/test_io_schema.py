"""Normalization onto the canonical schema, slice columns and mapping checks."""

from __future__ import annotations

import json
import unicodedata

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragbatch.core import columns as C
from ragbatch.config.job import InputSection
from ragbatch.core.errors import InputError
from ragbatch.io import ReadTask, check_columns, normalize, plan_read, read_task, slice_columns
from ragbatch.io.contexts import _parse_one, _strict_json_lists
from ragbatch.core.reasons import quote

TASK = ReadTask("/data/f.csv", "f.csv", "csv")


def cfg(**kwargs) -> InputSection:
    return InputSection(uri="unused", **kwargs)


def issues(table: pa.Table, column: str) -> list:
    return table.column(C.ISSUES).combine_chunks().field(column).to_pylist()


def contexts_of(values, type_=pa.string(), **kwargs):
    raw = pa.table({"c": pa.array(values, type_)})
    out = normalize(raw, cfg(columns={"contexts": "c"}, **kwargs), TASK)
    return out["contexts"].to_pylist(), issues(out, "contexts")


# --------------------------------------------------------------------------- shape


def test_output_schema_is_canonical_then_slices():
    raw = pa.table({"q": ["a", None], "app": ["x", "y"], "n": [1, 2]})
    out = normalize(raw, cfg(columns={"question": "q"}), TASK)
    assert out.schema == pa.schema(
        list(C.CANONICAL_SCHEMA) + [("app", pa.string()), ("n", pa.int64())]
    )
    assert out.to_pydict() == {
        "row_id": ["f.csv:0", "f.csv:1"],
        "question": ["a", None],
        "contexts": [None, None],
        "answer": [None, None],
        "reference": [None, None],
        "latency_s": [None, None],
        "_issues": [dict.fromkeys(C.NULLABLE_INPUTS)] * 2,
        "app": ["x", "y"],
        "n": [1, 2],
    }


def test_empty_table():
    raw = pa.table({"q": pa.array([], pa.string())})
    out = normalize(raw, cfg(columns={"question": "q", "answer": "missing"}), TASK)
    assert out.num_rows == 0
    assert out.schema.names[:7] == list(C.CANONICAL_SCHEMA.names)


# --------------------------------------------------------------------------- row ids


def test_duplicate_rows_get_distinct_ids_and_ids_use_row_offset():
    raw = pa.table({"q": ["same", "same", "same"]})
    task = ReadTask("/d/p.parquet", "run=1/p.parquet", "parquet", row_offset=40, row_groups=(4,))
    out = normalize(raw, cfg(columns={"question": "q"}), task)
    assert out["row_id"].to_pylist() == [
        "run=1/p.parquet:40",
        "run=1/p.parquet:41",
        "run=1/p.parquet:42",
    ]


def test_row_ids_are_stable_across_two_reads(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("q\nx\nx\ny\n")
    config = InputSection(uri=str(path), columns={"question": "q"})
    runs = []
    for _ in range(2):
        runs.append(
            [
                normalize(read_task(t, config), config, t)["row_id"].to_pylist()
                for t in plan_read(config)
            ]
        )
    assert runs[0] == runs[1] == [["t.csv:0", "t.csv:1", "t.csv:2"]]


def test_mapped_row_id_column_is_cast_to_string():
    raw = pa.table({"id": [7, 8], "q": ["a", "b"]})
    out = normalize(raw, cfg(columns={"row_id": "id", "question": "q"}), TASK)
    assert out["row_id"].to_pylist() == ["7", "8"]
    assert out.column_names[7:] == []  # the id column is mapped, so not a slice column


@pytest.mark.parametrize(
    "ids, message",
    [
        (
            ["a", None, None],
            r"f\.csv: the row_id column 'id' is null in 2 row\(s\) \(first at row 1\)",
        ),
        (["a", "b", "a"], r"f\.csv: the row_id column 'id' repeats 1 value\(s\) \(e\.g\. 'a'\)"),
    ],
)
def test_bad_mapped_row_ids(ids, message):
    raw = pa.table({"id": ids})
    with pytest.raises(InputError, match=message):
        normalize(raw, cfg(columns={"row_id": "id"}), TASK)


# --------------------------------------------------------------------------- text columns


def test_text_passes_through_byte_identical():
    values = [
        "  padded  ",
        "",
        None,
        "漢字とかな",
        "emoji 👩‍👩‍👧 ok",
        "e\u0301 combining",  # not NFC-normalized
        "line\r\nbreak",
    ]
    raw = pa.table({"a": values})
    out = normalize(raw, cfg(columns={"answer": "a"}), TASK)
    got = out["answer"].to_pylist()
    assert got == values
    assert [g.encode() if g is not None else None for g in got] == [
        v.encode() if v is not None else None for v in values
    ]
    assert unicodedata.normalize("NFC", got[5]) != got[5]
    assert issues(out, "answer") == [None] * len(values)


def test_large_string_and_dictionary_columns_are_text():
    raw = pa.table(
        {
            "q": pa.array(["a", None], pa.large_string()),
            "r": pa.array(["x", "x"]).dictionary_encode(),
        }
    )
    out = normalize(raw, cfg(columns={"question": "q", "reference": "r"}), TASK)
    assert out["question"].to_pylist() == ["a", None]
    assert out["reference"].to_pylist() == ["x", "x"]


def test_non_string_arrow_column_in_text_is_null_with_issue():
    raw = pa.table({"a": [42, None, 7]})
    out = normalize(raw, cfg(columns={"answer": "a"}), TASK)
    assert out["answer"].to_pylist() == [None, None, None]
    assert issues(out, "answer") == [
        "answer: expected a string, got int (42)",
        None,
        "answer: expected a string, got int (7)",
    ]


def test_mixed_json_values_in_text_columns(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [
        {"q": "ok", "a": "42"},
        {"q": 3.5, "a": 42},
        {"q": True, "a": {"text": "nested"}},
        {"q": ["x"], "a": None},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    config = InputSection(uri=str(path), columns={"question": "q", "answer": "a"})
    task = plan_read(config)[0]
    out = normalize(read_task(task, config), config, task)
    assert out["question"].to_pylist() == ["ok", None, None, None]
    assert out["answer"].to_pylist() == ["42", None, None, None]
    assert issues(out, "question") == [
        None,
        "question: expected a string, got float (3.5)",
        "question: expected a string, got bool (true)",
        'question: expected a string, got list (["x"])',
    ]
    assert issues(out, "answer") == [
        None,
        "answer: expected a string, got int (42)",
        'answer: expected a string, got object ({"text": "nested"})',
        None,
    ]
    assert out.column_names[7:] == []  # the marker column never becomes a slice


# --------------------------------------------------------------------------- latency


def test_latency_seconds_milliseconds_and_bad_values():
    raw = pa.table({"l": ["1.5", " 250 ", "12ms", None, "", "-3", "nan", "1e3"]})
    out = normalize(raw, cfg(columns={"latency_s": "l"}, latency_unit="ms"), TASK)
    assert out["latency_s"].to_pylist() == [0.0015, 0.25, None, None, None, None, None, 1.0]
    assert issues(out, "latency_s") == [
        None,
        None,
        "latency_s: '12ms' is not a number",
        None,
        "latency_s: '' is not a number",
        "latency_s: -0.003 is negative",
        "latency_s: 'nan' is not a number",
        None,
    ]


def test_latency_numeric_columns():
    raw = pa.table(
        {"l": pa.array([1, 2, None], pa.int32()), "d": pa.array([1500, None, 2], pa.duration("ms"))}
    )
    out = normalize(raw, cfg(columns={"latency_s": "l"}), TASK)
    assert out["latency_s"].to_pylist() == [1.0, 2.0, None]
    out = normalize(raw, cfg(columns={"latency_s": "d"}, latency_unit="ms"), TASK)
    assert out["latency_s"].to_pylist() == [1.5, None, 0.002]  # durations carry their own unit
    raw = pa.table({"l": [float("inf"), 0.5]})
    out = normalize(raw, cfg(columns={"latency_s": "l"}), TASK)
    assert out["latency_s"].to_pylist() == [None, 0.5]
    assert issues(out, "latency_s") == ["latency_s: inf is not a finite number", None]


def test_latency_booleans_are_rejected():
    raw = pa.table({"l": [True, None]})
    out = normalize(raw, cfg(columns={"latency_s": "l"}), TASK)
    assert out["latency_s"].to_pylist() == [None, None]
    assert issues(out, "latency_s") == ["latency_s: expected a number, got bool (true)", None]


# --------------------------------------------------------------------------- contexts


def test_contexts_auto_from_strings():
    values = [
        '["a", "b"]',
        "[]",
        None,
        "just one chunk",
        "",
        "  [\"padded\"]  ",
        "[citation needed] not json",
        '["x", null]',
    ]
    got, notes = contexts_of(values)
    assert got == [
        ["a", "b"],
        [],
        None,
        ["just one chunk"],
        [""],
        ["padded"],
        ["[citation needed] not json"],
        ["x", None],
    ]
    assert notes == [None] * len(values)


def test_contexts_json_list_of_objects():
    values = [
        json.dumps([{"index": 0, "excerpt": "first"}, {"index": 1, "excerpt": "second"}]),
        json.dumps([{"page_content": "pc", "metadata": {}}]),
        json.dumps([{"text": "t", "excerpt": "e"}]),
        json.dumps([{"id": 1}]),
    ]
    got, notes = contexts_of(values)
    assert got == [["first", "second"], ["pc"], ["t"], None]
    assert notes == [
        None,
        None,
        None,
        "contexts: item 0 is an object with none of the fields text, content, page_content, "
        "excerpt, chunk, document (its keys: [\"id\"]); set input.contexts_field",
    ]
    got, notes = contexts_of(values, contexts_field="excerpt")
    assert got == [["first", "second"], None, ["e"], None]
    assert notes[1] == (
        "contexts: item 0 is an object without the field 'excerpt' "
        "(input.contexts_field); its keys: [\"page_content\", \"metadata\"]"
    )


def test_contexts_json_format_problems():
    values = ['["a"]', '"solo"', "not json", "5", "[1, 2]", '[["nested"]]', "null", "[]"]
    got, notes = contexts_of(values, contexts_format="json")
    assert got == [["a"], ["solo"], None, None, None, None, None, []]
    assert notes == [
        None,
        None,
        "contexts: not valid JSON (Expecting value): 'not json'",
        "contexts: expected a JSON list of strings, got int (5)",
        "contexts: item 0 is int (1); expected a string or an object with a text field",
        'contexts: item 0 is list (["nested"]); expected a string or an object with a text field',
        None,
        None,
    ]


def test_contexts_text_format_wraps_everything():
    got, notes = contexts_of(['["a", "b"]', None, "x"], contexts_format="text")
    assert got == [['["a", "b"]'], None, ["x"]]
    assert notes == [None, None, None]


def test_contexts_list_columns():
    got, notes = contexts_of([["a", None], [], None], pa.list_(pa.large_string()))
    assert got == [["a", None], [], None] and notes == [None] * 3
    structs = pa.list_(pa.struct([("excerpt", pa.string()), ("score", pa.float64())]))
    got, notes = contexts_of(
        [[{"excerpt": "e1", "score": 0.5}, None, {"excerpt": None, "score": 1.0}], [], None],
        structs,
    )
    assert got == [["e1", None, None], [], None] and notes == [None] * 3
    got, notes = contexts_of([[1, 2], None], pa.list_(pa.int64()))
    assert got == [None, None]
    assert notes == [
        "contexts: item 0 is int (1); expected a string or an object with a text field",
        None,
    ]


def test_contexts_list_format_rejects_strings():
    got, notes = contexts_of(['["a"]', None], contexts_format="list")
    assert got == [None, None]
    assert notes == [
        "contexts: expected a list (input.contexts_format is 'list'), got a string ('[\"a\"]')",
        None,
    ]


def test_contexts_from_numbers():
    got, notes = contexts_of([3, None], pa.int64())
    assert got == [None, None]
    assert notes == ["contexts: expected a list or a string, got int (3)", None]


def test_contexts_unicode_survives_json_decoding():
    items = ["漢字", "👩‍👩‍👧", "e\u0301", "tab\tin", "quote \" and \\ slash"]
    got, _ = contexts_of(
        [json.dumps(items, ensure_ascii=True), json.dumps(items, ensure_ascii=False)]
    )
    assert got == [items, items]


def test_contexts_from_mixed_json_column(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [
        {"c": ["a", "b"]},
        {"c": "single"},
        {"c": 5},
        {"c": [{"excerpt": "e"}]},
        {"c": "[\"j\"]"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    config = InputSection(uri=str(path), columns={"contexts": "c"})
    task = plan_read(config)[0]
    out = normalize(read_task(task, config), config, task)
    assert out["contexts"].to_pylist() == [["a", "b"], ["single"], None, ["e"], ["j"]]
    assert issues(out, "contexts") == [
        None,
        None,
        "contexts: expected a list or a string, got int (5)",
        None,
        None,
    ]


def test_lone_surrogate_in_json_context_is_an_issue():
    got, notes = contexts_of(['["ok", "\\ud800"]', '["fine"]'])
    assert got == [None, ["fine"]]
    assert notes[0].startswith("contexts: an item holds an unpaired UTF-16 surrogate")


json_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.one_of(st.none(), json_text), max_size=4), min_size=1, max_size=6),
    st.booleans(),
)
def test_batch_json_decoding_matches_python(lists, ascii_only):
    encoded = [json.dumps(x, ensure_ascii=ascii_only) for x in lists]
    fast = _strict_json_lists(pa.array(encoded))
    assert fast is not None
    assert (
        fast.to_pylist()
        == [_parse_one(e, cfg(contexts_format="json"), quote)[0] for e in encoded]
        == lists
    )


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.none(),
            json_text,
            st.lists(st.one_of(json_text, st.integers(), st.none()), max_size=3).map(json.dumps),
        ),
        max_size=8,
    )
)
def test_auto_contexts_never_lose_rows(values):
    got, notes = contexts_of(values)
    assert len(got) == len(values)
    for value, ctx, note in zip(values, got, notes):
        if value is None:
            assert ctx is None and note is None
        elif ctx is None:
            assert note.startswith("contexts: item")
        elif not value.lstrip().startswith("["):
            assert ctx == [value]


# --------------------------------------------------------------------------- slices


def test_unmapped_columns_become_slices_and_reserved_names_are_renamed():
    schema = pa.schema(
        [
            ("q", pa.string()),
            ("metric", pa.string()),
            ("score", pa.float64()),
            ("app", pa.string()),
            ("cell::x", pa.string()),
            ("input_metric", pa.int64()),
        ]
    )
    config = cfg(columns={"question": "q"})
    assert slice_columns(config, schema) == [
        ("metric", "input_input_metric"),
        ("score", "input_score"),
        ("app", "app"),
        ("cell::x", "cell::x"),  # internal columns live under __ragbatch_, so this one is free
        ("input_metric", "input_metric"),
    ]
    raw = pa.table(
        {
            "q": ["a"],
            "metric": ["m"],
            "score": [1.0],
            "app": ["x"],
            "cell::x": ["c"],
            "input_metric": [3],
        }
    )
    out = normalize(raw, config, TASK)
    assert out.column_names[7:] == [
        "input_input_metric",
        "input_score",
        "app",
        "cell::x",
        "input_metric",
    ]
    assert out.slice(0, 1).to_pylist()[0]["input_score"] == 1.0


def test_explicit_slice_columns_and_missing_ones():
    schema = pa.schema([("q", pa.string()), ("app", pa.string()), ("question", pa.string())])
    config = cfg(columns={"question": "q"}, slice_columns=["question", "app"])
    assert slice_columns(config, schema) == [("question", "input_question"), ("app", "app")]
    raw = pa.table({"q": ["a", "b"], "question": ["x", "y"]})
    out = normalize(raw, config, TASK, slices=slice_columns(config, schema))
    assert out["input_question"].to_pylist() == ["x", "y"]
    assert out["app"].type == pa.null() and out["app"].null_count == 2


def test_missing_mapped_column_in_a_file():
    raw = pa.table({"q": ["a"]})
    with pytest.raises(
        InputError,
        match=r"f\.csv: column 'ans' \(input\.columns\.answer\) "
        r"is missing from this file; it has: 'q'",
    ):
        normalize(raw, cfg(columns={"answer": "ans"}), TASK)


# --------------------------------------------------------------------------- check_columns


def test_check_columns_lists_available_columns():
    schema = pa.schema([("question", pa.string()), ("answer", pa.string()), ("n", pa.int64())])
    config = cfg(columns={"question": "questoin", "answer": "answer"}, slice_columns=["app"])
    assert check_columns(config, schema) == [
        "input.columns.question: column 'questoin' does not exist in the input (did you mean "
        "'question'?); the input has: 'question', 'answer', 'n'",
        "input.slice_columns: column 'app' does not exist in the input; the input has: "
        "'question', 'answer', 'n'",
    ]


def test_check_columns_types():
    schema = pa.schema(
        [
            ("n", pa.int64()),
            ("s", pa.string()),
            ("objs", pa.list_(pa.struct([("id", pa.int64()), ("body", pa.string())]))),
            ("flag", pa.bool_()),
            ("nested", pa.list_(pa.string())),
        ]
    )
    config = cfg(columns={"contexts": "n", "answer": "n", "latency_s": "flag", "row_id": "nested"})
    assert check_columns(config, schema) == [
        "input.columns.row_id: column 'nested' has type list<item: string>; row ids need strings or integers",
        "input.columns.contexts: column 'n' has type int64; contexts need a list of strings, a "
        "JSON-encoded list or a string",
        "input.columns.answer: column 'n' has type int64, so every answer would be null; map a "
        "column of strings",
        "input.columns.latency_s: column 'flag' has type bool; latency needs numbers (or numeric strings)",
    ]
    assert check_columns(cfg(columns={"contexts": "objs"}), schema) == [
        "input.columns.contexts: column 'objs' holds objects without any of text, content, "
        "page_content, excerpt, chunk, document (their fields: id, body); set "
        "input.contexts_field to the field holding the text"
    ]
    assert check_columns(cfg(columns={"contexts": "objs"}, contexts_field="body"), schema) == []
    assert check_columns(cfg(columns={"contexts": "objs"}, contexts_field="id"), schema) == [
        "input.columns.contexts: column 'objs' holds objects whose 'id' has type int64, not string"
    ]
    assert check_columns(cfg(columns={"contexts": "s"}, contexts_format="list"), schema) == [
        "input.columns.contexts: column 's' has type string but input.contexts_format is 'list'; "
        "use 'auto', 'json' (JSON-encoded lists) or 'text' (one context per value)"
    ]
    fine = cfg(columns={"question": "s", "contexts": "nested", "latency_s": "n", "row_id": "n"})
    assert check_columns(fine, schema) == []


def test_sliced_and_chunked_input_gives_the_same_result():
    values = ['["a"]', "text", None, '[{"excerpt": "e"}]', "[]", "[1]"]
    lat = ["1", "x", None, "2", "3", "4"]
    whole = pa.table({"c": ["pad"] + values, "l": ["0"] + lat, "a": [None] + values}).slice(1)
    chunked = pa.Table.from_batches(whole.to_batches(max_chunksize=2))
    config = cfg(columns={"contexts": "c", "latency_s": "l", "answer": "a"})
    expected = normalize(pa.table({"c": values, "l": lat, "a": values}), config, TASK)
    assert normalize(whole, config, TASK).equals(expected)
    assert normalize(chunked, config, TASK).equals(expected)


def test_object_items_take_the_first_text_field_with_a_value_in_every_path():
    items = [
        [{"text": "a"}, {"excerpt": "b"}, {"text": None, "content": "c"}, {"text": None}, None]
    ]
    expected = [["a", "b", "c", None, None]]
    from_json, notes = contexts_of([json.dumps(items[0])])
    assert from_json == expected and notes == [None]
    arrow = pa.array(items)  # list<struct<text, excerpt, content>>: missing keys are null
    assert pa.types.is_struct(arrow.type.value_type)
    from_struct, notes = contexts_of(items, arrow.type)
    assert from_struct == expected and notes == [None]
    without_candidates = [[{"id": 1}], []]
    got, notes = contexts_of(without_candidates, pa.array(without_candidates).type)
    assert got == [None, []]
    assert notes[0].startswith("contexts: item 0 is an object with none of the fields")
