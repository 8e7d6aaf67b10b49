"""What the ranking metrics share: the ``k`` param, the guards and one batch computation.

The ranking metrics (``hit_rate``, ``precision_at_k``, ``recall_at_k``, ``mrr``,
``ndcg_at_k``, ``average_precision``) score a row's retrieved ids, ``context_ids`` in
retrieved order, against the ids known relevant. Their definitions follow trec_eval (as
``pytrec_eval`` and ``ranx`` compute them); docs/metrics.md lists each one's formula.

Which ids are relevant
    ``relevant_ids`` when the row has it (null items ignored, each id counted once);
    otherwise the ids whose ``relevance`` grade is above 0. ``ndcg_at_k`` uses the
    ``relevance`` grades themselves when the row has them (grades at or below 0 gain
    nothing), otherwise grade 1 for each id of ``relevant_ids``.
Ranks
    The first id of ``context_ids`` has rank 1. With ``k`` set only ranks 1..k count.
    An id repeated in the ranking counts at its first rank only: a later copy keeps its
    rank (it used a slot) but is never relevant, so precision cannot exceed 1 and recall
    cannot count an id twice. A null id takes its rank and is never relevant.
Degenerate rows
    ``context_ids`` null, or an issue in any ranking column: ``missing_input`` with the
    reason; ``relevant_ids`` and ``relevance`` both null: ``missing_input``; no relevant id
    at all: ``not_applicable`` (recall, average precision and nDCG divide by the number of
    relevant ids); an empty ranking with relevant ids: scored, 0.0.

The score of a batch comes from one pass (:func:`ranking_stats`): the rankings are
exploded, joined with the judged ids and aggregated per row, all in Polars.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

import polars as pl
from pydantic import Field

from ragbatch.core.columns import CONTEXT_IDS, ISSUES, RANKING, RELEVANCE, RELEVANT_IDS
from ragbatch.core.status import MISSING_INPUT, NOT_APPLICABLE
from ragbatch.metrics.base import ExpressionMetric, StrictParams
from ragbatch.metrics.cells import Guard, details_json, frame_cells, missing

#: Largest ``k`` a config may give (far above any ranking a RAG system retrieves).
K_MAX = 100_000

#: Policy lines every ranking metric shares (docs/metrics.md prints them).
SHARED_POLICY: tuple[tuple[str, str], ...] = (
    ("context_ids null (or not usable: see input.columns)", "missing_input"),
    ("relevant_ids and relevance both null", "missing_input"),
    ("no relevant id (empty relevant_ids, or no grade above 0)", "not_applicable"),
    ("context_ids an empty list, some id relevant", "scored: 0.0"),
    ("an id repeated in context_ids", "counts at its first rank only; later copies never relevant"),
    ("a null id in context_ids", "takes its rank, never relevant"),
    ("relevant_ids given", "it decides relevance; relevance is not read (ndcg_at_k excepted)"),
)


class RankParams(StrictParams):
    """``k``: the cutoff rank."""

    k: int | None = Field(
        None,
        ge=1,
        le=K_MAX,
        description="only ranks 1..k of context_ids count; unset: the whole ranking",
    )


def _issue(column: str) -> Guard:
    issue = pl.col(ISSUES).struct.field(column)
    return Guard(issue.is_not_null(), MISSING_INPUT, issue)


def _no_relevant(graded: bool) -> pl.Expr:
    """True where the row judges no id relevant (see the module doc)."""
    ids = pl.col(RELEVANT_IDS).list.drop_nulls().list.len() == 0
    grades = ~pl.col(RELEVANCE).list.eval(pl.element().struct.field("grade") > 0).list.any()
    if graded:
        return pl.when(pl.col(RELEVANCE).is_not_null()).then(grades).otherwise(ids)
    return pl.when(pl.col(RELEVANT_IDS).is_not_null()).then(ids).otherwise(grades)


def guards(graded: bool = False) -> list[Guard]:
    """The ranking metrics' guards, in order (see the module doc)."""
    return [
        missing(CONTEXT_IDS),
        _issue(RELEVANT_IDS),
        _issue(RELEVANCE),
        Guard(
            pl.col(RELEVANT_IDS).is_null() & pl.col(RELEVANCE).is_null(),
            MISSING_INPUT,
            pl.lit("relevant_ids and relevance are null"),
        ),
        Guard(_no_relevant(graded), NOT_APPLICABLE, pl.lit("no id is known relevant")),
    ]


def _judged(frame: pl.DataFrame, graded: bool) -> pl.DataFrame:
    """``(row, id, gain)`` of every relevant id of every row, ids distinct per row."""
    rows = frame.with_row_index("row")
    from_ids = (
        rows.select("row", id=pl.col(RELEVANT_IDS))
        .explode("id")
        .drop_nulls("id")
        .with_columns(gain=pl.lit(1.0))
    )
    from_grades = (
        rows.select("row", e=pl.col(RELEVANCE))
        .explode("e")
        .drop_nulls("e")
        .select("row", id=pl.col("e").struct.field("id"), gain=pl.col("e").struct.field("grade"))
        .filter(pl.col("gain") > 0)
    )
    if graded:
        has_grades = rows.filter(pl.col(RELEVANCE).is_not_null()).get_column("row")
        from_ids = from_ids.filter(~pl.col("row").is_in(has_grades.implode()))
    else:
        has_ids = rows.filter(pl.col(RELEVANT_IDS).is_not_null()).get_column("row")
        from_grades = from_grades.filter(~pl.col("row").is_in(has_ids.implode()))
        from_grades = from_grades.with_columns(gain=pl.lit(1.0))
    return pl.concat([from_ids, from_grades]).unique(["row", "id"], keep="first")


