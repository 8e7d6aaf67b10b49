"""``semantic_similarity``: how close the answer's meaning is to the reference answer.

Two engines compute it:

* ``cross_encoder`` (the reference definition, as in Vellum's semantic similarity
  evaluator): a one-label cross-encoder reads the pair ``(answer, reference)`` and the
  score is the sigmoid of its logit;
* ``embedding`` (the default, needing no model store): a bi-encoder embeds both texts and
  the score is their cosine similarity clipped to [0, 1]. With no model configured the
  packaged all-MiniLM-L6-v2 is used.
"""

from __future__ import annotations

import logging
import math
from typing import Any, ClassVar

import numpy as np
import polars as pl

from ragbatch.core.columns import ANSWER, ISSUES, NULLABLE_INPUTS, REFERENCE
from ragbatch.engines.sentence_transformers import LoadedModel
from ragbatch.core.errors import EngineError
from ragbatch.metrics.cells import CELL_DTYPE, Guard, PyCell, blank, missing, python_cells
from ragbatch.metrics.base import Example, ModelMetric
from ragbatch.core.registry import register
from ragbatch.core.status import ERROR

logger = logging.getLogger(__name__)

_ISSUES_DTYPE = pl.Struct({name: pl.String for name in NULLABLE_INPUTS})


def cosine_to_score(cosine: float) -> float:
    """Map a cosine similarity onto the metric's range [0, 1].

    Parameters
    ----------
    cosine : float
        Cosine of two embeddings, nominally in [-1, 1] (float rounding can put it a
        little outside).

    Returns
    -------
    float
        ``min(max(cosine, 0), 1)``: a negative cosine (no semantic overlap) scores 0,
        rounding past 1 scores 1, anything in between is returned unchanged.
    """
    return min(max(float(cosine), 0.0), 1.0)


def pair_cosines(model: LoadedModel, answers: list[str], references: list[str]) -> np.ndarray:
    """Cosine similarity of each (answer, reference) pair with a bi-encoder.

    Every distinct text is embedded once (references often repeat across rows).

    Parameters
    ----------
    model : LoadedModel
        An ``embedding`` model.
    answers, references : list of str, length n

    Returns
    -------
    numpy.ndarray
        Shape ``(n,)``, float64, in [-1, 1] up to rounding.
    """
    unique = list(dict.fromkeys([*answers, *references]))
    position = {text: i for i, text in enumerate(unique)}
    vectors: np.ndarray = model.embed(unique).astype(np.float64)
    left = vectors[[position[t] for t in answers]]
    right = vectors[[position[t] for t in references]]
    return np.einsum("ij,ij->i", left, right)


def pair_probabilities(
    model: LoadedModel, answers: list[str], references: list[str]
) -> tuple[np.ndarray, np.ndarray]:
    """Cross-encoder probability and logit of each (answer, reference) pair.

    Every distinct pair is scored once.

    Returns
    -------
    probability, logit : numpy.ndarray
        Each of shape ``(n,)``, float64; the probability is ``sigmoid(logit)`` in [0, 1].
    """
    pairs = list(zip(answers, references))
    unique = list(dict.fromkeys(pairs))
    index = {pair: i for i, pair in enumerate(unique)}
    position = [index[pair] for pair in pairs]
    probability, logit = model.score_pairs(unique)
    return probability[position], logit[position]


def _bi_encoder_cells(
    model: LoadedModel, answers: list[str], references: list[str]
) -> list[PyCell]:
    cells = []
    for cosine in pair_cosines(model, answers, references):
        if not math.isfinite(cosine):
            reason = f"embedding model returned a non-finite cosine ({cosine})"
            cells.append(PyCell(None, ERROR, reason))
        else:
            cells.append(PyCell(cosine_to_score(cosine), details={"cosine": float(cosine)}))
    return cells


def _cross_encoder_cells(
    model: LoadedModel, answers: list[str], references: list[str]
) -> list[PyCell]:
    cells = []
    for probability, logit in zip(*pair_probabilities(model, answers, references)):
        if not math.isfinite(logit):
            reason = f"cross-encoder returned a non-finite logit ({logit})"
            cells.append(PyCell(None, ERROR, reason))
        else:
            cells.append(PyCell(float(probability), details={"logit": float(logit)}))
    return cells


def score_pairs(model: LoadedModel, rows: list[dict[str, Any]]) -> list[PyCell]:
    """Score rows that passed the input guards; a model failure gives ``error`` cells.

    Parameters
    ----------
    model : LoadedModel
    rows : list of dict
        Each with non-blank string ``answer`` and ``reference``.

    Returns
    -------
    list of PyCell
        One per row, in order. When the model raises, every cell has status ``error``
        and the exception (type and message) as its reason; no row is dropped and none
        scores 0.
    """
    answers = [r[ANSWER] for r in rows]
    references = [r[REFERENCE] for r in rows]
    try:
        if model.kind == "cross_encoder":
            return _cross_encoder_cells(model, answers, references)
        return _bi_encoder_cells(model, answers, references)
    except Exception as exc:  # any model failure becomes a per-row status, never a lost row
        logger.warning(
            "semantic_similarity: %s failed on %d rows: %s", model.model_id, len(rows), exc
        )
        reason = f"{type(exc).__name__}: {exc}"
        return [PyCell(None, ERROR, reason) for _ in rows]


