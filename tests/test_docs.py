"""The docs (README and the reference in docs/) document what the code does: metrics,
policies, statuses, output columns."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from scipy import stats

from ragbatch.core.columns import SCORES_COLUMNS
from ragbatch.analysis.summary_types import SUMMARY_SCHEMA
from ragbatch.scoring.registry import all_metrics
from ragbatch.core.status import STATUSES

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
#: The reference the README links to: metrics, statuses and output columns live there.
REFERENCE = README + "".join(
    (ROOT / "docs" / name).read_text(encoding="utf-8")
    for name in ("metrics.md", "output.md", "config.md")
)


def _table_rows(text: str) -> set[tuple[str, ...]]:
    rows = set()
    for line in text.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            rows.add(tuple(cell.strip() for cell in line.strip("|").split("|")))
    return rows


ROWS = _table_rows(REFERENCE)
METRICS_DOC = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")


def _metric_section(name: str) -> str:
    """The text under docs/metrics.md's heading for metric ``name``, up to the next heading."""
    start = METRICS_DOC.index(f"\n### `{name}`\n")
    end = METRICS_DOC.find("\n#", start + 1)
    return METRICS_DOC[start:] if end < 0 else METRICS_DOC[start:end]


@pytest.mark.parametrize("cls", all_metrics(), ids=lambda c: c.name)
def test_metric_documented_with_its_policy(cls):
    overview = [r for r in _table_rows(METRICS_DOC) if r[0] == f"`{cls.name}`"]
    assert overview and all(len(r) == 5 and r[1] == cls.kind for r in overview), (
        "missing from the metrics table"
    )
    section = _metric_section(cls.name)
    rows = _table_rows(section)
    for case, outcome in cls.policy:
        assert (case, outcome) in rows, f"policy row missing: {case} -> {outcome}"
    for pname, finfo in cls.Params.model_fields.items():
        assert any(r[0] == f"`{finfo.alias or pname}`" and len(r) == 4 for r in rows), pname
    assert f"- source: {cls.source}" in section


def test_readme_metrics_section_points_to_the_generated_reference():
    """The README does not repeat the metric table: its Metrics section links to the
    generated docs/metrics.md (tests/test_metrics_doc.py checks that file against the
    code) and gives the number of registered metrics and their kinds."""
    section = README[README.index("\n## Metrics\n") :]
    section = section[: section.index("\n## ", 1)]
    assert "(docs/metrics.md)" in section
    assert not [r for r in _table_rows(section) if r[0].startswith("`")], "a metric table"
    metrics = all_metrics()
    assert f" {len(metrics)} metrics of " in " ".join(section.split())
    for kind in {cls.kind for cls in metrics}:
        assert f"`{kind}`" in section, kind


@pytest.mark.parametrize("doc", ["judges.md", "pii.md"])
def test_policy_tables_elsewhere_match_the_metrics(doc):
    """docs/judges.md and docs/pii.md repeat their metrics' policies in one table; each
    row there must be the metric's own, and each metric there must have all its rows."""
    policies = {
        cls.name: {(case, outcome) for case, outcome in cls.policy} for cls in all_metrics()
    }
    rows = {
        r
        for r in _table_rows((ROOT / "docs" / doc).read_text(encoding="utf-8"))
        if len(r) == 3 and r[0].strip("`") in policies
    }
    assert rows, f"no policy table in docs/{doc}"
    for name in {r[0].strip("`") for r in rows}:
        assert {r[1:] for r in rows if r[0] == f"`{name}`"} == policies[name], name


def test_every_status_documented():
    for status in STATUSES:
        assert any(r[0] == f"`{status}`" for r in ROWS), status


def test_output_columns_documented():
    for column in SCORES_COLUMNS:
        assert any(r[0] == f"`{column}`" for r in ROWS), column
    for field in SUMMARY_SCHEMA.names:
        if not field.startswith("n_") or field in ("n_total", "n_ok"):
            assert f"`{field}`" in REFERENCE, field


def test_readme_commands_are_what_ci_runs():
    ci = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text()
    assert "make test" in README and "make test" in ci
    assert "make demo" in README


#: The Markdown files whose relative links must resolve: the README, the reference in
#: docs/ (benchmark studies included) and the benchmarks summary.
LINKED_DOCS = sorted([ROOT / "README.md", ROOT / "BENCHMARKS.md", *(ROOT / "docs").rglob("*.md")])
_FENCE = re.compile(r"^(```|~~~)")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans removed."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
        elif not fenced:
            lines.append(re.sub(r"`[^`]*`", "", line))
    return lines


def _anchors(path: Path) -> set[str]:
    """The heading anchors GitHub gives a Markdown file: lowercased, punctuation other
    than `-` and `_` dropped, spaces as `-`; a repeated heading gets `-1`, `-2`, ..."""
    seen: dict[str, int] = {}
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
        match = None if fenced else re.match(r"#{1,6} (.+)", line)
        if match:
            slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            if count:
                seen.setdefault(f"{slug}-{count}", 1)
    return set(seen)


