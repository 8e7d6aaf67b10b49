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

The score of a batch comes from compiled loops over the flattened ids, without Python
per row (:mod:`ragbatch.metrics._ranking_kernel`): :class:`RankedIds` matches the
retrieved ids against the judged ones, and its :meth:`RankedIds.stats` gives the per-row
counts and sums at a cutoff. In the expression stage every ranking metric of the batch
reads one shared :class:`RankedIds` (the :class:`RankingMatch` intermediate), whatever
its ``k``; a metric evaluated alone builds its own. The loops are compiled by Numba the
first time a machine runs them (about 5 s on two cores, then cached on disk); each
process that uses them pays about 1 s to start Numba and load them.
"""

from __future__ import annotations

import json
import threading
from abc import abstractmethod
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from collections.abc import Mapping
from types import ModuleType
from typing import Any, ClassVar

import numpy as np
import polars as pl
import pyarrow as pa
from pydantic import Field

from ragbatch.core.columns import CONTEXT_IDS, ISSUES, RANKING, RELEVANCE, RELEVANT_IDS
from ragbatch.core.status import MISSING_INPUT, NOT_APPLICABLE
from ragbatch.scoring.base import ExpressionMetric, Intermediate, StrictParams
from ragbatch.scoring.cells import Guard, frame_cells, missing

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


_NO_RELEVANT = "no id is known relevant"


def guards() -> list[Guard]:
    """The ranking metrics' guards, in order (see the module doc). The last rule, no
    relevant id: ``not_applicable``, is applied with the scores, from the counts of the
    match (:meth:`RankingMetric._cells`)."""
    return [
        missing(CONTEXT_IDS),
        _issue(RELEVANT_IDS),
        _issue(RELEVANCE),
        Guard(
            pl.col(RELEVANT_IDS).is_null() & pl.col(RELEVANCE).is_null(),
            MISSING_INPUT,
            pl.lit("relevant_ids and relevance are null"),
        ),
    ]


@dataclass(frozen=True)
class _Ids:
    """A list column of ids laid out for :mod:`ragbatch.metrics._ranking_kernel`: row
    ``r``'s items are ``starts[r]`` up to ``starts[r + 1]`` (a null list has none); per
    item its 64-bit hash ``keys``, its UTF-8 bytes (``offsets``, ``data``) and whether
    it is non-null (``valid``)."""

    starts: np.ndarray
    keys: np.ndarray
    offsets: np.ndarray
    data: np.ndarray
    valid: np.ndarray

    @classmethod
    def of(cls, values: pl.Series, lengths: np.ndarray) -> _Ids:
        """``values``: the items in row order (String, or ids cast to it), ``lengths``
        the number of items of each row."""
        values = values.cast(pl.String).rechunk()
        starts: np.ndarray = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        text = values.to_arrow(compat_level=pl.CompatLevel.oldest()).cast(pa.large_string())
        buffers = text.buffers()
        offsets = np.frombuffer(buffers[1], dtype=np.int64)[
            text.offset : text.offset + len(text) + 1
        ]
        data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else _NO_BYTES
        return cls(
            starts=starts,
            keys=values.hash(seed=0).to_numpy(),
            offsets=offsets,
            data=data,
            valid=values.is_not_null().to_numpy(),
        )

    def first_copies(self, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:func:`ragbatch.metrics._ranking_kernel.distinct` of the items where ``keep``
        holds: whether each item is its id's first copy in its row, and their number per
        row."""
        first: np.ndarray = np.zeros(len(self.keys), dtype=bool)
        counts: np.ndarray = np.zeros(len(self.starts) - 1, dtype=np.int64)
        by_key = _by_key(self.starts, self.keys)
        _kernel().distinct(
            *_ro(self.starts, self.keys, self.offsets, self.data, keep, by_key), first, counts
        )
        return first, counts

    def match(
        self, counted: np.ndarray, judged: _Ids, first: tuple[np.ndarray, np.ndarray]
    ) -> np.ndarray:
        """Per item where ``counted`` holds, the index of the equal id among the items
        of ``judged`` that are first copies (``first``, as :meth:`first_copies` returns
        it), -1 for none."""
        mask, counts = first
        items = np.flatnonzero(mask)
        starts: np.ndarray = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=starts[1:])
        out: np.ndarray = np.full(len(self.keys), -1, dtype=np.int64)
        keys = judged.keys[items]
        _kernel().match(
            *_ro(self.starts, self.keys, self.offsets, self.data, counted),
            *_ro(starts, items, keys, judged.offsets, judged.data, _by_key(starts, keys)),
            out,
        )
        return out


