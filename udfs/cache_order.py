"""Rows in the order of their judgment-cache buckets, so that a judge batch reads few
bucket files.

The judgment cache files every entry under its row's group (a hash of the engine's
identity and the row's judge inputs, :func:`ragbatch.judge.cache.group_key`), and a
group's entries live in the bucket file named by the group's first hex digits
(:func:`ragbatch.judge.cache_files.bucket_of`). A judge batch looks up the groups of its
rows, one read of each bucket file they fall in: rows in input order fall in nearly as
many buckets as they are rows (64 rows, about 57 of 256 buckets), and on object storage
each bucket file is a request. :func:`order_by_cache_bucket` sorts each block of rows by
bucket before the judge stage cuts it into batches, so that a batch's rows fall in a few
neighbouring buckets instead (a block of 4,096 rows gives batches of 64 rows about 5
buckets each). Only the order changes: every row stays, and the scores table is keyed by
row id.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from ragbatch.judge.cache import GROUP_COLUMNS, group_key
from ragbatch.judge.cache_files import bucket_of


class _Identity:
    """What a group key takes from an engine, as the driver worked it out."""

    def __init__(self, model_id: str, sampling: dict[str, Any]) -> None:
        self.model_id = model_id
        self.sampling = sampling

    def sampling_key(self) -> dict[str, Any]:
        return self.sampling


def order_by_cache_bucket(batch: pa.Table, model_id: str, sampling: dict[str, Any]) -> pa.Table:
    """``batch`` with its rows sorted by the cache bucket of their group (a stable sort:
    rows of one bucket keep their order).

    A Ray Data batch function, run on whole blocks before the judge stage.

    Parameters
    ----------
    batch : pyarrow.Table
        Canonical rows (the judge inputs among :data:`ragbatch.judge.cache.GROUP_COLUMNS`;
        absent ones count as null, as in the judge stage).
    model_id : str
    sampling : dict
        The judge engine's identity as its cache keys record it (model id and sampling
        key, :func:`ragbatch.judge.cache_probe.engine_identities`).

    Returns
    -------
    pyarrow.Table
        The same rows and columns, reordered.
    """
    if batch.num_rows < 2:
        return batch
    identity = _Identity(model_id, sampling)
    present = [c for c in GROUP_COLUMNS if c in batch.column_names]
    rows = batch.select(present).to_pylist()
    buckets = [bucket_of(group_key(identity, row)) for row in rows]
    order = sorted(range(len(rows)), key=buckets.__getitem__)
    return batch.take(pa.array(order, type=pa.int64()))
