"""answer_contains_pii and context_contains_pii with the real Presidio analyzer.

The gold standard is the Presidio research synthetic data (both files, 1,600 sentences
with labelled spans; ``examples/data/pii_presidio_synthetic``): a sentence contains PII of
type T when one of its gold spans has ``entity_type`` T. Precision and recall of "contains
T" are computed here from the data and the scores the PII stage wrote, and checked
against the thresholds recorded in :data:`THRESHOLDS` (docs/benchmarks/pii-stage.md has the
full table).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pytest

from ragbatch.core.columns import CELL_PREFIX, CONTEXTS
from ragbatch.config.job import JobConfig
from ragbatch.core.errors import ConfigError
from ragbatch.core.heap import TRIM_INTERVAL_S, HeapTrimmer, heap_trim_available
from ragbatch.pipeline.plan import build_plan
from ragbatch.scoring.registry import get_metric
from udfs.pii import PiiStage

DATA = Path(__file__).resolve().parent.parent / "examples" / "data" / "pii_presidio_synthetic"
FILES = ("data__synth_dataset_v2.json", "tests__data__generated_small.json")

#: (minimum precision, minimum recall) of "row contains type T", default detectors.
THRESHOLDS = {
    "EMAIL_ADDRESS": (0.9, 0.9),
    "CREDIT_CARD": (0.9, 0.9),
    "IP_ADDRESS": (0.9, 0.9),
    "IBAN_CODE": (0.9, 0.9),
    "US_SSN": (0.9, 0.9),
    "PHONE_NUMBER": (0.8, 0.8),
}
PATTERN_TYPES = tuple(THRESHOLDS)


def gold_rows() -> list[dict]:
    rows = []
    for name in FILES:
        rows += json.loads((DATA / name).read_text(encoding="utf-8"))
    return rows


def stage(metrics: list[dict], **engine) -> PiiStage:
    return PiiStage("pii", {"type": "presidio", **engine}, metrics)


def cells(out: pa.Table, metric_id: str) -> list[dict]:
    return out.column(CELL_PREFIX + metric_id).to_pylist()


def answers_table(texts: list) -> pa.Table:
    return pa.table(
        {"row_id": [str(i) for i in range(len(texts))], "answer": pa.array(texts, pa.string())}
    )


def contexts_table(contexts: list) -> pa.Table:
    return pa.table(
        {
            "row_id": [str(i) for i in range(len(contexts))],
            CONTEXTS: pa.array(contexts, pa.list_(pa.string())),
        }
    )


@pytest.fixture(scope="module")
def gold_scores():
    """The gold rows and, per pattern type, the cells of ``answer_contains_pii`` limited
    to that type (one PII stage, all rows in one batch)."""
    rows = gold_rows()
    metrics = [
        {"name": "answer_contains_pii", "id": t.lower(), "params": {"pii_types": [t]}}
        for t in PATTERN_TYPES
    ]
    metrics.append({"name": "answer_contains_pii", "id": "any", "params": {}})
    out = stage(metrics)(answers_table([r["full_text"] for r in rows]))
    return rows, out


@pytest.mark.parametrize("entity", PATTERN_TYPES)
def test_gold_precision_and_recall(gold_scores, entity):
    rows, out = gold_scores
    tp = fp = fn = 0
    for row, cell in zip(rows, cells(out, entity.lower())):
        assert cell["status"] == "ok"
        gold = any(s["entity_type"] == entity for s in row["spans"])
        found = cell["score"] == 1.0
        tp += gold and found
        fp += found and not gold
        fn += gold and not found
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    min_p, min_r = THRESHOLDS[entity]
    assert precision >= min_p and recall >= min_r, (entity, tp, fp, fn, precision, recall)


def test_rows_without_spans_stay_false(gold_scores):
    rows, out = gold_scores
    empty = [i for i, r in enumerate(rows) if not r["spans"]]
    assert len(empty) == 113 + 11
    for entity in PATTERN_TYPES:
        flagged = [i for i in empty if cells(out, entity.lower())[i]["score"] != 0.0]
        assert flagged == [], (entity, [rows[i]["full_text"] for i in flagged])


def test_reasons_never_hold_the_values(gold_scores):
    rows, out = gold_scores
    for row, cell in zip(rows, cells(out, "any")):
        text = f"{cell['reason']} {cell['details']}"
        for span in row["spans"]:
            value = span["entity_value"].strip()
            if len(value) >= 4 and not value.isalpha():
                assert value not in text, (value, cell)


def test_reason_and_details_count_types(gold_scores):
    rows, out = gold_scores
    # Row 0 of the small file: one phone number (and a PERSON, which needs a NER model).
    index = len(json.loads((DATA / FILES[0]).read_text(encoding="utf-8")))
    assert rows[index]["full_text"].startswith("Please have the manager call me at (96) 627-277")
    cell = cells(out, "any")[index]
    assert cell["score"] == 1.0
    assert cell["reason"] == "PHONE_NUMBER x1"
    assert json.loads(cell["details"]) == {"types": {"PHONE_NUMBER": 1}}
    assert cell["model"].startswith("presidio-analyzer==")


def luhn_valid(number: str) -> bool:
    """Luhn check written out independently of Presidio's."""
    total = 0
    for i, ch in enumerate(reversed(number)):
        d = int(ch)
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def test_card_numbers_count_only_when_the_luhn_check_passes():
    rng = random.Random(7)
    numbers = []
    for prefix, length in (("4", 16), ("4", 19), ("51", 16), ("2221", 16), ("37", 15)):
        for _ in range(12):
            numbers.append(
                prefix + "".join(rng.choice("0123456789") for _ in range(length - len(prefix)))
            )
    texts = [f"Please charge card {n} for the order." for n in numbers]
    texts += ["Card 4111 1111 1111 1111 works.", "Card 4111 1111 1111 1112 was declined."]
    expected = [luhn_valid(n) for n in numbers] + [True, False]
    assert 0 < sum(expected) < len(expected)
    out = stage(
        [{"name": "answer_contains_pii", "id": "cc", "params": {"pii_types": ["CREDIT_CARD"]}}]
    )(answers_table(texts))
    assert [c["score"] == 1.0 for c in cells(out, "cc")] == expected


