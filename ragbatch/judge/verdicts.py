"""The verdict step shared by the judge metrics that give one 0/1 verdict per item
(statement, context or point), with or without a reason per verdict.

By default every verdict carries a one-sentence reason written before it, as Ragas asks
for (the reason is the judge's reasoning; only the verdicts are scored and kept in
``details``, the raw reply keeps the reasons). ``reasons: false`` in a metric's params
asks for the bare verdicts, ``{"verdicts": [1, 0, ...]}``, as Tonic Validate asks for a
bare true/false: the verdict step's reply shrinks from a sentence per item to a few
tokens (the statement steps of the two-step metrics are unchanged). Whether the judge
agrees with people as well without the reasons depends on the judge; ``ragbatch
calibrate`` measures it.
"""

from __future__ import annotations

import functools
import re
from typing import Any, ClassVar

from pydantic import Field

from ragbatch.judge.aligned import AlignedExamples
from ragbatch.judge.metric import JudgeMetric, ScoreParams
from ragbatch.judge.parse import REASON_MAX_CHARS, parse_verdicts, verdicts_schema
from ragbatch.judge.prompt import Instructions, StepPrompt, build_messages
from ragbatch.judge.protocol import Ask, OutputSpec, VerdictSlots

#: ``max_tokens`` per verdict with its reason: a reason of ``REASON_MAX_CHARS`` (about 3
#: characters a token) plus the item's keys. (Faithfulness keeps its own, slightly
#: smaller budget, :data:`ragbatch.judge.parse.VERDICT_MAX_TOKENS`.)
REASONED_VERDICT_MAX_TOKENS = REASON_MAX_CHARS // 3 + 28
#: ``max_tokens`` per bare verdict. In compact JSON a verdict is a digit and a comma, a
#: token each in common tokenizers; the rest is room for a tokenizer that spells them
#: out byte by byte. Compact JSON is what vLLM engines produce by default
#: (``disable_any_whitespace``); a server that allows whitespace runs may need more.
BARE_VERDICT_MAX_TOKENS = 4
#: ``max_tokens`` for the reply's keys and brackets.
REPLY_OVERHEAD_TOKENS = 16

#: The two parts of a verdict task template that ask for reasons, and what replaces them
#: (templates are ``str.format`` strings, so the JSON's braces are doubled).
_REASON_SENTENCE = re.compile(r",\s+each\s+with\s+a\s+one-sentence\s+reason\.")
_REASON_FORMAT = '{{"verdicts": [{{"reason": "...", "verdict": 0 or 1}}, ...]}}'
_BARE_FORMAT = '{{"verdicts": [0 or 1, ...]}}'

#: How a reasoned verdict step's task asks for its reply, up to what ends it (``"."``, or
#: which item comes first): a ``str.format`` template taking ``{n}``.
VERDICTS_TASK_REPLY = "Reply with JSON: " + _REASON_FORMAT + " with exactly\n{n} items"
#: The same in the ``instructions_first`` layout's instructions (plain text), up to what
#: each item is for (``" statement."``, ...).
VERDICTS_INSTRUCTIONS_REPLY = (
    'Reply with JSON: {"verdicts": [{"reason": "...", "verdict": 0 or 1}, ...]}, one item per'
)


#: Where a :func:`~ragbatch.judge.parse.verdicts_schema` reply holds its 0/1 verdicts,
#: with and without reasons.
REASONED_SLOTS = VerdictSlots((("0", 0.0), ("1", 1.0)), key="verdict")
BARE_SLOTS = VerdictSlots((("0", 0.0), ("1", 1.0)), key="verdicts", items=True)


class VerdictParams(ScoreParams):
    """Params of the metrics that judge item by item with 0/1 verdicts."""

    reasons: bool = Field(
        True,
        description=(
            "ask for a one-sentence reason before each verdict (true, the default), or for "
            "the bare 0/1 verdicts (false: far fewer reply tokens; check the judge's "
            "agreement with `ragbatch calibrate`)"
        ),
    )


