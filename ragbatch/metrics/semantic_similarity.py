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
from functools import partial
from typing import Any, ClassVar, Sequence

import numpy as np
import polars as pl

from ragbatch.core.columns import ANSWER, ISSUES, NULLABLE_INPUTS, REFERENCE
from ragbatch.core.engine_registry import DefaultEngineFor, EnginesProviding
from ragbatch.engines.sentence_transformers import LoadedModel
from ragbatch.core.errors import EngineError
from ragbatch.scoring.cells import CELL_DTYPE, Guard, batch_cells, blank, missing
from ragbatch.scoring.base import Example, ModelMetric
from ragbatch.scoring.registry import register
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


def distinct(texts: pl.Series) -> tuple[list[str], np.ndarray]:
    """The distinct values of a String series, in first-seen order, and where each value
    of the series is among them.

    Returns
    -------
    values : list of str
        Each distinct value once (length ``k``).
    index : numpy.ndarray
        Shape ``(len(texts),)``, int64 in ``[0, k)``: ``values[index[i]] == texts[i]``.

    Notes
    -----
    Hashing and matching run in Polars; only the ``k`` distinct values become Python
    strings (a model's tokenizer needs them as such).
    """
    frame = texts.cast(pl.String).alias("t").to_frame()
    values = frame.unique(maintain_order=True).with_row_index("i")
    index = frame.join(values, on="t", how="left", maintain_order="left").get_column("i")
    return values.get_column("t").to_list(), index.to_numpy().astype(np.int64)


def pair_cosines(
    model: LoadedModel, answers: Sequence[str] | pl.Series, references: Sequence[str] | pl.Series
) -> np.ndarray:
    """Cosine similarity of each (answer, reference) pair with a bi-encoder.

    Every distinct text is embedded once (references often repeat across rows).

    Parameters
    ----------
    model : LoadedModel
        An ``embedding`` model.
    answers, references : sequence of str or polars String Series, length n

    Returns
    -------
    numpy.ndarray
        Shape ``(n,)``, float64, in [-1, 1] up to rounding.
    """
    first = pl.Series(answers, dtype=pl.String)
    texts = pl.concat([first, pl.Series(references, dtype=pl.String)])
    values, index = distinct(texts)
    vectors: np.ndarray = model.embed(values).astype(np.float64)
    n = len(first)
    return np.einsum("ij,ij->i", vectors[index[:n]], vectors[index[n:]])


def pair_probabilities(
    model: LoadedModel, answers: Sequence[str] | pl.Series, references: Sequence[str] | pl.Series
) -> tuple[np.ndarray, np.ndarray]:
    """Cross-encoder probability and logit of each (answer, reference) pair.

    Every distinct pair is scored once.

    Returns
    -------
    probability, logit : numpy.ndarray
        Each of shape ``(n,)``, float64; the probability is ``sigmoid(logit)`` in [0, 1].
    """
    pairs = pl.DataFrame(
        {"a": pl.Series(answers, dtype=pl.String), "r": pl.Series(references, dtype=pl.String)}
    )
    unique = pairs.unique(maintain_order=True).with_row_index("i")
    position = (
        pairs.join(unique, on=["a", "r"], how="left", maintain_order="left", nulls_equal=True)
        .get_column("i")
        .to_numpy()
        .astype(np.int64)
    )
    distinct_pairs = list(zip(unique.get_column("a").to_list(), unique.get_column("r").to_list()))
    probability, logit = model.score_pairs(distinct_pairs)
    return probability[position], logit[position]


def _value_cells(values: np.ndarray, field: str, scores: np.ndarray, failure: str) -> pl.DataFrame:
    """The scored rows' cells from the model's number per row (``field``: ``cosine`` or
    ``logit``): ``scores`` where the number is finite, else status ``error`` with
    ``failure`` and the number as the reason. ``details`` is ``{"<field>": value}``."""
    finite = pl.col(field).is_finite()
    shown = pl.col(field).cast(pl.String).str.to_lowercase()
    frame = pl.DataFrame(
        {
            field: np.asarray(values, dtype=np.float64),
            "score": np.asarray(scores, dtype=np.float64),
        }
    )
    return frame.select(
        score=pl.when(finite).then(pl.col("score")),
        status=pl.when(finite).then(pl.lit(None, pl.String)).otherwise(pl.lit(ERROR)),
        reason=pl.when(finite)
        .then(pl.lit(None, pl.String))
        .otherwise(pl.format(f"{failure} ({{}})", shown)),
        details=pl.when(finite).then(pl.struct(field).struct.json_encode()),
    )


def _failed_cells(n: int, reason: str) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "score": pl.repeat(None, n, dtype=pl.Float64, eager=True),
            "status": pl.repeat(ERROR, n, dtype=pl.String, eager=True),
            "reason": pl.repeat(reason, n, dtype=pl.String, eager=True),
            "details": pl.repeat(None, n, dtype=pl.String, eager=True),
        }
    )


def score_frame(model: LoadedModel, rows: pl.DataFrame) -> pl.DataFrame:
    """Score rows that passed the input guards; a model failure gives ``error`` cells.

    Parameters
    ----------
    model : LoadedModel
    rows : polars.DataFrame
        ``answer`` and ``reference``, non-blank String, one row per row to score.

    Returns
    -------
    polars.DataFrame
        One row per row of ``rows``, in order: ``score`` (Float64, null unless scored),
        ``status`` (null where scored, ``error`` otherwise), ``reason`` and ``details``
        (String). When the model raises, every row has status ``error`` and the
        exception (type and message) as its reason; no row is dropped and none scores 0.
        A row whose number is NaN or infinite is ``error`` with a reason saying so.
    """
    if rows.height == 0:
        return _failed_cells(0, "")
    answers, references = rows.get_column(ANSWER), rows.get_column(REFERENCE)
    try:
        if model.scores_pairs:
            probability, logit = pair_probabilities(model, answers, references)
            return _value_cells(
                logit, "logit", probability, "cross-encoder returned a non-finite logit"
            )
        cosine = pair_cosines(model, answers, references)
        return _value_cells(
            cosine,
            "cosine",
            np.clip(cosine, 0.0, 1.0),
            "embedding model returned a non-finite cosine",
        )
    except Exception as exc:  # any model failure becomes a per-row status, never a lost row
        logger.warning(
            "semantic_similarity: %s failed on %d rows: %s", model.model_id, rows.height, exc
        )
        return _failed_cells(rows.height, f"{type(exc).__name__}: {exc}")


def _canonical_inputs(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with string-typed inputs and an ``_issues`` column (all null if absent)."""
    fixes = [pl.col(c).cast(pl.String) for c in (ANSWER, REFERENCE) if frame.schema[c] != pl.String]
    if ISSUES not in frame.columns:
        fixes.append(pl.lit(None, _ISSUES_DTYPE).alias(ISSUES))
    return frame.with_columns(fixes) if fixes else frame


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
    # any engine that embeds texts or scores text pairs; by default the packaged model
    engine_types: ClassVar[tuple[str, ...]] = EnginesProviding("embed", "score_pairs")  # type: ignore[assignment]
    default_engine: ClassVar[dict[str, Any] | None] = DefaultEngineFor("embed")  # type: ignore[assignment]
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
            Named after the metric id, dtype :data:`~ragbatch.scoring.cells.CELL_DTYPE`,
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
        out = batch_cells(
            _canonical_inputs(frame),
            self.guards(),
            [ANSWER, REFERENCE],
            partial(score_frame, model),
            model=model.model_id,
        ).alias(self.id)
        return out if out.dtype == CELL_DTYPE else out.cast(CELL_DTYPE)