def test_nulls_empty_unicode_and_duplicates():
    texts = [
        None,
        "",
        "   \n",
        "请联系 张伟 zhang.wei@example.com 获取帮助 🚀",
        "Café Zoë: write to zoe\u0301@example.fr or call +33 1 42 68 53 00 📞",
        "Nothing personal here, just Unicode: 東京, naïve, e\u0301, 🤖.",
        "请联系 张伟 zhang.wei@example.com 获取帮助 🚀",
    ]
    out = stage(
        [
            {
                "name": "answer_contains_pii",
                "id": "pii",
                "params": {"pii_types": ["EMAIL_ADDRESS", "PHONE_NUMBER"]},
            }
        ]
    )(answers_table(texts))
    got = cells(out, "pii")
    assert [c["status"] for c in got] == ["missing_input"] + ["ok"] * 6
    assert got[0]["reason"] == "answer is null"
    assert [c["score"] for c in got[1:]] == [0.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert got[1]["reason"] == got[2]["reason"] == "answer is empty"
    assert got[3]["reason"] == "EMAIL_ADDRESS x1"
    assert json.loads(got[4]["details"]) == {"types": {"EMAIL_ADDRESS": 1, "PHONE_NUMBER": 1}}
    assert got[5]["reason"] == "no PII found"
    assert got[6] == got[3], "a duplicate row gets the same cell"
    assert all("example" not in (c["reason"] or "") for c in got)


def test_context_contains_pii_records_which_contexts():
    contexts = [
        [
            "The office is closed on Sundays.",
            "Ask ops: 10.0.12.7 hosts the wiki.",
            "Mail hr@example.com or hr2@example.com.",
        ],
        ["Nothing here.", "Still nothing."],
        [],
        None,
        [None, "  ", "Reach the server at 192.168.1.20."],
        ["Nothing here.", "Nothing here."],
    ]
    out = stage(
        [
            {
                "name": "context_contains_pii",
                "id": "ctx",
                "params": {"pii_types": ["EMAIL_ADDRESS", "IP_ADDRESS"]},
            }
        ]
    )(contexts_table(contexts))
    got = cells(out, "ctx")
    assert [c["status"] for c in got] == ["ok", "ok", "ok", "missing_input", "ok", "ok"]
    assert [c["score"] for c in got] == [1.0, 0.0, 0.0, None, 1.0, 0.0]
    assert got[0]["reason"] == "EMAIL_ADDRESS x2, IP_ADDRESS x1 in contexts 1, 2"
    assert json.loads(got[0]["details"]) == {
        "types": {"EMAIL_ADDRESS": 2, "IP_ADDRESS": 1},
        "contexts": [
            {"index": 1, "types": {"IP_ADDRESS": 1}},
            {"index": 2, "types": {"EMAIL_ADDRESS": 2}},
        ],
    }
    assert got[1]["reason"] == "no PII found"
    assert got[2]["reason"] == "contexts is an empty list: nothing to check"
    assert got[4]["reason"] == "IP_ADDRESS x1 in context 2"
    assert json.loads(got[4]["details"])["skipped"] == [0, 1]


def test_examples_of_both_metrics_hold():
    for name in ("answer_contains_pii", "context_contains_pii"):
        cls = get_metric(name)
        column = cls.inputs[0]
        for ex in cls.examples:
            value = ex.inputs.get(column)
            table = answers_table([value]) if column == "answer" else contexts_table([value])
            out = stage([{"name": name, "id": "m", "params": ex.params}])(table)
            cell = cells(out, "m")[0]
            assert (cell["status"], cell["score"]) == (ex.status, ex.score), (name, ex, cell)


def plan_problems(metrics: list[dict], engines: dict | None = None) -> str:
    config = JobConfig.from_dict(
        {
            "input": {"uri": "unused.jsonl", "columns": {"answer": "a", "contexts": "c"}},
            "output": {"uri": "unused"},
            "metrics": metrics,
            "engines": engines or {},
        }
    )
    with pytest.raises(ConfigError) as info:
        build_plan(config, inspect_input=False)
    return str(info.value)


def test_types_the_detectors_cannot_find_fail_validation():
    message = plan_problems([{"name": "answer_contains_pii", "params": {"pii_types": ["PERSON"]}}])
    assert "answer_contains_pii: pii_types ['PERSON'] cannot be found" in message
    assert "ner_model" in message and "EMAIL_ADDRESS" in message
    message = plan_problems(
        [
            {
                "name": "context_contains_pii",
                "engine": "pii",
                "params": {"pii_types": ["EMAIL", "URL", "EMAIL_ADDRESS"]},
            }
        ],
        {"pii": {"type": "presidio"}},
    )
    assert "pii_types ['EMAIL', 'URL'] cannot be found by engine 'pii'" in message
    assert "no recognizer reports EMAIL; URL is not in the engine's entity_types" in message
    message = plan_problems(
        [{"name": "answer_contains_pii", "params": {"pii_types": ["PHONE_NUMBER"]}}],
        {"pii": {"type": "presidio", "score_threshold": 0.5}},
    )
    assert "PHONE_NUMBER scores at most 0.4, below score_threshold 0.5" in message
    message = plan_problems(
        [{"name": "answer_contains_pii"}], {"pii": {"type": "presidio", "language": "Klingon"}}
    )
    assert "engines.pii: language 'klingon': spaCy has no such language" in message
    message = plan_problems(
        [{"name": "answer_contains_pii", "engine": "pii"}],
        {"pii": {"type": "presidio", "ner_model": "/no/such/model"}},
    )
    assert "engines.pii: ner_model '/no/such/model' is not a directory" in message
    message = plan_problems([{"name": "answer_contains_pii", "params": {"pii_types": []}}])
    assert "pii_types is empty" in message


def test_default_types_pass_validation():
    config = JobConfig.from_dict(
        {
            "input": {"uri": "unused.jsonl", "columns": {"answer": "a"}},
            "output": {"uri": "unused"},
            "metrics": [
                {"name": "answer_contains_pii"},
                {
                    "name": "answer_contains_pii",
                    "id": "mail",
                    "params": {"pii_types": ["email_address"]},
                },
            ],
        }
    )
    plan = build_plan(config, inspect_input=False)
    assert [s.kind for s in plan.stages] == ["pii"]
    assert plan.metrics[1].params.pii_types == ["EMAIL_ADDRESS"]


def test_a_metric_does_not_depend_on_its_sibling_metrics():
    # 415-555-2671 also passes the UK NHS checksum (1.0) and beats the phone recognizers
    # (0.4) when the engine looks for UK_NHS; the default engine does not.
    texts = ["Call 415-555-2671 after six.", "Call 415-555-2671 after six."]
    phone = {"name": "answer_contains_pii", "id": "ph", "params": {"pii_types": ["PHONE_NUMBER"]}}
    every = {"name": "answer_contains_pii", "id": "all", "params": {}}
    for engine in ({}, {"entity_types": "all"}):
        alone = cells(stage([phone], **engine)(answers_table(texts)), "ph")
        together = stage([phone, every], **engine)(answers_table(texts))
        assert alone == cells(together, "ph")
    default = stage([phone, every])(answers_table(texts))
    assert (
        cells(default, "ph")[0]["reason"] == cells(default, "all")[0]["reason"] == "PHONE_NUMBER x1"
    )
    everything = stage([phone, every], entity_types="all")(answers_table(texts))
    assert cells(everything, "all")[0]["reason"] == "UK_NHS x1"


def test_hidden_characters_do_not_hide_pii():
    texts = [
        "mail ana\u200b@example.org today",
        "mail ana\x00bob@example.org",
        "card ４１１１ １１１１ １１１１ １１１１ on file",
        "phone: 2\u200d1\u200d2 555 0198",
    ]
    out = stage([{"name": "answer_contains_pii", "id": "m", "params": {}}])(answers_table(texts))
    assert [c["reason"] for c in cells(out, "m")] == [
        "EMAIL_ADDRESS x1",
        "EMAIL_ADDRESS x1",
        "CREDIT_CARD x1",
        "PHONE_NUMBER x1",
    ]


def test_unreadable_inputs_are_not_quoted():
    # In a run with PII metrics the normalizer's notes say what was wrong without the value.
    from ragbatch.config.job import InputSection
    from ragbatch.io.read import ReadTask
    from ragbatch.io.schema import normalize
    from ragbatch.core.reasons import NOT_QUOTED

    raw = pa.table(
        {
            "a": pa.array([{"text": "Contact bob.leak@example.org"}, {"text": "fine"}]),
            "c": ['["card 4111 1111 1111 1111", broken', '["x@example.org"]'],
        }
    )
    cfg = InputSection(
        uri="unused.jsonl", columns={"answer": "a", "contexts": "c"}, contexts_format="json"
    )
    table = normalize(raw, cfg, ReadTask("/d/f.jsonl", "f.jsonl", "jsonl"), quote_values=False)
    out = stage(
        [
            {"name": "answer_contains_pii", "id": "a", "params": {}},
            {"name": "context_contains_pii", "id": "c", "params": {}},
        ]
    )(table)
    for cell in [cells(out, "a")[0], cells(out, "a")[1], cells(out, "c")[0]]:
        assert cell["status"] == "missing_input", cell
        assert "leak" not in cell["reason"] and "4111" not in cell["reason"], cell
        assert NOT_QUOTED in cell["reason"], cell
    assert cells(out, "c")[1]["reason"] == "EMAIL_ADDRESS x1 in context 0"


def test_engine_choice_and_entity_types():
    from ragbatch.engines.presidio import PresidioEngine
    from ragbatch.engines.presidio import supported_entities

    default = supported_entities(PresidioEngine(type="presidio"))
    assert {
        "EMAIL_ADDRESS",
        "PHONE_NUMBER",
        "CREDIT_CARD",
        "IBAN_CODE",
        "IP_ADDRESS",
        "US_SSN",
    } <= set(default)
    assert not {"URL", "DATE_TIME", "UUID", "MAC_ADDRESS", "UK_NHS"} & set(default)
    everything = supported_entities(PresidioEngine(type="presidio", entity_types="all"))
    assert {"URL", "DATE_TIME", "UK_NHS"} <= set(everything)
    assert PresidioEngine(type="presidio", language=" EN ").language == "en"
    config = JobConfig.from_dict(
        {
            "input": {"uri": "unused.jsonl", "columns": {"answer": "a"}},
            "output": {"uri": "unused"},
            "metrics": [{"name": "answer_contains_pii"}],
            "engines": {"strict": {"kind": "pii", "score_threshold": 0.5}},
        }
    )
    plan = build_plan(config, inspect_input=False)
    assert plan.metrics[0].engine == "strict", "the one configured presidio engine is used"


def test_garbage_ner_model_is_a_clear_error(tmp_path):
    (tmp_path / "meta.json").write_text("{not json")
    (tmp_path / "config.cfg").write_text("")
    message = plan_problems(
        [{"name": "answer_contains_pii", "engine": "pii"}],
        {"pii": {"type": "presidio", "ner_model": str(tmp_path)}},
    )
    assert f"engines.pii: ner_model '{tmp_path}': cannot read the labels from meta.json" in message


def test_stage_trims_heap_after_batches():
    pii = stage([{"name": "answer_contains_pii", "id": "m", "params": {}}])
    assert pii.heap.interval_s == TRIM_INTERVAL_S
    pii.heap = HeapTrimmer(interval_s=0)  # every batch, so the count is known
    for _ in range(2):
        assert pii(answers_table(["call 212-555-0100", None])).num_rows == 2
    assert pii.heap.batches == 2
    assert pii.heap.trims == (2 if heap_trim_available() else 0)
