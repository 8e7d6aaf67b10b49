"""Adapter for Presidio's analyzer: PII detection that runs inside the job.

Every call into ``presidio_analyzer`` (and the spaCy, tldextract and phonenumbers calls
made on its behalf) lives in this file. Written against presidio-analyzer 2.2.366; the
calls used are ``RecognizerRegistry.load_predefined_recognizers``, ``AnalyzerEngine``
(``analyze`` with precomputed ``nlp_artifacts``), ``SpacyNlpEngine``, ``SpacyRecognizer``,
``HuggingFaceNerRecognizer``, ``PhoneRecognizer``, ``CreditCardRecognizer`` and
``EmailRecognizer``.

What runs (see :func:`describe_detectors`):

* Presidio's pattern and checksum recognizers for the engine's language, on a blank spaCy
  pipeline (a tokenizer only; no model to download);
* two changes to them, both local: the email recognizer checks the domain against
  tldextract's bundled public-suffix snapshot instead of fetching the list over the
  network, and two more recognizers run beside Presidio's (:data:`CARD_IIN_PATTERN`, card
  numbers of the ISO/IEC 7812 issuer ranges that Presidio's pattern leaves out, still
  Luhn-checked; :class:`LabelledPhoneRecognizer`, numbers right after a phone label);
* with ``ner_model``, a named-entity model from a local directory: a spaCy pipeline
  (Presidio's spaCy NLP engine and recognizer) or a transformers token-classification
  model (Presidio's Hugging Face recognizer).

Nothing here opens a network connection; models load from local paths only. What needs
no Presidio (findings, text cleaning, overlaps, reading a NER model's labels) is in
:mod:`ragbatch.engines.pii_text`.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Sequence

from typing import Literal

from pydantic import Field, field_validator

from ragbatch.config.engine_spec import StageResources
from ragbatch.core.engine_registry import EngineType, register_engine
from ragbatch.core.errors import EngineError
from ragbatch.core.pool_sizing import SINGLE_THREAD_POOL
from ragbatch.engines.pii_text import Finding, clean_text, ner_labels, resolve_overlaps

# --- the engine type: spec model and registration (adapter below) -----------------------

#: Regions whose national number formats the PII phone detector accepts without a label:
#: Presidio's own default set (numbers written with a ``+`` country code are recognised
#: for every region).
DEFAULT_PHONE_REGIONS = ("US", "GB", "DE", "FR", "IL", "IN", "CA", "BR")

#: Entity types the PII detectors look for unless ``entity_types`` says otherwise: personal
#: data. URL, DATE_TIME, UUID and MAC_ADDRESS are left out: in RAG corpora they mark
#: documentation and code far more often than people (see docs/pii.md for measured rates).
#: UK_NHS is left out too: about one ten-digit phone number in eleven passes its checksum.
DEFAULT_PII_ENTITY_TYPES = (
    "EMAIL_ADDRESS",
    "PHONE_NUMBER",
    "CREDIT_CARD",
    "IBAN_CODE",
    "IP_ADDRESS",
    "CRYPTO",
    "US_SSN",
    "US_ITIN",
    "US_PASSPORT",
    "US_DRIVER_LICENSE",
    "US_BANK_NUMBER",
    "MEDICAL_LICENSE",
    "PERSON",
    "LOCATION",
    "NRP",
)


class PresidioEngine(StageResources):
    """Local PII detection with Presidio's analyzer (no network, no API key).

    By default only pattern and checksum recognizers run, on a blank spaCy pipeline
    (emails, phone numbers, credit cards, IBANs, IP addresses, US SSNs, URLs, ...).
    ``ner_model`` adds a named-entity model for PERSON, LOCATION and the other NER types:
    a local spaCy pipeline directory or a local transformers token-classification model
    directory (``ner_backend`` says which; ``auto`` looks at the files). A finding counts
    when its Presidio score is at least ``score_threshold``. ``phone_regions`` (ISO 3166
    codes) are the regions whose national number formats are accepted anywhere in a text;
    a number of any format also counts when a phone label (phone, tel, mobile, fax, call
    ...) stands right before it. ``entity_types`` limits the detectors to those types
    (default: :data:`DEFAULT_PII_ENTITY_TYPES`; ``all`` for every type Presidio has)."""

    type: Literal["presidio"]
    language: str = "en"
    entity_types: list[str] | Literal["all"] = Field(
        default_factory=lambda: list(DEFAULT_PII_ENTITY_TYPES)
    )
    score_threshold: float = Field(0.4, ge=0, le=1)
    ner_model: str | None = None
    ner_backend: Literal["auto", "spacy", "transformers"] = "auto"
    phone_regions: list[str] = Field(default_factory=lambda: list(DEFAULT_PHONE_REGIONS))

    @field_validator("language")
    @classmethod
    def _language_lower(cls, value: str) -> str:
        value = value.strip().lower()
        if not value:
            raise ValueError("language is empty; use an ISO 639-1 code such as en or de")
        return value

    @field_validator("entity_types")
    @classmethod
    def _types_upper(cls, value: list[str] | str) -> list[str] | str:
        if isinstance(value, str):
            return value
        if not value:
            raise ValueError(
                "entity_types is empty; leave it out for the default set or write `all`"
            )
        return list(dict.fromkeys(v.strip().upper() for v in value))

    @field_validator("phone_regions")
    @classmethod
    def _regions_known(cls, value: list[str]) -> list[str]:
        import phonenumbers

        upper = [r.upper() for r in value]
        unknown = [r for r in upper if r not in phonenumbers.SUPPORTED_REGIONS]
        if unknown:
            raise ValueError(
                f"unknown phone region(s) {unknown}; use ISO 3166 alpha-2 codes such as US, GB, DE"
            )
        return upper


register_engine(
    EngineType(
        "presidio",
        PresidioEngine,
        "pii",
        "ragbatch.engines.presidio:PiiDetector",
        "pip install presidio-analyzer spacy phonenumbers",
        ("presidio-analyzer", "spacy", "phonenumbers", "tldextract"),
        pool_rule=SINGLE_THREAD_POOL,
        order=50,
        provides=("detect_pii",),
        default_for=("detect_pii",),
        synonyms=("pii",),
    )
)

# ------------------------------------------------------------------------------------------

logger = logging.getLogger(__name__)

#: Card numbers by issuer range (ISO/IEC 7812 IINs) that Presidio's own card pattern does
#: not cover: Visa of 19 digits, Mastercard 2221-2720, JCB 2131/1800 (15 digits) and
#: 3528-3589 (16-19), Discover 16-19 and Diners 14-19. Maestro's 12-19 digit numbers
#: (50, 56-69) are left out: too many order and tracking numbers of that shape pass the
#: Luhn check. Matches still pass the Luhn check of Presidio's card recognizer to count.
CARD_IIN_PATTERN = (
    r"\b(?:4\d{18}"
    r"|(?:222[1-9]|22[3-9]\d|2[3-6]\d{2}|27[01]\d|2720)\d{12}"
    r"|(?:2131|1800)\d{11}"
    r"|35(?:2[89]|[3-8]\d)\d{12,15}"
    r"|6(?:011|5\d{2}|4[4-9]\d)\d{12,15}"
    r"|3(?:0[0-5]|[689]\d)\d{11,16})\b"
)

#: Words that label a phone number when they stand right before it.
PHONE_LABELS = (
    "phone",
    "telephone",
    "tel",
    "mobile",
    "cell",
    "cellphone",
    "fax",
    "call me on",
    "call me at",
    "call",
    "whatsapp",
    "sms",
    "text me at",
)

#: Presidio recognizers that only read entities from the NLP engine's own NER; they are
#: replaced by an explicit NER recognizer when ``ner_model`` is set.
_NLP_RECOGNIZERS = ("SpacyRecognizer", "StanzaRecognizer", "TransformersRecognizer")


def _entity_mapping(backend: str) -> dict[str, str]:
    """Model label -> Presidio entity, as Presidio maps them for each backend."""
    if backend == "spacy":
        from presidio_analyzer.nlp_engine.ner_model_configuration import (
            MODEL_TO_PRESIDIO_ENTITY_MAPPING,
        )

        return dict(MODEL_TO_PRESIDIO_ENTITY_MAPPING)
    from presidio_analyzer.predefined_recognizers import HuggingFaceNerRecognizer

    return dict(HuggingFaceNerRecognizer.DEFAULT_LABEL_MAPPING)


def ner_entities(spec: PresidioEngine) -> tuple[str | None, dict[str, str]]:
    """The NER backend and {model label: Presidio entity} for the labels the configured
    model has that Presidio maps to a PII entity (empty without ``ner_model``)."""
    if not spec.ner_model:
        return None, {}
    backend, labels = ner_labels(spec.ner_model, spec.ner_backend)
    mapping = _entity_mapping(backend)
    return backend, {label: mapping[label] for label in labels if label in mapping}


def _offline_email_recognizer(language: str) -> Any:
    import tldextract
    from presidio_analyzer.predefined_recognizers import EmailRecognizer

    # The bundled public-suffix snapshot only: no suffix-list URLs, no cache directory.
    extract = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None, fallback_to_snapshot=True)

    class OfflineEmailRecognizer(EmailRecognizer):
        """Presidio's email recognizer with its domain check kept on this machine."""

        def validate_result(self, pattern_text: str) -> bool:
            return extract(pattern_text).fqdn != ""

    return OfflineEmailRecognizer(supported_language=language)


