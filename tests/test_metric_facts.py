"""Analysis reads each metric's facts from the run's manifest entry; manifests written
before the entries held them get the facts from the metric registry."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ragbatch.analysis.metric_facts import MetricFacts, metric_facts
from ragbatch.scoring.registry import get_metric


def _run(*entries: dict[str, Any]) -> Any:
    """What metric_facts reads of a committed run: its manifest's metric entries."""
    return SimpleNamespace(manifest=SimpleNamespace(metrics=list(entries)))


def test_facts_recorded_in_the_manifest_win_over_the_registry():
    # answer_similarity is registered with range (0, 5) and not boolean: the entry's own
    # facts are read instead, and a name the registry does not know is read the same way.
    recorded = {"boolean": True, "higher_is_better": False, "score_range": [-1, 2]}
    facts = metric_facts(
        _run(
            {"id": "sim", "name": "answer_similarity", "kind": "judge", **recorded},
            {"id": "gone", "name": "no_such_metric", "kind": "model", **recorded},
        )
    )
    assert facts == {
        "sim": MetricFacts("sim", "answer_similarity", "judge", True, False, (-1.0, 2.0), True),
        "gone": MetricFacts("gone", "no_such_metric", "model", True, False, (-1.0, 2.0), True),
    }


def test_old_manifests_get_the_registry_facts_or_the_fallbacks():
    facts = metric_facts(
        _run(
            {"id": "sim", "name": "answer_similarity", "kind": "judge"},
            {"id": "gone", "name": "no_such_metric"},
        ),
        _run({"id": "sim", "name": "answer_match", "boolean": True}),  # first run wins
    )
    assert facts == {
        "sim": MetricFacts("sim", "answer_similarity", "judge", False, True, (0.0, 5.0), True),
        "gone": MetricFacts("gone", "no_such_metric", "", False, True, None, False),
    }


def test_a_metric_records_the_facts_analysis_reads():
    assert get_metric("answer_similarity").facts() == {
        "boolean": False,
        "higher_is_better": True,
        "score_range": [0.0, 5.0],
    }
    assert get_metric("answer_match").facts() == {
        "boolean": True,
        "higher_is_better": True,
        "score_range": [0.0, 1.0],
    }
