"""Tests for ragbatch.core.regex_compat: Polars must agree with Python ``re``."""

from __future__ import annotations

import re
from collections import Counter

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragbatch.core.regex_compat import Translation, translate

# Patterns such as "[[a]]" make Python warn about possible future set syntax;
# that is exactly the behaviour being tested, so the warning is noise here.
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def polars_count(rust: str, text: str) -> int:
    return pl.Series([text]).str.count_matches(rust).item()


def polars_contains(rust: str, text: str) -> bool:
    return pl.Series([text]).str.contains(rust).item()


def assert_agrees(pattern: str, text: str) -> tuple[Translation, Translation]:
    """Check both modes of ``pattern`` on ``text`` and return the translations."""
    counted = translate(pattern, count=True)
    if counted.rust_pattern is not None:
        assert polars_count(counted.rust_pattern, text) == len(re.findall(pattern, text)), (
            pattern,
            counted.rust_pattern,
            text,
        )
    searched = translate(pattern, count=False)
    if searched.rust_pattern is not None:
        assert polars_contains(searched.rust_pattern, text) == (
            re.search(pattern, text) is not None
        ), (pattern, searched.rust_pattern, text)
    return counted, searched


# ---------------------------------------------------------------------------
# Hand-worked cases


@pytest.mark.parametrize(
    ("pattern", "text", "expected_count"),
    [
        # Rust's \w includes the combining accent, Python's does not.
        (r"\w+", "x\u0301y", 2),
        # Python folds "İ" onto "i"; Rust does not.
        ("(?i)i", "\u0130", 1),
        # Python's \s includes the information separators \x1c-\x1f.
        (r"\s", "a\x1cb", 1),
        # Python reads "[[a]]" as the class {"[", "a"} followed by "]".
        ("[[a]]", "a] [] a", 2),
        (r"\w+", "数据库 🚀 databricks", 2),
        (r"[^\w\s]", "数据库 🚀 databricks", 1),
        ("数据", "数据库 🚀 数据", 2),
        ("🚀", "数据库 🚀 databricks 🚀", 2),
        ("(?i)databricks", "Databricks DATABRICKS databricks", 3),
        # Kelvin sign and long s fold onto k and s in Python.
        ("(?i)k", "k K \u212a", 3),
        ("(?i)s", "s S \u017f", 3),
        ("(?a)(?i)k", "k K \u212a", 2),
        ("(?i:a)B", "AB Ab ab aB", 2),
        ("(?m)^x$", "x\nx\nyx\n", 2),
        (r"\Ax\Z", "x", 1),
        (r"\Ax\Z", "x\n", 0),
        ("a.b", "a\nb a-b", 1),
        ("(?s)a.b", "a\nb a-b", 2),
        ("a+?", "aaa", 3),
        ("(?:ab|a)c", "abc ac", 2),
    ],
)
def test_hand_worked_cases(pattern, text, expected_count):
    assert len(re.findall(pattern, text)) == expected_count
    counted, searched = assert_agrees(pattern, text)
    assert counted.rust_pattern is not None, counted.reason
    assert searched.rust_pattern is not None, searched.reason
    assert counted.reason is None and searched.reason is None
    assert polars_count(counted.rust_pattern, text) == expected_count


def test_combining_mark_is_not_word_character():
    rust = translate(r"\w+", count=True).rust_pattern
    # Running the raw pattern in Polars would give 1 here.
    assert polars_count(r"\w+", "x\u0301y") == 1
    assert polars_count(rust, "x\u0301y") == 2


@pytest.mark.parametrize(
    ("pattern", "count", "reason_part"),
    [
        ("(?<=a)b", False, "look-behind"),
        ("(?<!a)b", True, "look-behind"),
        ("a(?=b)", True, "look-ahead"),
        ("a(?!b)", False, "look-ahead"),
        (r"(a)\1", True, "backreference"),
        (r"(?P<x>a)(?P=x)", False, "backreference"),
        ("(a)?(?(1)b|c)", True, "conditional"),
        ("(?>ab)", True, "atomic"),
        ("a*+b", False, "possessive"),
        ("a$", True, "'$'"),
        ("a$", False, "'$'"),
        (r"\bword\b", True, r"\b"),
        (r"a\B", False, r"\B"),
        ("a*", True, "empty string"),
        ("x|", True, "empty string"),
        ("^", True, "empty string"),
    ],
)
def test_fallbacks(pattern, count, reason_part):
    result = translate(pattern, count=count)
    assert result == Translation(pattern, None, result.reason)
    assert reason_part in result.reason


def test_zero_width_patterns_translate_for_search():
    for pattern, text, expected in [("a*", "bbb", True), ("^", "", True)]:
        result = translate(pattern, count=False)
        assert result.rust_pattern is not None, result.reason
        assert polars_contains(result.rust_pattern, text) is expected


def test_multiline_dollar_translates():
    result = translate("(?m)a$", count=True)
    assert result.rust_pattern is not None
    assert polars_count(result.rust_pattern, "a\nba\na") == 3


def test_invalid_pattern_raises_re_error():
    with pytest.raises(re.error):
        translate("(unclosed", count=True)
    with pytest.raises(re.error):
        translate("(?<=a+)b", count=False)


def test_empty_class_never_matches():
    result = translate(r"x[^\x00-\U0010ffff]?y", count=True)
    assert result.rust_pattern is not None
    assert polars_count(result.rust_pattern, "xy xzy") == 1


def test_polars_size_limit_falls_back():
    result = translate(r"\w{2000}", count=True)
    assert result.rust_pattern is None
    assert "Polars rejected" in result.reason