def _card_iin_recognizer(language: str) -> Any:
    from presidio_analyzer import Pattern
    from presidio_analyzer.predefined_recognizers import CreditCardRecognizer

    return CreditCardRecognizer(
        patterns=[Pattern("card number (issuer ranges)", CARD_IIN_PATTERN, 0.3)],
        supported_language=language,
        name="CardIssuerRangeRecognizer",
    )


def _labelled_phone_recognizer(language: str) -> Any:
    from presidio_analyzer import LocalRecognizer, RecognizerResult

    labels = "|".join(
        re.escape(w).replace(r"\ ", r"\s+") for w in sorted(PHONE_LABELS, key=len, reverse=True)
    )
    candidate = re.compile(
        rf"(?i)\b(?:{labels})\b[ \t]*(?:number|no\.?|#)?[ \t]*[:.]?\s{{0,2}}"
        r"(?P<number>\+?\(?\d[\d\-. ()]{5,22}\d)(?![\d\w])"
    )
    date_like = re.compile(r"^\d{4}[-./]\d{1,2}[-./]\d{1,2}$|^\d{1,2}[-./]\d{1,2}[-./]\d{2,4}$")

    class LabelledPhoneRecognizer(LocalRecognizer):
        """A number of 7 to 15 digits (the E.164 maximum) right after a phone label
        ("Phone:", "Fax", "call me on", ...), in any national format. Dates are skipped."""

        SCORE = 0.4

        def load(self) -> None:
            pass

        def analyze(self, text: str, entities: list[str], nlp_artifacts: Any = None) -> list:
            results = []
            for match in candidate.finditer(text):
                number = match.group("number")
                digits = sum(ch.isdigit() for ch in number)
                if not 7 <= digits <= 15 or date_like.match(number):
                    continue
                results.append(
                    RecognizerResult(
                        "PHONE_NUMBER",
                        match.start("number"),
                        match.end("number"),
                        self.SCORE,
                        recognition_metadata={
                            RecognizerResult.RECOGNIZER_NAME_KEY: self.name,
                            RecognizerResult.RECOGNIZER_IDENTIFIER_KEY: self.id,
                        },
                    )
                )
            return results

    return LabelledPhoneRecognizer(
        supported_entities=["PHONE_NUMBER"],
        supported_language=language,
        name="LabelledPhoneRecognizer",
    )


