"""``input.contexts_format: delimited``: a string of contexts joined by
``input.contexts_delimiter`` becomes one context per piece (before, a ``|``-joined string
silently became a single context)."""

from __future__ import annotations

import json

import duckdb
import pyarrow as pa
import pytest

from ragbatch.config.job import InputSection, JobConfig
from ragbatch.core.errors import ConfigError
from ragbatch.io import ReadTask, normalize
from ragbatch.pipeline.runner import run_job

TASK = ReadTask("/data/f.csv", "f.csv", "csv")


def _contexts(values, delimiter="|", type_=pa.string()):
    column = values if isinstance(values, pa.Array) else pa.array(values, type_)
    raw = pa.table({"c": column})
    cfg = InputSection(
        uri="unused",
        columns={"contexts": "c"},
        contexts_format="delimited",
        contexts_delimiter=delimiter,
    )
    return normalize(raw, cfg, TASK)["contexts"].to_pylist()


def test_split_on_the_delimiter_dropping_empty_pieces():
    assert _contexts(["a|b", "a", None, "", "|", "a||b|", "|a", " a | b "]) == [
        ["a", "b"],
        ["a"],
        None,
        [],
        [],
        ["a", "b"],
        ["a"],
        [" a ", " b "],
    ]


def test_unicode_and_multi_character_delimiters_are_literal():
    assert _contexts(["数据¦🚀¦é", "x¦"], delimiter="¦") == [["数据", "🚀", "é"], ["x"]]
    assert _contexts(["a.*b.*c", "a.b"], delimiter=".*") == [["a", "b", "c"], ["a.b"]]
    assert _contexts(["one\n---\ntwo", "one"], delimiter="\n---\n") == [["one", "two"], ["one"]]


def test_a_sliced_chunk_and_a_list_column_keep_their_rows():
    raw = pa.array(["x|y", "a|b", None, "c"]).slice(1)  # an array with an offset
    assert _contexts(raw) == [["a", "b"], None, ["c"]]
    # a list column is a list whatever the format says
    assert _contexts([["a|b"], None], type_=pa.list_(pa.string())) == [["a|b"], None]


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"contexts_format": "delimited"}, "needs contexts_delimiter"),
        ({"contexts_format": "delimited", "contexts_delimiter": ""}, "needs contexts_delimiter"),
        ({"contexts_delimiter": "|"}, "only used with contexts_format: delimited"),
        ({"contexts_format": "json", "contexts_delimiter": "|"}, "only used with contexts_format"),
    ],
)
def test_delimiter_config_is_checked(fields, message):
    with pytest.raises(ConfigError, match=message):
        JobConfig.from_dict(
            {
                "input": {"uri": "x.csv", **fields},
                "output": {"uri": "out"},
                "metrics": [{"name": "exact_match"}],
            }
        )


@pytest.mark.slow
def test_run_scores_each_delimited_context(ray_local, tmp_path):
    src = tmp_path / "traces.csv"
    src.write_text('id,ctx\nr1,short|a much longer one\nr2,\nr3,"x|y|"\n', encoding="utf-8")
    config = JobConfig.from_dict(
        {
            "run": {"name": "delimited"},
            "input": {
                "uri": str(src),
                "columns": {"row_id": "id", "contexts": "ctx"},
                "contexts_format": "delimited",
                "contexts_delimiter": "|",
            },
            "output": {"uri": str(tmp_path / "out")},
            "metrics": [{"name": "context_length", "params": {"max_chars": 5}}],
        }
    )
    result = run_job(config)
    rows = (
        duckdb.connect()
        .execute(
            f"SELECT row_id, score, status, reason, details FROM read_parquet("
            f"'{result.layout.root}/scores/**/*.parquet', hive_partitioning=true) ORDER BY row_id"
        )
        .fetchall()
    )
    assert [(r, s, st, why) for r, s, st, why, _ in rows] == [
        ("r1", 0.0, "ok", "#1 (17 chars) outside [0, 5]"),
        ("r2", None, "missing_input", "contexts is null"),  # an empty CSV cell is null
        ("r3", 1.0, "ok", None),
    ]
    assert json.loads(rows[2][4])["lengths"] == [1, 1]