def test_scoped_ascii_flag_falls_back():
    # Python checks the first character of "(?a:\S)" against the Unicode \s
    # as well (a search shortcut compiled with the global flags), so "\x1c"
    # matches "(?a)\S" but not "(?a:\S)".
    assert re.search(r"(?a)\S", "\x1c") is not None
    assert re.search(r"(?a:\S)", "\x1c") is None
    for count in (True, False):
        result = translate(r"(?a:\S)", count=count)
        assert result.rust_pattern is None
        assert "(?a:...)" in result.reason
    # Repeating the global flag in a group changes nothing and is fine.
    assert translate(r"(?a)(?a:\S)", count=True).rust_pattern is not None


def test_repeat_of_nullable_part_falls_back_only_for_counting():
    pattern, text = "a(?:(?:a?|b*)a?)*", "aaba"
    # Python stops looping after an empty pass, Rust does not, so the two
    # engines end the first match at different places.
    assert len(re.findall(pattern, text)) == 2
    assert polars_count(pattern, text) == 1
    counted = translate(pattern, count=True)
    assert counted.rust_pattern is None
    assert "repeated part" in counted.reason
    searched = translate(pattern, count=False)
    assert searched.rust_pattern is not None
    assert polars_contains(searched.rust_pattern, text)
    # A nullable part under "?" is still safe to count.
    assert translate("a(?:b*)?", count=True).rust_pattern is not None


def test_capture_groups_do_not_change_counts():
    counted, _ = assert_agrees(r"(a)(b)?", "ab a b")
    assert counted.rust_pattern is not None
    assert polars_count(counted.rust_pattern, "ab a b") == 2


# ---------------------------------------------------------------------------
# Property test over a small pattern grammar

PIECES = [
    *"abkKsSiIyz019_ ",
    "\n",
    "\u0130",  # İ
    "\u0131",  # ı
    "\u212a",  # Kelvin sign
    "\u017f",  # long s
    "\u00e9",  # é precomposed
    "e\u0301",  # e + combining acute
    "\u6570",  # 数
    "\U0001f680",  # rocket emoji
    "\x1c",
]
SINGLE_CHARS = sorted({c for piece in PIECES for c in piece})

texts = st.lists(st.sampled_from(PIECES), max_size=10).map("".join)

class_items = st.one_of(
    st.sampled_from(SINGLE_CHARS).map(re.escape),
    st.tuples(st.sampled_from(SINGLE_CHARS), st.sampled_from(SINGLE_CHARS)).map(
        lambda ends: "%s-%s" % tuple(re.escape(c) for c in sorted(ends))
    ),
    st.sampled_from([r"\d", r"\w", r"\s", r"\D", r"\W", r"\S"]),
    # Text that Rust would read as set syntax but Python reads literally.
    st.sampled_from(["[", "&&", "--", "~~", "[a]"]),
)
char_classes = st.builds(
    lambda negate, items: "[" + ("^" if negate else "") + "".join(items) + "]",
    st.booleans(),
    st.lists(class_items, min_size=1, max_size=3),
)
atoms = st.one_of(
    st.sampled_from(PIECES).map(re.escape),
    char_classes,
    st.sampled_from([r"\d", r"\w", r"\s", r"\D", r"\W", r"\S", "."]),
    st.sampled_from(["^", "$", r"\A", r"\Z"]),
    st.sampled_from([r"\b", r"(?=a)", r"(?<!b)", r"(a)\1"]),
)
quantifiers = st.builds(
    lambda base, lazy: base + ("?" if lazy else ""),
    st.sampled_from(["*", "+", "?", "{2}", "{1,3}", "{0,2}", "{2,}", "{,2}"]),
    st.booleans(),
)
group_openers = st.sampled_from(["(", "(?:", "(?i:", "(?-i:", "(?s:", "(?m:", "(?a:", "(?is:"])


def _extend(inner):
    return st.one_of(
        st.lists(inner, min_size=2, max_size=3).map("".join),
        st.lists(inner, min_size=2, max_size=3).map("|".join),
        st.builds(lambda opener, body: opener + body + ")", group_openers, inner),
        st.builds(lambda body, q: "(?:" + body + ")" + q, inner, quantifiers),
        st.builds(lambda body, q: body + q, atoms, quantifiers),
    )


patterns = st.builds(
    lambda flags, body: ("(?" + "".join(flags) + ")" if flags else "") + body,
    st.lists(st.sampled_from("isma"), max_size=2, unique=True),
    st.recursive(atoms, _extend, max_leaves=6),
)


def check_pattern(pattern: str, sample: list[str], stats: Counter) -> None:
    try:
        re.compile(pattern)
    except re.error:
        stats["invalid"] += 1
        return
    stats["valid"] += 1
    column = pl.Series(sample, dtype=pl.String)
    counted = translate(pattern, count=True)
    if counted.rust_pattern is not None:
        stats["count_translated"] += 1
        expected = [len(re.findall(pattern, s)) for s in sample]
        got = column.str.count_matches(counted.rust_pattern).to_list()
        assert got == expected, (pattern, counted.rust_pattern, sample)
    searched = translate(pattern, count=False)
    if searched.rust_pattern is not None:
        stats["search_translated"] += 1
        expected = [re.search(pattern, s) is not None for s in sample]
        got = column.str.contains(searched.rust_pattern).to_list()
        assert got == expected, (pattern, searched.rust_pattern, sample)


def test_random_patterns_agree_with_python():
    stats: Counter = Counter()

    @settings(
        max_examples=300,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(pattern=patterns, sample=st.lists(texts, min_size=1, max_size=8))
    def check(pattern, sample):
        check_pattern(pattern, sample, stats)

    check()
    # The comparison is only meaningful if plenty of patterns get translated.
    assert stats["valid"] >= 150, stats
    assert stats["search_translated"] >= 0.4 * stats["valid"], stats
    assert stats["count_translated"] >= 0.2 * stats["valid"], stats