def _quiet_presidio() -> None:
    """Presidio logs every recognizer it loads or skips at INFO and WARNING; keep its
    errors only."""
    logging.getLogger("presidio-analyzer").setLevel(logging.ERROR)


def _pattern_recognizers(spec: PresidioEngine) -> list[Any]:
    """Presidio's predefined pattern recognizers for the language, with the email and
    phone recognizers replaced, plus ours; no NER recognizer."""
    _quiet_presidio()
    from presidio_analyzer import RecognizerRegistry
    from presidio_analyzer.predefined_recognizers import PhoneRecognizer

    registry = RecognizerRegistry(supported_languages=[spec.language])
    registry.load_predefined_recognizers(languages=[spec.language])
    replaced = (*_NLP_RECOGNIZERS, "EmailRecognizer", "PhoneRecognizer")
    out = [r for r in registry.recognizers if type(r).__name__ not in replaced]
    out.append(_offline_email_recognizer(spec.language))
    out.append(
        PhoneRecognizer(
            supported_language=spec.language, supported_regions=tuple(spec.phone_regions)
        )
    )
    out.append(_labelled_phone_recognizer(spec.language))
    out.append(_card_iin_recognizer(spec.language))
    return out


#: Score of a finding of the spaCy NER recognizer (Presidio's default for spaCy models,
#: which give no confidence); transformers models give their own, up to 1.0.
_SPACY_NER_SCORE = 0.85