class VerdictMetric(JudgeMetric):
    """A judge metric whose (last) step asks for one 0/1 verdict per item; takes
    :class:`VerdictParams` and builds that step with :meth:`verdicts_ask`.

    A subclass lists the prompts of its verdict steps in :attr:`verdict_prompts`; each
    is checked when the class is defined, so a prompt that cannot be rewritten for bare
    verdicts fails at import (ValueError), not row by row in a run.
    """

    Params = VerdictParams
    verdict_prompts: ClassVar[tuple[StepPrompt, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for step in cls.verdict_prompts:
            bare_verdicts_step(step)

    @property
    def reasons(self) -> bool:
        """The ``reasons`` param."""
        return bool(self.params.reasons)  # type: ignore[attr-defined]

    def cache_identity(self) -> dict[str, Any]:
        """As :meth:`JudgeMetric.cache_identity`, leaving ``reasons`` out while it is
        the default, so that judgments cached before the param existed (made with the
        same prompts) still match."""
        identity = super().cache_identity()
        if self.reasons:
            identity["params"] = {k: v for k, v in identity["params"].items() if k != "reasons"}
        return identity

    def step_prompt(self, step: StepPrompt) -> StepPrompt:
        """``step``, rewritten for bare verdicts (:func:`bare_verdicts_step`) when it is
        one of :attr:`verdict_prompts` and ``reasons`` is false."""
        if not self.reasons and step in self.verdict_prompts:
            return bare_verdicts_step(step)
        return step

    def step_prompts(self) -> tuple[StepPrompt, ...]:
        return tuple(self.step_prompt(p) for p in self.prompts)

    def verdicts_ask(
        self,
        row: dict[str, Any],
        template: StepPrompt,
        n: int,
        *,
        max_tokens_per_verdict: int,
        step: str = "verdicts",
        **fields: str,
    ) -> Ask:
        """:func:`verdicts_ask` with this metric's ``reasons``, layout and instructions."""
        return verdicts_ask(
            row,
            template,
            n,
            reasons=self.reasons,
            max_tokens_per_verdict=max_tokens_per_verdict,
            step=step,
            layout=self.prompt_layout,
            instructions=self.instructions(),
            examples=self.step_examples(template),
            **fields,
        )


@functools.lru_cache(maxsize=64)
def bare_verdicts_template(template: str) -> str:
    """A verdict task template of this package rewritten to ask for bare verdicts: its
    ``, each with a one-sentence reason.`` clause becomes ``.`` and its reply format
    ``{"verdicts": [0 or 1, ...]}``. The template is rewritten before any row's text is
    put in, so nothing a row holds can be taken for these parts.

    Raises
    ------
    ValueError
        ``template`` does not hold each of the two parts exactly once (a task whose
        wording changed must be updated here too).
    """
    text, sentences = _REASON_SENTENCE.subn(".", template)
    formats = text.count(_REASON_FORMAT)
    if sentences != 1 or formats != 1:
        raise ValueError(
            f"a verdict task must ask for reasons once in words and once in "
            f"its reply format; found {sentences} and {formats}"
        )
    return text.replace(_REASON_FORMAT, _BARE_FORMAT)


@functools.lru_cache(maxsize=64)
def bare_verdicts_step(step: StepPrompt) -> StepPrompt:
    """A verdict step's prompt rewritten to ask for bare verdicts in both layouts: its
    ``task`` by :func:`bare_verdicts_template`, its ``instructions`` (plain text, which
    hold the reply format in that layout) losing the reason clause and taking the bare
    reply format ``{"verdicts": [0 or 1, ...]}``.

    Raises
    ------
    ValueError
        The task cannot be rewritten, or the instructions do not hold the reason clause
        and the reply format once each.
    """
    instructions, sentences = _REASON_SENTENCE.subn(".", step.instructions)
    reasoned, bare = _REASON_FORMAT.format(), _BARE_FORMAT.format()
    formats = instructions.count(reasoned)
    if sentences != 1 or formats != 1:
        raise ValueError(
            f"{step.name}: a verdict step's instructions must ask for reasons once in words "
            f"and once in their reply format; found {sentences} and {formats}"
        )
    return StepPrompt(
        step.name,
        bare_verdicts_template(step.task),
        instructions.replace(reasoned, bare),
        step.ask,
    )


def verdicts_ask(
    row: dict[str, Any],
    template: str | StepPrompt,
    n: int,
    *,
    reasons: bool,
    max_tokens_per_verdict: int,
    step: str = "verdicts",
    layout: str = "row_first",
    instructions: Instructions | None = None,
    examples: AlignedExamples | None = None,
    **fields: str,
) -> Ask:
    """The judge request for ``n`` verdicts on ``row``.

    Parameters
    ----------
    row : dict
        The canonical values of the row (for the shared prompt block).
    template : str or StepPrompt
        The metric's verdict step, written with reasons: a ``row_first`` task template,
        or the step's prompt for both layouts; rewritten for bare verdicts
        (:func:`bare_verdicts_template`, :func:`bare_verdicts_step`) when ``reasons`` is
        false, then filled with ``n`` and ``fields``.
    n : int
        Verdicts asked for (1 or more).
    reasons : bool
        Reasons before the verdicts (the metric's ``reasons`` param).
    max_tokens_per_verdict : int
        The metric's reply budget per verdict with a reason; bare verdicts get
        :data:`BARE_VERDICT_MAX_TOKENS` each.
    step : str
        The step's name (in the judge bookkeeping).
    layout : {"row_first", "instructions_first"}
        The prompt layout (:func:`~ragbatch.judge.prompt.build_messages`);
        ``instructions_first`` needs a :class:`StepPrompt`.
    instructions : Instructions, optional
        The stage's instruction sets (``instructions_first``); by default the step's own.
    examples : AlignedExamples, optional
        Worked examples shown ahead of the task (:meth:`AlignedExamples.task`; the
        metric's ``examples_file`` for its first step).
    **fields : str
        The template's other fields (``statements``, ``reference``...).

    Raises
    ------
    ValueError
        ``reasons`` is false and ``template`` cannot be rewritten
        (:func:`bare_verdicts_template`); ``instructions_first`` with a str template.

    Returns
    -------
    Ask
        Structured output :func:`~ragbatch.judge.parse.verdicts_schema` ``(n, reasons)``,
        ``max_tokens`` :data:`REPLY_OVERHEAD_TOKENS` plus ``n`` times the per-verdict
        budget; the parsed result is the list of ``n`` verdicts (int 0 or 1). The
        verdicts' places (:data:`REASONED_SLOTS` or :data:`BARE_SLOTS`) go with it, so
        their token logprobs are asked for.
    """
    if isinstance(template, StepPrompt):
        prompt = template if reasons else bare_verdicts_step(template)
        filled = prompt.fill(n=n, **fields)
        messages = build_messages(
            row,
            filled if examples is None else examples.task(filled),
            "instructions_first" if layout == "instructions_first" else "row_first",
            instructions,
        )
    else:
        if layout == "instructions_first":
            raise ValueError("the instructions_first layout needs a StepPrompt, not a template")
        task = (template if reasons else bare_verdicts_template(template)).format(n=n, **fields)
        messages = build_messages(row, task if examples is None else examples.ahead_of(task))
    per_item = max_tokens_per_verdict if reasons else BARE_VERDICT_MAX_TOKENS
    return Ask(
        messages,
        OutputSpec.of_schema(
            verdicts_schema(n, reasons), max_tokens=REPLY_OVERHEAD_TOKENS + per_item * n
        ),
        lambda text: parse_verdicts(text, n, reasons),
        step=step,
        verdicts=REASONED_SLOTS if reasons else BARE_SLOTS,
    )
