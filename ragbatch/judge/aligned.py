"""Few-shot examples that align a judge metric to people's labels.

An *examples file* (the ``examples_file`` param of every judge metric) is a JSON file::

    {"format_version": 1, "metric": "faithfulness", "created_by": "<calibration run id>",
     "seed": 0, "split": {...}, "examples": [
        {"inputs": {"question": ..., "contexts": [...], "answer": ..., "reference": ...},
         "label": true, "reply": "{\\"reason\\": ..., \\"verdict\\": true}"}, ...]}

Only ``format_version`` (1), ``metric`` and ``examples`` (a non-empty list, each with
``inputs`` and a string ``reply``; ``label`` is kept for the record) are required. The
examples are shown to the judge before the task of the metric's first step (see
:meth:`ragbatch.judge.metric.JudgeMetric.messages`): each as its row, in the layout of
:func:`ragbatch.judge.prompt.shared_block`, then the reply the judge should give. The
SHA-256 of the file's bytes goes into the metric's cache key, so an edited file asks
the judge again and the same file reuses the cached judgments.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass, replace
from typing import Any

from ragbatch.judge.prompt import Task, shared_block

#: The ``format_version`` this module reads and writes.
FORMAT_VERSION = 1

#: The heading of the examples in a prompt.
EXAMPLES_HEADING = "## Examples"
EXAMPLES_INTRO = (
    "Each example below is a row like the one you judge, then the reply a careful "
    "reviewer gave to the same task. Judge the row you are given in the same way."
)


@dataclass(frozen=True)
class AlignedExamples:
    """The contents of one examples file.

    Attributes
    ----------
    metric : str
        The name of the judge metric the examples were chosen for.
    examples : tuple of dict
        Each ``{"inputs": dict, "reply": str, "label": ...}``; ``inputs`` holds the
        canonical columns (``question``, ``contexts``, ``answer``, ``reference``).
    sha256 : str
        Hex SHA-256 of the file's bytes (64 characters): the cache keys' part.
    record : dict
        The whole parsed file (``created_by``, ``seed``, ``split``...).
    """

    metric: str
    examples: tuple[dict[str, Any], ...]
    sha256: str
    record: dict[str, Any]

    def render(self) -> str:
        """The examples as the prompt shows them: :data:`EXAMPLES_HEADING`, a short
        introduction, then ``### Example <n>``, the row's block with its reference
        answer, and ``### Reply`` with the reply, for each example in file order."""
        parts = [EXAMPLES_HEADING, EXAMPLES_INTRO]
        for n, example in enumerate(self.examples, start=1):
            block = shared_block(example["inputs"], reference=True).replace("\n## ", "\n#### ")
            block = block.replace("## ", "#### ", 1) if block.startswith("## ") else block
            parts.append(f"### Example {n}\n{block}\n\n### Reply\n{example['reply'].strip()}")
        return "\n\n".join(parts)

    def ahead_of(self, text: str) -> str:
        """``text`` (a task or an instruction set) after the examples: :meth:`render`,
        then ``## Your task`` and ``text`` stripped."""
        return f"{self.render()}\n\n## Your task\n{text.strip()}"

    def task(self, task: Task) -> Task:
        """``task`` with the examples ahead of its ``row_first`` text and of its
        instruction set (:meth:`ahead_of`); its ask unchanged."""
        return replace(
            task, text=self.ahead_of(task.text), instructions=self.ahead_of(task.instructions)
        )


def parse_examples(data: bytes) -> AlignedExamples:
    """Parse and check the bytes of an examples file.

    Raises
    ------
    ValueError
        Not JSON, not an object, a ``format_version`` other than :data:`FORMAT_VERSION`,
        a missing or empty ``metric``, an empty ``examples`` list, or an example without
        an ``inputs`` object or a string ``reply``; the message names the key.
    """
    try:
        record = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a JSON file: {exc}") from None
    if not isinstance(record, dict):
        raise ValueError("the file must hold a JSON object")
    if record.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"format_version must be {FORMAT_VERSION}, got {record.get('format_version')!r}"
        )
    metric = record.get("metric")
    if not isinstance(metric, str) or not metric:
        raise ValueError("metric must be a non-empty string (the judge metric's name)")
    examples = record.get("examples")
    if not isinstance(examples, list) or not examples:
        raise ValueError("examples must be a non-empty list")
    for i, example in enumerate(examples):
        if not isinstance(example, dict) or not isinstance(example.get("inputs"), dict):
            raise ValueError(f"examples[{i}].inputs must be an object of the row's columns")
        if not isinstance(example.get("reply"), str) or not example["reply"].strip():
            raise ValueError(f"examples[{i}].reply must be a non-empty string")
    digest = hashlib.sha256(data).hexdigest()
    return AlignedExamples(metric, tuple(examples), digest, record)


@functools.lru_cache(maxsize=64)
def _load(path: str, mtime_ns: int, size: int) -> AlignedExamples:
    with open(path, "rb") as f:
        return parse_examples(f.read())


def load_examples(path: str) -> AlignedExamples:
    """The examples file at ``path`` (a local path), read once per version of the file
    (its modification time and size).

    Raises
    ------
    ValueError
        The file cannot be read, or :func:`parse_examples` rejects it.
    """
    try:
        stat = os.stat(path)
    except OSError as exc:
        raise ValueError(f"cannot read the examples file {path!r}: {exc.strerror}") from None
    return _load(os.path.abspath(path), stat.st_mtime_ns, stat.st_size)


def write_examples(path: str, record: dict[str, Any]) -> AlignedExamples:
    """Write ``record`` (with ``format_version`` set to :data:`FORMAT_VERSION`) as an
    examples file at ``path`` (UTF-8 JSON, keys sorted, non-ASCII kept) and return it
    as read back.

    Raises
    ------
    ValueError
        ``record`` is not a valid examples file (:func:`parse_examples`).
    """
    data = json.dumps(
        {**record, "format_version": FORMAT_VERSION}, ensure_ascii=False, indent=1, sort_keys=True
    ).encode("utf-8")
    parsed = parse_examples(data)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return parsed
