"""``describe_exception``: an exception as one printable line for logs, statuses and the
``cache check`` listing."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragbatch.core.errors import describe_exception


def test_lines_become_one_and_runs_of_space_one_space():
    exc = ValueError("first line\n\n  second\tline\r\nthird ")
    assert describe_exception(exc) == "ValueError: first line second line third"


def test_control_characters_are_escaped_and_other_text_kept():
    # ESC starts a terminal escape sequence; U+000F and DEL are what a damaged file may hold
    exc = OSError("type: \x0f, colour: \x1b[31mred\x1b[0m, del \x7f; 表 😀 é (e\u0301)")
    assert describe_exception(exc) == (
        "OSError: type: \\x0f, colour: \\x1b[31mred\\x1b[0m, del \\x7f; 表 😀 é (e\u0301)"
    )


def test_a_long_message_is_cut_and_an_empty_one_gives_the_type():
    assert describe_exception(RuntimeError("x" * 50), limit=10) == "RuntimeError: xxxxxxx..."
    assert describe_exception(RuntimeError("x" * 10), limit=10) == "RuntimeError: " + "x" * 10
    assert describe_exception(KeyError()) == "KeyError"
    assert describe_exception(ValueError(" \n ")) == "ValueError"


def test_pyarrow_error_about_damaged_pages_is_one_printable_line(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": ["x" * 100] * 10}), path, compression="none")
    data = bytearray(path.read_bytes())
    data[4:40] = bytes(range(1, 37))  # the first page header, overwritten
    with pytest.raises(Exception) as info:
        pq.read_table(pa.BufferReader(bytes(data)))
    text = describe_exception(info.value)
    assert "\n" not in text and text.isprintable(), text
    assert text.startswith(type(info.value).__name__ + ": ")


def test_format_surrogate_and_private_characters_are_escaped():
    from ragbatch.core.errors import printable

    # a bidi override reorders a terminal line; a zero-width space hides; a lone
    # surrogate cannot be encoded; private-use characters have no agreed glyph
    text = "a\u202eb\u200bc\udcffd\U000f0000e"
    assert printable(text) == "a\\u202eb\\u200bc\\udcffd\\U000f0000e"
    assert printable(text).encode("utf-8")  # writable to a UTF-8 terminal or log
    assert printable("\u2028two\x85lines\x1c") == "two lines"  # Unicode line breaks
