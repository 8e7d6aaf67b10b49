"""Numbers in reasons carry no floating-point noise, and millisecond latencies convert to
the seconds a person would write (7100 ms is 7.1 s, not 7.1000000000000005 s)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from support.metric_frames import run_metric
from ragbatch.config.job import InputSection
from ragbatch.io import ReadTask, normalize
from ragbatch.metrics.context_length import ContextLength
from ragbatch.metrics.latency import Latency
from ragbatch.metrics.response_length import ResponseLength
from ragbatch.core.reasons import number_text

TASK = ReadTask("/data/f.csv", "f.csv", "csv")


def _seconds(values, type_=pa.string(), unit="ms") -> list:
    raw = pa.table({"l": pa.array(values, type_)})
    cfg = InputSection(uri="unused", columns={"latency_s": "l"}, latency_unit=unit)
    return normalize(raw, cfg, TASK)["latency_s"].to_pylist()


def test_milliseconds_become_the_decimal_seconds():
    # 7100 * 0.001 == 7.1000000000000005 and 300 * 0.001 == 0.30000000000000004;
    # dividing by 1000 gives the float nearest the decimal value
    assert _seconds(["7100", "300", "1"]) == [7.1, 0.3, 0.001]
    assert _seconds([7100, 300], pa.int64()) == [7.1, 0.3]
    assert _seconds([7100, 300], pa.duration("ms"), unit="s") == [7.1, 0.3]
    assert _seconds([7_100_000], pa.duration("us"), unit="s") == [7.1]


def test_latency_at_its_target_in_milliseconds_passes():
    [seconds] = _seconds(["7100"])
    [cell] = run_metric(Latency.from_params({"target_s": 7.1}), [{"latency_s": seconds}])
    assert (cell["score"], cell["reason"]) == (1.0, None)


@pytest.mark.parametrize(
    "latency, target, reason",
    [
        (7.1000000000000005, 5.0, "7.1 s > target 5 s"),
        (0.30000000000000004, 0.25, "0.3 s > target 0.25 s"),
        (12.0, 0.1, "12 s > target 0.1 s"),
        (1234567.125, 1e-07, "1234567.125 s > target 1e-07 s"),
    ],
)
def test_latency_reason_has_no_float_noise(latency, target, reason):
    [cell] = run_metric(Latency.from_params({"target_s": target}), [{"latency_s": latency}])
    assert (cell["score"], cell["reason"]) == (0.0, reason)


def test_length_reasons_print_integers():
    [cell] = run_metric(ResponseLength.from_params({"max_chars": 3}), [{"answer": "abcd"}])
    assert cell["reason"] == "4 chars outside [0, 3]"
    [cell] = run_metric(ContextLength.from_params({"max_chars": 2}), [{"contexts": ["abc", "x"]}])
    assert cell["reason"] == "#0 (3 chars) outside [0, 2]"


@pytest.mark.parametrize(
    "value, text",
    [
        (7.1000000000000005, "7.1"),
        (5.0, "5"),
        (5, "5"),
        (0.1 + 0.2, "0.3"),
        (1e-07, "1e-07"),
        (float("inf"), "inf"),
        (-2.5, "-2.5"),
        (123456789012.5, "123456789012"),
    ],
)
def test_number_text(value, text):
    assert number_text(value) == text
