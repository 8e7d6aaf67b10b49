"""What the PII adapter (:mod:`ragbatch.engines.presidio`) does without Presidio: the
findings it reports, the text its recognizers see, the overlap rule between findings of
different types, and the entity labels of a local NER model read from its files.

Pure Python: importing this module imports neither Presidio nor a model library.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ragbatch.core.errors import EngineError


@dataclass(frozen=True)
class Finding:
    """One detected entity: its type, character span and score; never its text.

    Attributes
    ----------
    entity_type : str
        Presidio entity name, for example ``EMAIL_ADDRESS``.
    start, end : int
        Character offsets (Python string indices) of the span in the analyzed text.
    score : float
        Presidio's confidence in [0, 1].
    recognizer : str
        Name of the recognizer that found it.
    """

    entity_type: str
    start: int
    end: int
    score: float
    recognizer: str


#: Control characters kept by :func:`clean_text` (they separate words).
_KEPT_CONTROLS = "\t\n\r"


def clean_text(text: str) -> str:
    """The text the recognizers see: NFKC-normalized (full-width digits and letters
    become ASCII), invisible format characters (zero-width space and joiners, direction
    marks; Unicode category Cf) removed, and other control characters (NUL, ...) turned
    into spaces, so that such characters cannot hide an email or a number."""
    text = unicodedata.normalize("NFKC", text)
    out = []
    for ch in text:
        category = unicodedata.category(ch)
        if category == "Cf":
            continue
        out.append(" " if category == "Cc" and ch not in _KEPT_CONTROLS else ch)
    return "".join(out)


def resolve_overlaps(findings: Sequence[Finding]) -> list[Finding]:
    """Drop findings that overlap a stronger finding of another type.

    Presidio's analyzer reports every recognizer's matches; a 16-digit card number may
    also match the phone recognizer, an IP address a phone pattern. A finding is dropped
    when another finding of a different type overlaps its span and ranks higher by
    (score, span length); ties keep both.

    Parameters
    ----------
    findings : sequence of Finding

    Returns
    -------
    list of Finding
        The kept findings, in the input order.
    """
    kept = []
    for f in findings:
        rank = (f.score, f.end - f.start)
        beaten = any(
            g.entity_type != f.entity_type
            and g.start < f.end
            and f.start < g.end
            and (g.score, g.end - g.start) > rank
            for g in findings
        )
        if not beaten:
            kept.append(f)
    return kept


def ner_labels(model_dir: str | Path, backend: str = "auto") -> tuple[str, list[str]]:
    """Read the entity labels of a local NER model from its files, without loading it.

    Parameters
    ----------
    model_dir : str or Path
        A spaCy pipeline directory (``meta.json`` with ``labels.ner``) or a transformers
        token-classification directory (``config.json`` with ``id2label``).
    backend : {"auto", "spacy", "transformers"}
        ``auto`` picks spaCy when ``meta.json`` and ``config.cfg`` exist, else
        transformers when ``config.json`` exists.

    Returns
    -------
    backend, labels : str, list of str
        The backend used and the model's labels with BIO prefixes (``B-``, ``I-``, ...)
        removed, in file order without repeats; ``O`` is left out.

    Raises
    ------
    EngineError
        The directory does not exist, or holds neither kind of model.
    """
    path = Path(model_dir).expanduser()
    if not path.is_dir():
        raise EngineError(
            f"ner_model {str(model_dir)!r} is not a directory; give a local "
            "spaCy pipeline or transformers model directory"
        )
    if backend == "auto":
        if (path / "meta.json").is_file() and (path / "config.cfg").is_file():
            backend = "spacy"
        elif (path / "config.json").is_file():
            backend = "transformers"
        else:
            raise EngineError(
                f"ner_model {str(path)!r} holds neither a spaCy pipeline "
                "(meta.json, config.cfg) nor a transformers model (config.json)"
            )
    name = "meta.json" if backend == "spacy" else "config.json"
    try:
        data = json.loads((path / name).read_text(encoding="utf-8"))
        if backend == "spacy":
            raw = [str(v) for v in data.get("labels", {}).get("ner", [])]
        else:
            raw = [str(v) for v in (data.get("id2label") or {}).values()]
    except (OSError, ValueError, AttributeError) as exc:
        raise EngineError(
            f"ner_model {str(path)!r}: cannot read the labels from {name} "
            f"({type(exc).__name__}: {exc}); is it a {backend} model directory?"
        ) from None
    if not raw:
        raise EngineError(f"ner_model {str(path)!r}: {name} lists no entity labels")
    labels = [re.sub(r"^[BIELSU]-", "", label) for label in raw]
    return backend, [label for label in dict.fromkeys(labels) if label != "O"]
