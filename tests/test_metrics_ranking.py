"""Ranking metrics: hand-worked batches, and a cross-check against trec_eval.

The reference values come from ``pytrec_eval`` (trec_eval's own C code), on random
rankings drawn by hypothesis and on the shipped TREC DL graded judgments. The single-row
hand-worked values are the metrics' ``examples`` (tests/test_metric_contract.py).
"""

from __future__ import annotations

import csv
import math
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragbatch.scoring.registry import get_metric
from support.metric_frames import run_metric

pytrec_eval = pytest.importorskip("pytrec_eval")

REPO = Path(__file__).resolve().parents[1]
TREC_DL = REPO / "examples" / "data" / "trec_dl" / "trec_dl_2021_2022_benchmark.csv"
NAMES = ("hit_rate", "precision_at_k", "recall_at_k", "mrr", "ndcg_at_k", "average_precision")


def _scores(name: str, rows: list[dict], k: int | None = None) -> list[tuple[str, float | None]]:
    metric = get_metric(name).from_params({"k": k} if k is not None else {})
    return [(c["status"], c["score"]) for c in run_metric(metric, rows)]


def test_a_batch_of_mixed_rows_keeps_each_row_its_own_cell():
    # rows 0 and 3 are the same row (a duplicate row scores the same); degenerate rows
    # sit between scored ones so a misaligned join would show.
    same = {"context_ids": ["d1", "d2", "d3", "d4"], "relevant_ids": ["d2", "d4", "d9"]}
    rows = [
        same,
        {"relevant_ids": ["d1"]},
        {"context_ids": ["a", "b"], "relevant_ids": []},
        same,
        {"context_ids": [], "relevant_ids": ["x"]},
        {
            "context_ids": ["文書", "😀", "e\u0301", "\u00e9"],
            "relevance": [
                {"id": "\u00e9", "grade": 2.0},
                {"id": "😀", "grade": 1.0},
                {"id": "無関係", "grade": 0.0},
            ],
        },
        {"context_ids": ["x"]},
    ]
    mi, na = ("missing_input", None), ("not_applicable", None)
    want = {
        "hit_rate": [1.0, None, None, 1.0, 0.0, 1.0, None],
        # k = 3: (1 + 0) / 3 for the first row, 1 / 3 for the unicode row (😀 at rank 2)
        "precision_at_k": [1 / 3, None, None, 1 / 3, 0.0, 1 / 3, None],
        "recall_at_k": [1 / 3, None, None, 1 / 3, 0.0, 1 / 2, None],
        "mrr": [1 / 2, None, None, 1 / 2, 0.0, 1 / 2, None],
        # unicode row at k = 3: dcg = 1/log2(3); ideal = 2 + 1/log2(3)
        "ndcg_at_k": [
            (1 / math.log2(3)) / (1 + 1 / math.log2(3) + 1 / 2),
            None,
            None,
            (1 / math.log2(3)) / (1 + 1 / math.log2(3) + 1 / 2),
            0.0,
            (1 / math.log2(3)) / (2 + 1 / math.log2(3)),
            None,
        ],
        "average_precision": [1 / 6, None, None, 1 / 6, 0.0, (1 / 2) / 2, None],
    }
    for name in NAMES:
        got = _scores(name, rows, k=3)
        statuses = [s for s, _ in got]
        assert statuses == [
            "ok",
            mi[0],
            na[0],
            "ok",
            "ok",
            "ok",
            mi[0],
        ], name
        assert [s for _, s in got] == pytest.approx(want[name], nan_ok=False), name


def test_reasons_name_the_problem():
    rows = [
        {"relevant_ids": ["d1"]},
        {"context_ids": ["x"]},
        {"context_ids": ["x"], "relevant_ids": [None]},
        {
            "context_ids": None,
            "relevant_ids": ["x"],
            "_issues": {"context_ids": "context_ids: 2 ids for 3 contexts; they must align"},
        },
        {
            "context_ids": ["x"],
            "relevance": None,
            "relevant_ids": None,
            "_issues": {"relevance": "relevance: an id is given more than once"},
        },
    ]
    metric = get_metric("recall_at_k").from_params({})
    reasons = [c["reason"] for c in run_metric(metric, rows)]
    assert reasons == [
        "context_ids is null",
        "relevant_ids and relevance are null",
        "no id is known relevant",
        "context_ids: 2 ids for 3 contexts; they must align",
        "relevance: an id is given more than once",
    ]