def _kernel() -> ModuleType:
    """:mod:`ragbatch.metrics._ranking_kernel`, imported on first use: importing Numba
    takes about 0.3 s, which jobs without ranking metrics should not pay."""
    from ragbatch.metrics import _ranking_kernel

    return _ranking_kernel


def _wide(starts: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The items of the rows wider than the kernels' ``NARROW`` (row r's items from
    ``starts[r]`` to ``starts[r + 1]``) and the row of each; None when no row is."""
    widths = np.diff(starts)
    wide = widths > _kernel().NARROW
    if not wide.any():
        return None
    items: np.ndarray = np.flatnonzero(np.repeat(wide, widths))
    rows: np.ndarray = np.repeat(np.flatnonzero(wide), widths[wide])
    return items, rows


def _by_key(starts: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The kernels' ``by_key`` (see :mod:`ragbatch.metrics._ranking_kernel`): within
    each row wider than its ``NARROW``, the row's item indices sorted by key, ties in
    item order; empty when no row is that wide."""
    wide = _wide(starts)
    if wide is None:
        return _NO_ITEMS
    items, rows = wide
    order: np.ndarray = np.arange(len(keys), dtype=np.int64)
    order[items] = items[np.lexsort((keys[items], rows))]
    return order


def _sort_wide_rows_descending(starts: np.ndarray, values: np.ndarray) -> None:
    """Sort, in place, the rows wider than the kernels' ``NARROW`` of a flat array of
    rows (row r from ``starts[r]`` to ``starts[r + 1]``) in decreasing order."""
    wide = _wide(starts)
    if wide is not None:
        items, rows = wide
        values[items] = values[items][np.lexsort((-values[items], rows))]


def _ro(*arrays: np.ndarray) -> list[np.ndarray]:
    """Read-only views of the kernels' input arrays: Numba compiles a function once per
    combination of argument types, and read-only is part of an array's type, so inputs
    always passed read-only (outputs always writable) keep it to one compilation."""
    views = []
    for array in arrays:
        view = np.ascontiguousarray(array).view()
        view.flags.writeable = False
        views.append(view)
    return views


_NO_BYTES: np.ndarray = np.zeros(0, dtype=np.uint8)
_NO_ITEMS: np.ndarray = np.zeros(0, dtype=np.int64)


def _flat(series: pl.Series) -> tuple[pl.Series, np.ndarray]:
    """A list column's items in order (null items kept) and each row's length (0 for a
    null list)."""
    lengths = series.list.len().fill_null(0).cast(pl.Int64).to_numpy()
    return series.explode(empty_as_null=False, keep_nulls=False), lengths


def _log2_table(size: int) -> np.ndarray:
    """``log2(r + 1)`` at index r, for r = 0..size (NumPy's log2, as the formulas of
    docs/metrics.md are written)."""
    return np.log2(np.arange(size + 1, dtype=np.int64) + 1)


#: Batches from this many rows up are matched in two halves at once, when Polars has
#: more than one thread (the compiled loops release the GIL).
SPLIT_ROWS = 20_000


