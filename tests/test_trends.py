"""Trends across nights (:mod:`ragbatch.analysis.trends`) and the report's trend section.

The shift rule is checked on series worked out by hand; then seven real nights of a small
expression job (run in the process, no Ray) whose answers start matching their references
more often from night five on in one slice: the report of night seven must mark that
slice's shift and no other, and render in headless Chromium with every chart decoded.
"""

from __future__ import annotations

import datetime as dt
import html as html_lib
import json
import re
from pathlib import Path

import polars as pl
import pytest

from support.headless_chromium import HeadlessChromium
from support.nightly_runs import run_cli
from ragbatch.analysis.runs import find_run
from ragbatch.analysis.trends import SERIES_SCHEMA, find_shifts, trend_runs, trend_series


def _series(rows: list[tuple]) -> pl.DataFrame:
    """(metric, slice column, slice value, [means], half width) -> the long series."""
    out = []
    for metric, column, value, means, half in rows:
        for night, mean in enumerate(means):
            out.append(
                {
                    "night": night,
                    "run_id": f"r{night}",
                    "run_date": dt.date(2026, 11, 1) + dt.timedelta(days=night),
                    "metric": metric,
                    "slice_column": column,
                    "slice_value": value,
                    "mean": mean,
                    "mean_ci_low": None if mean is None or half is None else mean - half,
                    "mean_ci_high": None if mean is None or half is None else mean + half,
                    "n_ok": 10,
                }
            )
    return pl.DataFrame(out, schema=SERIES_SCHEMA)


def test_shifts_by_hand():
    series = _series(
        [
            # reference = median(0.50, 0.52, 0.48, 0.51) = 0.505; the last three lows 0.57,
            # 0.58, 0.59 are above it; the fourth from last (0.48) is not: 3 runs in a row
            ("m", None, None, [0.50, 0.52, 0.48, 0.51, 0.60, 0.61, 0.62], 0.03),
            # one night out, then back: no shift
            ("m", "app", "a", [0.5, 0.5, 0.5, 0.5, 0.5, 0.7, 0.5], 0.03),
            # down in a CJK slice: reference median(0.9, 0.8, 0.85) = 0.85; highs 0.8, 0.75,
            # 0.7 are below it; the run before (0.85 + 0.1) is not: 3 runs in a row
            ("m", "app", "北京", [0.9, 0.8, 0.85, 0.7, 0.65, 0.6], 0.1),
            # a move inside the intervals' width: no shift
            ("m", "app", "e\u0301", [0.5, 0.5, 0.5, 0.55, 0.55, 0.55], 0.1),
            # too few runs (5 < 3 + 3)
            ("m", "app", None, [0.1, 0.1, 0.9, 0.9, 0.9], 0.01),
            # no intervals (a summary before intervals): not judged
            ("n", None, None, [0.1, 0.1, 0.1, 0.9, 0.9, 0.9], None),
        ]
    )
    shifts = find_shifts(series)
    assert [(s.metric, s.slice_column, s.slice_value, s.direction, s.nights) for s in shifts] == [
        ("m", None, None, "up", 3),
        ("m", "app", "北京", "down", 3),
    ]
    assert shifts[0].reference == pytest.approx(0.505)
    assert shifts[0].latest == pytest.approx((0.60, 0.61, 0.62))
    assert shifts[1].reference == pytest.approx(0.85)
    # shorter rule: two runs in a row over two earlier runs
    two = find_shifts(series, shift_nights=2, min_reference=2)
    assert ("m", "app", None, "up") in {
        (s.metric, s.slice_column, s.slice_value, s.direction) for s in two
    }
    with pytest.raises(ValueError):
        find_shifts(series, shift_nights=0)
    assert find_shifts(pl.DataFrame(schema=SERIES_SCHEMA)) == []


N_ROWS = 60
APPS = ("检索", "chat")


