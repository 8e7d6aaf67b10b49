"""The prompt layouts shared by every judge metric.

Every judge prompt is two chat messages, a system message and a user message. The
user message always holds the row's shared block (retrieved contexts, then question,
then answer), byte-identical for every metric and step of a row. Where a metric's task
goes is the metric's ``prompt_layout`` param:

``instructions_first``
    The system message holds the instructions of every judge metric of the stage (each
    step's instruction set under its name, in a fixed order: :class:`Instructions`),
    identical for every row and request of the stage; each set ends with its reply
    format. The user message is the shared block, with the row's reference answer (when
    it has one) after the answer, then a short ask (:class:`Task`): which instruction
    set applies, the step's own inputs (the statements to check) and how many items the
    reply holds.
    An engine with prefix caching (vLLM's automatic prefix caching) computes the
    instructions once per stage and the shared block once per row.
``row_first`` (the default)
    The only layout before ``prompt_layout`` existed: the system message is
    :data:`SYSTEM_PROMPT`, the user message the shared block, then ``## Task`` and the
    step's whole task (instructions, inputs, reply format), so the instructions are
    computed again for every row.

:func:`build_messages` also takes ``layout="task_first"`` (the task before the shared
block), which only the prefix-cache benchmark (``benchmarks/judge_stage.py``) uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Literal, Sequence

from ragbatch.judge.protocol import Message

SYSTEM_PROMPT = (
    "You evaluate the output of a retrieval-augmented generation (RAG) system. You are "
    "given the retrieved contexts, the user's question and the system's answer, followed "
    "by a task. Do exactly what the task asks, judge only from the text you are given, and "
    "reply only in the format the task requires."
)

#: The opening of the system message in the ``instructions_first`` layout; the stage's
#: instruction sets follow it.
INSTRUCTIONS_PREAMBLE = (
    "You evaluate the output of a retrieval-augmented generation (RAG) system. Below are "
    "sets of instructions, each under its name. After them you are given the retrieved "
    "contexts, the user's question and the system's answer, followed by a task that names "
    "the instruction set to follow. Follow that set only, judge only from the text you are "
    "given, and reply only in the format the task requires."
)

#: Shown in place of an input that the row does not have.
NOT_GIVEN = "(not given)"

#: The values of the judge metrics' ``prompt_layout`` param.
PromptLayout = Literal["instructions_first", "row_first"]
#: The layout a judge metric uses when its params do not name one.
DEFAULT_LAYOUT: PromptLayout = "row_first"


def numbered(items: Sequence[str]) -> str:
    """``[1] first\\n[2] second`` (``(none)`` for an empty sequence)."""
    if not items:
        return "(none)"
    return "\n".join(f"[{i}] {text}" for i, text in enumerate(items, start=1))


def shared_block(row: dict[str, Any], reference: bool = False) -> str:
    """The part of the user message every judge metric of ``row`` shares.

    ``row`` has the canonical keys ``contexts`` (list of str or None), ``question`` and
    ``answer`` (str or None); missing or null values are shown as ``(not given)``. With
    ``reference`` (the ``instructions_first`` layout) a ``## Reference answer`` section
    follows when the row's ``reference`` is not null, so the metrics that read it share
    it too.
    """
    contexts = row.get("contexts")
    question = row.get("question")
    answer = row.get("answer")
    block = (
        "## Retrieved contexts\n"
        f"{numbered(contexts) if contexts is not None else NOT_GIVEN}\n\n"
        "## Question\n"
        f"{question if question is not None else NOT_GIVEN}\n\n"
        "## Answer\n"
        f"{answer if answer is not None else NOT_GIVEN}"
    )
    if reference and row.get("reference") is not None:
        block += f"\n\n## Reference answer\n{row['reference']}"
    return block


@dataclass(frozen=True)
class Task:
    """One judge step's task for one row, in both layouts.

    Attributes
    ----------
    name : str
        The instruction set's name (``"faithfulness: verdicts"``), shown as its heading.
    text : str
        The whole task as the ``row_first`` layout shows it after ``## Task``.
    instructions : str
        The ``instructions_first`` layout's instruction set: no value of the row.
    ask : str
        The ``instructions_first`` layout's ask: the step's inputs from the row and what
        its reply must count (the reply's shape is in the instructions); may be empty.
    """

    name: str
    text: str
    instructions: str
    ask: str


def _fill(template: str, fields: dict[str, Any]) -> str:
    """``template`` filled with ``fields`` (``str.format``), or as it is without fields
    (templates without fields are written with single braces)."""
    return template.format(**fields) if fields else template


@dataclass(frozen=True)
class StepPrompt:
    """The prompt text of one judge step, for both layouts.

    Attributes
    ----------
    name : str
        The instruction set's name, ``"<metric>: <step>"``.
    task : str
        The ``row_first`` task: a ``str.format`` template when the step has fields
        (``{n}``, ``{reference}``...; literal braces doubled), else plain text.
    instructions : str
        The ``instructions_first`` instruction set, its reply format last: plain text,
        the same for every row.
    ask : str
        The ``instructions_first`` ask: a template with the same fields as ``task`` (or
        plain text when it has none, or empty).
    """

    name: str
    task: str
    instructions: str
    ask: str

    def fill(self, **fields: Any) -> Task:
        """The :class:`Task` of one row: ``task`` and ``ask`` filled with ``fields``.

        Raises
        ------
        KeyError
            A field the templates use is not given.
        """
        return Task(self.name, _fill(self.task, fields), self.instructions, _fill(self.ask, fields))


@dataclass(frozen=True)
class Instructions:
    """The instruction sets of a stage's ``instructions_first`` metrics, in a fixed order.

    Build it with :meth:`of`. ``sets`` holds ``(heading, text)`` pairs sorted by name,
    then text; two different sets with one name (a metric twice with different params)
    are told apart by a suffix, `` (2)``, `` (3)``..., in that order.
    """

    sets: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, steps: Iterable[tuple[str, str]]) -> "Instructions":
        """The block for ``steps``, ``(name, instructions)`` pairs (duplicates dropped)."""
        unique = sorted(set(steps))
        seen: dict[str, int] = {}
        sets = []
        for name, text in unique:
            seen[name] = seen.get(name, 0) + 1
            heading = name if seen[name] == 1 else f"{name} ({seen[name]})"
            sets.append((heading, text))
        return cls(tuple(sets))

    def heading(self, task: Task) -> str:
        """The heading under which ``task``'s instructions appear.

        Raises
        ------
        ValueError
            ``task``'s instructions are not in the block (the metric was not among those
            the block was built for: build it with every metric of the stage).
        """
        for heading, text in self.sets:
            if text == task.instructions and (
                heading == task.name or heading.startswith(f"{task.name} (")
            ):
                return heading
        raise ValueError(
            f"instruction set {task.name!r} is not in the stage's instructions; build them "
            "with every judge metric of the stage (ragbatch.judge.metric.bind_instructions)"
        )

    def system(self) -> str:
        """The system message: :data:`INSTRUCTIONS_PREAMBLE`, then each set under
        ``## Instructions: <heading>``."""
        parts = [INSTRUCTIONS_PREAMBLE]
        parts += [f"## Instructions: {heading}\n{text.strip()}" for heading, text in self.sets]
        return "\n\n".join(parts)