def _max_scores(recognizers: Sequence[Any]) -> dict[str, float]:
    """Entity type -> the highest score any of ``recognizers`` can give it: a pattern's
    own score, or 1.0 when the recognizer confirms matches with a checksum."""
    from presidio_analyzer import PatternRecognizer

    best: dict[str, float] = {}
    for r in recognizers:
        if isinstance(r, PatternRecognizer):
            validated = type(r).validate_result is not PatternRecognizer.validate_result
            top = 1.0 if validated else max((p.score for p in r.patterns), default=0.0)
        else:
            top = float(getattr(r, "SCORE", 1.0))
        for entity in r.supported_entities:
            best[entity] = max(best.get(entity, 0.0), top)
    return best


def _check_language(language: str) -> None:
    import spacy

    try:
        spacy.util.get_lang_class(language)
    except Exception:  # noqa: BLE001 - spaCy raises ImportError or its own error
        raise EngineError(
            f"language {language!r}: spaCy has no such language; use an ISO "
            "639-1 code such as en, de or es"
        ) from None


def reachable_entities(spec: PresidioEngine) -> dict[str, float]:
    """Entity type -> highest score, for every type the configured recognizers report
    (before ``entity_types`` and ``score_threshold`` are applied)."""
    _check_language(spec.language)
    best = _max_scores(_pattern_recognizers(spec))
    backend, mapping = ner_entities(spec)
    for entity in mapping.values():
        best[entity] = max(best.get(entity, 0.0), _SPACY_NER_SCORE if backend == "spacy" else 1.0)
    return best


def supported_entities(spec: PresidioEngine) -> list[str]:
    """The entity types the configured detectors find, sorted: types in ``entity_types``
    that some recognizer reports with a score that can reach ``score_threshold``.

    Cheap enough for ``ragbatch validate``: it builds the pattern recognizers and reads
    the NER model's labels from its files, loading no model weights.

    Raises
    ------
    EngineError
        ``language`` is not a spaCy language, or ``ner_model`` is not a readable model
        directory.
    """
    best = reachable_entities(spec)
    enabled = set(best) if spec.entity_types == "all" else set(spec.entity_types)
    return sorted(e for e, top in best.items() if e in enabled and top >= spec.score_threshold)


def validate_note(spec: PresidioEngine) -> str:
    """The line ``ragbatch validate`` prints about a ``presidio`` engine, after its name:
    ``"finds: <entity type>, ..."`` (:func:`supported_entities`).

    Raises
    ------
    EngineError
        As :func:`supported_entities`.
    """
    return f"finds: {', '.join(supported_entities(spec))}"


