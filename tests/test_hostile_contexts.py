"""A contexts cell holding valid JSON that Python will not parse (an integer of more than
4300 digits) is a value like any other, never an exception that fails the batch."""

from __future__ import annotations

import pyarrow as pa

from ragbatch.config.job import InputSection
from ragbatch.core import columns as C
from ragbatch.io import ReadTask, normalize

TASK = ReadTask("/data/f.csv", "f.csv", "csv")
HUGE = "[" + "1" * 5000 + "]"


def _normalize(contexts_format: str) -> pa.Table:
    config = InputSection(uri="unused", columns={"contexts": "c"}, contexts_format=contexts_format)
    return normalize(pa.table({"c": [HUGE, '["a"]']}), config, TASK)


def test_auto_takes_it_for_one_text():
    out = _normalize("auto")
    assert out["contexts"].to_pylist() == [[HUGE], ["a"]]


def test_json_makes_it_null_with_a_note():
    out = _normalize("json")
    assert out["contexts"].to_pylist() == [None, ["a"]]
    note = out.column(C.ISSUES).combine_chunks().field("contexts").to_pylist()[0]
    assert note.startswith(
        "contexts: not valid JSON (an integer of more than 4300 digits, which Python does "
        "not read): '[1111"
    )
