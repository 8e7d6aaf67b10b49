"""Deterministic metrics against hand-worked values.

Every frame mixes ordinary rows with nulls, empty strings, CJK, emoji, combining marks and
an exact duplicate row; expected cells were worked out by hand from the definitions in
DESIGN.md / the metric docstrings.
"""

from __future__ import annotations

import polars as pl
import pytest

from support.metric_frames import run_metric
from ragbatch.core.errors import ConfigError
from ragbatch.scoring.registry import get_metric

NULL = None
OK, MISSING, NA, ERROR = "ok", "missing_input", "not_applicable", "error"


def metric(name, **params):
    return get_metric(name).from_params(params)


def scores(cells):
    return [(c["score"], c["status"]) for c in cells]


def test_answer_match_case_insensitive_default():
    rows = [
        {"answer": "Paris"},
        {"answer": "PARIS"},
        {"answer": "paris "},
        {"answer": ""},
        {"answer": None},
        {"answer": "Paris"},
    ]
    got = scores(run_metric(metric("answer_match", text="paris"), rows))
    assert got == [(1.0, OK), (1.0, OK), (0.0, OK), (0.0, OK), (NULL, MISSING), (1.0, OK)]


def test_answer_match_unicode_and_case_sensitive():
    rows = [{"answer": "東京🚀"}, {"answer": "e\u0301"}, {"answer": "\u00e9"}, {"answer": "ΣΟΦΙΑ"}]
    got = scores(run_metric(metric("answer_match", text="e\u0301", case_sensitive=True), rows))
    assert got == [(0.0, OK), (1.0, OK), (0.0, OK), (0.0, OK)]  # no Unicode normalization
    greek = scores(run_metric(metric("answer_match", text="σοφια"), rows))
    assert greek[3] == (1.0, OK)


def test_exact_match_strip_and_nulls():
    rows = [
        {"answer": "\nRich people and nerds.", "reference": "Rich people and nerds."},
        {"answer": "rich people and nerds.", "reference": "Rich people and nerds."},
        {"answer": "x", "reference": None},
        {"answer": None, "reference": "x"},
        {"answer": "", "reference": ""},
        {"answer": "数据\u3000", "reference": "数据"},  # ideographic space is whitespace
    ]
    got = scores(run_metric(metric("exact_match"), rows))
    assert got == [(1.0, OK), (0.0, OK), (NULL, MISSING), (NULL, MISSING), (1.0, OK), (1.0, OK)]
    cells = run_metric(metric("exact_match"), rows)
    assert cells[2]["reason"] == "reference is null"
    assert cells[3]["reason"] == "answer is null"
    insensitive = scores(run_metric(metric("exact_match", case_sensitive=False), rows))
    assert insensitive[1] == (1.0, OK)


def test_exact_match_reason_from_normalizer_issue():
    rows = [
        {
            "answer": None,
            "reference": "x",
            "_issues": {"answer": "answer: expected a string, got int (42)"},
        }
    ]
    cell = run_metric(metric("exact_match"), rows)[0]
    assert (cell["status"], cell["reason"]) == (MISSING, "answer: expected a string, got int (42)")


def test_contains_text_list_and_reason():
    rows = [
        {"answer": "Delta Lake runs on Databricks"},
        {"answer": "Delta only"},
        {"answer": ""},
        {"answer": None},
        {"answer": "DATABRICKS 🚀 delta lake"},
    ]
    cells = run_metric(metric("contains_text", text=["delta lake", "Databricks"]), rows)
    assert scores(cells) == [(1.0, OK), (0.0, OK), (0.0, OK), (NULL, MISSING), (1.0, OK)]
    assert cells[1]["reason"] == "not found: 'delta lake', 'Databricks'"
    assert cells[0]["reason"] is None


def test_contains_text_case_sensitive_and_cjk():
    rows = [{"answer": "価格は🚀です"}, {"answer": "Spark"}]
    assert scores(run_metric(metric("contains_text", text="🚀"), rows)) == [(1.0, OK), (0.0, OK)]
    assert scores(run_metric(metric("contains_text", text="spark", case_sensitive=True), rows)) == [
        (0.0, OK),
        (0.0, OK),
    ]


