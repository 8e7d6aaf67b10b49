"""The split, the choice of examples and the examples file of a judge's alignment."""

from __future__ import annotations

import hashlib
import json

import pytest

from ragbatch.calibrate.align import (
    choose_examples,
    examples_record,
    ids_digest,
    split_rows,
    verdict_reply,
)
from ragbatch.judge.aligned import load_examples, write_examples

IDS = [f"r{i}" for i in range(20)]
LABELS = [1] * 8 + [0] * 12


def test_split_is_stratified_disjoint_and_complete():
    split = split_rows(IDS, LABELS, 0.5, seed=3)
    assert set(split.train) | set(split.held_out) == set(IDS)
    assert not set(split.train) & set(split.held_out)
    label = dict(zip(IDS, LABELS))
    # half of each label: 4 of the 8 ones, 6 of the 12 zeros
    assert sum(label[i] for i in split.train) == 4 and len(split.train) == 10
    assert list(split.train) == sorted(split.train, key=IDS.index)  # input order


def test_split_depends_on_the_seed_only():
    assert split_rows(IDS, LABELS, 0.5, 3) == split_rows(IDS, LABELS, 0.5, 3)
    assert split_rows(IDS, LABELS, 0.5, 3).train != split_rows(IDS, LABELS, 0.5, 4).train


def test_split_keeps_a_row_of_every_label_held_out():
    split = split_rows(["a", "b", "c"], [1, 1, 0], 0.9, seed=0)
    # label 1: round(2 * 0.9) = 2, capped at 1; label 0: a single row goes to training
    assert len(split.train) == 2 and len(split.held_out) == 1
    with pytest.raises(ValueError, match="no row would be held out"):
        split_rows(["a", "b"], [1, 0], 0.9, seed=0)
    with pytest.raises(ValueError, match="train_fraction"):
        split_rows(IDS, LABELS, 1.0, seed=0)
    with pytest.raises(ValueError, match="unique"):
        split_rows(["a", "a"], [1, 0], 0.5, seed=0)


def test_examples_alternate_between_labels():
    chosen = choose_examples(IDS, LABELS, shots=4, seed=0)
    label = dict(zip(IDS, LABELS))
    # labels in the order of their repr: 0 then 1, taken in turn
    assert [label[i] for i in chosen] == [0, 1, 0, 1]
    assert len(set(chosen)) == 4
    assert choose_examples(["a", "b"], [1, 1], shots=5, seed=0) in {("a", "b"), ("b", "a")}
    with pytest.raises(ValueError, match="shots"):
        choose_examples(IDS, LABELS, shots=0, seed=0)


def test_ids_digest_ignores_order():
    expected = hashlib.sha256("a\nb\nç".encode()).hexdigest()
    assert ids_digest(["ç", "a", "b"]) == expected == ids_digest(["b", "ç", "a"])


def test_verdict_reply_is_the_reply_format_of_a_verdict():
    assert json.loads(verdict_reply(1.0)) == {"reason": "a reviewer judged it so", "verdict": 1}
    assert json.loads(verdict_reply(0.2))["verdict"] == 0


def test_examples_record_writes_a_file_a_judge_metric_reads(tmp_path):
    ids = ["é1", "é2", "é3", "é4"]
    split = split_rows(ids, [1, 0, 1, 0], 0.5, seed=1)
    rows = [
        {"row_id": i, "label": 1, "question": "Qui ?", "answer": "Ünïcode ✓", "contexts": ["c"]}
        for i in split.train
    ]
    record = examples_record("faithfulness", "cal-1", split, rows, [verdict_reply(1)] * 2)
    path = str(tmp_path / "aligned" / "faithfulness" / "cal-1.json")
    write_examples(path, record)
    read = load_examples(path)
    assert read.metric == "faithfulness" and read.record["split"]["held_out_rows"] == 2
    assert read.examples[0]["inputs"]["answer"] == "Ünïcode ✓"
    assert read.examples[0]["inputs"]["reference"] is None
    assert "Ünïcode ✓" in open(path, encoding="utf-8").read()  # kept, not escaped
    held = {"row_id": split.held_out[0], "label": 0}
    with pytest.raises(ValueError, match="not a training row"):
        examples_record("faithfulness", "cal-1", split, [held], ["r"])


# ------------------------------------------------------------------ example replies

ROW = {
    "question": "Q?",
    "contexts": ["The only context."],
    "answer": "An answer.",
    "reference": "R.",
}


