"""The ranking metrics' compiled match under hostile and unusual batches.

Every expected value comes from :func:`_reference`, a plain-Python reading of the rules
in ragbatch.metrics._ranking's module doc (one row at a time, Python sets and dicts, no
hashing of our own), or is worked out by hand beside the assertion. The batches attack
what the compiled loops assume: Arrow buffers of slices and of several chunks, the row
ranges matched on threads, ids that share hashes' neighbours (prefixes, a last byte, NUL
bytes, long ids stored outside Polars' 12-byte views), wide rows, and counts of many
digits in the details JSON.
"""

from __future__ import annotations

import json
import math
import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from ragbatch.config.job import InputSection
from ragbatch.core.columns import RANKING, RANKING_SCHEMA, cell_column
from ragbatch.scoring.registry import get_metric
from ragbatch.io import ReadTask, normalize
from ragbatch.metrics import _ranking
from ragbatch.metrics._ranking import RankedIds
from support.metric_frames import canonical_frame, run_metric

NAMES = ("hit_rate", "precision_at_k", "recall_at_k", "mrr", "ndcg_at_k", "average_precision")
STATS = ("retrieved", "relevant", "hits", "first", "ap_sum", "dcg", "idcg", "details")

#: Ids that differ little: lengths around Polars' 12 inlined bytes, prefixes of one
#: another, a different last byte, NUL bytes, the empty id, non-ASCII text (composed and
#: decomposed é, CJK, emoji with joiners), integers as normalize writes them.
HOSTILE = [
    "a" * 12,
    "a" * 13,
    "a" * 14,
    "abcdefghijklmnop1",
    "abcdefghijklmnop2",
    "abcdefghijklmnop",
    "",
    "\x00",
    "\x00\x00",
    "x\x00y",
    "x\x00z",
    "x\x00",
    "x",
    "文書",
    "文書2",
    "😀",
    "🏳️‍🌈",
    "🏳️",
    "e\u0301",
    "\u00e9",
    "\u0301",
    "7",
    "07",
    "-7",
    "9223372036854775807",
    "18446744073709551615",
]


def _reference(row: dict[str, Any], k: int | None, graded: bool) -> dict[str, Any]:
    """The stats of one row by the module doc's rules, in plain Python."""
    ranking = row.get("context_ids") or []
    listed, entries = row.get("relevant_ids"), row.get("relevance")
    grades: dict[str, float] = {}
    for entry in entries or []:
        if entry["grade"] > 0 and entry["id"] not in grades:
            grades[entry["id"]] = entry["grade"]
    ids = {i: 1.0 for i in listed if i is not None} if listed is not None else None
    if graded:
        gains = grades if entries is not None else (ids or {})
    else:
        gains = ids if ids is not None else {i: 1.0 for i in grades}
    seen: set[str] = set()
    hits, first, ap_sum, dcg = 0, None, 0.0, 0.0
    for rank, doc in enumerate(ranking[:k] if k is not None else ranking, start=1):
        if doc is None or doc in seen:
            continue
        seen.add(doc)
        if gains.get(doc, 0.0) > 0:
            hits += 1
            first = first or rank
            ap_sum += hits / rank
            dcg += gains[doc] / math.log2(rank + 1)
    ideal = sorted(gains.values(), reverse=True)[:k] if graded else []
    counts = {"retrieved": len(ranking), "relevant": len(gains), "hits": hits}
    return {
        **counts,
        "first": first,
        "ap_sum": ap_sum,
        "dcg": dcg,
        "idcg": sum(g / math.log2(r + 1) for r, g in enumerate(ideal, start=1)),
        "details": json.dumps(counts, separators=(",", ":")),
    }


def _reference_cell(name: str, row: dict[str, Any], k: int | None) -> tuple:
    """(status, score, details) of metric ``name`` on one row, from :func:`_reference`."""
    if row.get("context_ids") is None or (
        row.get("relevant_ids") is None and row.get("relevance") is None
    ):
        return ("missing_input", None, None)
    s = _reference(row, k, graded=name == "ndcg_at_k")
    if s["relevant"] == 0:
        return ("not_applicable", None, None)
    score = {
        "hit_rate": lambda: float(s["hits"] > 0),
        "precision_at_k": lambda: (
            s["hits"] / k if k else (s["hits"] / s["retrieved"] if s["retrieved"] else 0.0)
        ),
        "recall_at_k": lambda: s["hits"] / s["relevant"],
        "mrr": lambda: 1 / s["first"] if s["first"] else 0.0,
        "ndcg_at_k": lambda: s["dcg"] / s["idcg"],
        "average_precision": lambda: s["ap_sum"] / s["relevant"],
    }[name]()
    return ("ok", score, s["details"])