def _canonical_inputs(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with string-typed inputs and an ``_issues`` column (all null if absent)."""
    frame = frame.with_columns(pl.col(ANSWER).cast(pl.String), pl.col(REFERENCE).cast(pl.String))
    if ISSUES not in frame.columns:
        frame = frame.with_columns(pl.lit(None, _ISSUES_DTYPE).alias(ISSUES))
    return frame


@register
class SemanticSimilarity(ModelMetric):
    """Semantic similarity of the answer to the reference answer, in [0, 1].

    With a ``cross_encoder`` engine the score is ``sigmoid(logit)`` of a one-label
    cross-encoder applied to ``(answer, reference)``; with an ``embedding`` engine it is
    the cosine of the two L2-normalised embeddings, clipped to [0, 1].

    Notes
    -----
    Source: Vellum's semantic similarity evaluator (cross-encoder, [0, 1]); the
    bi-encoder cosine follows sentence-transformers' semantic textual similarity recipe.
    Cost: one forward pass per distinct text (bi-encoder) or distinct pair
    (cross-encoder) per batch; rows settled by a guard never reach the model.
    """

    name: ClassVar[str] = "semantic_similarity"
    inputs: ClassVar[tuple[str, ...]] = (ANSWER, REFERENCE)
    engine_types: ClassVar[tuple[str, ...]] = ("embedding", "cross_encoder")
    default_engine: ClassVar[dict[str, Any] | None] = {"type": "embedding"}
    score_range: ClassVar[tuple[float, float]] = (0.0, 1.0)
    boolean: ClassVar[bool] = False
    higher_is_better: ClassVar[bool] = True
    summary: ClassVar[str] = (
        "How close the answer's meaning is to the reference: cross-encoder probability, or "
        "bi-encoder cosine clipped to [0, 1]"
    )
    source: ClassVar[str] = (
        "Vellum semantic similarity (cross-encoder on answer vs reference, in [0, 1]); "
        "bi-encoder cosine fallback as in sentence-transformers semantic textual similarity"
    )
    policy: ClassVar[tuple[tuple[str, str], ...]] = (
        (
            "answer or reference is null",
            "missing_input; reason is the normalizer's note, or '<column> is null'",
        ),
        (
            "answer or reference is empty or only whitespace",
            "missing_input; reason '<column> is empty'",
        ),
        ("bi-encoder cosine below 0", "score 0.0 (clipped); details.cosine keeps the raw cosine"),
        (
            "bi-encoder cosine above 1 by float rounding",
            "score 1.0 (clipped); details.cosine keeps the raw cosine",
        ),
        (
            "text longer than the model's maximum sequence length",
            "the model truncates it and scores the leading tokens (all-MiniLM-L6-v2: 256 word "
            "pieces); no status change",
        ),
        (
            "model raises on a batch",
            "error for every row of that batch sent to the model; reason holds the exception",
        ),
        ("model returns NaN or infinity for a row", "error; reason says so"),
    )
    examples: ClassVar[tuple[Example, ...]] = (
        Example(
            inputs={ANSWER: "Paris is the capital of France.", REFERENCE: None},
            score=None,
            status="missing_input",
            note="null reference",
        ),
        Example(
            inputs={ANSWER: "   ", REFERENCE: "Paris is the capital of France."},
            score=None,
            status="missing_input",
            note="whitespace-only answer",
        ),
    )

    @staticmethod
    def guards() -> tuple[Guard, ...]:
        """Input guards in priority order: null answer, null reference, blank answer,
        blank reference (all ``missing_input``)."""
        return (missing(ANSWER), missing(REFERENCE), blank(ANSWER), blank(REFERENCE))

    def compute(self, model: LoadedModel, frame: pl.DataFrame) -> pl.Series:
        """Score every row of ``frame``.

        Parameters
        ----------
        model : LoadedModel
            An ``embedding`` or ``cross_encoder`` model from
            :func:`ragbatch.engines.sentence_transformers.load_model`.
        frame : polars.DataFrame
            At least ``answer`` and ``reference`` (String); ``_issues`` is used for null
            reasons when present.

        Returns
        -------
        polars.Series
            Named after the metric id, dtype :data:`~ragbatch.metrics.cells.CELL_DTYPE`,
            ``len(frame)`` cells in row order. ``score`` is Float64 in [0, 1] when the
            status is ``ok`` and null otherwise; ``details`` is ``{"cosine": c}``
            (embedding) or ``{"logit": z}`` (cross-encoder); ``model`` is
            ``model.model_id``.

        Raises
        ------
        EngineError
            ``model`` is of a kind this metric does not support.
        """
        if model.kind not in self.engine_types:
            raise EngineError(
                f"{self.id}: engine type {model.kind!r} is not supported; use one of "
                f"{', '.join(self.engine_types)}"
            )
        cells = python_cells(
            self.guards(),
            [ANSWER, REFERENCE],
            lambda rows: score_pairs(model, rows),
            model=model.model_id,
        )
        out = _canonical_inputs(frame).select(cells.alias(self.id)).to_series()
        if out.dtype != CELL_DTYPE:
            out = out.cast(CELL_DTYPE)
        return out