def unsupported_reason(spec: PresidioEngine, entity: str) -> str:
    """Why ``entity`` is not among :func:`supported_entities` (for error messages)."""
    best = reachable_entities(spec)
    if entity in best and best[entity] < spec.score_threshold:
        return (
            f"{entity} scores at most {best[entity]:g}, below score_threshold "
            f"{spec.score_threshold:g}"
        )
    if entity in best:
        return f"{entity} is not in the engine's entity_types"
    if entity in ("PERSON", "LOCATION", "ORGANIZATION", "NRP"):
        return f"{entity} needs a NER model (ner_model)"
    return f"no recognizer reports {entity}"


def describe_detectors(spec: PresidioEngine) -> dict[str, Any]:
    """What the run manifest records about the detectors of a ``presidio`` engine.

    Returns
    -------
    dict
        ``language``, ``score_threshold``, ``nlp`` (``"blank spaCy tokenizer"`` or the NER
        backend and model path), ``recognizers`` (name -> entity types), ``entities``,
        ``phone_regions`` and ``network`` (always ``"none"``).
    """
    backend, mapping = ner_entities(spec)
    recognizers = {r.name: list(r.supported_entities) for r in _pattern_recognizers(spec)}
    if backend is not None:
        recognizers[f"ner:{backend}"] = sorted(set(mapping.values()))
    return {
        "language": spec.language,
        "score_threshold": spec.score_threshold,
        "nlp": (
            "blank spaCy tokenizer"
            if backend is None
            else {"backend": backend, "model": spec.ner_model, "labels": mapping}
        ),
        "recognizers": recognizers,
        "entities": supported_entities(spec),
        "entity_types": spec.entity_types,
        "phone_regions": list(spec.phone_regions),
        "network": "none",
    }


