"""Pair the rows of two runs: by ``row_id``, then by a hash of their content.

Two runs of the same traces give each input row the same ``row_id``, and those rows pair
directly. When ids differ (the traces were exported again under another file name, the
rows were reordered, an id column changed), the rows left over on both sides are paired
by a *content key*: the SHA-256 of the JSON array of their ``match_on`` values (by
default ``question``, ``contexts`` and ``reference``: what an answer is judged against,
not the answer itself, which is what a candidate changes). Values are compared exactly:
no case folding, whitespace trimming or Unicode normalization, and a null differs from an
empty string.

A content key that occurs more than once on either side cannot say which row is which,
so those rows stay unpaired and are reported as *ambiguous*; nothing is paired by
position or guesswork. Rows still unpaired are *only in the baseline* or *only in the
candidate*.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import polars as pl

from ragbatch.core import columns as C
from ragbatch.analysis.inputs import INPUT_COLUMNS, load_inputs
from ragbatch.analysis.runs import CommittedRun
from ragbatch.core.errors import InputError

#: Columns whose values form the content key unless told otherwise.
DEFAULT_MATCH_ON: tuple[str, ...] = (C.QUESTION, C.CONTEXTS, C.REFERENCE)

BY_ROW_ID = "row_id"
BY_CONTENT = "content"

_PAIR_SCHEMA = {
    "baseline_row_id": pl.String,
    "candidate_row_id": pl.String,
    "matched_by": pl.String,
}


@dataclass
class Pairing:
    """How the rows of a baseline and a candidate run correspond.

    Attributes
    ----------
    pairs : polars.DataFrame
        ``baseline_row_id: str``, ``candidate_row_id: str``, ``matched_by: str``
        (``"row_id"`` or ``"content"``); each row id appears at most once per side.
    only_baseline, only_candidate : list of str
        Row ids with no partner, sorted.
    ambiguous_baseline, ambiguous_candidate : list of str
        Row ids left unpaired because their content key occurs more than once on at
        least one side (a subset of the ``only_*`` lists), sorted.
    match_on : tuple of str
        Columns of the content key.
    note : str or None
        Why content pairing could not run (inputs unavailable), else None.
    """

    pairs: pl.DataFrame
    only_baseline: list[str] = field(default_factory=list)
    only_candidate: list[str] = field(default_factory=list)
    ambiguous_baseline: list[str] = field(default_factory=list)
    ambiguous_candidate: list[str] = field(default_factory=list)
    match_on: tuple[str, ...] = DEFAULT_MATCH_ON
    note: str | None = None

    def counts(self) -> dict[str, int]:
        """``{"row_id": n, "content": n, "only_baseline": n, "only_candidate": n,
        "ambiguous_baseline": n, "ambiguous_candidate": n}``."""
        by = dict(self.pairs.group_by("matched_by").len().iter_rows())
        return {
            BY_ROW_ID: int(by.get(BY_ROW_ID, 0)),
            BY_CONTENT: int(by.get(BY_CONTENT, 0)),
            "only_baseline": len(self.only_baseline),
            "only_candidate": len(self.only_candidate),
            "ambiguous_baseline": len(self.ambiguous_baseline),
            "ambiguous_candidate": len(self.ambiguous_candidate),
        }


def pair_by_row_id(
    baseline_ids: Sequence[str], candidate_ids: Sequence[str]
) -> tuple[pl.DataFrame, list[str], list[str]]:
    """Pair equal row ids.

    Returns
    -------
    (pairs, baseline_left, candidate_left)
        ``pairs`` as in :attr:`Pairing.pairs` with ``matched_by == "row_id"``, sorted by
        row id; the ids of each side without an equal id on the other, sorted.
    """
    base, cand = set(baseline_ids), set(candidate_ids)
    common = sorted(base & cand)
    pairs = pl.DataFrame(
        {
            "baseline_row_id": common,
            "candidate_row_id": common,
            "matched_by": [BY_ROW_ID] * len(common),
        },
        schema=_PAIR_SCHEMA,
    )
    return pairs, sorted(base - cand), sorted(cand - base)


def content_keys(rows: pl.DataFrame, match_on: Sequence[str]) -> pl.DataFrame:
    """SHA-256 (hex) of each row's ``match_on`` values.

    Parameters
    ----------
    rows : polars.DataFrame
        ``row_id`` plus every column of ``match_on`` (strings, lists of strings, or any
        JSON-serializable type; other values are written with ``str``).

    Returns
    -------
    polars.DataFrame
        ``row_id: str``, ``key: str`` (64 hex digits), in ``rows``' order. The key hashes
        ``json.dumps([v1, v2, ...], ensure_ascii=False)`` of the values in ``match_on``
        order, so a null and an empty string, or ``["a", "b"]`` and ``["ab"]``, differ.

    Raises
    ------
    InputError
        A ``match_on`` column is missing from ``rows``.
    """
    missing = [c for c in match_on if c not in rows.columns]
    if missing:
        raise InputError(
            f"--match-on: column(s) {missing} are not in the rows; available: "
            f"{sorted(c for c in rows.columns if c != C.ROW_ID)}"
        )
    keys = []
    for values in rows.select(list(match_on)).iter_rows():
        blob = json.dumps(list(values), ensure_ascii=False, default=str)
        keys.append(hashlib.sha256(blob.encode("utf-8")).hexdigest())
    return pl.DataFrame(
        {"row_id": rows[C.ROW_ID].cast(pl.String), "key": keys},
        schema={"row_id": pl.String, "key": pl.String},
    )


def pair_by_content(
    baseline: pl.DataFrame, candidate: pl.DataFrame, match_on: Sequence[str]
) -> tuple[pl.DataFrame, list[str], list[str]]:
    """Pair rows whose content keys are equal and unique on both sides.

    Parameters
    ----------
    baseline, candidate : polars.DataFrame
        ``row_id`` plus the ``match_on`` columns of the rows still unpaired.

    Returns
    -------
    (pairs, ambiguous_baseline, ambiguous_candidate)
        ``pairs`` with ``matched_by == "content"``, sorted by baseline row id; the row ids
        whose key occurs on both sides but more than once on at least one, sorted.
    """
    b = content_keys(baseline, match_on)
    c = content_keys(candidate, match_on)
    b_count = b.group_by("key").len("n_b")
    c_count = c.group_by("key").len("n_c")
    counts = b_count.join(c_count, on="key", how="inner")
    unique = counts.filter((pl.col("n_b") == 1) & (pl.col("n_c") == 1)).select("key")
    clash = counts.filter((pl.col("n_b") > 1) | (pl.col("n_c") > 1)).select("key")
    pairs = (
        b.join(unique, on="key")
        .join(c, on="key", suffix="_c")
        .select(
            pl.col("row_id").alias("baseline_row_id"),
            pl.col("row_id_c").alias("candidate_row_id"),
            pl.lit(BY_CONTENT).alias("matched_by"),
        )
        .sort("baseline_row_id")
    )
    amb_b = sorted(b.join(clash, on="key")["row_id"].to_list())
    amb_c = sorted(c.join(clash, on="key")["row_id"].to_list())
    return pairs.cast(_PAIR_SCHEMA), amb_b, amb_c


def check_match_on(match_on: Sequence[str], *runs: CommittedRun) -> None:
    """Check that every ``match_on`` column is a canonical input column or a slice column
    of every run.

    Raises
    ------
    InputError
        A column is neither; the message lists what can be used.
    """
    for name in match_on:
        for run in runs:
            if name not in INPUT_COLUMNS and name not in run.slice_columns:
                raise InputError(
                    f"--match-on {name!r}: not an input column of run {run.run_id}; use "
                    f"{', '.join(c for c in INPUT_COLUMNS if c != C.ROW_ID)} or one of its "
                    f"slice columns ({', '.join(run.slice_columns) or 'none'})"
                )
    if not match_on:
        raise InputError("--match-on needs at least one column")


def _content_rows(
    run: CommittedRun, scores: pl.DataFrame, ids: list[str], match_on: Sequence[str]
) -> tuple[pl.DataFrame | None, str | None]:
    """``row_id`` plus the ``match_on`` columns for ``ids``: canonical columns read again
    from the input, slice columns from the scores table."""
    frame = pl.DataFrame({C.ROW_ID: ids}, schema={C.ROW_ID: pl.String})
    canonical = [c for c in match_on if c in INPUT_COLUMNS and c != C.ROW_ID]
    if canonical:
        inputs = load_inputs(run, ids)
        if inputs.rows is None:
            return None, inputs.note
        frame = frame.join(inputs.rows.select(C.ROW_ID, *canonical), on=C.ROW_ID, how="left")
    slices = [c for c in match_on if c not in INPUT_COLUMNS]
    if slices:
        values = (
            scores.filter(pl.col(C.ROW_ID).is_in(ids))
            .group_by(C.ROW_ID)
            .agg(pl.col(s).first() for s in slices)
        )
        frame = frame.join(values, on=C.ROW_ID, how="left")
    return frame, None


def pair_runs(
    baseline: CommittedRun,
    candidate: CommittedRun,
    baseline_scores: pl.DataFrame,
    candidate_scores: pl.DataFrame,
    match_on: Sequence[str] = DEFAULT_MATCH_ON,
) -> Pairing:
    """Pair the rows of two committed runs: equal row ids first, then content keys for the
    rows left over on both sides (see the module notes).

    Parameters
    ----------
    baseline, candidate : CommittedRun
    baseline_scores, candidate_scores : polars.DataFrame
        The runs' scores tables (:func:`ragbatch.analysis.runs.load_scores`); at least
        ``row_id`` and any slice column named in ``match_on``.
    match_on : sequence of str
        Content-key columns: canonical input columns (read again from each run's input
        with :func:`ragbatch.analysis.inputs.load_inputs`, only when rows are left over
        on both sides) and/or slice columns.

    Returns
    -------
    Pairing
        With ``note`` set when content pairing was needed but a run's input could not be
        read (those rows are then reported as only in one run).

    Raises
    ------
    InputError
        A ``match_on`` column is unknown (:func:`check_match_on`).
    """
    match_on = tuple(match_on)
    check_match_on(match_on, baseline, candidate)
    pairs, b_left, c_left = pair_by_row_id(
        baseline_scores[C.ROW_ID].unique().to_list(), candidate_scores[C.ROW_ID].unique().to_list()
    )
    if not (b_left and c_left):
        return Pairing(pairs, b_left, c_left, match_on=match_on)
    b_rows, b_note = _content_rows(baseline, baseline_scores, b_left, match_on)
    c_rows, c_note = _content_rows(candidate, candidate_scores, c_left, match_on)
    if b_rows is None or c_rows is None:
        note = f"rows with different ids were not paired by content: {b_note or c_note}"
        return Pairing(pairs, b_left, c_left, match_on=match_on, note=note)
    by_content, amb_b, amb_c = pair_by_content(b_rows, c_rows, match_on)
    paired_b = set(by_content["baseline_row_id"].to_list())
    paired_c = set(by_content["candidate_row_id"].to_list())
    return Pairing(
        pl.concat([pairs, by_content]),
        [r for r in b_left if r not in paired_b],
        [r for r in c_left if r not in paired_c],
        amb_b,
        amb_c,
        match_on,
    )
