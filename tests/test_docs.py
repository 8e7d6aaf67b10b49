"""The docs (README and the reference in docs/) document what the code does: metrics, policies, statuses, output columns."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragbatch.columns import SCORES_COLUMNS
from ragbatch.analysis.summary import SUMMARY_SCHEMA
from ragbatch.registry import all_metrics
from ragbatch.status import STATUSES

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
#: The reference the README links to: metrics, statuses and output columns live there.
REFERENCE = README + "".join((ROOT / "docs" / name).read_text(encoding="utf-8")
                             for name in ("metrics.md", "output.md", "config.md"))
JUDGES = (ROOT / "docs" / "judges.md").read_text(encoding="utf-8")
PII = (ROOT / "docs" / "pii.md").read_text(encoding="utf-8")


def _table_rows(text: str) -> set[tuple[str, ...]]:
    rows = set()
    for line in text.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            rows.add(tuple(cell.strip() for cell in line.strip("|").split("|")))
    return rows


ROWS = _table_rows(REFERENCE)
POLICY_ROWS = ROWS | _table_rows(JUDGES) | _table_rows(PII)


@pytest.mark.parametrize("cls", all_metrics(), ids=lambda c: c.name)
def test_metric_documented_with_its_policy(cls):
    assert any(r[0] == f"`{cls.name}`" and len(r) == 5 for r in ROWS), "missing from the metrics table"
    for case, outcome in cls.policy:
        assert (f"`{cls.name}`", case, outcome) in POLICY_ROWS, f"policy row missing: {case} -> {outcome}"


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