def _close(got: Any, want: Any) -> bool:
    if isinstance(want, float) and got is not None:
        return math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-300)
    return bool(got == want)


def _assert_stats(ranked: RankedIds, rows: list[dict], ks=(None, 1, 3, 40)) -> None:
    for k in ks:
        for graded in (False, True):
            got = ranked.stats(k, graded).to_dicts()
            assert len(got) == len(rows)
            for i, (cells, row) in enumerate(zip(got, rows)):
                want = _reference(row, k, graded)
                names = STATS
                if graded and _extreme(row):
                    # both sums of such a row are scaled by one power of two: their ratio
                    names = tuple(s for s in STATS if s not in ("dcg", "idcg"))
                    assert _close(cells["dcg"] / cells["idcg"], want["dcg"] / want["idcg"])
                for name in names:
                    assert _close(cells[name], want[name]), (k, graded, i, name, row)


def _extreme(row: dict) -> bool:
    """Whether a row has a grade beyond the range where nDCG's sums are kept unscaled."""
    grades = [e["grade"] for e in row.get("relevance") or [] if e["grade"] > 0]
    return bool(grades) and abs(math.frexp(max(grades))[1]) > _ranking.GAIN_EXPONENT_LIMIT


def _table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist([{c: r.get(c) for c in RANKING} for r in rows], RANKING_SCHEMA)


def _frame(rows: list[dict]) -> pl.DataFrame:
    frame = pl.from_arrow(_table(rows))
    assert isinstance(frame, pl.DataFrame)
    return frame


def _rows(n: int, seed: int, wide: bool = False) -> list[dict]:
    """Seeded rows of every kind: relevant_ids only, relevance only, both, neither;
    null and empty lists, null ids, repeats, grades at or below 0, hostile ids."""
    rng = random.Random(seed)
    pool = HOSTILE + [f"d{i}" for i in range(50 if wide else 8)]
    out = []
    for _ in range(n):
        kind = rng.randrange(6)
        width = rng.choice([0, 1, 33, 64, 90]) if wide else rng.randrange(12)
        row: dict = {"context_ids": [rng.choice(pool + [None]) for _ in range(width)]}
        if kind == 5:
            row["context_ids"] = None
        size = (lambda: rng.choice([0, 2, 40])) if wide else (lambda: rng.randrange(5))
        if kind in (0, 2, 5):
            row["relevant_ids"] = [rng.choice(pool + [None]) for _ in range(size())]
        if kind in (1, 2):
            row["relevance"] = [
                {"id": rng.choice(pool), "grade": rng.choice([-2.0, 0.0, 0.25, 1.0, 3.0, 1e6])}
                for _ in range(size())
            ]
        if rng.random() < 0.1:
            row[rng.choice(["relevant_ids", "relevance"])] = None
        out.append(row)
    return out


