"""Property tests: expression metrics against a second implementation in plain Python.

The Python reference for each metric is written from its definition (Tonic Validate /
Vellum semantics): ``str.lower``, ``str.strip``, ``len``, ``in``, ``re.findall`` and
``re.search``.
"""

from __future__ import annotations

import re
import unicodedata

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.metric_frames import run_metric
from ragbatch.scoring.registry import get_metric

# Characters assigned in this Python's Unicode database (case mappings of characters added
# in later Unicode versions legitimately differ between Python and Rust builds).
_ASSIGNED = st.characters(
    codec="utf-8",
    exclude_categories=("Cs", "Cn"),
).filter(lambda c: unicodedata.category(c) != "Cn")
_SPECIAL = st.sampled_from(list("aAbB \n\t\x1c\u3000İıKſé\u0301数据🚀ΣσςẞßǅΩ0123.!?"))
_TEXT = st.text(alphabet=st.one_of(_SPECIAL, _ASSIGNED), max_size=20)

SETTINGS = settings(
    max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
#: The regex property compiles a pattern per example in both engines: fewer examples keep
#: it within the suite's time (the translation's own cases are in test_regex_compat.py).
REGEX_SETTINGS = settings(SETTINGS, max_examples=100)


def _score(name, params, answers, **extra_cols):
    m = get_metric(name).from_params(params)
    rows = [
        {"answer": a, **{k: v[i] for k, v in extra_cols.items()}} for i, a in enumerate(answers)
    ]
    return [c["score"] for c in run_metric(m, rows)]


@SETTINGS
@given(text=_TEXT, answers=st.lists(_TEXT, min_size=1, max_size=5))
def test_answer_match_equals_python_lower(text, answers):
    got = _score("answer_match", {"text": text}, answers)
    assert got == [float(a.lower() == text.lower()) for a in answers]


@SETTINGS
@given(
    answers=st.lists(_TEXT, min_size=1, max_size=5), refs=st.lists(_TEXT, min_size=5, max_size=5)
)
def test_exact_match_equals_python_strip(answers, refs):
    refs = refs[: len(answers)]
    got = _score("exact_match", {}, answers, reference=refs)
    assert got == [float(a.strip() == r.strip()) for a, r in zip(answers, refs)]
    got_ci = _score("exact_match", {"case_sensitive": False}, answers, reference=refs)
    assert got_ci == [float(a.strip().lower() == r.strip().lower()) for a, r in zip(answers, refs)]


@SETTINGS
@given(
    needles=st.lists(_TEXT.filter(bool), min_size=1, max_size=3),
    answers=st.lists(_TEXT, min_size=1, max_size=5),
)
def test_contains_text_equals_python_in(needles, answers):
    got = _score("contains_text", {"text": needles}, answers)
    assert got == [float(all(n.lower() in a.lower() for n in needles)) for a in answers]
    got_cs = _score("contains_text", {"text": needles, "case_sensitive": True}, answers)
    assert got_cs == [float(all(n in a for n in needles)) for a in answers]


@SETTINGS
@given(
    answers=st.lists(_TEXT, min_size=1, max_size=5), low=st.integers(0, 8), width=st.integers(0, 8)
)
def test_response_length_equals_python_len(answers, low, width):
    got = _score("response_length", {"min_chars": low, "max_chars": low + width}, answers)
    assert got == [float(low <= len(a) <= low + width) for a in answers]


def _context_length_reference(contexts, low, high):
    """(score, status, reason) of ``context_length`` from its definition, in plain Python."""
    if contexts is None:
        return None, "missing_input", "contexts is null"
    if not contexts:
        return None, "not_applicable", "contexts is an empty list"
    if None in contexts:
        return None, "missing_input", f"contexts[{contexts.index(None)}] is null"
    bad = [f"#{i} ({len(c)} chars)" for i, c in enumerate(contexts) if not low <= len(c) <= high]
    if not bad:
        return 1.0, "ok", None
    return 0.0, "ok", f"{', '.join(bad)} outside [{low}, {high}]"


@SETTINGS
@given(
    rows=st.lists(
        st.one_of(st.none(), st.lists(st.one_of(st.none(), _TEXT, _TEXT, _TEXT), max_size=5)),
        min_size=1,
        max_size=8,
    ),
    low=st.integers(0, 6),
    width=st.integers(0, 6),
)
def test_context_length_equals_python_len(rows, low, width):
    # Repeat the rows so that every batch also holds exact duplicates.
    rows = rows + rows[:2]
    m = get_metric("context_length").from_params({"min_chars": low, "max_chars": low + width})
    cells = run_metric(m, [{"contexts": c} for c in rows])
    got = [(c["score"], c["status"], c["reason"]) for c in cells]
    assert got == [_context_length_reference(c, low, low + width) for c in rows]


# Patterns are assembled from pieces so that every construct the translator handles, and
# several it must refuse, show up often.
_ATOMS = st.sampled_from(
    [
        "a",
        "b",
        "A",
        "İ",
        "ı",
        "ſ",
        "K",
        "é",
        "e\u0301",
        "数",
        "🚀",
        " ",
        r"\n",
        r"\x1c",
        ".",
        r"\w",
        r"\W",
        r"\d",
        r"\s",
        r"\S",
        "[a-z]",
        "[^a ]",
        "[İı]",
        r"[\w.]",
        "(?:ab|a)",
        "(a|b)",
        r"\b",
        "^",
        "$",
        r"\A",
        r"\Z",
        "(?<=a)",
        "(?=b)",
        r"(a)\1",
    ]
)
_QUANT = st.sampled_from(["", "", "", "*", "+", "?", "{1,2}", "*?", "+?", "{2}"])
_FLAGS = st.sampled_from(["", "", "(?i)", "(?s)", "(?m)", "(?a)", "(?i)(?m)"])


@st.composite
def _patterns(draw):
    parts = draw(st.lists(st.tuples(_ATOMS, _QUANT), min_size=1, max_size=4))
    body = "".join(
        a + (q if a not in ("^", "$", r"\A", r"\Z", r"\b", "(?<=a)", "(?=b)") else "")
        for a, q in parts
    )
    return draw(_FLAGS) + body


@REGEX_SETTINGS
@given(
    pattern=_patterns(), answers=st.lists(_TEXT, min_size=1, max_size=4), expected=st.integers(0, 3)
)
def test_regex_metric_equals_python_re(pattern, answers, expected):
    try:
        compiled = re.compile(pattern)
    except re.error:
        return
    counted = _score("regex", {"pattern": pattern, "expected_count": expected}, answers)
    assert counted == [float(len(compiled.findall(a)) == expected) for a in answers], pattern
    searched = _score("regex", {"pattern": pattern}, answers)
    assert searched == [float(compiled.search(a) is not None) for a in answers], pattern