class RankedIds:
    """A batch's retrieved ids matched once against its judged ids, for every ranking
    metric and every ``k`` (see the module doc for which ids are relevant).

    Built from a frame with columns ``context_ids``, ``relevant_ids`` and ``relevance``
    (ids as strings, or cast to them) by the compiled per-row loops of
    :mod:`ragbatch.metrics._ranking_kernel`: ids are compared by a 64-bit hash and then
    by their bytes, so a hash collision never makes an id relevant. Two judged sets are
    matched, each id once per row: ``relevant_ids`` (nulls dropped) and the
    ``relevance`` ids graded above 0; binary relevance reads the first where a row has
    it, graded gains the second. What depends on ``k`` is computed by :meth:`stats`,
    once per ``(k, graded)`` pair; the object may be shared by threads.

    Rows are independent, so a batch of :data:`SPLIT_ROWS` rows or more is matched in
    ``parts`` contiguous row ranges at once on threads (default: two when Polars has
    more than one thread, else one); the results are the same for any ``parts``.
    """

    def __init__(self, frame: pl.DataFrame, parts: int | None = None) -> None:
        self.n = frame.height
        if parts is None:
            parts = 2 if self.n >= SPLIT_ROWS and pl.thread_pool_size() > 1 else 1
        size = -(-self.n // max(parts, 1)) or 1
        slices = [frame.slice(start, size) for start in range(0, self.n, size)] or [frame]
        self._parts = self._each(_RankedPart, slices)
        self._stats: dict[tuple[int | None, bool], pl.DataFrame] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _each(function: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        """``function`` of each item, on threads when there are several."""
        if len(items) == 1:
            return [function(items[0])]
        with ThreadPoolExecutor(len(items), thread_name_prefix="ragbatch-rank") as pool:
            return list(pool.map(function, items))

    def stats(self, k: int | None, graded: bool = False) -> pl.DataFrame:
        """Per row: ``retrieved`` (ids in the ranking, 0 for null), ``relevant`` (number
        of relevant ids), ``hits`` (relevant ids at ranks 1..k, each once), ``first``
        (rank of the first of them, null when none), ``ap_sum`` (sum over those hits of
        precision at their rank), ``dcg`` (sum of gain / log2(rank + 1) over ranks 1..k)
        and, for ``graded``, ``idcg`` (the same for the ideal ranking: the judged gains in
        decreasing order, cut at k; 0.0 otherwise; a row of grades near the float64
        limits has both ``dcg`` and ``idcg`` of its gains divided by one power of two, see
        :func:`_scaled_for_sums`). Counts are Int64 and 0, sums Float64 and 0.0, where a
        row has nothing to count. ``k`` None: the whole ranking. Last,
        ``details``: the JSON object of ``retrieved``, ``relevant`` and ``hits`` that
        every ranking metric's cell carries."""
        with self._lock:
            if (k, graded) not in self._stats:
                frames = self._each(lambda part: part.stats(k, graded), self._parts)
                self._stats[(k, graded)] = pl.concat(frames, rechunk=False)
            return self._stats[(k, graded)]


class _RankedPart:
    """:class:`RankedIds` of one contiguous range of a batch's rows."""

    def __init__(self, frame: pl.DataFrame) -> None:
        self.n = n = frame.height
        values, self.lengths = _flat(frame.get_column(CONTEXT_IDS))
        ranked = _Ids.of(values, self.lengths)
        self.starts = ranked.starts
        has_ids = frame.get_column(RELEVANT_IDS).is_not_null().to_numpy()
        has_grades = frame.get_column(RELEVANCE).is_not_null().to_numpy()
        listed = _Ids.of(*_flat(frame.get_column(RELEVANT_IDS)))
        entries, entry_lengths = _flat(frame.get_column(RELEVANCE))
        graded = _Ids.of(entries.struct.field("id"), entry_lengths)
        grades = entries.struct.field("grade").cast(pl.Float64).to_numpy()
        listed_first = listed.first_copies(listed.valid)
        graded_first = graded.first_copies(graded.valid & (grades > 0))
        n_listed, n_graded = listed_first[1], graded_first[1]
        counted = ranked.first_copies(ranked.valid)[0]
        in_listed = ranked.match(counted, listed, listed_first)
        in_graded = ranked.match(counted, graded, graded_first)
        #: Per row, the number of relevant ids under binary relevance and graded.
        self.relevant = {
            False: np.where(has_ids, n_listed, n_graded),
            True: np.where(has_grades, n_graded, n_listed),
        }
        relevant_graded = self.relevant[True]
        self.ideal_starts: np.ndarray = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(relevant_graded, out=self.ideal_starts[1:])
        self.ideal_gains: np.ndarray = np.ones(int(self.ideal_starts[-1]))
        #: Per ranked id, its gain under binary relevance (1.0 / 0.0) and graded (nDCG).
        self.gain = {False: np.empty(len(counted)), True: np.empty(len(counted))}
        _kernel().gains(
            *_ro(self.starts, in_listed, in_graded, has_ids, has_grades),
            *_ro(graded.starts, graded_first[0], grades),
            self.gain[False],
            self.gain[True],
            *_ro(self.ideal_starts),
            self.ideal_gains,
        )
        _sort_wide_rows_descending(self.ideal_starts, self.ideal_gains)
        self._dcg_gain, self._ideal_dcg_gains = _scaled_for_sums(
            self.starts, self.gain[True], self.ideal_starts, self.ideal_gains
        )
        self.widest_ideal = int(relevant_graded.max()) if n else 0
        self.longest = int(self.lengths.max()) if n else 0
        self._log2 = _log2_table(max(self.longest, self.widest_ideal))
        self._seen_details: list[tuple[np.ndarray, np.ndarray, pl.Series]] = []

    def stats(self, k: int | None, graded: bool) -> pl.DataFrame:
        """:meth:`RankedIds.stats` of this part's rows."""
        cut = max(self.longest, self.widest_ideal) if k is None else k
        n = self.n
        hits, first = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
        ap_sum, dcg, idcg = np.empty(n), np.empty(n), np.zeros(n)
        starts, gain, log2 = _ro(self.starts, self.gain[graded], self._log2)
        _kernel().cut_stats(starts, gain, cut, log2, hits, first, ap_sum, dcg)
        if graded:
            if self._dcg_gain is not self.gain[True]:
                # rows of extreme grades: their DCG from the gains scaled for the sums
                scratch = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64), np.empty(n)
                scaled = _ro(self._dcg_gain)[0]
                _kernel().cut_stats(starts, scaled, cut, log2, *scratch[:2], scratch[2], dcg)
            ideal = _ro(self.ideal_starts, self._ideal_dcg_gains)
            _kernel().ideal_dcg(*ideal, cut, log2, idcg)
        stats = pl.DataFrame(
            {
                "retrieved": self.lengths,
                "relevant": self.relevant[graded],
                "hits": hits,
                "first": np.where(first > 0, first, np.nan),
                "ap_sum": ap_sum,
                "dcg": dcg,
                "idcg": idcg,
            },
            nan_to_null=True,
        )
        return stats.with_columns(details=self._details(self.relevant[graded], hits))

    def _details(self, relevant: np.ndarray, hits: np.ndarray) -> pl.Series:
        """The details JSON per row; reused when another ``(k, graded)`` pair had the
        same counts (binary and graded relevance usually agree on them)."""
        for seen_relevant, seen_hits, details in self._seen_details:
            if np.array_equal(seen_relevant, relevant) and np.array_equal(seen_hits, hits):
                return details
        details = _count_json({"retrieved": self.lengths, "relevant": relevant, "hits": hits})
        self._seen_details.append((relevant, hits, details))
        return details


#: Rows whose largest gain lies beyond 2**±GAIN_EXPONENT_LIMIT have their nDCG sums
#: taken over scaled gains (:func:`_scaled_for_sums`).
GAIN_EXPONENT_LIMIT = 900


def _scaled_for_sums(
    starts: np.ndarray, gain: np.ndarray, ideal_starts: np.ndarray, ideal_gains: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The graded gains (per ranked item, rows from ``starts``) and ideal gains (rows
    from ``ideal_starts``, each row in decreasing order) to sum for DCG and ideal DCG.

    A row whose largest gain is at or above 2**900 or below 2**-901 (grades near the float64
    limits, which ``relevance`` accepts as finite numbers) would overflow its sums to
    infinity (nDCG inf / inf = NaN) or lose its digits to subnormal numbers; its gains
    are divided by the power of two that brings the largest into [0.5, 1). nDCG is a
    ratio of linear sums, so the scale cancels; any other row is left as it is, and
    the arrays themselves are returned when no row needs scaling.
    """
    bound = 2.0**GAIN_EXPONENT_LIMIT
    if not len(ideal_gains) or (ideal_gains.max() < bound and ideal_gains.min() >= 1 / bound):
        return gain, ideal_gains  # every gain in range: no row needs it (the usual case)
    rows = len(ideal_starts) - 1
    widths = np.diff(ideal_starts)
    top = np.ones(rows)
    top[widths > 0] = ideal_gains[ideal_starts[:-1][widths > 0]]
    _, exponents = np.frexp(top)
    extreme = np.abs(exponents) > GAIN_EXPONENT_LIMIT
    if not extreme.any():
        return gain, ideal_gains
    shift = np.where(extreme, -exponents, 0)
    return (
        np.ldexp(gain, np.repeat(shift, np.diff(starts))),
        np.ldexp(ideal_gains, np.repeat(shift, widths)),
    )


def _count_json(counts: dict[str, np.ndarray]) -> pl.Series:
    """The JSON object of named int64 counts per row (String), as Polars'
    ``struct.json_encode`` writes it: ``{"a":1,"b":2}``."""
    names = [json.dumps(name) for name in counts]
    # the text around the numbers: '{"a":', ',"b":', ..., '}'
    texts = [("{" if i == 0 else ",") + name + ":" for i, name in enumerate(names)] + ["}"]
    encoded = [text.encode() for text in texts]
    piece_starts = np.cumsum([0] + [len(e) for e in encoded], dtype=np.int64)
    pieces = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    values = np.ascontiguousarray(np.stack([v.astype(np.int64) for v in counts.values()]))
    offsets: np.ndarray = np.zeros(values.shape[1] + 1, dtype=np.int64)
    _kernel().count_text_sizes(int(piece_starts[-1]), *_ro(values), offsets)
    data: np.ndarray = np.empty(int(offsets[-1]), dtype=np.uint8)
    _kernel().write_count_texts(*_ro(pieces, piece_starts, values, offsets), data)
    text = pa.LargeStringArray.from_buffers(
        len(offsets) - 1, pa.py_buffer(offsets), pa.py_buffer(data)
    )
    return pl.Series(text)


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
        return frame_cells(guards(), list(RANKING), self._score_frame)

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

        return frame_cells(guards(), list(RANKING), score_frame)

    def _score_frame(self, frame: pl.DataFrame) -> pl.DataFrame:
        return self._cells(ranking_stats(frame, self.k, self.graded))

    def _cells(self, stats: pl.DataFrame) -> pl.DataFrame:
        """Score, reason and details per row; ``status`` not_applicable where no id is
        known relevant (the relevant count is 0)."""
        none = pl.col("relevant") == 0
        return stats.select(
            score=self.score(),
            reason=pl.when(none).then(pl.lit(_NO_RELEVANT)).otherwise(pl.lit(None, pl.String)),
            details=pl.col("details"),
            status=pl.when(none).then(pl.lit(NOT_APPLICABLE)).otherwise(pl.lit(None, pl.String)),
        )