def test_hostile_ids_are_told_apart_by_every_byte():
    rows = [
        # ranks: a*13 (1), a*12 (2), a*14 (3, relevant), "" (4, relevant), x\0y (5),
        # x\0z (6, relevant), x (7), e+combining (8, relevant), é (9)
        {
            "context_ids": ["a" * 13, "a" * 12, "a" * 14, "", "x\x00y", "x\x00z", "x"]
            + ["e\u0301", "\u00e9"],
            "relevant_ids": ["a" * 14, "", "x\x00z", "e\u0301", "abcdefghijklmnop"],
        },
        # the empty id is an id; a null one takes a rank and is never relevant
        {"context_ids": [None, "", ""], "relevant_ids": ["", None]},
        # ids 17 bytes long that differ in their last byte
        {"context_ids": ["abcdefghijklmnop1", "abcdefghijklmnop2"], "relevant_ids": HOSTILE[4:5]},
        {"context_ids": ["\x00", "\x00\x00"], "relevant_ids": ["\x00\x00", "x\x00"]},
        {"context_ids": ["🏳️", "🏳️‍🌈", "文書"], "relevant_ids": ["🏳️‍🌈", "文"]},
    ]
    want = {
        "recall_at_k": [4 / 5, 1.0, 1.0, 1 / 2, 1 / 2],
        "mrr": [1 / 3, 1 / 2, 1 / 2, 1 / 2, 1 / 2],
        "precision_at_k": [4 / 9, 1 / 3, 1 / 2, 1 / 2, 1 / 3],
        "average_precision": [(1 / 3 + 2 / 4 + 3 / 6 + 4 / 8) / 5, 1 / 2, 1 / 2, 1 / 4, 1 / 4],
    }
    for name, scores in want.items():
        cells = run_metric(get_metric(name).from_params({}), rows)
        assert [c["score"] for c in cells] == pytest.approx(scores), name
        assert [c["status"] for c in cells] == ["ok"] * len(rows)
    for parts in (1, 2, 3):
        _assert_stats(RankedIds(_frame(rows), parts=parts), rows)


def test_slices_chunks_and_row_ranges_match_as_the_whole_batch():
    # a batch sliced from a larger table (non-zero offsets in every buffer, as Ray Data
    # hands out), a batch of several chunks, and the row ranges matched on threads
    rows = _rows(240, seed=1) + _rows(24, seed=2, wide=True)
    random.Random(3).shuffle(rows)
    table = _table(rows)
    whole = _frame(rows)
    batches = [(whole, rows)]
    for start, stop in ((1, 120), (97, 264), (200, 201)):
        sliced = pl.from_arrow(table.slice(start, stop - start))
        batches += [
            (sliced, rows[start:stop]),
            (whole.slice(start, stop - start), rows[start:stop]),
        ]
    chunked = pl.from_arrow(pa.Table.from_batches(table.slice(5).to_batches(37)), rechunk=False)
    assert isinstance(chunked, pl.DataFrame) and chunked.n_chunks("all") != [1, 1, 1]
    batches.append((chunked, rows[5:]))
    for frame, want in batches:
        for parts in (1, 2, 3):
            _assert_stats(RankedIds(frame, parts=parts), want)  # type: ignore[arg-type]