def _metric(name: str, **params):
    from ragbatch.scoring.registry import get_metric

    return get_metric(name).from_params(params)


@pytest.mark.parametrize("name", ["hate_speech", "duplication"])
def test_a_yes_no_answer_verdict_gets_a_boolean_verdict(name):
    from ragbatch.calibrate.align_replies import example_reply, scored_reply

    metric = _metric(name)
    assert json.loads(example_reply(metric, ROW, 1.0)) == {
        "reason": "a reviewer judged it so",
        "verdict": True,
    }
    assert json.loads(example_reply(metric, ROW, 0.0))["verdict"] is False
    # the integer verdict of verdict_reply is not this step's format: its parser refuses it
    with pytest.raises(ValueError, match="does not accept the reply"):
        scored_reply(metric, ROW, verdict_reply(1.0))


@pytest.mark.parametrize(
    "name", ["retrieval_precision", "context_precision", "augmentation_accuracy"]
)
def test_a_verdict_per_context_needs_a_row_with_one_context(name):
    from ragbatch.calibrate.align_replies import example_reply, row_problem

    metric = _metric(name)
    assert json.loads(example_reply(metric, ROW, 1.0)) == {
        "verdicts": [json.loads(verdict_reply(1))]
    }
    assert json.loads(example_reply(_metric(name, reasons=False), ROW, 0.0)) == {"verdicts": [0]}
    two = {**ROW, "contexts": ["one", "two"]}
    assert (
        row_problem(metric, two)
        == "it has 2 contexts; a row's label gives one verdict, for one context"
    )
    with pytest.raises(ValueError, match="2 contexts"):
        example_reply(metric, two, 1.0)


def test_answer_consistency_binary_states_claims():
    from ragbatch.calibrate.align_replies import example_reply

    reply = json.loads(example_reply(_metric("answer_consistency_binary"), ROW, 0.0))
    assert (reply["states_claims"], reply["unattributable"]) == (True, True)


def test_the_shipped_rubrics_get_their_extreme_values():
    """jobs/calibrate_rubric.yaml: a pass/fail rubric without reasons and a 1-5 scale."""
    import yaml
    from pathlib import Path

    from ragbatch.calibrate.align_replies import example_reply, scored_reply
    from ragbatch.metrics.rubric import Rubric

    config = yaml.safe_load(
        (Path(__file__).resolve().parents[1] / "jobs" / "calibrate_rubric.yaml").read_text()
    )
    faithful, relevant = (Rubric.from_params(m["params"]) for m in config["metrics"])
    assert [example_reply(faithful, ROW, v) for v in (1.0, 0.0)] == ["supported", "unsupported"]
    high, low = (json.loads(example_reply(relevant, ROW, v)) for v in (1.0, 0.0))
    assert (high["score"], low["score"]) == (5, 1)
    assert scored_reply(relevant, ROW, json.dumps(high)) == 1.0


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("faithfulness", "lists the statements of a text"),
        ("factual_correctness", "lists the statements of a text"),
        ("answer_similarity", "does not reply with one verdict for the row"),
        ("answer_relevancy", "does not reply with one verdict for the row"),
    ],
)
def test_a_first_step_a_label_does_not_decide_is_refused(name, why):
    from ragbatch.calibrate.align_replies import example_reply, metric_problem

    assert why in metric_problem(_metric(name))
    with pytest.raises(ValueError, match=why):
        example_reply(_metric(name), ROW, 1.0)


def test_paired_difference_moves_with_the_rows():
    import numpy as np

    from ragbatch.calibrate.measures import Bootstrap, paired_difference

    human = np.array([1.0, 1.0, 0.0, 0.0])
    before = np.array([1.0, 1.0, 1.0, 1.0])
    after = np.array([1.0, 0.0, 0.0, 0.0])
    # accuracy 2/4 -> 3/4; recall 1 -> 1/2
    acc = paired_difference("accuracy", before, after, human, 0.5, Bootstrap(50, 0))
    assert acc.value == pytest.approx(0.25) and acc.n == 4
    assert paired_difference("recall", before, after, human, 0.5, Bootstrap(50, 0)).value == -0.5
    # no human label is 1: recall is undefined on both sides
    none = paired_difference("recall", before, after, np.zeros(4), 0.5, Bootstrap(50, 0))
    assert none.value is None and "no human label is 1" in none.reason
