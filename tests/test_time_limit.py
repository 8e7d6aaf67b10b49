"""map_with_time_limit: in-process results, a stuck item becomes TIMED_OUT, the rest go on."""

from __future__ import annotations

import os
import re
import time

import pytest

from ragbatch.core.time_limit import TIMED_OUT, Failed, map_with_time_limit


def _work(item):
    if item == "hang":
        time.sleep(60)
    if item == "raise":
        raise KeyError("no such thing")
    if item == "die":
        os._exit(3)
    return item.upper() if isinstance(item, str) else item


def test_results_equal_the_in_process_values_in_order():
    items = ["a", "é", "中文", "👍", "", 7, None, "a"]
    assert map_with_time_limit(_work, items, 5.0) == ["A", "É", "中文", "👍", "", 7, None, "A"]


def test_a_stuck_item_times_out_and_later_items_still_run():
    started = time.monotonic()
    got = map_with_time_limit(_work, ["x", "hang", "y", "hang", "z"], 0.3)
    assert got == ["X", TIMED_OUT, "Y", TIMED_OUT, "Z"]
    assert time.monotonic() - started < 30  # not the 60 s the stuck items would sleep


def test_raising_and_dying_items_become_failures():
    got = map_with_time_limit(_work, ["raise", "ok", "die", "ok"], 5.0)
    assert got[0] == Failed("KeyError: 'no such thing'")
    assert got[1] == "OK" and got[3] == "OK"
    assert isinstance(got[2], Failed) and "exit code 3" in got[2].message


def test_catastrophic_backtracking_in_python_re_is_cut_off():
    pattern = re.compile("(a|a)+$")  # 2^n ways to split n a's before the final 'b'
    got = map_with_time_limit(
        lambda s: pattern.search(s) is not None, ["a" * 40 + "b", "aaa", "b"], 0.5
    )
    assert got == [TIMED_OUT, True, False]


def test_empty_input_and_bad_limit():
    assert map_with_time_limit(_work, [], 1.0) == []
    with pytest.raises(ValueError, match="limit_s must be > 0"):
        map_with_time_limit(_work, ["a"], 0)


def test_many_fast_items_around_a_stuck_one_come_back_exactly():
    items = [f"r{i}-é中👍" for i in range(3000)]
    items[1700] = "hang"
    got = map_with_time_limit(_work, items, 0.5)
    want = [s.upper() for s in items]
    want[1700] = TIMED_OUT
    assert got == want
