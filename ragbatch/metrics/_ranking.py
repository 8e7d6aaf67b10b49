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

The score of a batch comes from one vectorized pass over the flattened ids, without
Python per row: :class:`RankedIds` matches the retrieved ids against the judged ones, and
its :meth:`RankedIds.stats` gives the per-row counts and sums at a cutoff. In the
expression stage every ranking metric of the batch reads one shared :class:`RankedIds`
(the :class:`RankingMatch` intermediate), whatever its ``k``; a metric evaluated alone
builds its own.
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import polars as pl
from pydantic import Field

from ragbatch.core.columns import CONTEXT_IDS, ISSUES, RANKING, RELEVANCE, RELEVANT_IDS
from ragbatch.core.status import MISSING_INPUT, NOT_APPLICABLE
from ragbatch.metrics.base import ExpressionMetric, Intermediate, StrictParams
from ragbatch.metrics.cells import Guard, details_json, frame_cells, missing

#: Largest ``k`` a config may give (far above any ranking a RAG system retrieves).
K_MAX = 100_000

#: Policy lines every ranking metric shares (docs/metrics.md prints them).
SHARED_POLICY: tuple[tuple[str, str], ...] = (
    ("context_ids null (or not usable: see input.columns)", "missing_input"),
    ("relevant_ids or relevance not usable (see input.columns)", "missing_input, with the note"),
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
        strict=True,  # YAML `k: yes` is a boolean, not k = 1
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


#: Multiplier mixing a row number into an id's 64-bit hash (2^64 / golden ratio, odd).
_MIX = np.uint64(0x9E3779B97F4A7C15)


def _flat(series: pl.Series) -> tuple[pl.Series, np.ndarray, np.ndarray]:
    """A list column's items in order, the row of each, and each row's length (0 for
    null); null items are kept."""
    lengths = series.list.len().fill_null(0).cast(pl.Int64).to_numpy()
    values = series.explode(empty_as_null=False, keep_nulls=False)
    rows: np.ndarray = np.repeat(np.arange(len(series), dtype=np.int64), lengths)
    return values, rows, lengths


def _keys(values: pl.Series, rows: np.ndarray) -> np.ndarray:
    """A uint64 key per (row, id): the id's hash mixed with its row number."""
    return values.hash(seed=0).to_numpy() ^ (rows.astype(np.uint64) * _MIX)


def _once(
    values: pl.Series, rows: np.ndarray, keep: np.ndarray
) -> tuple[pl.Series, np.ndarray, np.ndarray, np.ndarray]:
    """The ``keep`` items of ``values`` (each row's items contiguous), each id once per
    row: the items, their rows, their keys (:func:`_keys`) and their indices in
    ``values``."""
    index = np.flatnonzero(keep)
    values, rows = values.gather(index), rows[index]
    keys = _keys(values, rows)
    once = _first_in_row(keys, rows)
    return values.filter(pl.Series(once)), rows[once], keys[once], index[once]


def _first_in_row(keys: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """True for each key not seen before in its row; each row's keys are contiguous.

    Narrow rows compare every key with the d-th key before it (one pass per d, rows
    compared only where the keys are equal); wide ones take one stable sort of the keys
    (a key mixes in its row, see :func:`_keys`).
    """
    first: np.ndarray = np.ones(len(keys), dtype=bool)
    if len(keys) == 0:
        return first
    widest = int(np.bincount(rows).max())
    if widest <= 64:
        for d in range(1, widest):
            same = np.flatnonzero(keys[d:] == keys[:-d])
            same = same[rows[same + d] == rows[same]]
            first[same + d] = False
        return first
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    first[order[1:][ordered[1:] == ordered[:-1]]] = False
    return first


#: Largest (ranked ids + rows) x widest row of judged ids matched position by position
#: (the passes cost ranked ids x widest, the table of judged ids rows x widest); past it
#: :func:`_match` sorts instead.
_MATCH_BY_POSITION_MAX = 64_000_000


def _match(
    ranked: pl.Series,
    ranked_rows: np.ndarray,
    ranked_keys: np.ndarray,
    judged: tuple[pl.Series, np.ndarray, np.ndarray, np.ndarray],
) -> np.ndarray:
    """Per ranked id, the index of the judged id with the same (row, id), -1 for none.

    Judged ids are distinct per row. Candidates are found by key, then confirmed by
    comparing the ids themselves, so a hash collision never makes an id relevant.
    ``judged`` is what :func:`_once` returns.
    """
    judged_ids, judged_rows, judged_keys, _ = judged
    match: np.ndarray = np.full(len(ranked_keys), -1, dtype=np.int64)
    if len(judged_keys) == 0 or len(ranked_keys) == 0:
        return match
    per_row = np.bincount(judged_rows)
    widest = int(per_row.max())
    n_rows = max(len(per_row), int(ranked_rows.max()) + 1)
    if (len(ranked_keys) + n_rows) * widest <= _MATCH_BY_POSITION_MAX:
        _match_by_position(match, ranked_rows, ranked_keys, judged_rows, judged_keys, per_row)
    else:
        _match_by_sorting(match, ranked_keys, judged_keys)
    found = np.flatnonzero(match >= 0)
    same = (ranked.gather(found) == judged_ids.gather(match[found])).fill_null(False).to_numpy()
    match[found[~same]] = -1
    return match


def _match_by_position(
    match: np.ndarray,
    ranked_rows: np.ndarray,
    ranked_keys: np.ndarray,
    judged_rows: np.ndarray,
    judged_keys: np.ndarray,
    per_row: np.ndarray,
) -> None:
    """Fill ``match`` comparing each ranked key with its row's m-th judged key, for each
    m up to the widest row: a few passes over flat arrays when rows judge few ids."""
    order = np.argsort(judged_rows, kind="stable")
    sorted_rows = judged_rows[order]
    position = np.arange(len(order)) - (np.cumsum(per_row) - per_row)[sorted_rows]
    n_rows = max(len(per_row), int(ranked_rows.max()) + 1)
    shape = (int(per_row.max()), n_rows)
    # row m of each table: every row's m-th judged key and its index (-1: none)
    index_at: np.ndarray = np.full(shape, -1, dtype=np.int64)
    index_at[position, sorted_rows] = order
    keys_at: np.ndarray = np.zeros(shape, dtype=np.uint64)
    keys_at[position, sorted_rows] = judged_keys[order]
    for m in range(shape[0]):
        at = np.flatnonzero(np.take(keys_at[m], ranked_rows) == ranked_keys)
        candidate = index_at[m][ranked_rows[at]]
        judged = candidate >= 0
        match[at[judged]] = candidate[judged]


def _match_by_sorting(match: np.ndarray, ranked_keys: np.ndarray, judged_keys: np.ndarray) -> None:
    """Fill ``match`` from one stable sort of both key arrays, which puts each judged key
    just before the ranked keys equal to it."""
    n_judged = len(judged_keys)
    keys = np.concatenate([judged_keys, ranked_keys])
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    is_judged = order < n_judged
    last = np.maximum.accumulate(np.where(is_judged, np.arange(len(order)), -1))
    at = ~is_judged
    before = last[at]
    safe = np.maximum(before, 0)
    equal = (before >= 0) & (ordered[safe] == ordered[at])
    match[order[at][equal] - n_judged] = order[safe][equal]


class RankedIds:
    """A batch's retrieved ids matched once against its judged ids, for every ranking
    metric and every ``k`` (see the module doc for which ids are relevant).

    Built from a frame with columns ``context_ids``, ``relevant_ids`` and ``relevance``
    in one vectorized pass (NumPy and Polars over the flattened ids, no Python per row):
    ids are matched through a 64-bit hash of (row, id), and every match is then
    confirmed by comparing the ids themselves. Two judged sets are matched, each at most
    once: ``relevant_ids`` (nulls dropped) and the ``relevance`` ids graded above 0, each
    id once per row; binary relevance reads the first where a row has it, graded gains
    the second. What depends on ``k`` is computed by :meth:`stats`, once per ``(k,
    graded)`` pair; the object may be shared by threads.
    """

    def __init__(self, frame: pl.DataFrame) -> None:
        self.n = n = frame.height
        ranked, rows, lengths = _flat(frame.get_column(CONTEXT_IDS))
        starts = np.cumsum(lengths) - lengths
        self.rows, self.lengths, self.starts = rows, lengths, starts
        self.rank = np.arange(len(ranked), dtype=np.int64) - starts[rows] + 1
        self.longest = int(lengths.max()) if n else 0
        has_ids = frame.get_column(RELEVANT_IDS).is_not_null().to_numpy()
        has_grades = frame.get_column(RELEVANCE).is_not_null().to_numpy()
        ids, id_rows, _ = _flat(frame.get_column(RELEVANT_IDS))
        listed = _once(ids, id_rows, ids.is_not_null().to_numpy())
        entries, entry_rows, _ = _flat(frame.get_column(RELEVANCE))
        grades = entries.struct.field("grade").to_numpy()
        graded = _once(entries.struct.field("id"), entry_rows, grades > 0)
        listed_rows, graded_rows, graded_gains = listed[1], graded[1], grades[graded[3]]
        keys = _keys(ranked, rows)
        counted = _first_in_row(keys, rows) & ranked.is_not_null().to_numpy()
        in_listed = counted & (_match(ranked, rows, keys, listed) >= 0)
        in_graded = _match(ranked, rows, keys, graded)
        gain_graded = np.where(
            counted & (in_graded >= 0),
            graded_gains[np.maximum(in_graded, 0)] if len(graded_gains) else 0.0,
            0.0,
        )
        n_listed = np.bincount(listed_rows, minlength=n)
        n_graded = np.bincount(graded_rows, minlength=n)
        by_ids = has_ids[rows]
        by_grades = has_grades[rows]
        #: Per ranked id, its gain under binary relevance (1.0 / 0.0) and graded (nDCG).
        self.gain = {
            False: np.where(by_ids, in_listed, gain_graded > 0).astype(np.float64),
            True: np.where(by_grades, gain_graded, in_listed.astype(np.float64)),
        }
        #: Per graded or not, the positions of the relevant ids in the flat ranking.
        self.relevant_at = {key: np.flatnonzero(gain > 0) for key, gain in self.gain.items()}
        #: Per row, the number of relevant ids under each.
        self.relevant = {
            False: np.where(has_ids, n_listed, n_graded),
            True: np.where(has_grades, n_graded, n_listed),
        }
        # The ideal ranking of the graded judgments: judged rows and gains in row order,
        # gains decreasing within a row.
        use_listed = ~has_grades[listed_rows]
        use_graded = has_grades[graded_rows]
        ideal_rows = np.concatenate([listed_rows[use_listed], graded_rows[use_graded]])
        ideal_gains = np.concatenate([np.ones(int(use_listed.sum())), graded_gains[use_graded]])
        order = np.lexsort((-ideal_gains, ideal_rows))
        relevant = self.relevant[True]
        self.ideal_rows = ideal_rows[order]
        self.ideal_at = (
            np.arange(len(order)) - (np.cumsum(relevant) - relevant)[self.ideal_rows] + 1
        )
        self.ideal_weights = ideal_gains[order] / np.log2(self.ideal_at + 1)
        self._stats: dict[tuple[int | None, bool], pl.DataFrame] = {}
        self._lock = threading.Lock()

    def stats(self, k: int | None, graded: bool = False) -> pl.DataFrame:
        """Per row: ``retrieved`` (ids in the ranking, 0 for null), ``relevant`` (number
        of relevant ids), ``hits`` (relevant ids at ranks 1..k, each once), ``first``
        (rank of the first of them, null when none), ``ap_sum`` (sum over those hits of
        precision at their rank), ``dcg`` (sum of gain / log2(rank + 1) over ranks 1..k)
        and, for ``graded``, ``idcg`` (the same for the ideal ranking: the judged gains in
        decreasing order, cut at k; 0.0 otherwise). Counts are Int64 and 0, sums Float64
        and 0.0, where a row has nothing to count. ``k`` None: the whole ranking. Last,
        ``details``: the JSON object of ``retrieved``, ``relevant`` and ``hits`` that
        every ranking metric's cell carries."""
        with self._lock:
            if (k, graded) not in self._stats:
                self._stats[(k, graded)] = self._compute(k, graded)
            return self._stats[(k, graded)]

    def _compute(self, k: int | None, graded: bool) -> pl.DataFrame:
        n = self.n
        at = self.relevant_at[graded]
        if k is not None and k < self.longest:
            at = at[self.rank[at] <= k]
        # the hits alone, in row order: each hit's row, rank and count so far in its row
        rows, rank = self.rows[at], self.rank[at]
        new_row: np.ndarray = np.ones(len(at), dtype=bool)
        new_row[1:] = rows[1:] != rows[:-1]
        count = np.arange(len(at))
        hits_in_row = count - np.maximum.accumulate(np.where(new_row, count, 0)) + 1
        first = np.full(n, np.nan)
        first[rows[new_row]] = rank[new_row]
        idcg = np.zeros(n)
        if graded:
            weights = self.ideal_weights
            if k is not None and len(weights) and k < self.ideal_at.max():
                weights = np.where(self.ideal_at <= k, weights, 0.0)
            idcg = np.bincount(self.ideal_rows, weights=weights, minlength=n)
        stats = pl.DataFrame(
            {
                "retrieved": self.lengths,
                "relevant": self.relevant[graded],
                "hits": np.bincount(rows, minlength=n).astype(np.int64),
                "first": first,
                "ap_sum": np.bincount(rows, weights=hits_in_row / rank, minlength=n),
                "dcg": np.bincount(
                    rows, weights=self.gain[graded][at] / np.log2(rank + 1), minlength=n
                ),
                "idcg": idcg,
            },
            nan_to_null=True,
        )
        return stats.with_columns(
            details=details_json(
                retrieved=pl.col("retrieved"), relevant=pl.col("relevant"), hits=pl.col("hits")
            )
        )


def ranking_stats(frame: pl.DataFrame, k: int | None, graded: bool = False) -> pl.DataFrame:
    """:meth:`RankedIds.stats` of ``frame`` (columns ``context_ids``, ``relevant_ids``,
    ``relevance``), for one metric alone."""
    return RankedIds(frame).stats(k, graded)


@dataclass(frozen=True)
class RankingMatch(Intermediate):
    """The :class:`RankedIds` of a batch, shared by every ranking metric of a stage."""

    columns: ClassVar[tuple[str, ...]] = RANKING

    def compute(self, frame: pl.DataFrame) -> RankedIds:
        """:class:`RankedIds` over ``frame``."""
        return RankedIds(frame)


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

    def intermediates(self) -> tuple[Intermediate, ...]:
        """The ids matched once per batch for every ranking metric (:class:`RankingMatch`)."""
        return (RankingMatch(),)

    def expression(self) -> pl.Expr:
        return frame_cells(guards(self.graded), list(RANKING), self._score_frame)

    def expression_with(self, values: Mapping[Intermediate, Any]) -> pl.Expr:
        """:meth:`expression`, reading the batch's :class:`RankedIds` from ``values``."""
        ranked = values[RankingMatch()]
        assert isinstance(ranked, RankedIds)

        def score_frame(frame: pl.DataFrame) -> pl.DataFrame:
            if frame.height != ranked.n:
                raise RuntimeError(
                    f"{self.id}: the shared ranking intermediate has {ranked.n} rows, "
                    f"the batch {frame.height}"
                )
            return self._cells(ranked.stats(self.k, self.graded))

        return frame_cells(guards(self.graded), list(RANKING), score_frame)

    def _score_frame(self, frame: pl.DataFrame) -> pl.DataFrame:
        return self._cells(ranking_stats(frame, self.k, self.graded))

    def _cells(self, stats: pl.DataFrame) -> pl.DataFrame:
        return stats.select(
            score=self.score(),
            reason=pl.lit(None, pl.String),
            details=pl.col("details"),
        )
