"""PII detection with a named-entity model from a local directory (spaCy or transformers).

No NER weights can be downloaded here, so ``tests/support/pii_models.py`` builds two tiny real
models: a spaCy pipeline trained on template sentences (PERSON, GPE) and a transformers
token classifier whose classifier is set to tag every token ``I-PER``.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from support.pii_models import build_spacy_ner, build_transformers_ner
from ragbatch.core.columns import CELL_PREFIX
from ragbatch.engines.presidio import PresidioEngine
from ragbatch.engines.presidio import describe_detectors, ner_labels, supported_entities
from udfs.pii import PiiStage


@pytest.fixture(scope="module")
def spacy_model(tmp_path_factory):
    return build_spacy_ner(tmp_path_factory.mktemp("ner") / "spacy")


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    return build_transformers_ner(tmp_path_factory.mktemp("ner") / "hf")


def run(engine: dict, texts: list[str], types: list[str] | None) -> list[dict]:
    stage = PiiStage(
        "ner",
        {"type": "presidio", **engine},
        [{"name": "answer_contains_pii", "id": "m", "params": {"pii_types": types}}],
    )
    table = pa.table({"row_id": [str(i) for i in range(len(texts))], "answer": texts})
    return stage(table).column(CELL_PREFIX + "m").to_pylist()


def test_labels_are_read_from_the_files(spacy_model, hf_model):
    assert ner_labels(spacy_model) == ("spacy", ["GPE", "PERSON"])
    assert ner_labels(hf_model) == ("transformers", ["PER", "LOC"])


def test_spacy_ner_finds_people_and_places(spacy_model):
    engine = {"ner_model": str(spacy_model)}
    spec = PresidioEngine(type="presidio", **engine)
    assert {"PERSON", "LOCATION", "EMAIL_ADDRESS"} <= set(supported_entities(spec))
    assert describe_detectors(spec)["nlp"] == {
        "backend": "spacy",
        "model": str(spacy_model),
        "labels": {"GPE": "LOCATION", "PERSON": "PERSON"},
    }
    texts = [
        "My name is Maria Lopez and I live in Lisbon.",
        "The meeting is on the third floor.",
        "My name is Maria Lopez and I live in Lisbon.",
    ]
    got = run(engine, texts, ["PERSON", "LOCATION"])
    assert [c["score"] for c in got] == [1.0, 0.0, 1.0]
    assert json.loads(got[0]["details"]) == {"types": {"LOCATION": 1, "PERSON": 1}}
    assert got[0]["model"].endswith(f"+ner:{spacy_model}")
    assert "Maria" not in got[0]["reason"] and "Lisbon" not in got[0]["reason"]


def test_transformers_ner_runs_through_presidio(hf_model):
    engine = {"ner_model": str(hf_model)}
    assert {"PERSON", "LOCATION"} <= set(
        supported_entities(PresidioEngine(type="presidio", **engine))
    )
    # The model tags every token I-PER, so every non-blank text holds one PERSON span.
    got = run(engine, ["hello there", "call me", ""], ["PERSON"])
    assert [c["score"] for c in got] == [1.0, 1.0, 0.0]
    assert got[0]["reason"] == "PERSON x1"


def test_a_text_the_model_cannot_take_becomes_an_error_cell(spacy_model):
    # spaCy pipelines refuse texts over nlp.max_length (1,000,000 characters): a real
    # failure on one row; the other rows of the batch are scored.
    texts = ["My name is John Smith and I live in Paris.", "a " * 600_000]
    got = run({"ner_model": str(spacy_model)}, texts, ["PERSON"])
    assert (got[0]["status"], got[0]["score"]) == ("ok", 1.0)
    assert got[1]["status"] == "error" and got[1]["score"] is None
    assert got[1]["reason"].startswith("PII detection failed (ValueError)")