def test_anchor_slugs_follow_github():
    # worked out by hand from GitHub's rule
    path = ROOT / "docs" / "judges.md"
    assert "a-small-real-model-smollm2-135m-instruct" in _anchors(path)
    assert "what-any-reason-may-hold-in-a-run-with-pii-metrics" in _anchors(
        ROOT / "docs" / "pii.md"
    )


def test_readme_is_short():
    assert len(README.encode("utf-8")) < 16 * 1024, (
        "README.md is the entry point; move detail to docs/"
    )


@pytest.mark.parametrize("doc", LINKED_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    broken = []
    for line in _prose_lines(doc.read_text(encoding="utf-8")):
        for target in _LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # http:, https:, mailto:
            file_part, _, anchor = target.partition("#")
            path = (doc.parent / file_part).resolve() if file_part else doc
            if not path.exists():
                broken.append(f"{target}: no such file")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                broken.append(f"{target}: no heading with anchor #{anchor}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


def test_readme_layout_lists_the_packages_and_folders():
    """The README's layout tree names every package of ragbatch/ (in the layer order of
    the import contract) and every top-level folder it lists exists."""
    section = README[README.index("\n## Layout\n") :]
    tree = section[section.index("```\n") + 4 : section.index("\n```", section.index("```\n") + 4)]
    listed_packages = [
        line.split()[0].rstrip("/") for line in tree.splitlines() if line.startswith("  ")
    ]
    packages = sorted(
        p.name for p in (ROOT / "ragbatch").iterdir() if (p / "__init__.py").is_file()
    )
    assert sorted(listed_packages) == packages
    top = [
        line.split()[0].rstrip("/")
        for line in tree.splitlines()
        if line and not line.startswith(" ")
    ]
    for folder in top:
        assert (ROOT / folder).is_dir(), folder
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in Python 3.11+")
    contract = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = [
        name.strip().removeprefix("ragbatch.")
        for layer in contract["contracts"][0]["layers"]
        for name in re.split(r"[|:]", layer)
        if name.strip().startswith("ragbatch.")
    ]
    assert listed_packages == [p for p in layers if p in listed_packages]


def test_readme_own_data_example_is_the_shipped_config_and_its_scores():
    """The README's own-data config is examples/quickstart/job.yaml (without its comment
    lines), and the means it prints are the ones worked out by hand from the CSV:
    exact_match (case-insensitive) holds for 1 of the 3 answers, contains_text
    ("Paris" and "France") for 1 of 3, every answer is 1-200 characters, and 2 of the
    4 latencies (820, 1430, 2950, 3100 ms) are within 2 s."""
    import csv
    import json

    from ragbatch.scoring.registry import get_metric
    from support.metric_frames import run_metric
    import yaml

    section = README[README.index("\n## Your own data\n") :]
    block = section[
        section.index("```yaml\n") + 8 : section.index("\n```", section.index("```yaml\n"))
    ]
    job = (ROOT / "examples" / "quickstart" / "job.yaml").read_text(encoding="utf-8")
    assert block + "\n" == "".join(
        line for line in job.splitlines(True) if not line.startswith("#")
    )

    config = yaml.safe_load(job)
    mapping = config["input"]["columns"]
    with open(ROOT / "examples" / "quickstart" / "traces.csv", encoding="utf-8", newline="") as f:
        raw = list(csv.DictReader(f))
    rows = [
        {
            "question": r[mapping["question"]],
            "contexts": json.loads(r[mapping["contexts"]]),
            "answer": r[mapping["answer"]] or None,
            "reference": r[mapping["reference"]],
            "latency_s": float(r[mapping["latency_s"]]) / 1000,
        }
        for r in raw
    ]
    means = {}
    for entry in config["metrics"]:
        metric = get_metric(entry["name"]).from_params(entry["params"])
        scores = [c["score"] for c in run_metric(metric, rows) if c["status"] == "ok"]
        means[entry["name"]] = (len(scores), round(sum(scores) / len(scores), 3))
    assert means == {
        "exact_match": (3, 0.333),
        "contains_text": (3, 0.333),
        "response_length": (3, 1.0),
        "latency": (4, 0.5),
    }
    for name, (ok, mean) in means.items():
        # Every metric of the quickstart is pass/fail: the console shows the Wilson
        # interval of its pass rate, here from scipy (a second implementation).
        ci = stats.binomtest(round(mean * ok), ok).proportion_ci(method="wilson")
        interval = rf"\[{ci.low:.3f}, {ci.high:.3f}\]"
        assert re.search(rf"^{name} +4 +{ok} +{mean:.3f} +{interval}", section, re.MULTILINE), name