def test_relevant_ids_decide_binary_relevance_and_relevance_decides_ndcg():
    row = {
        "context_ids": ["a", "b"],
        "relevant_ids": ["b"],
        "relevance": [{"id": "a", "grade": 3.0}, {"id": "b", "grade": 1.0}],
    }
    assert _scores("mrr", [row]) == [("ok", 0.5)]
    assert _scores("ndcg_at_k", [row]) == [("ok", pytest.approx(1.0))]


def test_k_is_checked():
    from ragbatch.core.errors import ConfigError

    with pytest.raises(ConfigError, match="params.k"):
        get_metric("precision_at_k").from_params({"k": 0})


# --------------------------------------------------------------------------- trec_eval


def _trec_eval(qrels: dict, rankings: dict, k: int | None) -> dict[str, dict[str, float]]:
    """trec_eval's values per query for the six metrics, cut at ``k`` (None: no cut).

    Runs give each id the score ``len - rank`` so trec_eval keeps the given order.
    """
    cut = {q: ids[:k] if k else ids for q, ids in rankings.items()}
    run = {q: {d: float(len(ids) - i) for i, d in enumerate(ids)} for q, ids in cut.items()}
    if k:
        measures = {f"success.{k}", f"P.{k}", f"recall.{k}", "recip_rank", f"ndcg_cut.{k}"}
        measures.add(f"map_cut.{k}")
    else:
        measures = {"set_P", "set_recall", "recip_rank", "ndcg", "map"}
    got = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)
    names = (
        [f"success_{k}", f"P_{k}", f"recall_{k}", "recip_rank", f"ndcg_cut_{k}", f"map_cut_{k}"]
        if k
        else [None, "set_P", "set_recall", "recip_rank", "ndcg", "map"]
    )
    out: dict[str, dict[str, float]] = {}
    for q, values in got.items():
        found = [d for d in cut[q] if qrels[q].get(d, 0) >= 1]
        hit = 1.0 if found else 0.0
        out[q] = {
            name: (hit if measure is None else values[measure])
            for name, measure in zip(NAMES, names)
        }
    return out


def _compare(
    qrels: dict, rankings: dict, k: int | None, graded_rows: bool, scale: float = 1.0
) -> None:
    """Our six metrics on rows built from ``qrels`` (grades times ``scale``) against
    trec_eval on the integer grades; nDCG's linear gain makes the scale cancel."""
    queries = sorted(q for q in rankings if any(g >= 1 for g in qrels[q].values()))
    rows = []
    for q in queries:
        judged = qrels[q]
        row: dict = {"context_ids": rankings[q]}
        if graded_rows:
            row["relevance"] = [{"id": d, "grade": g * scale} for d, g in judged.items()]
        else:
            row["relevant_ids"] = [d for d, g in judged.items() if g >= 1]
        rows.append(row)
    want = _trec_eval({q: qrels[q] for q in queries}, {q: rankings[q] for q in queries}, k)
    for name in NAMES:
        got = _scores(name, rows, k)
        for q, (status, score) in zip(queries, got):
            assert status == "ok", (name, q)
            if name == "ndcg_at_k" and not graded_rows:
                continue  # binary rows: trec_eval still sees the grades
            assert score == pytest.approx(want[q][name], abs=1e-9), (name, q, k)


@st.composite
def _judged_rankings(draw):
    n_queries = draw(st.integers(1, 6))
    pool = [f"d{i}" for i in range(12)] + ["文", "📄", "e\u0301", "7"]
    qrels, rankings = {}, {}
    for q in range(n_queries):
        judged = draw(st.lists(st.sampled_from(pool), unique=True, min_size=1, max_size=8))
        grades = draw(st.lists(st.integers(0, 3), min_size=len(judged), max_size=len(judged)))
        if not any(grades):
            grades[0] = 1
        ranking = draw(st.lists(st.sampled_from(pool), unique=True, min_size=1, max_size=10))
        qrels[f"q{q}"] = dict(zip(judged, grades))
        rankings[f"q{q}"] = ranking
    return qrels, rankings


