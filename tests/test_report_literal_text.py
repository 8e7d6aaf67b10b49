"""Text in the report's charts is literal: ``$...$`` in a slice value or a metric id is
never parsed as mathtext (matplotlib would render valid TeX as math and raise on invalid
TeX such as ``$\\x$``, failing ``run --report`` and ``ragbatch report``).

Charts keep their text as SVG ``<text>`` (``svg.fonttype: none``), so the literal string
is searched for in the SVG; a string drawn as math would appear as separate glyphs
without its dollar signs.
"""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path

import pytest
import yaml

from support.nightly_runs import run_cli
from ragbatch.analysis import plots

FRACTION = r"$\frac{a}{b}$"  # valid TeX
INVALID = r"$\x$"  # mathtext raises on it
METRIC = r"len$\x$"


def _svg_texts(svg: str) -> list[str]:
    """The text content of every ``<text>`` element, unescaped."""
    return [html.unescape(t) for t in re.findall(r"<text[^>]*>(.*?)</text>", svg, flags=re.S)]


@pytest.mark.parametrize(
    "draw, literals",
    [
        (lambda: plots.score_distribution([0.2, 0.7], title=METRIC, boolean=False), [METRIC]),
        (lambda: plots.score_distribution([0.0, 1.0], title=METRIC, boolean=True), [METRIC]),
        (
            lambda: plots.status_breakdown({METRIC: {"ok": 2, "error": 1}, FRACTION: {"ok": 1}}),
            [METRIC, FRACTION],
        ),
        (
            lambda: plots.interval_dots(
                [FRACTION, INVALID],
                [0.1, -0.2],
                [0.0, -0.3],
                [0.2, -0.1],
                title=METRIC,
                xlabel=FRACTION,
                zero_line=True,
            ),
            [METRIC, FRACTION, INVALID],
        ),
        (
            lambda: plots.slice_panel(
                [FRACTION, INVALID],
                {METRIC: [0.5, 0.25]},
                {METRIC: [0.4, 0.1]},
                {METRIC: [0.6, 0.4]},
                title=FRACTION,
                ranges={METRIC: (0.0, 1.0)},
            ),
            [METRIC, FRACTION, INVALID],
        ),
    ],
    ids=["histogram", "boolean", "status", "interval_dots", "slice_panel"],
)
def test_every_chart_draws_dollar_text_literally(draw, literals):
    texts = _svg_texts(draw())
    for literal in literals:
        assert any(literal in t for t in texts), (literal, texts)


@pytest.mark.slow
def test_run_report_and_report_with_tex_in_slice_values(ray_local, tmp_path):
    rows = [
        ("q1", "short", FRACTION),
        ("q2", "a longer answer", INVALID),
        ("q3", "mid", "plain"),
        ("q4", "x", FRACTION),
    ]
    data = tmp_path / "in.jsonl"
    data.write_text(
        "".join(json.dumps({"q": q, "a": a, "topic": t}) + "\n" for q, a, t in rows),
        encoding="utf-8",
    )
    config = tmp_path / "job.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "run": {"name": "tex", "run_date": "2026-02-01"},
                "input": {
                    "uri": str(data),
                    "format": "jsonl",
                    "columns": {"question": "q", "answer": "a"},
                    "slice_columns": ["topic"],
                },
                "output": {"uri": str(tmp_path / "out")},
                "metrics": [
                    {"name": "response_length", "params": {"min_chars": 1, "max_chars": 5}}
                ],
            }
        ),
        encoding="utf-8",
    )

    code, out, err = run_cli(["run", str(config), "--run-id", "tex", "--report"])
    assert code == 0, err[-3000:]
    written = next((tmp_path / "out" / "reports").rglob("report.html"))
    code, out, err = run_cli(
        ["report", "--output", str(tmp_path / "out"), "tex", "-o", str(tmp_path / "again.html")]
    )
    assert code == 0, err[-3000:]
    for page in (written, tmp_path / "again.html"):
        charts = _charts(page)
        # the per-slice panel: both TeX values drawn as written
        panel = [texts for texts in charts if FRACTION in texts]
        assert panel and INVALID in panel[0] and "plain" in panel[0], charts


def _charts(page: Path) -> list[str]:
    """The text of each SVG chart embedded in a report as a data: URI."""
    uris = re.findall(
        r"data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)", page.read_text(encoding="utf-8")
    )
    return [" | ".join(_svg_texts(base64.b64decode(u).decode("utf-8"))) for u in uris]