def _night_input(path: Path, night: int) -> Path:
    """60 rows in two apps; from night 5 on (index 4) every answer of app 检索 matches its
    reference, before that one in three does; app chat always one in three."""
    rows = []
    for i in range(N_ROWS):
        app = APPS[i % 2]
        matches = (app == APPS[0] and night >= 4) or i % 3 == 0
        ref = f"answer {i} 😀"
        rows.append(
            {
                "q": f"question {i}",
                "a": ref if matches else f"other {i + night}",
                "ref": ref,
                "app": app,
            }
        )
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n")
    return path


@pytest.fixture(scope="module")
def seven_nights(tmp_path_factory):
    base = tmp_path_factory.mktemp("trend")
    out = base / "out"
    ids = []
    for night in range(7):
        date = dt.date(2026, 11, 20) + dt.timedelta(days=night)
        config = base / f"night{night}.yaml"
        config.write_text(
            json.dumps(
                {
                    "run": {"name": "trend", "executor": "in_process", "run_date": str(date)},
                    "input": {
                        "uri": str(_night_input(base / f"in{night}.jsonl", night)),
                        "format": "jsonl",
                        "columns": {"question": "q", "answer": "a", "reference": "ref"},
                        "slice_columns": ["app"],
                    },
                    "output": {"uri": str(out)},
                    "metrics": [{"name": "exact_match"}],
                }
            )
        )
        code, stdout, err = run_cli(["run", str(config)])
        assert code == 0, err
        ids.append(stdout.split()[1])
    return out, ids


@pytest.mark.slow
def test_series_and_shift_of_seven_nights(seven_nights):
    out, ids = seven_nights
    last = find_run(str(out), ids[-1])
    runs = trend_runs(last)
    assert [r.run_id for r in runs] == ids
    assert [r.run_id for r in trend_runs(last, nights=3)] == ids[-3:]
    series = trend_series(runs)
    overall = series.filter(pl.col("slice_column").is_null()).sort("night")
    # per night: app chat matches i % 3 == 0 (10 of its 30 rows); app 检索 10 of 30 before
    # night five, then all 30
    expected = [20 / 60] * 4 + [40 / 60] * 3
    assert overall["mean"].to_list() == pytest.approx(expected)
    shifts = find_shifts(series)
    assert [(s.slice_column, s.slice_value, s.direction) for s in shifts] == [
        (None, None, "up"),
        ("app", APPS[0], "up"),
    ]


@pytest.mark.slow
def test_report_marks_the_shift_and_renders(seven_nights, tmp_path):
    out, ids = seven_nights
    html_path = tmp_path / "report.html"
    code, _, err = run_cli(["report", "--output", str(out), ids[-1], "-o", str(html_path)])
    assert code == 0, err
    html = html_path.read_text(encoding="utf-8")
    assert "Trend over the last 7 runs" in html
    shifts = html_lib.unescape(html.split('id="trend-shifts"', 1)[1].split("</table>", 1)[0])
    rows = re.findall(r"<tr><td><code>([^<]+)</code></td><td>([^<]+)</td>", shifts)
    assert rows == [("exact_match", "all rows"), ("exact_match", f"app={APPS[0]}")]
    assert "up (better)" in shifts and "0.333" in shifts
    with HeadlessChromium() as browser:
        result = browser.open_page(
            html_path.as_uri(),
            evaluate=(
                "Promise.all([...document.images].map(i => i.decode().then("
                "() => [i.alt, i.naturalWidth], () => [i.alt, -1])))"
            ),
        )
    assert result.errors == []
    images = dict(result.value)
    assert images.get("trend of exact_match", -1) > 0
    # a report without the trend, and the first night's report has none either
    code, _, err = run_cli(
        [
            "report",
            "--output",
            str(out),
            ids[-1],
            "-o",
            str(tmp_path / "n.html"),
            "--trend-nights",
            "0",
        ]
    )
    assert code == 0 and "Trend over" not in (tmp_path / "n.html").read_text(encoding="utf-8")
    code, _, err = run_cli(["report", "--output", str(out), ids[0], "-o", str(tmp_path / "f.html")])
    assert code == 0 and "Trend over" not in (tmp_path / "f.html").read_text(encoding="utf-8")
