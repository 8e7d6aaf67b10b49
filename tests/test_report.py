"""``ragbatch report``: the HTML report of the ARES nights, opened in headless Chromium.

The console-error detector is proven first on pages with deliberate faults (a script
error, a console.error call, a missing image, a script blocked by the report's
Content-Security-Policy); then the report of the night whose answers were replaced
(some of them with HTML and script) must render with no console error, every chart
decoded, no request outside the file itself, and the injected markup shown as text.
A full-page screenshot is kept in test-artifacts/ (gitignored) and the test's tmp dir.
"""

from __future__ import annotations

import html as html_lib
import re
from pathlib import Path

import pytest

from support.headless_chromium import HeadlessChromium
from support.nightly_runs import (
    ALTERED,
    ALTERED_NIGHT,
    NIGHTS,
    ORIGINAL,
    altered_answer,
    read_ares,
    row_id,
    run_cli,
)
from ragbatch.analysis.report import MAX_CHART_VALUES, TOP_ROWS

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
CSP = (
    '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; img-src data:; '
    'style-src \'unsafe-inline\'">'
)

_IMAGES = (
    "Promise.all([...document.images].map(i => i.decode().then("
    "() => [i.alt, i.naturalWidth], () => [i.alt, -1])))"
)


@pytest.fixture(scope="module")
def chromium():
    with HeadlessChromium() as browser:
        yield browser


def _page(tmp_path: Path, name: str, body: str, head: str = "") -> str:
    path = tmp_path / name
    path.write_text(
        f"<!DOCTYPE html><html><head><meta charset='utf-8'>{head}<title>{name}</title>"
        f"</head><body>{body}</body></html>",
        encoding="utf-8",
    )
    return path.as_uri()


@pytest.mark.parametrize(
    "name, body, head, expected",
    [
        (
            "script_error.html",
            "<p>x</p><script>notDefinedAnywhere();</script>",
            "",
            "ReferenceError: notDefinedAnywhere is not defined",
        ),
        (
            "console_error.html",
            "<script>console.error('deliberate failure')</script>",
            "",
            "console.error: deliberate failure",
        ),
        ("missing_image.html", "<img src='missing-chart.svg' alt='x'>", "", "missing-chart.svg"),
        (
            "csp_blocked.html",
            "<script>document.title = 'ran'</script>",
            CSP,
            "Content Security Policy",
        ),
    ],
)
def test_detector_reports_deliberate_faults(chromium, tmp_path, name, body, head, expected):
    result = chromium.open_page(_page(tmp_path, name, body, head), evaluate="document.title")
    assert any(expected in e for e in result.errors), result.errors
    assert result.value == name  # the CSP page's script never ran


def test_detector_is_quiet_on_a_clean_page(chromium, tmp_path):
    result = chromium.open_page(
        _page(tmp_path, "clean.html", "<p>检索 😀 cafe\u0301</p>"), evaluate="document.title"
    )
    assert result.errors == [] and result.value == "clean.html"


def _chartable_slice_columns() -> list[str]:
    """Slice columns of jobs/ares.yaml with at most MAX_CHART_VALUES distinct values
    (an empty cell is null, counted as one value), from the raw TSV."""
    header, rows = read_ares()
    mapped = {"Question", "Document", "Answer"}
    return [
        name
        for i, name in enumerate(header)
        if name not in mapped and len({r[i] or None for r in rows}) <= MAX_CHART_VALUES
    ]


@pytest.fixture(scope="module")
def report_html(ares_nights, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "report.html"
    ids = ares_nights.run_ids
    code, stdout, err = run_cli(
        [
            "report",
            "--output",
            str(ares_nights.nightly),
            ids[ALTERED_NIGHT],
            "--baseline",
            ids[ORIGINAL],
            "-o",
            str(out),
        ]
    )
    assert code == 0, err
    assert f"compared with {ids[ORIGINAL]}" in stdout
    return out


@pytest.mark.slow
def test_report_renders_in_chromium_without_errors(chromium, ares_nights, report_html, tmp_path):
    result = chromium.open_page(
        report_html.as_uri(),
        screenshot=True,
        evaluate=(
            f"Promise.all([{_IMAGES}, document.title, document.scripts.length, "
            "document.getElementById('moved-rows').textContent])"
        ),
    )
    images, title, n_scripts, moved_text = result.value
    assert result.errors == []
    # Every request is the file itself or an embedded data: chart: nothing from a network.
    assert all(
        u == report_html.as_uri() or u.startswith("data:image/svg+xml") for u in result.requests
    )
    metrics = [
        "response_length",
        "context_length",
        "mentions_databricks",
        "cites_a_url",
        "mentions_spark",
        "not_a_refusal",
    ]
    expected = (
        {f"distribution of {m} scores" for m in metrics}
        | {f"means by {c}" for c in _chartable_slice_columns()}
        | {"cells by status", "paired differences by metric"}
        | {f"trend of {m}" for m in metrics}
    )
    assert sorted(alt for alt, _ in images) == sorted(expected)
    assert all(width > 0 for _, width in images), images
    # Answers holding markup and script were shown as text and never ran.
    assert title == f"ragbatch report: ares-databricks {ares_nights.run_ids[ALTERED_NIGHT]}"
    assert n_scripts == 0
    assert "<script>document.title='injected'</script>" in moved_text
    assert result.screenshot.startswith(b"\x89PNG") and len(result.screenshot) > 50_000
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "report.png").write_bytes(result.screenshot)
    (tmp_path / "report.png").write_bytes(result.screenshot)


