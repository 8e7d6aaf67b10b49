"""Compiled per-row loops of the ranking metrics (Numba, no Python per row).

The ranking metrics match each row's retrieved ids against that row's judged ids. Rows
are short (tens of ids) and independent, so the work is a loop over rows with a small
nested loop inside: in NumPy that takes one pass over the whole batch per judged
position, in compiled code one pass in all. The functions here take flat arrays, the
way Arrow stores a list column:

- ``starts``: int64, ``rows + 1`` entries; row ``r``'s items are ``starts[r]`` up to
  ``starts[r + 1]`` (a null list has no items);
- ``keys``: uint64, one 64-bit hash per item (Polars ``Series.hash``), compared first;
- ``offsets`` (int64, ``items + 1``) and ``data`` (uint8): each item's UTF-8 bytes, so
  that two items are the same id only when their bytes are equal (a hash collision
  never makes an id relevant);
- ``valid``: bool per item, False for a null id (never relevant, never counted);
- ``by_key``: int64 per item, used only for rows of more than :data:`NARROW` items:
  there, ``by_key[starts[r]:starts[r + 1]]`` lists the row's items sorted by key
  (ties in item order), as NumPy sorts them before the call. Narrow rows compare
  pairs; wide ones look within runs of equal keys, so a hostile row of a million ids
  costs a sort, not a million squared comparisons. The array may be empty when no row
  is wide.

Each function fills output arrays its caller allocated (allocating inside compiled code
was slower here), is compiled on first use and cached on disk (``cache=True``), and
releases the GIL, so batches on different threads run at once. Sorting stays in NumPy:
Numba's own sorts took most of the compile time.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: Rows with at most this many items compare every pair; wider ones use ``by_key``.
NARROW = 32


@njit(cache=True, nogil=True, inline="always")
def _same_bytes(offsets_a, data_a, i, offsets_b, data_b, j):
    """True when item ``i`` of a and item ``j`` of b hold the same bytes."""
    start_a, start_b = offsets_a[i], offsets_b[j]
    size = offsets_a[i + 1] - start_a
    if size != offsets_b[j + 1] - start_b:
        return False
    for t in range(size):
        if data_a[start_a + t] != data_b[start_b + t]:
            return False
    return True


@njit(cache=True, nogil=True, inline="always")
def _bit(key):
    """One of 64 bits chosen by a key: a row's keys OR-ed together rule most ids out
    before any comparison (a one-word Bloom filter)."""
    return np.uint64(1) << (key & np.uint64(63))


@njit(cache=True, nogil=True)
def distinct(starts, keys, offsets, data, keep, by_key, first, counts):
    """Which items are the first copy of their id in their row, among the items where
    ``keep`` holds.

    Fills ``first`` (bool per item, all False on entry) and ``counts`` (int64 per row,
    all 0 on entry: the number of first copies). ``by_key``: see the module doc.
    """
    for row in range(len(starts) - 1):
        lo, hi = starts[row], starts[row + 1]
        if hi - lo <= NARROW:
            bits = np.uint64(0)
            for i in range(lo, hi):
                if not keep[i]:
                    continue
                key = keys[i]
                bit = _bit(key)
                seen = False
                if bits & bit:
                    for j in range(lo, i):
                        if (
                            keys[j] == key
                            and keep[j]
                            and _same_bytes(offsets, data, j, offsets, data, i)
                        ):
                            seen = True
                            break
                bits |= bit
                first[i] = not seen
                counts[row] += not seen
            continue
        run = lo
        for t in range(lo, hi):
            i = by_key[t]
            if t > lo and keys[i] != keys[by_key[t - 1]]:
                run = t
            if not keep[i]:
                continue
            seen = False
            for u in range(run, t):
                j = by_key[u]
                if first[j] and _same_bytes(offsets, data, j, offsets, data, i):
                    seen = True
                    break
            first[i] = not seen
            counts[row] += not seen


@njit(cache=True, nogil=True)
def match(
    starts, keys, offsets, data, counted,
    judged_starts, judged, judged_keys, judged_offsets, judged_data, judged_by_key, out,
):  # fmt: skip
    """Set ``out[i]`` (int64 per item of the ranking, -1 on entry), for each item where
    ``counted`` holds, to the index of the judged item of its row with the same bytes.

    The judged ids are given packed, each at most once per row (see :func:`distinct`):
    ``judged`` (int64) their item indices, ``judged_keys`` their keys, row r's from
    ``judged_starts[r]`` to ``judged_starts[r + 1]``; their bytes are read from
    ``judged_offsets`` and ``judged_data`` at those item indices. Rows judging at most
    :data:`NARROW` ids are scanned; wider ones are searched by bisection in
    ``judged_by_key`` (packed positions sorted by key within each wide row, as
    ``by_key`` in the module doc).
    """
    for row in range(len(starts) - 1):
        lo, hi = judged_starts[row], judged_starts[row + 1]
        if hi == lo:
            continue
        wide = hi - lo > NARROW
        for i in range(starts[row], starts[row + 1]):
            if not counted[i]:
                continue
            key = keys[i]
            c = lo
            end = hi
            if wide:
                # the first position of the row's sorted keys whose key is >= key
                left, right = lo, hi
                while left < right:
                    mid = (left + right) // 2
                    if judged_keys[judged_by_key[mid]] < key:
                        left = mid + 1
                    else:
                        right = mid
                c = left
            while c < end:
                at = judged_by_key[c] if wide else c
                if judged_keys[at] == key:
                    j = judged[at]
                    if _same_bytes(offsets, data, i, judged_offsets, judged_data, j):
                        out[i] = j
                        break
                elif wide:
                    break
                c += 1


@njit(cache=True, nogil=True)
def cut_stats(starts, gain, k, log2_of_rank_plus_1, hits, first, ap_sum, dcg):
    """Per row, over the items at ranks 1..k (rank 1 the row's first item) whose ``gain``
    is above 0, fill ``hits`` (int64), ``first`` (int64, rank of the first, 0 when
    none), ``ap_sum`` (float64, sum of hits so far / rank at each) and ``dcg`` (float64,
    sum of gain / log2(rank + 1)); every output array has one entry per row.

    ``log2_of_rank_plus_1[rank]`` holds log2(rank + 1) (computed by NumPy, so that the
    sums equal those of a NumPy formula term for term); sums run in rank order.
    """
    for row in range(len(starts) - 1):
        lo = starts[row]
        hi = min(starts[row + 1], lo + k)
        h = 0
        rank_of_first = 0
        ap = 0.0
        total = 0.0
        for i in range(lo, hi):
            g = gain[i]
            if g > 0:
                rank = i - lo + 1
                h += 1
                if h == 1:
                    rank_of_first = rank
                ap += h / rank
                total += g / log2_of_rank_plus_1[rank]
        hits[row] = h
        first[row] = rank_of_first
        ap_sum[row] = ap
        dcg[row] = total


@njit(cache=True, nogil=True)
def gains(
    starts, in_listed, in_graded, has_ids, has_grades,
    graded_starts, graded_first, grades,
    gain_binary, gain_graded, ideal_starts, ideal_gains,
):  # fmt: skip
    """Per ranked item its gain, and per row its ideal ranking for nDCG (see
    ragbatch.metrics._ranking's module doc for the rules).

    ``in_listed`` / ``in_graded``: per ranked item the matched judged item or -1
    (:func:`match`); ``has_ids`` / ``has_grades``: per row, whether ``relevant_ids`` /
    ``relevance`` is non-null; ``graded_first``, ``grades``: per ``relevance`` entry,
    whether it is its id's first copy graded above 0 (:func:`distinct`), and its grade.

    Fills ``gain_binary`` and ``gain_graded`` (float64 per ranked item: 1.0 / 0.0, and
    the gain for nDCG) and ``ideal_gains`` (float64, 1.0 on entry), where row r's ideal
    gains, from ``ideal_starts[r]`` to ``ideal_starts[r + 1]``, become its grades above
    0 (1.0 per relevant id where the row has no ``relevance``), in decreasing order in
    rows of at most :data:`NARROW` (the caller sorts the wider ones).
    """
    for row in range(len(starts) - 1):
        for i in range(starts[row], starts[row + 1]):
            listed = 1.0 if in_listed[i] >= 0 else 0.0
            grade = grades[in_graded[i]] if in_graded[i] >= 0 else 0.0
            if has_ids[row]:
                gain_binary[i] = listed
            else:
                gain_binary[i] = 1.0 if grade > 0 else 0.0
            gain_graded[i] = grade if has_grades[row] else listed
        if has_grades[row]:
            at = ideal_starts[row]
            for j in range(graded_starts[row], graded_starts[row + 1]):
                if graded_first[j]:
                    ideal_gains[at] = grades[j]
                    at += 1
    sort_narrow_rows_descending(ideal_starts, ideal_gains)


@njit(cache=True, nogil=True)
def sort_narrow_rows_descending(starts, values):
    """Sort each row's ``values[starts[r]:starts[r + 1]]`` in decreasing order, in place,
    for the rows of at most :data:`NARROW` values (insertion sort); wider rows are left
    for NumPy."""
    for row in range(len(starts) - 1):
        lo, hi = starts[row], starts[row + 1]
        if hi - lo > NARROW:
            continue
        for i in range(lo + 1, hi):
            v = values[i]
            at = i
            while at > lo and values[at - 1] < v:
                values[at] = values[at - 1]
                at -= 1
            values[at] = v


@njit(cache=True, nogil=True)
def ideal_dcg(starts, gains, k, log2_of_rank_plus_1, out):
    """Fill ``out`` (float64 per row) with the DCG of each row's gains cut at k:
    ``gains[starts[r]:starts[r + 1]]`` are row r's gains, already in decreasing order
    (:func:`sort_narrow_rows_descending` and the caller)."""
    for row in range(len(starts) - 1):
        lo, hi = starts[row], starts[row + 1]
        total = 0.0
        for i in range(lo, min(hi, lo + k)):
            total += gains[i] / log2_of_rank_plus_1[i - lo + 1]
        out[row] = total


@njit(cache=True, nogil=True, inline="always")
def _digits(v):
    """The number of decimal digits of ``v`` >= 0."""
    digits = 1
    while v >= 10:
        v //= 10
        digits += 1
    return digits


@njit(cache=True, nogil=True)
def count_text_sizes(fixed, values, offsets):
    """Fill ``offsets`` (int64, rows + 1, 0 on entry) with the Arrow string offsets of
    :func:`write_count_texts`'s texts: ``fixed`` bytes of text pieces per row, plus
    each of ``values[f, r]`` (int64, shape (fields, rows)) in decimal."""
    fields, n = values.shape
    for r in range(n):
        size = fixed
        for f in range(fields):
            v = values[f, r]
            size += (v < 0) + _digits(abs(v))
        offsets[r + 1] = offsets[r] + size


@njit(cache=True, nogil=True)
def write_count_texts(pieces, piece_starts, values, offsets, data):
    """Write into ``data`` (uint8, ``offsets[-1]`` bytes) per row ``r`` the UTF-8 text
    ``piece 0, values[0, r], piece 1, ..., values[fields - 1, r], last piece``, at
    ``offsets[r]`` (:func:`count_text_sizes`): a JSON object of counts without a string
    formatter per row. ``pieces`` (uint8) holds the pieces end to end, piece p from
    ``piece_starts[p]`` to ``piece_starts[p + 1]``, one more piece than fields."""
    fields, n = values.shape
    for r in range(n):
        at = offsets[r]
        for f in range(fields + 1):
            for t in range(piece_starts[f], piece_starts[f + 1]):
                data[at] = pieces[t]
                at += 1
            if f == fields:
                break
            v = values[f, r]
            if v < 0:
                data[at] = 45  # "-"
                at += 1
                v = -v
            digits = _digits(v)
            for d in range(digits - 1, -1, -1):
                data[at + d] = 48 + v % 10
                v //= 10
            at += digits