def test_batches_at_the_split_threshold_give_the_same_frames_for_any_parts():
    base = _rows(400, seed=4) + _rows(8, seed=5, wide=True)
    split = _ranking.SPLIT_ROWS
    for n in (split - 1, split, split + 1):
        rows = (base * (n // len(base) + 1))[:n]
        frame = _frame(rows)
        one, default, three = (RankedIds(frame, parts=p) for p in (1, None, 3))
        assert len(one._parts) == 1 and len(three._parts) == 3
        for k in (None, 2):
            for graded in (False, True):
                want = one.stats(k, graded)
                assert_frame_equal(default.stats(k, graded), want)
                assert_frame_equal(three.stats(k, graded), want)
        # the rows on either side of each range's edge, against the reference
        for edge in ((n + 1) // 2, -(-n // 3), 2 * -(-n // 3)):
            near = list(range(edge - 3, edge + 3))
            got = three.stats(None, True)[near].to_dicts()
            for i, cells in zip(near, got):
                want_row = _reference(rows[i], None, True)
                assert all(_close(cells[s], want_row[s]) for s in STATS), (n, i)


def test_the_expression_stage_on_a_sliced_batch_of_chunks_matches_the_reference():
    from udfs.expressions import expression_stage

    rows = _rows(150, seed=6) + _rows(12, seed=7, wide=True)
    table = canonical_frame(rows).to_arrow()
    metrics = [
        get_metric(name).from_params({"k": k} if k else {}, metric_id=f"{name}_{k}")
        for name in NAMES
        for k in (None, 1, 100_000)
    ]
    batch = pa.Table.from_batches(table.slice(11, 140).to_batches(max_chunksize=45))
    out = expression_stage(batch, metrics)
    for metric in metrics:
        cells = out.column(cell_column(metric.id)).combine_chunks()
        got = zip(*(pc.struct_field(cells, f).to_pylist() for f in ("status", "score", "details")))
        for i, (cell, row) in enumerate(zip(got, rows[11:151])):
            want = _reference_cell(metric.name, row, metric.k)
            assert cell[0] == want[0] and cell[2] == want[2], (metric.id, i)
            assert _close(cell[1], want[1]), (metric.id, i)


@pytest.mark.parametrize("k", [1, 3, 1_000, None])
def test_wide_rows_with_repeats_in_the_ranking_and_the_judged_set(k):
    rng = random.Random(8)
    rows = []
    for width in (33, 64, 1000):
        pool = HOSTILE + [f"{'q' * rng.randrange(20)}{i}" for i in range(width // 3)]
        for kind in range(3):
            row: dict = {"context_ids": [rng.choice(pool + [None]) for _ in range(width)]}
            if kind != 1:
                row["relevant_ids"] = [rng.choice(pool + [None]) for _ in range(width)]
            if kind != 0:
                row["relevance"] = [
                    {"id": rng.choice(pool), "grade": rng.choice([-1.0, 0.0, 1.0, 2.5])}
                    for _ in range(width)
                ]
            rows.append(row)
    rows.append({"context_ids": ["same"] * 1000, "relevant_ids": ["same"] * 1000})
    rows.append({"context_ids": [None] * 1000, "relevant_ids": [None] * 50 + ["x"]})
    _assert_stats(RankedIds(_frame(rows)), rows, ks=(k,))
    # by hand: "same" 1000 times is one relevant id, at rank 1
    assert [c["score"] for c in run_metric(get_metric("mrr").from_params({}), rows[-2:])] == [
        1.0,
        0.0,
    ]


def test_the_details_of_large_counts_are_the_json_of_the_counts():
    edges = [0, 1, 9, 10, 11, 99, 100, 101, 999, 1_000, 999_999, 10**6, 10**6 + 1, 2**31]
    edges += [2**53 + 1, 2**63 - 1]
    counts = {
        "retrieved": np.array(edges, dtype=np.int64),
        "relevant": np.array(edges[::-1], dtype=np.int64),
        "hits": np.array(edges[5:] + edges[:5], dtype=np.int64),
    }
    want = [
        json.dumps({name: int(values[i]) for name, values in counts.items()}, separators=(",", ":"))
        for i in range(len(edges))
    ]
    assert _ranking._count_json(counts).to_list() == want
    empty = {name: np.zeros(0, dtype=np.int64) for name in counts}
    assert _ranking._count_json(empty).to_list() == []
    # through the metric: 100 retrieved, 10 relevant of which 9 at ranks 1..9, and so on
    rows = [
        {"context_ids": [f"d{i}" for i in range(n)], "relevant_ids": [f"d{i}" for i in hit]}
        for n, hit in ((100, range(-1, 9)), (99, range(10)), (10, range(9, 109)), (9, []))
    ]
    cells = run_metric(get_metric("recall_at_k").from_params({}), rows)
    assert [c["details"] for c in cells[:3]] == [
        '{"retrieved":100,"relevant":10,"hits":9}',
        '{"retrieved":99,"relevant":10,"hits":10}',
        '{"retrieved":10,"relevant":100,"hits":1}',
    ]
    assert cells[3]["status"] == "not_applicable" and cells[3]["details"] is None


def test_one_match_serves_several_threads_asking_for_different_cutoffs():
    rows = _rows(600, seed=9) + _rows(20, seed=10, wide=True)
    frame = _frame(rows)
    pairs = [(k, graded) for k in (None, 1, 2, 3, 10, 40) for graded in (False, True)]
    alone = {pair: RankedIds(frame, parts=1).stats(*pair) for pair in pairs}
    for trial in range(3):
        shared = RankedIds(frame, parts=2)
        asked = pairs * 3
        random.Random(trial).shuffle(asked)
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda pair: shared.stats(*pair), asked))
        for pair, stats in zip(asked, got):
            assert_frame_equal(stats, alone[pair])


def _normalize(**columns: pa.Array) -> pa.Table:
    raw = pa.table({f"in_{name}": values for name, values in columns.items()})
    mapping = {name: f"in_{name}" for name in columns}
    task = ReadTask("/data/f.csv", "f.csv", "csv")
    return normalize(raw, InputSection(uri="unused", columns=mapping), task)


def test_integer_ids_match_the_same_ids_written_as_text():
    big = 2**63 - 1
    out = _normalize(
        context_ids=pa.array([[1, -2, big, 0], [7, 7, 70]], pa.list_(pa.int64())),
        relevant_ids=pa.array(['["9223372036854775807", -2, "x"]', None]),
        relevance=pa.array([None, [(7, 1.0), (70, 0.0)]], pa.map_(pa.int32(), pa.float64())),
    )
    rows = pl.from_arrow(out).select(RANKING).to_dicts()  # type: ignore[union-attr]
    assert rows[0]["context_ids"] == ["1", "-2", str(big), "0"]
    # row 0: ranks 2 and 3 relevant of 3; row 1: "7" at rank 1 (its copy never counts)
    ap = get_metric("average_precision").from_params({})
    assert [c["score"] for c in run_metric(ap, rows)] == pytest.approx([(1 / 2 + 2 / 3) / 3, 1])
    precision = get_metric("precision_at_k").from_params({"k": 3})
    assert [c["score"] for c in run_metric(precision, rows)] == pytest.approx([2 / 3, 1 / 3])


def test_grades_near_the_float_limits_give_a_finite_ndcg():
    # normalize accepts any finite grade; sums of two grades near 1.8e308 overflow to
    # infinity (nDCG inf / inf = NaN) and gains near 5e-324 round to subnormal steps
    out = _normalize(
        context_ids=pa.array(['["c", "b", "a"]', '["b", "a"]', '["x", "a"]', '["t", "h"]']),
        relevance=pa.array(
            [
                '{"a": 1.7976931348623157e308, "b": 1.7976931348623157e308, '
                '"c": 1.7976931348623157e308}',
                '{"a": 1.5e308, "b": 1e308}',
                '{"a": 5e-324, "b": 5e-324}',
                '{"h": 1e308, "t": 5e-324}',
            ]
        ),
    )
    rows = pl.from_arrow(out).select(RANKING).to_dicts()  # type: ignore[union-attr]
    assert rows[0]["relevance"][0]["grade"] == 1.7976931348623157e308
    cells = run_metric(get_metric("ndcg_at_k").from_params({}), rows)
    third = 1 / math.log2(3)
    # by hand, each row's grades divided by its largest (the ratio does not change):
    # [b, a] of a 1.5, b 1: (1 + 1.5/log2 3) / (1.5 + 1/log2 3); [x, a] of two equal
    # grades: (1/log2 3) / (1 + 1/log2 3); [t, h], t next to nothing: (1/log2 3) / 1
    want = [1.0, (1 + 1.5 * third) / (1.5 + third), third / (1 + third), third]
    assert [c["score"] for c in cells] == pytest.approx(want, rel=1e-12)
    assert [c["status"] for c in cells] == ["ok"] * 4
    # the tiny grade still counts as a hit
    assert json.loads(cells[3]["details"]) == {"retrieved": 2, "relevant": 2, "hits": 2}
    # grades in the usual range take the sums as they are: bit for bit the same values
    plain = {"context_ids": ["x", "a"], "relevance": [{"id": "a", "grade": 3.0}]}
    stats = RankedIds(_frame([plain])).stats(None, True)
    assert stats["dcg"].to_list() == [3.0 / np.log2(3)] and stats["idcg"].to_list() == [3.0]


_ID = st.sampled_from(HOSTILE + ["d1", "d2"]) | st.integers(-3, 3).map(str)
_GRADE = st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0, 1e300])


@settings(max_examples=15, deadline=None)
@given(
    rows=st.lists(
        st.fixed_dictionaries(
            {
                "context_ids": st.none() | st.lists(st.none() | _ID, max_size=40),
                "relevant_ids": st.none() | st.lists(st.none() | _ID, max_size=40),
                "relevance": st.none()
                | st.lists(st.fixed_dictionaries({"id": _ID, "grade": _GRADE}), max_size=40),
            }
        ),
        min_size=1,
        max_size=12,
    ),
    parts=st.sampled_from([1, 2, 3]),
    k=st.sampled_from([None, 1, 2, 5, 50]),
)
def test_random_hostile_batches_agree_with_the_reference(rows, parts, k):
    _assert_stats(RankedIds(_frame(rows), parts=parts), rows, ks=(k,))
    for name in ("precision_at_k", "ndcg_at_k", "mrr"):
        metric = get_metric(name).from_params({"k": k} if k else {})
        for cell, row in zip(run_metric(metric, rows), rows):
            want = _reference_cell(name, row, k)
            assert (cell["status"], cell["details"]) == (want[0], want[2]), (name, row)
            assert _close(cell["score"], want[1]), (name, row)


def test_list_children_with_their_own_offsets_and_null_lists_over_items():
    # Arrow lets a list's child array start at an offset of its own, a struct's fields
    # start at different offsets, and a null list span child items: the match must
    # read each row's items through all of them
    from udfs.expressions import expression_stage

    ids = pa.array(["zz", "zz", "zz", "a" * 20, "b", "a" * 20, "c", "b" * 15, None, "d"]).slice(3)
    ranked = pa.ListArray.from_arrays(
        pa.array([0, 3, 4, 5, 7], pa.int32()), ids, mask=pa.array([False, True, False, False])
    )
    listed = pa.ListArray.from_arrays(
        pa.array([0, 1, 2, 3, 4], pa.int32()),
        pa.array(["q", "q", "a" * 20, "b" * 15, "d", "c"]).slice(2),
    )
    entries = pa.StructArray.from_arrays(
        [
            pa.array(["p"] * 3 + ["c", "d", "b" * 15, "a" * 20]).slice(3),
            pa.array([9.0, 2.0, 1.0, 3.0, 0.5]).slice(1),
        ],
        names=["id", "grade"],
    )
    graded = pa.ListArray.from_arrays(
        pa.array([0, 1, 2, 3, 4], pa.int32()), entries, mask=pa.array([True, False, True, False])
    )
    rows = [
        {"context_ids": ["a" * 20, "b", "a" * 20], "relevant_ids": ["a" * 20]},
        {
            "relevant_ids": ["b" * 15],
            "relevance": [{"id": "d", "grade": 1.0}],
        },
        {"context_ids": ["b" * 15], "relevant_ids": ["d"]},
        {
            "context_ids": [None, "d"],
            "relevant_ids": ["c"],
            "relevance": [{"id": "a" * 20, "grade": 0.5}],
        },
    ]
    table = pa.table(
        {
            "context_ids": ranked,
            "relevant_ids": listed,
            "relevance": graded.cast(RANKING_SCHEMA.field("relevance").type),
        }
    )
    assert table.to_pylist() == [{c: row.get(c) for c in RANKING} for row in rows]
    # null lists that span items: ranked row 1 (one id), graded rows 0 and 2
    assert ranked.is_null().to_pylist()[1] and ranked.offsets.to_pylist()[1:3] == [3, 4]
    assert graded.is_null().to_pylist() == [True, False, True, False]
    assert graded.offsets.to_pylist() == [0, 1, 2, 3, 4]
    for start in (0, 1, 2):
        frame = pl.from_arrow(table.slice(start))
        assert isinstance(frame, pl.DataFrame)
        _assert_stats(RankedIds(frame, parts=2), rows[start:])
    # through the stage (which re-bases sliced lists), rows 1-3: missing, then recall 0
    # (d and c not retrieved) and nDCG 0 (no judged id retrieved: d of row 2 at no rank,
    # a*20 of row 3 not retrieved)
    canonical = canonical_frame(rows).to_arrow()
    for name in table.column_names:
        at = canonical.schema.get_field_index(name)
        canonical = canonical.set_column(
            at, name, table.column(name).cast(canonical.schema.field(at).type)
        )
    metrics = [get_metric(n).from_params({}, metric_id=n) for n in ("recall_at_k", "ndcg_at_k")]
    out = expression_stage(canonical.slice(1), metrics)
    recall = out.column(cell_column("recall_at_k")).combine_chunks()
    ndcg = out.column(cell_column("ndcg_at_k")).combine_chunks()
    assert pc.struct_field(recall, "score").to_pylist() == [None, 0.0, 0.0]
    assert pc.struct_field(ndcg, "score").to_pylist() == [None, 0.0, 0.0]
