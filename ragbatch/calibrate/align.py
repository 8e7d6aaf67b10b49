"""Aligning a judge metric to people's labels with few-shot examples: the split of the
labelled rows, the choice of examples from its training part, and the examples file's
record (docs/calibration.md, "Aligning a judge").

Agreement of an aligned judge is measured only on the held-out rows; the rows shown as
examples come from the training rows, so no measured row was shown to the judge.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import numpy as np


@dataclass(frozen=True)
class Split:
    """A split of labelled rows into training and held-out rows.

    Attributes
    ----------
    train, held_out : tuple of str
        Row ids, each in input order; disjoint, together every row.
    seed : int
        The seed that drew the split.
    train_fraction : float
        The share of each label's rows asked for in ``train``, in (0, 1).
    """

    train: tuple[str, ...]
    held_out: tuple[str, ...]
    seed: int
    train_fraction: float

    def record(self) -> dict[str, Any]:
        """What the manifest and the examples file record of the split: the seed, the
        fraction, the sizes and the SHA-256 (hex) of each part's ids
        (:func:`ids_digest`)."""
        return {
            "seed": self.seed,
            "train_fraction": self.train_fraction,
            "train_rows": len(self.train),
            "held_out_rows": len(self.held_out),
            "train_ids_sha256": ids_digest(self.train),
            "held_out_ids_sha256": ids_digest(self.held_out),
        }


def ids_digest(ids: Sequence[str]) -> str:
    """Hex SHA-256 of the sorted ``ids`` joined by newlines (UTF-8): the same set of ids
    gives the same digest whatever their order."""
    return hashlib.sha256("\n".join(sorted(ids)).encode("utf-8")).hexdigest()


def _by_label(ids: Sequence[str], labels: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    groups: dict[Hashable, list[int]] = {}
    for i, label in enumerate(labels):
        groups.setdefault(label, []).append(i)
    return dict(sorted(groups.items(), key=lambda kv: repr(kv[0])))


def split_rows(
    ids: Sequence[str], labels: Sequence[Hashable], train_fraction: float, seed: int
) -> Split:
    """Split rows into training and held-out rows, stratified by label.

    Within each label, the rows are shuffled with ``numpy.random.default_rng(seed)`` and
    the first ``round(n * train_fraction)`` go to training, at least one row of a label
    with two or more rows staying held out.

    Parameters
    ----------
    ids : sequence of str
        Unique row ids.
    labels : sequence
        Each row's label (any hashable value), in the order of ``ids``.
    train_fraction : float
        In (0, 1).
    seed : int
        The seed of the shuffle; the same inputs and seed give the same split.

    Raises
    ------
    ValueError
        ``ids`` and ``labels`` differ in length, ``ids`` repeat, ``train_fraction`` is
        outside (0, 1), or no row would be held out.
    """
    if len(ids) != len(labels):
        raise ValueError(f"{len(ids)} row ids but {len(labels)} labels")
    if len(set(ids)) != len(ids):
        raise ValueError("row ids must be unique")
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
    rng = np.random.default_rng(seed)
    train: set[int] = set()
    for rows in _by_label(ids, labels).values():
        order = rng.permutation(len(rows))
        n = round(len(rows) * train_fraction)
        if len(rows) >= 2:
            n = min(n, len(rows) - 1)
        train.update(rows[k] for k in order[:n])
    if len(train) == len(ids):
        raise ValueError("no row would be held out: lower train_fraction or add rows")
    return Split(
        tuple(ids[i] for i in range(len(ids)) if i in train),
        tuple(ids[i] for i in range(len(ids)) if i not in train),
        seed,
        train_fraction,
    )


def choose_examples(
    ids: Sequence[str], labels: Sequence[Hashable], shots: int, seed: int
) -> tuple[str, ...]:
    """Choose ``shots`` example rows, balanced by label.

    The rows of each label are shuffled with ``numpy.random.default_rng(seed)``; then one
    row of each label is taken in turn (labels in a fixed order) until ``shots`` rows are
    chosen or none is left.

    Parameters
    ----------
    ids, labels : sequence
        The training rows' ids and labels (``Split.train`` and their labels).
    shots : int
        How many examples, at least 1.

    Returns
    -------
    tuple of str
        The chosen ids, in the order they were taken (at most ``shots``; fewer when
        there are fewer rows).

    Raises
    ------
    ValueError
        ``shots`` below 1, or ``ids`` and ``labels`` differ in length.
    """
    if shots < 1:
        raise ValueError(f"shots must be at least 1, got {shots}")
    if len(ids) != len(labels):
        raise ValueError(f"{len(ids)} row ids but {len(labels)} labels")
    rng = np.random.default_rng(seed)
    queues = [
        [rows[k] for k in rng.permutation(len(rows))] for rows in _by_label(ids, labels).values()
    ]
    chosen: list[str] = []
    while len(chosen) < shots and any(queues):
        for queue in queues:
            if queue and len(chosen) < shots:
                chosen.append(ids[queue.pop(0)])
    return tuple(chosen)


def verdict_reply(label: float, threshold: float = 0.5) -> str:
    """The reply of a one-verdict judge step for a human label: ``{"reason": ...,
    "verdict": 1}`` when ``label >= threshold``, else with ``"verdict": 0`` (JSON, the
    reason a fixed sentence saying the reviewer's judgment)."""
    verdict = 1 if label >= threshold else 0
    reason = "a reviewer judged it so" if verdict else "a reviewer judged it not so"
    return f'{{"reason": "{reason}", "verdict": {verdict}}}'


def examples_record(
    metric: str,
    created_by: str,
    split: Split,
    rows: Sequence[dict[str, Any]],
    replies: Sequence[str],
) -> dict[str, Any]:
    """The examples file's record (:func:`ragbatch.judge.aligned.write_examples`).

    Parameters
    ----------
    metric : str
        The judge metric's name.
    created_by : str
        The calibration run id.
    split : Split
        The split the examples were chosen from; recorded with :meth:`Split.record`.
    rows : sequence of dict
        The chosen rows: ``row_id``, ``label`` and the canonical inputs (``question``,
        ``contexts``, ``answer``, ``reference``; missing ones are null).
    replies : sequence of str
        The reply the judge should give to each row, in the order of ``rows``.

    Raises
    ------
    ValueError
        A chosen row is not a training row of ``split``, or ``rows`` and ``replies``
        differ in length.
    """
    if len(rows) != len(replies):
        raise ValueError(f"{len(rows)} rows but {len(replies)} replies")
    train = set(split.train)
    examples = []
    for row, reply in zip(rows, replies):
        if row["row_id"] not in train:
            raise ValueError(f"row {row['row_id']!r} is not a training row")
        inputs = {k: row.get(k) for k in ("question", "contexts", "answer", "reference")}
        examples.append(
            {"row_id": row["row_id"], "inputs": inputs, "label": row.get("label"), "reply": reply}
        )
    return {
        "metric": metric,
        "created_by": created_by,
        "seed": split.seed,
        "split": split.record(),
        "examples": examples,
    }


__all__ = [
    "Split",
    "choose_examples",
    "examples_record",
    "ids_digest",
    "split_rows",
    "verdict_reply",
]