def build_messages(
    row: dict[str, Any],
    task: str | Task,
    layout: Literal["row_first", "instructions_first", "task_first"] = "row_first",
    instructions: Instructions | None = None,
) -> tuple[Message, ...]:
    """The chat for one judge call: the system message, then the user message.

    Parameters
    ----------
    row : dict
        Canonical values of one input row (``contexts``, ``question``, ``answer``).
    task : str or Task
        The metric-specific part. A str is a ``row_first`` task (instructions, extra
        inputs, reply format); a :class:`Task` serves every layout.
    layout : {"row_first", "instructions_first", "task_first"}
        ``row_first`` puts :func:`shared_block` first and the whole task last, after
        :data:`SYSTEM_PROMPT`; ``instructions_first`` puts the stage's instruction sets
        in the system message and only the ask after the shared block; ``task_first``
        (the task before the shared block) only serves the prefix-cache benchmark.
    instructions : Instructions, optional
        The stage's instruction sets (``instructions_first``); by default a block of
        ``task``'s own set alone.

    Returns
    -------
    tuple of Message
        ``(system, user)``.

    Raises
    ------
    ValueError
        An unknown layout; ``instructions_first`` with a str task; a task whose
        instructions are not in ``instructions``.
    """
    if layout == "instructions_first":
        if not isinstance(task, Task):
            raise ValueError("the instructions_first layout needs a Task, not a task text")
        if instructions is None:
            instructions = Instructions.of([(task.name, task.instructions)])
        ask = f'Follow the instructions "{instructions.heading(task)}".'
        if task.ask.strip():
            ask += f"\n\n{task.ask.strip()}"
        user = f"{shared_block(row, reference=True)}\n\n## Task\n{ask}"
        return (Message("system", instructions.system()), Message("user", user))
    text = (task.text if isinstance(task, Task) else task).strip()
    block = shared_block(row)
    if layout == "row_first":
        user = f"{block}\n\n## Task\n{text}"
    elif layout == "task_first":
        user = f"## Task\n{text}\n\n{block}"
    else:
        raise ValueError(f"unknown prompt layout {layout!r}")
    return (Message("system", SYSTEM_PROMPT), Message("user", user))
