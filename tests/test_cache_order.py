"""Rows ordered by judgment-cache bucket before the judge stage
(:func:`udfs.cache_order.order_by_cache_bucket`): every row kept, rows of one bucket in
their input order, and 64-row batches falling in a few buckets instead of dozens."""

from __future__ import annotations

import hashlib
import json

import pyarrow as pa

from udfs.cache_order import order_by_cache_bucket

MODEL, SAMPLING = "models/smollm2@abc", {"temperature": 0.0, "seed": 0}


def _bucket(row: dict) -> str:
    """The bucket of a row's group, worked out here from the cache layout's definition:
    the first two hex digits of SHA-256 over the engine identity and the row's inputs."""
    document = {
        "model": MODEL,
        "sampling": SAMPLING,
        "row": {c: row.get(c) for c in ("question", "contexts", "answer", "reference")},
    }
    text = json.dumps(document, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:2]


def _rows(n: int) -> pa.Table:
    texts = ["检索 😀", "cafe\u0301", "plain", None]
    return pa.table(
        {
            "row_id": [f"r{i}" for i in range(n)],
            "question": [f"question {i // 2}" for i in range(n)],  # pairs of duplicate rows
            "contexts": [None if i % 7 == 0 else [texts[i % 4] or "", "ctx"] for i in range(n)],
            "answer": [texts[i % 4] if i % 5 else f"answer {i // 2}" for i in range(n)],
            "reference": [None] * n,
            "slice": ["a"] * n,
        }
    )


def _buckets_per_batch(table: pa.Table, size: int = 64) -> list[int]:
    rows = table.to_pylist()
    return [len({_bucket(r) for r in rows[i : i + size]}) for i in range(0, len(rows), size)]


def test_every_row_kept_in_bucket_order_and_stable():
    table = _rows(4096)
    out = order_by_cache_bucket(table, MODEL, SAMPLING)
    assert out.schema == table.schema and out.num_rows == table.num_rows
    assert sorted(out.column("row_id").to_pylist()) == sorted(table.column("row_id").to_pylist())
    rows = out.to_pylist()
    buckets = [_bucket(r) for r in rows]
    assert buckets == sorted(buckets)
    # rows of one bucket keep their input order (a stable sort)
    position = {r: i for i, r in enumerate(table.column("row_id").to_pylist())}
    for b in set(buckets):
        ids = [r["row_id"] for r, rb in zip(rows, buckets) if rb == b]
        assert [position[i] for i in ids] == sorted(position[i] for i in ids)


def test_batches_fall_in_few_buckets():
    table = _rows(4096)
    before = _buckets_per_batch(table)
    after = _buckets_per_batch(order_by_cache_bucket(table, MODEL, SAMPLING))
    # in input order a 64-row batch touches about 256 * (1 - (255/256)^n) buckets for its
    # n distinct groups (duplicate rows share one); sorted, about 64 * 256 / 4096 + 1
    assert min(before) >= 20
    assert max(after) <= 8 and sum(after) / len(after) <= 6


def test_small_blocks_pass_unchanged():
    one = _rows(1)
    assert order_by_cache_bucket(one, MODEL, SAMPLING).equals(one)
    empty = _rows(0)
    assert order_by_cache_bucket(empty, MODEL, SAMPLING).num_rows == 0
