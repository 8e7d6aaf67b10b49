"""Two tiny local NER models for the PII tests. Use them in tests only.

Test machines cannot reach a model hub, so the PII tests build their own models:

* :func:`build_spacy_ner` trains a blank English spaCy pipeline with a single ``ner``
  component. It learns ``PERSON`` and ``GPE`` from a few dozen synthetic sentences made
  from templates, using spaCy's default ``ner`` architecture. It tags names and cities
  well in sentences like the training ones and is unreliable on anything else. Training
  takes about 2.5 s on 2 CPU cores. The first spaCy factory lookup in a process also
  imports presidio_analyzer, transformers and torch (about 10 s): presidio registers a
  ``spacy_factories`` entry point, and spaCy loads all such entry points together.
* :func:`build_transformers_ner` saves a ``BertForTokenClassification`` with random
  weights (hidden size 32, 2 layers, 2 heads, about 39k parameters) and a WordPiece
  tokenizer built from a vocabulary written here. It learns nothing. By default its
  classifier is set so that one label wins on every token, which makes its output
  predictable (see ``force_label``).

Both builders fix their seeds, so every build gives the same model. You can read the
label list of either model from its files without loading any weights:
``meta.json`` -> ``["labels"]["ner"]`` for spaCy, and ``config.json`` -> ``"id2label"``
for transformers.

Command line: ``python tests/support/pii_models.py spacy|transformers OUT_DIR``.
"""

from __future__ import annotations

import re
import string
import sys
from pathlib import Path

SEED = 0
SPACY_EPOCHS = 10

_NAMES = [
    "Maria Lopez",
    "John Smith",
    "Aisha Khan",
    "Pierre Dubois",
    "Li Wei",
    "Anna Novak",
    "Carlos Mendes",
    "Emma Brown",
    "Yuki Tanaka",
    "Omar Haddad",
    "Sofia Rossi",
    "David Cohen",
]
_CITIES = [
    "Lisbon",
    "London",
    "Paris",
    "Berlin",
    "Madrid",
    "Tokyo",
    "Chicago",
    "Nairobi",
    "Toronto",
    "Vienna",
    "Oslo",
    "Dublin",
]
#: Sentence templates. ``{p}`` is replaced by a person and ``{g}`` by a city.
_TEMPLATES = [
    "My name is {p} and I live in {g}.",
    "{p} moved to {g} last year.",
    "Please send the invoice to {p} in {g}.",
    "I met {p} at the office.",
    "The flight to {g} was delayed by two hours.",
    "Contact {p} for more details.",
    "Yesterday {p} called me from {g}.",
    "We are opening a new branch in {g} next month.",
    "This report was written by {p}.",
    "{p} was born in {g} and still works there.",
    "Our customer {p} asked for a refund.",
    "The weather in {g} is lovely today.",
]


def spacy_training_data() -> list[tuple[str, list[tuple[int, int, str]]]]:
    """48 synthetic sentences with their ``(start, end, label)`` character spans.

    Each template is filled four times, rotating through the names and the cities,
    so no pair repeats exactly.
    """
    data = []
    for i, template in enumerate(_TEMPLATES):
        for j in range(4):
            person = _NAMES[(i + 5 * j) % len(_NAMES)]
            city = _CITIES[(3 * i + j) % len(_CITIES)]
            text, spans = "", []
            for part in re.split(r"(\{[pg]\})", template):
                if part in ("{p}", "{g}"):
                    value, label = (person, "PERSON") if part == "{p}" else (city, "GPE")
                    spans.append((len(text), len(text) + len(value), label))
                    part = value
                text += part
            data.append((text, spans))
    return data


def build_spacy_ner(out_dir: Path) -> Path:
    """Train the tiny spaCy ``PERSON``/``GPE`` pipeline and save it to ``out_dir``.

    The model is trained for :data:`SPACY_EPOCHS` epochs with seed :data:`SEED`, then
    saved with ``nlp.to_disk``. The saved ``meta.json`` lists the labels under
    ``["labels"]["ner"]``. Returns ``out_dir``.
    """
    import random

    import spacy
    from spacy.training import Example
    from spacy.util import minibatch

    spacy.util.fix_random_seed(SEED)
    rng = random.Random(SEED)
    nlp = spacy.blank("en")
    nlp.add_pipe("ner")
    examples = [
        Example.from_dict(nlp.make_doc(text), {"entities": spans})
        for text, spans in spacy_training_data()
    ]
    optimizer = nlp.initialize(lambda: examples)
    for _ in range(SPACY_EPOCHS):
        rng.shuffle(examples)
        for batch in minibatch(examples, size=8):
            nlp.update(batch, sgd=optimizer, drop=0.1)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    nlp.to_disk(out_dir)
    return out_dir


ID2LABEL = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}
_WORDS = (
    "the a an and or of to in on at for from by with is was are my name i me we "
    "you he she it they live lives moved works born call called send please "
    "contact city office report today yesterday"
).split()


def _bert_vocab() -> dict[str, int]:
    """Special tokens, single characters and their ``##`` forms, then some common words."""
    chars = string.ascii_lowercase + string.digits
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens += list(chars + string.punctuation) + ["##" + c for c in chars] + _WORDS
    return {tok: i for i, tok in enumerate(dict.fromkeys(tokens))}


def build_transformers_ner(out_dir: Path, force_label: str | None = "I-PER") -> Path:
    """Save the tiny random BERT token classifier and its tokenizer to ``out_dir``.

    The weights are random (``torch.manual_seed(SEED)``). If ``force_label`` is set, the
    classifier weights are zeroed and that label gets a bias of 10. Every token then gets
    that label with a score of about 0.9998, whatever the text. With the default
    ``"I-PER"``, the ``"simple"`` aggregation gives one ``PER`` entity covering the whole
    text, which Presidio maps to ``PERSON``. (``"B-PER"`` would make each word piece a
    separate entity.) Pass ``None`` to keep the random classifier. The label list is in
    ``config.json`` under ``"id2label"``. Returns ``out_dir``.
    """
    import torch
    from transformers import BertConfig, BertForTokenClassification, BertTokenizerFast

    torch.manual_seed(SEED)
    vocab = _bert_vocab()
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        id2label=ID2LABEL,
        label2id={label: i for i, label in ID2LABEL.items()},
    )
    model = BertForTokenClassification(config).eval()
    if force_label is not None:
        with torch.no_grad():
            model.classifier.weight.zero_()
            model.classifier.bias.zero_()
            model.classifier.bias[config.label2id[force_label]] = 10.0
    tokenizer = BertTokenizerFast(vocab=vocab, do_lower_case=True, model_max_length=512)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


BUILDERS = {"spacy": build_spacy_ner, "transformers": build_transformers_ner}

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in BUILDERS:
        sys.exit(f"usage: python {sys.argv[0]} spacy|transformers OUT_DIR")
    print(BUILDERS[sys.argv[1]](Path(sys.argv[2])))
