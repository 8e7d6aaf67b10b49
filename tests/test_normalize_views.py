"""Text columns read and normalized as string views, and string contexts normalized once
per distinct value: the same values, issues and scores as the plain path."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ragbatch.io.contexts as contexts_module
from ragbatch.config.job import InputSection
from ragbatch.core import columns as C
from ragbatch.io import ReadTask, normalize, read_task
from ragbatch.io.read import _read_row_groups, _read_text_columns_fast
from ragbatch.io.contexts import _starts_a_list, _strict_json_lists
from ragbatch.io.schema import VIEW_TYPES

TASK = ReadTask("/data/f.csv", "f.csv", "csv")


def cfg(**kwargs) -> InputSection:
    return InputSection(uri="unused", **kwargs)


def _notes(table: pa.Table, column: str) -> list:
    return table.column(C.ISSUES).combine_chunks().field(column).to_pylist()


#: Contexts values of every kind: JSON lists (padded, with nulls, of objects), text,
#: bad JSON, JSON that is not a list of strings, null, empty.
VALUES = [
    '["a", "b"]',
    '  ["padded"]',
    "\u3000[\"ideographic space\"]",
    '["x", null]',
    "[]",
    "",
    None,
    "plain text",
    "[citation needed] not json",
    "not json",
    "5",
    "[1, 2]",
    '[{"excerpt": "e"}]',
    '[{"id": 1}]',
    '"solo"',
    "null",
    '[\n  "pretty",\n  "printed"\n]',
    "a|b||c|",
]


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"contexts_format": "json"},
        {"contexts_format": "text"},
        {"contexts_format": "list"},
        {"contexts_format": "delimited", "contexts_delimiter": "|"},
        {"contexts_field": "excerpt"},
    ],
)
def test_repeated_contexts_are_normalized_once_with_the_same_rows_and_issues(monkeypatch, options):
    # Every value five times, shuffled: at most a fifth of the values are distinct, so
    # each is normalized once; each row gets the contexts and the issue its value gets
    # alone (normalized here one row at a time).
    rows = [VALUES[(7 * i) % len(VALUES)] for i in range(5 * len(VALUES))]
    config = cfg(columns={"contexts": "c"}, **options)
    sizes: list[int] = []
    real = contexts_module._contexts_from_strings

    def counting(strings, *args):
        sizes.append(len(strings))
        return real(strings, *args)

    monkeypatch.setattr(contexts_module, "_contexts_from_strings", counting)
    for views in (False, True):
        sizes.clear()
        raw = pa.table({"c": pa.array(rows, pa.string_view() if views else pa.string())})
        out = normalize(raw, config, TASK, views=views)
        assert sizes == [len(VALUES) - 1]  # the distinct non-null values, once
        assert out.schema.field("contexts").type == (
            VIEW_TYPES["contexts"] if views else pa.list_(pa.string())
        )
        for i, value in enumerate(rows):
            alone = normalize(pa.table({"c": pa.array([value], pa.string())}), config, TASK)
            assert out["contexts"][i].as_py() == alone["contexts"][0].as_py()
            assert _notes(out, "contexts")[i] == _notes(alone, "contexts")[0]


def test_mostly_distinct_contexts_are_normalized_row_by_row(monkeypatch):
    sizes: list[int] = []
    real = contexts_module._contexts_from_strings

    def counting(strings, *args):
        sizes.append(len(strings))
        return real(strings, *args)

    monkeypatch.setattr(contexts_module, "_contexts_from_strings", counting)
    rows = [json.dumps([f"c{i}"]) for i in range(9)] + ['["c0"]']
    out = normalize(pa.table({"c": rows}), cfg(columns={"contexts": "c"}), TASK)
    assert sizes == [10]
    assert out["contexts"].to_pylist() == [[f"c{i}"] for i in range(9)] + [["c0"]]


def test_views_keep_the_text_and_the_scores_of_the_plain_path(tmp_path):
    # The same Parquet file read plainly and as views: equal values in every column,
    # the view types for the text columns and the contexts, the file's own types for the
    # row id and the slice column.
    long = "long text that does not fit in a view " * 3
    table = pa.table(
        {
            "id": [f"r{i}" for i in range(8)],
            "q": ["q", None, long, "q", "", "日本", long, "e\u0301"],
            "c": [["a", None], [], None, [long, "b"], ["a", None], [long], [], ["x"]],
            "j": ['["a"]', '["a"]', None, "[1]", '["a"]', "text", '["a"]', '["a"]'],
            "team": ["t", "u", "t", "u", "t", "u", "t", "u"],
        }
    )
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=4)
    for contexts in ("c", "j"):
        config = InputSection(
            uri=str(path),
            columns={"row_id": "id", "question": "q", "answer": "q", "contexts": contexts},
        )
        views = frozenset({"q", contexts})
        for groups, offset in (((0,), 0), ((1,), 4), (None, 0)):
            task = ReadTask(str(path), "t.parquet", "parquet", offset, groups)
            slices = [("team", "team")]
            plain = normalize(read_task(task, config), config, task, slices=slices)
            raw = read_task(task, config, views)
            assert raw.schema.field("q").type == pa.string_view()
            assert raw.schema.field("id").type == pa.string()
            out = normalize(raw, config, task, slices=slices, views=True)
            assert out.schema.names == plain.schema.names
            for name in out.schema.names:
                want = VIEW_TYPES.get(name, plain.schema.field(name).type)
                assert out.schema.field(name).type == want
                assert out[name].to_pylist() == plain[name].to_pylist(), name


def test_view_read_equals_the_arrow_read_value_for_value(tmp_path):
    table = pa.table(
        {
            "id": ["r0", "r1", "r2"],
            "contexts": pa.array([["a", None], None, ["é 日本"]], pa.list_(pa.large_string())),
            "answer": pa.array(["one", None, "x" * 40], pa.large_string()),
            "n": [1, 2, None],
        }
    )
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    task = ReadTask(str(path), "t.parquet", "parquet", 0, None)
    parquet = pq.ParquetFile(path, memory_map=True)
    views = _read_text_columns_fast(parquet, task, frozenset({"contexts", "answer"}))
    arrow = _read_row_groups(parquet, task)
    assert views is not None
    assert views.schema.field("contexts").type == pa.list_(pa.string_view())
    assert views.schema.field("answer").type == pa.string_view()
    assert views.schema.field("n").type == pa.int64()
    assert views.to_pylist() == arrow.to_pylist()
    # A type the fast path does not read: Arrow's reader, the file's own types.
    stamped = table.append_column("at", pa.array([0, 1, 2], pa.timestamp("us")))
    pq.write_table(stamped, path)
    got = read_task(task, InputSection(uri=str(path)), frozenset({"answer"}))
    assert got.schema.field("answer").type == pa.large_string()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.none(),
            st.text(
                st.sampled_from(["[", "a", " ", "\t", "\n", "\u00a0", "\u2003", "\u3000", "\x1c"]),
                max_size=6,
            ),
        ),
        max_size=8,
    )
)
def test_starts_a_list_is_whitespace_stripped_starts_with(values):
    strings = pa.array(values, pa.string())
    expected = pc.starts_with(pc.utf8_ltrim_whitespace(strings), "[")
    assert _starts_a_list(strings).to_pylist() == expected.to_pylist()


def test_json_lists_with_and_without_line_breaks_decode_alike():
    lists = [["a", "b"], [], ["x\ny"], [None, "z"]]
    compact = [json.dumps(x) for x in lists]
    pretty = [json.dumps(x, indent=2) for x in lists]
    assert any("\n" in p for p in pretty)
    assert _strict_json_lists(pa.array(compact)).to_pylist() == lists
    assert _strict_json_lists(pa.array(pretty)).to_pylist() == lists
    mixed = compact[:2] + ["[\r\n\"c\"]"]
    assert _strict_json_lists(pa.array(mixed)).to_pylist() == lists[:2] + [["c"]]
