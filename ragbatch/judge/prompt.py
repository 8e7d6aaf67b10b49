"""The prompt layout shared by every judge metric.

Every judge prompt is two chat messages: the same system message for all metrics, and a
user message that starts with the row's shared block (retrieved contexts, then question,
then answer) and ends with the metric's own task (its instructions, the reference answer
or the statements to check, the reply format). The shared block is byte-identical for
every metric and step of a row, so an engine with prefix caching (vLLM's automatic
prefix caching) computes it once per row and reuses it for the other asks.

``layout="task_first"`` puts the task before the shared block; it exists only so that
the benchmark can measure what the shared-first layout saves.
"""

from __future__ import annotations

from typing import Any, Literal, Sequence

from ragbatch.judge.protocol import Message

SYSTEM_PROMPT = (
    "You evaluate the output of a retrieval-augmented generation (RAG) system. You are "
    "given the retrieved contexts, the user's question and the system's answer, followed "
    "by a task. Do exactly what the task asks, judge only from the text you are given, and "
    "reply only in the format the task requires."
)

#: Shown in place of an input that the row does not have.
NOT_GIVEN = "(not given)"


def numbered(items: Sequence[str]) -> str:
    """``[1] first\\n[2] second`` (``(none)`` for an empty sequence)."""
    if not items:
        return "(none)"
    return "\n".join(f"[{i}] {text}" for i, text in enumerate(items, start=1))


def shared_block(row: dict[str, Any]) -> str:
    """The part of the user message every judge metric of ``row`` shares.

    ``row`` has the canonical keys ``contexts`` (list of str or None), ``question`` and
    ``answer`` (str or None); missing or null values are shown as ``(not given)``.
    """
    contexts = row.get("contexts")
    question = row.get("question")
    answer = row.get("answer")
    return (
        "## Retrieved contexts\n"
        f"{numbered(contexts) if contexts is not None else NOT_GIVEN}\n\n"
        "## Question\n"
        f"{question if question is not None else NOT_GIVEN}\n\n"
        "## Answer\n"
        f"{answer if answer is not None else NOT_GIVEN}"
    )


def build_messages(
    row: dict[str, Any], task: str, layout: Literal["shared_first", "task_first"] = "shared_first"
) -> tuple[Message, ...]:
    """The chat for one judge call: the system message, then the user message.

    Parameters
    ----------
    row : dict
        Canonical values of one input row (``contexts``, ``question``, ``answer``).
    task : str
        The metric-specific part: instructions, extra inputs (reference answer,
        statements), reply format. Goes last.
    layout : {"shared_first", "task_first"}
        ``shared_first`` (the default, used by every metric) puts :func:`shared_block`
        first; ``task_first`` only serves the prefix-cache benchmark.

    Returns
    -------
    tuple of Message
        ``(system, user)``.
    """
    block = shared_block(row)
    if layout == "shared_first":
        user = f"{block}\n\n## Task\n{task.strip()}"
    elif layout == "task_first":
        user = f"## Task\n{task.strip()}\n\n{block}"
    else:
        raise ValueError(f"unknown prompt layout {layout!r}")
    return (Message("system", SYSTEM_PROMPT), Message("user", user))