def test_contains_text_case_mappings_beyond_one_to_one():
    # Worked by hand from the Unicode case mappings: the Kelvin sign lowercases to "k";
    # "İ" lowercases to "i" + U+0307 (so "is" is not in "İstanbul"'s lowercase, "i" is);
    # a capital sigma lowercases to final "ς" at the end of a word, else to "σ".
    rows = [
        {"answer": "20 \u212a"},
        {"answer": "İstanbul"},
        {"answer": "ΟΔΟΣ"},
        {"answer": "ΟΔΟΣ Α"},
        {"answer": "ΣΟ"},
        {"answer": "İ ΟΔΟΣ 20 K"},
    ]

    def run(text):
        return [s for s, _ in scores(run_metric(metric("contains_text", text=text), rows))]

    assert run("k") == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert run("K") == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert run("is") == [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert run("i") == [0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    assert run("ος") == [0.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert run("οσ") == [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert run("σο") == [0.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    # the needle is lowercased the same way: "ΟΔΟΣ" -> "οδος", with a final sigma
    assert run("ΟΔΟΣ") == [0.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    # needles without i, U+0307, σ or ς, next to the special characters: "i̇stanbul"
    # holds "stanbul", "οδος" holds "δο", "i̇ οδος 20 k" holds " 20 k"
    assert run("STANBUL") == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert run("δο") == [0.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert run(" 20 k") == [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    # needles with one of them: "i̇stanbul" holds U+0307 + "s"; "ς 20" needs the final ς
    # of "οδος 20" (row 6), not the "σ" before a letter
    assert run("\u0307s") == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert run(["stanbul", "i"]) == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert run(["δο", "ς 20"]) == [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]


def test_contains_text_case_classes():
    from ragbatch.metrics.contains_text import _case_table

    table = _case_table()
    # each class: the character and every character whose lowercase is that one alone
    assert table.pattern("k") == "[\\x{6B}\\x{4B}\\x{212A}]"
    assert table.pattern("数") == "\\x{6570}"
    # a character that is not its own lowercase cannot be in a lowercased text outside
    # the special answers: the pattern matches nothing
    assert pl.Series(["K", "k", "Kk"]).str.contains(table.pattern("K")).to_list() == [
        False,
        False,
        False,
    ]


def test_case_table_covers_every_cased_character():
    # The table reads planes 0 and 1 only: no code point above them changes when lowercased.
    from ragbatch.metrics.contains_text import _CASED_PLANES_END

    above = pl.Series([chr(i) for i in range(_CASED_PLANES_END, 0x110000)])
    assert (above.str.to_lowercase() == above).all()


@pytest.mark.parametrize("n", [1000, 1001, 5000])
def test_contains_text_long_needles(n):
    # Up to MAX_PATTERN_CHARS (1,000) characters a needle becomes a case-class pattern;
    # longer ones are searched in the lowercased answers (a pattern of some 50,000
    # classes would exceed the regex size limit).
    rows = [{"answer": "x" + "Θ" * n + "K"}, {"answer": "θ" * (n - 1)}, {"answer": "k" * n}]
    cells = run_metric(metric("contains_text", text="θ" * n + "\u212a"), rows)
    assert [s for s, _ in scores(cells)] == [1.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "params, expected",
    [
        (
            {"min_chars": 1, "max_chars": 4},
            [(1.0, OK), (0.0, OK), (0.0, OK), (1.0, OK), (NULL, MISSING), (1.0, OK)],
        ),
        (
            {"min_chars": 0, "max_chars": 0},
            [(0.0, OK), (0.0, OK), (1.0, OK), (0.0, OK), (NULL, MISSING), (0.0, OK)],
        ),
        (
            {"max_chars": 4},
            [(1.0, OK), (0.0, OK), (1.0, OK), (1.0, OK), (NULL, MISSING), (1.0, OK)],
        ),
        (
            {"min_chars": 5},
            [(0.0, OK), (1.0, OK), (0.0, OK), (0.0, OK), (NULL, MISSING), (0.0, OK)],
        ),
    ],
)
def test_response_length_bounds(params, expected):
    # lengths by hand: "abcd"=4, "abcdef"=6, ""=0, "e\u0301🚀数"=4 code points, null, "abcd" duplicate
    rows = [
        {"answer": "abcd"},
        {"answer": "abcdef"},
        {"answer": ""},
        {"answer": "e\u0301🚀数"},
        {"answer": None},
        {"answer": "abcd"},
    ]
    cells = run_metric(metric("response_length", **params), rows)
    assert scores(cells) == expected
    assert [c["details"] for c in cells] == [
        '{"length":4}',
        '{"length":6}',
        '{"length":0}',
        '{"length":4}',
        None,
        '{"length":4}',
    ]


def test_context_length_cases():
    rows = [
        {"contexts": ["abc", "数据库"]},  # 3, 3
        {"contexts": ["abc", "abcdefgh"]},  # 3, 8 -> #1 out
        {"contexts": []},
        {"contexts": None},
        {"contexts": ["abc", None]},
        {"contexts": ["", "🚀🚀"]},  # 0, 2 -> #0 out
    ]
    cells = run_metric(metric("context_length", min_chars=1, max_chars=5), rows)
    assert scores(cells) == [
        (1.0, OK),
        (0.0, OK),
        (NULL, NA),
        (NULL, MISSING),
        (NULL, MISSING),
        (0.0, OK),
    ]
    assert cells[1]["reason"] == "#1 (8 chars) outside [1, 5]"
    assert cells[5]["reason"] == "#0 (0 chars) outside [1, 5]"
    assert cells[4]["reason"] == "contexts[1] is null"
    assert cells[2]["reason"] == "contexts is an empty list"
    assert cells[0]["details"] == '{"lengths":[3,3]}'


def test_context_length_reason_lists_every_offender_in_order():
    # Rows with several offenders beside rows with one, a passing row between them, and
    # a duplicate row: each reason worked out by hand (e\u0301 is two code points).
    several = {"contexts": ["a", "abcdef", "ok", "🚀🚀🚀🚀🚀", "e\u0301"]}  # 1, 6, 2, 5, 2
    rows = [
        several,
        {"contexts": ["abc"]},
        {"contexts": ["数据库数据库"]},
        several,
        {"contexts": ["xx", "", "yy"]},
    ]
    cells = run_metric(metric("context_length", min_chars=2, max_chars=4), rows)
    assert scores(cells) == [(0.0, OK), (1.0, OK), (0.0, OK), (0.0, OK), (0.0, OK)]
    assert [c["reason"] for c in cells] == [
        "#0 (1 chars), #1 (6 chars), #3 (5 chars) outside [2, 4]",
        None,
        "#0 (6 chars) outside [2, 4]",
        "#0 (1 chars), #1 (6 chars), #3 (5 chars) outside [2, 4]",
        "#1 (0 chars) outside [2, 4]",
    ]
    assert cells[0]["details"] == '{"lengths":[1,6,2,5,2]}'


def test_latency():
    rows = [
        {"latency_s": 1.5},
        {"latency_s": 2.0},
        {"latency_s": 2.0000001},
        {"latency_s": None},
        {"latency_s": float("nan")},
        {"latency_s": -0.1},
        {"latency_s": float("inf")},
    ]
    cells = run_metric(metric("latency", target_s=2.0), rows)
    assert scores(cells) == [
        (1.0, OK),
        (1.0, OK),
        (0.0, OK),
        (NULL, MISSING),
        (NULL, MISSING),
        (NULL, MISSING),
        (0.0, OK),
    ]
    assert cells[5]["reason"] == "latency_s is negative (-0.1)"


def test_json_valid_with_and_without_schema():
    rows = [
        {"answer": '{"a": 1}'},
        {"answer": "[1, 2"},
        {"answer": "NaN"},
        {"answer": ""},
        {"answer": None},
        {"answer": ' "数据" '},
        {"answer": "```json\n{}\n```"},
    ]
    cells = run_metric(metric("json_valid"), rows)
    assert scores(cells) == [
        (1.0, OK),
        (0.0, OK),
        (0.0, OK),
        (0.0, OK),
        (NULL, MISSING),
        (1.0, OK),
        (0.0, OK),
    ]
    assert cells[1]["reason"].startswith("not JSON: ")
    schema = {"type": "object", "required": ["a"], "properties": {"a": {"type": "integer"}}}
    with_schema = run_metric(metric("json_valid", schema=schema), rows)
    assert scores(with_schema)[:2] == [(1.0, OK), (0.0, OK)]
    assert scores(with_schema)[5] == (0.0, OK)  # a JSON string is not an object
    assert "does not match schema" in with_schema[5]["reason"]


@pytest.mark.parametrize(
    "pattern, expected_count, answers, expected",
    [
        ("(?i)databricks", None, ["Databricks", "none", "", None], [1.0, 0.0, 0.0, None]),
        ("(?i)databricks", 2, ["databricks and DATABRICKS", "databricks"], [1.0, 0.0]),
        (r"\w+", 2, ["x\u0301y", "数据 库"], [1.0, 1.0]),  # Python \w skips the combining mark
        (r"(?<=a)b", 1, ["abab", "ab"], [0.0, 1.0]),  # look-behind: Python re path
        (r"(\w)\1", None, ["aa", "ab"], [1.0, 0.0]),  # backreference
        (r"end$", None, ["the end\n", "end."], [1.0, 0.0]),  # $ before a final newline
        (r"🚀+", 1, ["go 🚀🚀 now", "🚀 🚀"], [1.0, 0.0]),
        (r"a*", 3, ["baa"], [1.0]),  # empty matches counted as Python does
    ],
)
def test_regex_matches_python(pattern, expected_count, answers, expected):
    m = metric("regex", pattern=pattern, expected_count=expected_count)
    cells = run_metric(m, [{"answer": a} for a in answers])
    assert [c["score"] for c in cells] == expected
    assert [c["status"] for c in cells] == [OK if a is not None else MISSING for a in answers]


def test_regex_engine_recorded():
    assert metric("regex", pattern="(?i)databricks").manifest_info()["regex_engine"] == "polars"
    info = metric("regex", pattern=r"(?<=a)b").manifest_info()
    assert info["regex_engine"] == "python-re" and info["regex_fallback_reason"]


def test_regex_validate_notes_say_where_the_pattern_runs():
    assert metric("regex", pattern="(?i)databricks").validate_notes() == ["regex runs on polars"]
    assert metric("regex", pattern=r"(?<=a)b").validate_notes() == [
        "regex runs on python-re (look-behind (?<=...) is not supported by Polars' regex engine)"
    ]
    assert metric("exact_match").validate_notes() == []


@pytest.mark.parametrize(
    "name, params, fragment",
    [
        ("regex", {"pattern": "(unclosed"}, "invalid regular expression"),
        ("regex", {"pattern": "a", "expected_count": -1}, "expected_count"),
        (
            "response_length",
            {"min_chars": 5, "max_chars": 2},
            "min_chars (5) is greater than max_chars (2)",
        ),
        ("response_length", {}, "set min_chars, max_chars or both"),
        ("context_length", {"min_chars": -1}, "min_chars"),
        ("contains_text", {"text": ["a", ""]}, "text[1] is empty"),
        ("contains_text", {"text": []}, "at least one string"),
        ("answer_match", {}, "params.text"),
        ("answer_match", {"text": "x", "casesensitive": True}, "unknown param for answer_match"),
        ("json_valid", {"schema": {"type": 5}}, "not a valid JSON Schema"),
        (
            "binary",
            {"callback": "no_such_module_xyz:f"},
            "cannot import module 'no_such_module_xyz'",
        ),
        ("binary", {"callback": "json"}, "must look like 'package.module:function'"),
        ("binary", {"callback": "json:no_such_function"}, "has no attribute 'no_such_function'"),
        ("latency", {"target_s": "soon"}, "target_s"),
    ],
)
def test_bad_params_name_the_field(name, params, fragment):
    with pytest.raises(ConfigError) as info:
        get_metric(name).from_params(params)
    assert fragment in str(info.value)


def test_unknown_metric_suggests():
    with pytest.raises(ConfigError) as info:
        get_metric("exact_mach")
    assert "did you mean 'exact_match'" in str(info.value)


def test_binary_batch_callback():
    rows = [{"answer": "42 apples"}, {"answer": "none"}, {"answer": None}, {"answer": "42 apples"}]
    cells = run_metric(metric("binary", callback="support.binary_callbacks:answer_has_digit"), rows)
    assert scores(cells) == [(1.0, OK), (0.0, OK), (NULL, NA), (1.0, OK)]
    assert cells[2]["reason"] == "callback returned null"
    seen = run_metric(
        metric("binary", callback="support.binary_callbacks:sees_canonical_columns"), rows
    )
    assert {c["score"] for c in seen} == {1.0}


def test_binary_batch_failures_become_error_cells():
    rows = [{"answer": "a"}, {"answer": "b"}]
    cells = run_metric(metric("binary", callback="support.binary_callbacks:wrong_length"), rows)
    assert scores(cells) == [(NULL, ERROR)] * 2
    assert cells[0]["reason"] == "callback returned 1 values for 2 rows"
    cells = run_metric(metric("binary", callback="support.binary_callbacks:raises"), rows)
    assert scores(cells) == [(NULL, ERROR)] * 2
    assert cells[0]["reason"].startswith("callback raised ValueError: boom")


def test_binary_row_callback():
    rows = [
        {"answer": "a", "reference": "x"},
        {"answer": "a"},
        {"answer": None},
        {"answer": "raise"},
        {"answer": "int"},
    ]
    cells = run_metric(
        metric("binary", callback="support.binary_callbacks:row_has_reference", mode="row"), rows
    )
    assert scores(cells) == [(1.0, OK), (0.0, OK), (NULL, NA), (NULL, ERROR), (NULL, ERROR)]
    assert "KeyError" in cells[3]["reason"]
    assert "expected True, False or None" in cells[4]["reason"]