@pytest.mark.slow
def test_report_content_matches_the_runs(ares_nights, report_html):
    html = report_html.read_text(encoding="utf-8")
    assert "<script" not in html
    assert "&lt;script&gt;document.title=" in html and "&lt;img src=x onerror=" in html
    # 25 answers replaced, every fifth with an empty cell (null): 5 rows x 4 answer metrics
    # missing_input, and not_applicable for the binary callback on those 5.
    empty = [i for i in ALTERED if altered_answer(i) == ""]
    assert len(empty) == 5
    assert f"missing inputs {len(empty) * 4}," in html and f"not applicable {len(empty)}." in html
    # Worst rows of not_a_refusal: the non-empty replacements score 0; the first TOP_ROWS
    # by row id (string order) are listed, each with its question.
    section = html.split("<h3><code>not_a_refusal</code>", 1)[1].split("<h3>", 1)[0]
    zero = sorted(row_id(i) for i in ALTERED if altered_answer(i))
    listed = re.findall(r"<td><code>([^<]+)</code></td><td class=\"num\">0\.000</td>", section)
    assert listed == zero[:TOP_ROWS]
    header, rows = read_ares()
    first = int(zero[0].rsplit(":", 1)[1])
    question = rows[first][header.index("Question")]
    assert question[:60] in html_lib.unescape(section)
    # The comparison section names the baseline and shows the answers of moved rows.
    assert f"Comparison with baseline <code>{ares_nights.run_ids[ORIGINAL]}" in html
    moved = html_lib.unescape(html.split('id="moved-rows"', 1)[1].split("</table>", 1)[0])
    assert "I'm sorry, I don't know. 我不知道 🤷" in moved
    # The trend: the three nights under the root, oldest first; three runs cannot show a
    # shift (it needs three earlier runs as its reference).
    assert "Trend over the last 3 runs" in html
    trend = html.split('id="trend-table"', 1)[1].split("</table>", 1)[0]
    assert re.findall(r"<td><code>([^<]+)</code></td>", trend) == [
        ares_nights.run_ids[night] for night in NIGHTS
    ]
    assert "No shift has lasted 3 runs." in html


@pytest.mark.slow
def test_report_without_baseline_and_of_an_unknown_run(ares_nights, tmp_path):
    out = tmp_path / "first.html"
    first = ares_nights.run_ids[ORIGINAL]
    code, _, err = run_cli(
        ["report", "--output", str(ares_nights.nightly), first, "--html", str(out)]
    )
    assert code == 0, err
    html = out.read_text(encoding="utf-8")
    assert 'id="comparison"' not in html and 'id="worst"' in html
    code, _, err = run_cli(["report", "--output", str(ares_nights.nightly), "nope", "-o", str(out)])
    assert code == 2 and "no committed run 'nope'" in err


@pytest.mark.slow
def test_texts_never_shown_next_to_a_pii_metric(ares_nights, monkeypatch):
    # No PII engine runs here (Presidio takes half a minute to start): the registry's
    # answer for one metric is replaced by a PII kind, as answer_contains_pii declares.
    import dataclasses

    from ragbatch.analysis import report
    from ragbatch.analysis.metric_facts import PII_KIND
    from ragbatch.analysis.runs import find_run

    real = report.metric_facts

    def as_if_pii(*runs):
        facts = real(*runs)
        facts["not_a_refusal"] = dataclasses.replace(facts["not_a_refusal"], kind=PII_KIND)
        return facts

    monkeypatch.setattr(report, "metric_facts", as_if_pii)
    root, ids = str(ares_nights.nightly), ares_nights.run_ids
    html = report.build_report(find_run(root, ids[ALTERED_NIGHT]), find_run(root, ids[ORIGINAL]))
    section = html.split("<h3><code>not_a_refusal</code>", 1)[1].split("<h3>", 1)[0]
    listed = re.findall(r"<td><code>([^<]+)</code></td>", section)
    assert len(listed) == TOP_ROWS and section.count("texts hidden: PII metric") == TOP_ROWS
    header, rows = read_ares()
    text = html_lib.unescape(section)
    for rid in listed:
        index = int(rid.rsplit(":", 1)[1])
        assert rows[index][header.index("Question")][:40] not in text
        assert altered_answer(index)[:20] not in text
    # The same rows keep their texts under a metric that is not about PII ...
    other = html_lib.unescape(
        html.split("<h3><code>mentions_databricks</code>", 1)[1].split("<h3>", 1)[0]
    )
    assert "I'm sorry, I don't know. 我不知道 🤷" in other
    # ... and in the moved rows, every not_a_refusal line hides them.
    moved = html.split('id="moved-rows"', 1)[1].split("</table>", 1)[0]
    lines = [line for line in moved.split("<tr>") if "<code>not_a_refusal</code>" in line]
    assert lines and all("texts hidden: PII metric" in line for line in lines)