def ranking_stats(frame: pl.DataFrame, k: int | None, graded: bool = False) -> pl.DataFrame:
    """Per row of ``frame`` (columns ``context_ids``, ``relevant_ids``, ``relevance``):

    ``retrieved`` (UInt32, ids in the ranking, 0 for null), ``relevant`` (number of
    relevant ids), ``hits`` (relevant ids at ranks 1..k, each once), ``first`` (rank of
    the first of them, null when none), ``ap_sum`` (sum over those hits of precision at
    their rank), ``dcg`` (sum of gain / log2(rank + 1) over ranks 1..k) and ``idcg`` (the
    same for the ideal ranking: the judged gains in decreasing order, cut at k). Counts
    are 0 and sums 0.0 where a row has nothing to count.
    """
    judged = _judged(frame, graded)
    length = pl.col(CONTEXT_IDS).list.len().fill_null(0)
    ranked = (
        frame.with_row_index("row")
        .select(
            "row",
            id=pl.col(CONTEXT_IDS).fill_null(pl.lit([], pl.List(pl.String))),
            rank=pl.int_ranges(1, length + 1),
        )
        .explode(["id", "rank"])
        .drop_nulls("rank")
    )
    if k is not None:
        ranked = ranked.filter(pl.col("rank") <= k)
    first_copy = pl.struct("row", "id").is_first_distinct() & pl.col("id").is_not_null()
    ranked = ranked.with_columns(first_copy.alias("first_copy")).join(
        judged, on=["row", "id"], how="left", maintain_order="left"
    )
    gain = pl.when("first_copy").then(pl.col("gain").fill_null(0.0)).otherwise(0.0)
    rel = gain > 0
    per_row = (
        ranked.with_columns(gain=gain, rel=rel)
        .with_columns(cum=pl.col("rel").cast(pl.Int64).cum_sum().over("row"))
        .group_by("row")
        .agg(
            hits=pl.col("rel").sum(),
            first=pl.col("rank").filter("rel").min(),
            ap_sum=(pl.col("cum") / pl.col("rank")).filter("rel").sum(),
            dcg=(pl.col("gain") / (pl.col("rank") + 1).log(2)).sum(),
        )
    )
    ideal_gain = pl.col("gain") / (pl.col("at") + 1).log(2)
    if k is not None:
        ideal_gain = ideal_gain.filter(pl.col("at") <= k)
    ideal = (
        judged.sort(["row", "gain"], descending=[False, True])
        .with_columns(at=pl.int_range(1, pl.len() + 1).over("row"))
        .group_by("row")
        .agg(relevant=pl.len(), idcg=ideal_gain.sum())
    )
    return (
        frame.select(retrieved=length.cast(pl.UInt32))
        .with_row_index("row")
        .join(per_row, on="row", how="left", maintain_order="left")
        .join(ideal, on="row", how="left", maintain_order="left")
        .select(
            "retrieved",
            relevant=pl.col("relevant").fill_null(0),
            hits=pl.col("hits").fill_null(0),
            first=pl.col("first"),
            ap_sum=pl.col("ap_sum").fill_null(0.0),
            dcg=pl.col("dcg").fill_null(0.0),
            idcg=pl.col("idcg").fill_null(0.0),
        )
    )


class RankingMetric(ExpressionMetric):
    """Base of the ranking metrics: declarations, guards and cells; a subclass gives
    :meth:`score` over the columns of :func:`ranking_stats`."""

    inputs: ClassVar[tuple[str, ...]] = RANKING
    Params = RankParams
    boolean = False
    #: Whether the score uses ``relevance`` grades (nDCG) rather than binary relevance.
    graded: ClassVar[bool] = False

    @abstractmethod
    def score(self) -> pl.Expr:
        """The score (Float64) from the columns of :func:`ranking_stats`."""

    @property
    def k(self) -> int | None:
        """The cutoff rank, or None for the whole ranking."""
        return self.params.k  # type: ignore[attr-defined, no-any-return]

    def check_input(self, available: set[str]) -> list[str]:
        """``context_ids`` and one of ``relevant_ids`` / ``relevance`` must be mapped."""
        problems = []
        if CONTEXT_IDS not in available:
            problems.append(
                f"{self.id} reads `context_ids` but input.columns maps nothing to it; add "
                "`context_ids: <input column>` (retrieved ids, in order) under input.columns"
            )
        if RELEVANT_IDS not in available and RELEVANCE not in available:
            problems.append(
                f"{self.id} needs the relevant ids: add `relevant_ids: <input column>` "
                "(ids known relevant) or `relevance: <input column>` (id -> grade) under "
                "input.columns"
            )
        return problems

    def expression(self) -> pl.Expr:
        return frame_cells(guards(self.graded), list(RANKING), self._score_frame)

    def _score_frame(self, frame: pl.DataFrame) -> pl.DataFrame:
        stats = ranking_stats(frame, self.k, self.graded)
        return stats.select(
            score=self.score(),
            reason=pl.lit(None, pl.String),
            details=details_json(
                retrieved=pl.col("retrieved"), relevant=pl.col("relevant"), hits=pl.col("hits")
            ),
        )