@settings(max_examples=12, deadline=None)
@given(_judged_rankings(), st.sampled_from([None, 1, 3, 5, 20]))
def test_random_rankings_agree_with_trec_eval(data, k):
    qrels, rankings = data
    _compare(qrels, rankings, k, graded_rows=True)
    _compare(qrels, rankings, k, graded_rows=False)


def _trec_dl() -> tuple[dict, dict]:
    """The shipped TREC DL judgments per query (grades 0..3, from 0, 1/3, 2/3, 1), and a
    seeded shuffle of each query's judged passages plus two unjudged ids as its ranking."""
    qrels: dict[str, dict[str, int]] = {}
    with TREC_DL.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            grade = round(float(row["expected_score"]) * 3)
            qrels.setdefault(row["query_id"], {})[row["doc_id"]] = grade
    rankings = {}
    for q, judged in qrels.items():
        ids = sorted(judged) + [f"unjudged_{q}_a", f"unjudged_{q}_b"]
        random.Random(int(q)).shuffle(ids)
        rankings[q] = ids
    return qrels, rankings


@pytest.mark.parametrize("k", [None, 3, 10])
def test_trec_dl_judgments_agree_with_trec_eval(k):
    qrels, rankings = _trec_dl()
    assert len(qrels) == 129
    _compare(qrels, rankings, k, graded_rows=True, scale=1 / 3)  # the file's 0, 1/3, 2/3, 1


def test_wide_rows_take_the_sorting_paths_with_the_same_scores():
    # rows wider than the pairwise check (ragbatch.metrics._ranking_kernel.NARROW, 32)
    # sort their keys instead: 100 ids, d0..d69 then d0..d29 again
    wide = {"context_ids": [f"d{i % 70}" for i in range(100)], "relevant_ids": ["d0", "d69"]}
    want = {
        "precision_at_k": 2 / 100,
        "recall_at_k": 1.0,
        "mrr": 1.0,
        "average_precision": (1 / 1 + 2 / 70) / 2,
    }
    for name, score in want.items():
        assert _scores(name, [wide]) == [("ok", pytest.approx(score))], name
    # a wide judged set with repeats and nulls: 40 distinct ids, each given twice, d5
    # and d77 of them retrieved (ranks 2 and 4)
    judged = [f"d{i}" for i in range(5, 85, 2)] * 2 + [None, None]
    row = {"context_ids": ["x", "d5", "y", "d77", "d5"], "relevant_ids": judged}
    assert _scores("recall_at_k", [row]) == [("ok", pytest.approx(2 / 40))]
    assert _scores("average_precision", [row]) == [("ok", pytest.approx((1 / 2 + 2 / 4) / 40))]
    assert _scores("precision_at_k", [row], 3) == [("ok", pytest.approx(1 / 3))]
    qrels, rankings = _trec_dl()
    _compare(qrels, rankings, 10, graded_rows=True, scale=1 / 3)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_wide_random_rankings_agree_with_trec_eval(data):
    # rankings and judged sets past the pairwise width, checked against trec_eval
    pool = [f"doc-{i}" for i in range(150)] + ["文", "📄", "e\u0301", "\u00e9"]
    qrels, rankings = {}, {}
    for q in range(data.draw(st.integers(1, 3))):
        judged = data.draw(st.lists(st.sampled_from(pool), unique=True, min_size=1, max_size=90))
        grades = data.draw(st.lists(st.integers(0, 3), min_size=len(judged), max_size=len(judged)))
        if not any(grades):
            grades[0] = 2
        qrels[f"q{q}"] = dict(zip(judged, grades))
        rankings[f"q{q}"] = data.draw(
            st.lists(st.sampled_from(pool), unique=True, min_size=1, max_size=120)
        )
    k = data.draw(st.sampled_from([None, 5, 40]))
    _compare(qrels, rankings, k, graded_rows=data.draw(st.booleans()))