class PiiDetector:
    """A loaded Presidio analyzer for one ``presidio`` engine spec.

    Build it once per worker (loading a NER model takes seconds) and call :meth:`find`
    per batch.

    Parameters
    ----------
    spec : PresidioEngine

    Attributes
    ----------
    entities : list of str
        Entity types it can find (as :func:`supported_entities`).
    model_id : str
        ``presidio-analyzer==<version>`` plus ``+ner:<path>`` when a NER model runs;
        recorded in each cell's ``model`` field.

    Raises
    ------
    EngineError
        The NER model cannot be loaded from its directory, or the language is not
        supported by spaCy.
    """

    def __init__(self, spec: PresidioEngine):
        from importlib import metadata

        from presidio_analyzer import AnalyzerEngine, RecognizerRegistry

        self.spec = spec
        backend, mapping = ner_entities(spec)
        nlp_engine = self._nlp_engine(spec, backend, mapping)
        registry = RecognizerRegistry(supported_languages=[spec.language])
        for recognizer in _pattern_recognizers(spec):
            registry.add_recognizer(recognizer)
        if backend is not None:
            registry.add_recognizer(self._ner_recognizer(spec, backend, mapping))
        self.analyzer = AnalyzerEngine(
            registry=registry,
            nlp_engine=nlp_engine,
            supported_languages=[spec.language],
            default_score_threshold=spec.score_threshold,
        )
        self.entities = supported_entities(spec)
        version = metadata.version("presidio-analyzer")
        self.model_id = f"presidio-analyzer=={version}" + (
            f"+ner:{spec.ner_model}" if backend else ""
        )

    @staticmethod
    def _nlp_engine(spec: PresidioEngine, backend: str | None, mapping: dict[str, str]) -> Any:
        import spacy
        from presidio_analyzer.nlp_engine import NerModelConfiguration, SpacyNlpEngine

        if backend == "spacy":
            model_path = str(Path(spec.ner_model).expanduser())  # type: ignore[arg-type]
            _, labels = ner_labels(model_path, "spacy")
            config = NerModelConfiguration(
                model_to_presidio_entity_mapping=mapping,
                labels_to_ignore=[label for label in labels if label not in mapping],
            )
            engine = SpacyNlpEngine(
                models=[{"lang_code": spec.language, "model_name": model_path}],
                ner_model_configuration=config,
            )
            try:
                engine.nlp = {spec.language: spacy.load(model_path)}
            except Exception as exc:  # noqa: BLE001 - any load failure is reported the same way
                raise EngineError(f"ner_model {model_path!r}: spaCy cannot load it: {exc}") from exc
            return engine
        engine = SpacyNlpEngine(models=[{"lang_code": spec.language, "model_name": "blank"}])
        try:
            blank = spacy.blank(spec.language)
        except Exception as exc:  # noqa: BLE001
            raise EngineError(
                f"language {spec.language!r}: spaCy has no tokenizer for it: {exc}"
            ) from exc
        blank.max_length = 50_000_000  # a tokenizer alone: long texts cost time, not memory
        engine.nlp = {spec.language: blank}
        return engine

    @staticmethod
    def _ner_recognizer(spec: PresidioEngine, backend: str, mapping: dict[str, str]) -> Any:
        entities = sorted(set(mapping.values()))
        if backend == "spacy":
            from presidio_analyzer.predefined_recognizers import SpacyRecognizer

            return SpacyRecognizer(supported_language=spec.language, supported_entities=entities)
        from presidio_analyzer.predefined_recognizers import HuggingFaceNerRecognizer

        try:
            recognizer = HuggingFaceNerRecognizer(
                supported_entities=entities,
                supported_language=spec.language,
                model_name=str(Path(spec.ner_model).expanduser()),  # type: ignore[arg-type]
                label_mapping=mapping,
                threshold=spec.score_threshold,
                device="cpu",
            )
            recognizer.load()
        except Exception as exc:  # noqa: BLE001
            raise EngineError(
                f"ner_model {spec.ner_model!r}: transformers cannot load it: {exc}"
            ) from exc
        return recognizer

    def find(self, texts: Sequence[str], entities: Sequence[str]) -> list[list[Finding] | str]:
        """Detect ``entities`` in each text.

        Parameters
        ----------
        texts : sequence of str, length n
            Repeated texts are analyzed once.
        entities : sequence of str
            Entity types to look for (a subset of :attr:`entities`).

        Returns
        -------
        list, length n
            Per text, the findings at or above the engine's ``score_threshold`` after
            :func:`resolve_overlaps` among ``entities``, sorted by start offset; or, when
            the analyzer raised on that text, a string ``"<ExceptionType>: <message>"``.
            Offsets refer to :func:`clean_text` of the text.
        """
        unique = list(dict.fromkeys(texts))
        found: dict[str, list[Finding] | str] = {}
        cleaned = {text: clean_text(text) for text in unique}
        artifacts = self._artifacts(list(dict.fromkeys(cleaned.values())))
        for text in unique:
            try:
                results = self.analyzer.analyze(
                    cleaned[text],
                    language=self.spec.language,
                    entities=list(entities),
                    nlp_artifacts=artifacts.get(cleaned[text]),
                )
            except Exception as exc:  # noqa: BLE001 - a per-text failure becomes that row's status
                found[text] = f"{type(exc).__name__}: {exc}"
                continue
            findings = [
                Finding(
                    r.entity_type,
                    r.start,
                    r.end,
                    float(r.score),
                    (r.recognition_metadata or {}).get("recognizer_name", ""),
                )
                for r in results
            ]
            found[text] = sorted(resolve_overlaps(findings), key=lambda f: (f.start, f.end))
        return [found[t] for t in texts]

    def _artifacts(self, texts: list[str]) -> dict[str, Any]:
        """NLP artifacts of the texts, computed in one spaCy ``pipe`` (batched NER); on a
        failure, empty, so that each text is processed (and fails) on its own."""
        engine = self.analyzer.nlp_engine
        try:
            return {
                text: art
                for text, art in engine.process_batch(
                    texts, language=self.spec.language, batch_size=64
                )
            }
        except Exception as exc:  # noqa: BLE001
            logger.warning("PII: batched NLP pass failed (%s); analyzing texts one by one", exc)
            return {}
