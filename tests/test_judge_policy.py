"""The judge-failure rows every judge metric's policy shares (ragbatch.judge.policy)."""

from __future__ import annotations

from ragbatch.judge.policy import failure_policy
from ragbatch.scoring.registry import all_metrics

TOO_LONG = "context_too_long; nothing is truncated"
PARSE_FAILURE = "parse_failure after the retries; the raw reply is kept"


def test_failure_policy_rows_in_order():
    assert failure_policy("reply is prose") == (
        ("prompt longer than the judge's window", TOO_LONG),
        ("reply is prose", PARSE_FAILURE),
    )
    assert failure_policy("reply is prose", "the contexts too")[0] == (
        "prompt longer than the judge's window (the contexts too)",
        TOO_LONG,
    )


def test_every_judge_metric_ends_its_judge_rows_with_the_shared_failures():
    judges = [m for m in all_metrics() if m.kind == "judge"]
    assert len(judges) >= 15
    for metric in judges:
        outcomes = [outcome for _, outcome in metric.policy]
        assert outcomes.count(TOO_LONG) == 1, metric.name
        assert outcomes.count(PARSE_FAILURE) == 1, metric.name
        assert outcomes[outcomes.index(TOO_LONG) + 1] == PARSE_FAILURE, metric.name
    others = [m for m in all_metrics() if m.kind != "judge"]
    assert all(TOO_LONG not in [o for _, o in m.policy] for m in others)