def _mixed_rows(n: int, seed: int) -> list[dict]:
    """Seeded rows of every kind the ranking metrics see: ids only, grades only, both,
    repeats, null ids, empty and null lists."""
    rng = random.Random(seed)
    pool = [f"d{i}" for i in range(9)] + ["文", "📄", "e\u0301", "\u00e9"]
    rows: list[dict] = []
    for _ in range(n):
        row: dict = {}
        kind = rng.randrange(6)
        ranking = [rng.choice(pool + [None]) for _ in range(rng.randrange(0, 12))]
        row["context_ids"] = None if kind == 5 and rng.random() < 0.5 else ranking
        if kind in (0, 2, 3):
            row["relevant_ids"] = [rng.choice(pool + [None]) for _ in range(rng.randrange(4))]
        if kind in (1, 2, 4):
            judged = rng.sample(pool, rng.randrange(0, 6))
            row["relevance"] = [{"id": d, "grade": float(rng.randrange(-1, 4))} for d in judged]
        rows.append(row)
    return rows


def test_a_stage_of_ranking_metrics_gives_what_each_gives_alone(monkeypatch):
    import pyarrow.compute as pc

    from ragbatch.core.columns import cell_column
    from ragbatch.metrics import _ranking
    from support.metric_frames import canonical_frame
    from udfs.expressions import expression_stage

    rows = _mixed_rows(300, seed=7)
    metrics = [
        get_metric(name).from_params({"k": k} if k else {}, metric_id=f"{name}_{k}")
        for name in NAMES
        for k in (None, 1, 3, 10)
    ] + [get_metric("response_length").from_params({"max_chars": 5})]
    computed = []
    compute = _ranking.RankingMatch.compute
    monkeypatch.setattr(
        _ranking.RankingMatch, "compute", lambda self, f: computed.append(1) or compute(self, f)
    )
    out = expression_stage(canonical_frame(rows).to_arrow(), metrics)
    assert len(computed) == 1  # one match for the 24 ranking metrics of the batch
    for metric in metrics:
        alone = run_metric(metric, rows)
        cells = out.column(cell_column(metric.id))
        for field in ("score", "status", "reason", "details"):
            got = pc.struct_field(cells, field).to_pylist()
            assert got == [c[field] for c in alone], (metric.id, field)
    statuses = {c["status"] for m in metrics[:-1] for c in run_metric(m, rows)}
    assert statuses == {"ok", "missing_input", "not_applicable"}


def test_ids_whose_hashes_collide_are_told_apart_by_their_bytes(monkeypatch):
    # Fault injection (a real 64-bit collision cannot be produced on demand): every id's
    # key is forced to 0, so every pair of ids in a row "collides" and only the byte
    # comparison can tell them apart; narrow rows and wide ones (past NARROW, where
    # runs of equal keys are searched) must score exactly as with real hashes.
    import dataclasses

    import numpy as np

    from ragbatch.metrics import _ranking

    rows = _mixed_rows(200, seed=11)
    rows += [
        {
            "context_ids": [f"w{i % 45}" for i in range(60)] + [None, "文", "e\u0301"],
            "relevant_ids": [f"w{i}" for i in range(0, 90, 2)] + ["\u00e9", None],
        },
        {
            "context_ids": [f"w{i}" for i in range(40)],
            "relevance": [{"id": f"w{i}", "grade": float(i % 4)} for i in range(39, -1, -1)],
        },
    ]
    metrics = [
        get_metric(name).from_params({"k": k} if k else {}) for name in NAMES for k in (None, 3, 50)
    ]
    want = [run_metric(m, rows) for m in metrics]
    real_of = _ranking._Ids.of.__func__

    def colliding(cls, values, lengths):
        ids = real_of(cls, values, lengths)
        return dataclasses.replace(ids, keys=np.zeros_like(ids.keys))

    monkeypatch.setattr(_ranking._Ids, "of", classmethod(colliding))
    assert [run_metric(m, rows) for m in metrics] == want
