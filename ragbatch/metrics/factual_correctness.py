"""``factual_correctness``: the answer's claims and the reference answer's claims, each
checked against the other text, scored as precision, recall or F1."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from ragbatch.core.columns import ANSWER, CONTEXTS, QUESTION, REFERENCE
from ragbatch.scoring.registry import register
from ragbatch.core.status import MISSING_INPUT, NOT_APPLICABLE
from ragbatch.judge.verdicts import VERDICTS_INSTRUCTIONS_REPLY, VERDICTS_TASK_REPLY
from ragbatch.judge.policy import SHARED_BLOCK, failure_policy
from ragbatch.judge.assumed import assumed_statements
from ragbatch.judge.health import HealthFields
from ragbatch.judge.metric import JudgeExample, Program
from ragbatch.judge.parse import STATEMENTS_MAX_TOKENS
from ragbatch.judge.prompt import StepPrompt, numbered
from ragbatch.judge.protocol import Ask
from ragbatch.judge.statement_verdicts import statements_ask
from ragbatch.judge.verdicts import REASONED_VERDICT_MAX_TOKENS, VerdictMetric, VerdictParams
from ragbatch.metrics import context_recall, faithfulness
from ragbatch.scoring.cells import Guard, PyCell, blank, missing

#: The answer's claims: the statement step of ``faithfulness``, word for word, under its
#: name, so a stage running both metrics shows that instruction set once.
ANSWER_CLAIMS = faithfulness.STATEMENTS
#: The reference answer's claims: the statement step of ``context_recall``, likewise.
REFERENCE_CLAIMS = context_recall.STATEMENTS

ANSWER_VERDICTS_TASK = (
    """\
Reference answer to the question:
{reference}

Below are statements taken from the system's answer. For each one, decide whether the
reference answer supports it. Verdict 1: the reference answer states it or it follows
directly from what the reference answer states. Verdict 0: the reference answer does not
give it, or contradicts it. Judge against the reference answer only: neither the
retrieved contexts nor your own knowledge count. Give one verdict per statement, in the
same order, each with a one-sentence reason.

Statements:
{statements}

"""
    + VERDICTS_TASK_REPLY
    + "."
)

#: The ``instructions_first`` layout's instruction set of this step (plain text).
ANSWER_VERDICTS_INSTRUCTIONS = (
    """\
The task lists statements taken from the system's answer. For each statement, decide
whether the reference answer supports it. Verdict 1: the reference answer states it or
it follows directly from what the reference answer states. Verdict 0: the reference
answer does not give it, or contradicts it. Judge against the reference answer only:
neither the retrieved contexts nor your own knowledge count. Give one verdict per
statement, in the same order, each with a one-sentence reason.

"""
    + VERDICTS_INSTRUCTIONS_REPLY
    + " statement."
)

#: The ``instructions_first`` layout's ask of the two verdict steps: faithfulness's own.
VERDICTS_ASK = faithfulness.VERDICTS_ASK

ANSWER_VERDICTS = StepPrompt(
    "factual_correctness/answer verdicts",
    ANSWER_VERDICTS_TASK,
    ANSWER_VERDICTS_INSTRUCTIONS,
    VERDICTS_ASK,
)

REFERENCE_VERDICTS_TASK = (
    """\
Below are statements taken from the reference answer. For each one, decide whether the
system's answer above supports it. Verdict 1: the answer states it or it follows
directly from what the answer states. Verdict 0: the answer does not give it, or
contradicts it. Judge against the system's answer only: neither the retrieved contexts
nor your own knowledge count. Give one verdict per statement, in the same order, each
with a one-sentence reason.

Statements:
{statements}

"""
    + VERDICTS_TASK_REPLY
    + "."
)

#: The ``instructions_first`` layout's instruction set of this step (plain text).
REFERENCE_VERDICTS_INSTRUCTIONS = (
    """\
The task lists statements taken from the reference answer. For each statement, decide
whether the system's answer supports it. Verdict 1: the answer states it or it follows
directly from what the answer states. Verdict 0: the answer does not give it, or
contradicts it. Judge against the system's answer only: neither the retrieved contexts
nor your own knowledge count. Give one verdict per statement, in the same order, each
with a one-sentence reason.

"""
    + VERDICTS_INSTRUCTIONS_REPLY
    + " statement."
)

REFERENCE_VERDICTS = StepPrompt(
    "factual_correctness/reference verdicts",
    REFERENCE_VERDICTS_TASK,
    REFERENCE_VERDICTS_INSTRUCTIONS,
    VERDICTS_ASK,
)

#: The values of the ``mode`` param.
Mode = Literal["precision", "recall", "f1"]


class FactualCorrectnessParams(VerdictParams):
    """Params of ``factual_correctness``."""

    mode: Mode = Field(
        "f1",
        description=(
            "`precision`: TP / (TP + FP), the share of the answer's claims the reference "
            "supports (two judge calls a row); `recall`: TP / (TP + FN); `f1` (the default, "
            "as Ragas): their harmonic mean. recall and f1 also split the reference into "
            "claims and check them against the answer (four calls a row); the requests "
            "precision makes are among them, so the judgment cache serves them to every mode"
        ),
    )


def counts_score(mode: str, tp: float, fp: float, fn: float) -> float:
    """The score of ``mode`` from the claim counts (or their expectations).

    Parameters
    ----------
    mode : {"precision", "recall", "f1"}
    tp, fp, fn : float
        Answer claims the reference supports, answer claims it does not, reference
        claims the answer does not support (each 0 or more).

    Returns
    -------
    float
        In [0, 1]. A ratio whose numerator TP is 0 is 0.0 even where its denominator is
        0 too (Ragas adds 1e-8 to each denominator, which gives the same 0); F1 is 0.0
        when precision and recall are both 0.
    """
    precision = tp / (tp + fp) if tp > 0 else 0.0
    if mode == "precision":
        return precision
    recall = tp / (tp + fn) if tp > 0 else 0.0
    if mode == "recall":
        return recall
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


@register
class FactualCorrectness(VerdictMetric):
    """Factual correctness of the answer against the reference answer, in [0, 1].

    The judge splits the answer into claims and checks each against the reference
    answer; in ``recall`` and ``f1`` modes it also splits the reference into claims and
    checks each against the answer. With TP the answer's claims the reference supports,
    FP those it does not and FN the reference's claims the answer does not support, the
    score is ``precision = TP / (TP + FP)``, ``recall = TP / (TP + FN)`` or their harmonic
    mean ``f1`` (the ``mode`` param; default ``f1``). ``details`` holds the claims and
    verdicts of each side that was judged and the counts ``tp``, ``fp`` (and ``fn``).

    Judge steps: one extraction step (the answer's claims; in recall and f1 modes the
    reference's claims too, in the same step), then one verdict step (likewise one or
    two requests). The claim prompts are those of ``faithfulness`` (answer) and
    ``context_recall`` (reference). A claim listed twice is counted twice, as in Ragas.
    With ``score: probability`` each count is replaced by its expectation under the
    verdicts' probabilities (TP the sum of p(1) over the answer's verdicts, FN the sum of
    p(0) over the reference's) and the same ratio is taken: a plug-in estimate, not the
    expectation of the ratio.

    Notes
    -----
    Source: Ragas ``FactualCorrectness`` (Ragas docs, "Factual Correctness": TP, FP and FN
    as above, modes precision, recall and f1, f1 the default). As in Ragas, TP comes from
    the answer's side and FN from the reference's, so recall is not the share of the
    reference's claims the answer supports (that share is in ``details``). Differences:
    Ragas's ``beta`` (an F-beta score), ``atomicity`` and ``coverage`` (decomposition
    settings) are not offered; where Ragas scores an answer with no claims 0 in
    precision mode, this metric returns ``not_applicable``, as it does in recall and f1
    modes for a reference with no claims. MLflow's ``Correctness`` judge asks the same
    question of the answer (are the expected facts or the expected response borne out?)
    but gives one yes/no per row; this metric counts claim by claim. Cost: two judge calls
    per row in precision mode, four in recall and f1 (two when a side has no claims).
    """

    Params = FactualCorrectnessParams
    name: ClassVar[str] = "factual_correctness"
    prompts: ClassVar[tuple[StepPrompt, ...]] = (
        ANSWER_CLAIMS,
        REFERENCE_CLAIMS,
        ANSWER_VERDICTS,
        REFERENCE_VERDICTS,
    )
    health: ClassVar[HealthFields] = HealthFields(
        extraction="answer_claims", verdicts="answer_verdicts"
    )
    version: ClassVar[int] = 1
    verdict_prompts: ClassVar[tuple[StepPrompt, ...]] = (ANSWER_VERDICTS, REFERENCE_VERDICTS)
    inputs: ClassVar[tuple[str, ...]] = (ANSWER, REFERENCE)
    boolean: ClassVar[bool] = False
    summary: ClassVar[str] = (
        "F1 (or precision, recall) of the answer's claims against the reference answer's"
    )
    source: ClassVar[str] = "Ragas FactualCorrectness (Ragas docs, Factual Correctness)"
    judge_steps: ClassVar[int] = 2
    policy: ClassVar[tuple[tuple[str, str], ...]] = (
        ("answer or reference is null", "missing_input"),
        ("answer empty or only whitespace", "missing_input; reason 'answer is empty'"),
        ("reference empty or only whitespace", "missing_input; reason 'reference is empty'"),
        ("question is null", "judged: the question is optional and shown as '(not given)'"),
        (
            "contexts null or an empty list",
            "not read: the claims are checked against the answer and the reference only; "
            "the shared prompt block shows '(none)' or '(not given)'",
        ),
        (
            "answer makes no claim (a refusal)",
            "precision: not_applicable, reason 'the answer makes no claims' (nothing to be "
            "precise about; Ragas: 0); recall and f1: 0.0 without a verdict step (TP = 0 "
            "and the reference has claims; Ragas: 0)",
        ),
        (
            "reference makes no claim",
            "recall and f1: not_applicable, reason 'the reference makes no claims' (or "
            "'neither the answer nor the reference makes claims'); precision: not "
            "extracted, so the answer's claims are judged against it as written",
        ),
        (
            "no answer claim supported (TP = 0)",
            "0.0 in every mode, also when no reference claim is missed (Ragas: 0)",
        ),
        (
            "a context chunk is junk (markup, boilerplate)",
            "no effect: the task tells the judge not to use the contexts (they stay in the "
            "shared prompt block)",
        ),
        *failure_policy(
            "verdict count differs from the claim count, or a reply cut at max_tokens",
            SHARED_BLOCK,
        ),
    )
    judge_examples: ClassVar[tuple[JudgeExample, ...]] = (
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                CONTEXTS: ["Apollo 11 landed on the Moon on 20 July 1969."],
                ANSWER: "Apollo 11 landed on 20 July 1969, commanded by Neil Armstrong.",
                REFERENCE: "Apollo 11 landed on the Moon on 20 July 1969.",
            },
            replies=(
                '{"statements": ["Apollo 11 landed on 20 July 1969.", '
                '"Neil Armstrong commanded Apollo 11."]}',
                '{"statements": ["Apollo 11 landed on the Moon.", '
                '"Apollo 11 landed on 20 July 1969."]}',
                '{"verdicts": [{"reason": "The date is stated.", "verdict": 1}, '
                '{"reason": "No commander is named.", "verdict": 0}]}',
                '{"verdicts": [{"reason": "The answer says Apollo 11 landed.", "verdict": 1}, '
                '{"reason": "The date is stated.", "verdict": 1}]}',
            ),
            # TP 1, FP 1, FN 0: precision 1/2, recall 1/1, f1 2 * 0.5 * 1 / 1.5 = 2/3
            score=2 / 3,
            note="f1: one of two answer claims supported, no reference claim missed",
        ),
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land?",
                ANSWER: "Apollo 11 landed on 20 July 1969, commanded by Neil Armstrong.",
                REFERENCE: "Apollo 11 landed on the Moon on 20 July 1969.",
            },
            replies=(
                '{"statements": ["Apollo 11 landed on 20 July 1969.", '
                '"Neil Armstrong commanded Apollo 11."]}',
                '{"verdicts": [{"reason": "The date is stated.", "verdict": 1}, '
                '{"reason": "No commander is named.", "verdict": 0}]}',
            ),
            score=0.5,
            params={"mode": "precision"},
            note="precision: TP 1, FP 1 (the reference is not split; no contexts needed)",
        ),
        JudgeExample(
            inputs={
                QUESTION: "Who wrote Hamlet?",
                ANSWER: "Shakespeare wrote Hamlet.",
                REFERENCE: "William Shakespeare wrote Hamlet around 1600, in London.",
            },
            replies=(
                '{"statements": ["Shakespeare wrote Hamlet."]}',
                '{"statements": ["William Shakespeare wrote Hamlet.", '
                '"Hamlet was written around 1600.", "Hamlet was written in London."]}',
                '{"verdicts": [{"reason": "Stated.", "verdict": 1}]}',
                '{"verdicts": [{"reason": "Stated.", "verdict": 1}, '
                '{"reason": "No year.", "verdict": 0}, {"reason": "No place.", "verdict": 0}]}',
            ),
            # TP 1, FN 2: recall 1/3
            score=1 / 3,
            params={"mode": "recall"},
            note="recall: the answer's one claim holds, two reference claims missed",
        ),
        JudgeExample(
            inputs={
                QUESTION: "Who wrote Hamlet?",
                ANSWER: "Hamlet was written by Marlowe in 1750.",
                REFERENCE: "William Shakespeare wrote Hamlet.",
            },
            replies=(
                '{"statements": ["Marlowe wrote Hamlet.", "Hamlet was written in 1750."]}',
                '{"statements": ["William Shakespeare wrote Hamlet."]}',
                '{"verdicts": [{"reason": "Contradicted.", "verdict": 0}, '
                '{"reason": "No year.", "verdict": 0}]}',
                '{"verdicts": [{"reason": "The answer names Marlowe.", "verdict": 0}]}',
            ),
            score=0.0,
            note="f1: no answer claim supported (TP 0, FP 2, FN 1)",
        ),
        JudgeExample(
            inputs={
                QUESTION: "Who wrote Hamlet?",
                ANSWER: "William Shakespeare wrote Hamlet.",
                REFERENCE: "Hamlet is by William Shakespeare.",
            },
            replies=(
                '{"statements": ["William Shakespeare wrote Hamlet."]}',
                '{"statements": ["William Shakespeare wrote Hamlet."]}',
                '{"verdicts": [1]}',
                '{"verdicts": [1]}',
            ),
            score=1.0,
            params={"reasons": False},
            note="f1, reasons: false: every claim supported on both sides",
        ),
        JudgeExample(
            inputs={
                QUESTION: "Who wrote Hamlet?",
                ANSWER: "I don't know.",
                REFERENCE: "William Shakespeare wrote Hamlet.",
            },
            replies=('{"statements": []}',),
            score=None,
            status=NOT_APPLICABLE,
            params={"mode": "precision"},
            note="precision: a refusal makes no claims",
        ),
        JudgeExample(
            inputs={QUESTION: "Who wrote Hamlet?", ANSWER: "Shakespeare.", REFERENCE: "n/a"},
            replies=('{"statements": ["Shakespeare wrote Hamlet."]}', '{"statements": []}'),
            score=None,
            status=NOT_APPLICABLE,
            note="f1: the reference makes no claims, so nothing is judged",
        ),
        JudgeExample(
            inputs={QUESTION: "Who wrote Hamlet?", ANSWER: "Shakespeare.", REFERENCE: " "},
            replies=(),
            score=None,
            status=MISSING_INPUT,
            note="blank reference: no judge call",
        ),
        JudgeExample(
            inputs={
                QUESTION: "Who wrote Hamlet?",
                ANSWER: "Shakespeare wrote it in 1600.",
                REFERENCE: "William Shakespeare wrote Hamlet.",
            },
            replies=(
                '{"statements": ["Shakespeare wrote Hamlet.", "Hamlet was written in 1600."]}',
                '{"verdicts": [{"reason": "Stated.", "verdict": 1}]}',
                '{"verdicts": [{"reason": "Stated.", "verdict": 1}]}',
            ),
            score=None,
            status="parse_failure",
            params={"mode": "precision"},
            note="one verdict for two claims, twice (first try and the one retry)",
        ),
    )

    @property
    def mode(self) -> str:
        """The ``mode`` param."""
        return str(self.params.mode)  # type: ignore[attr-defined]

    #: ``mode`` decides which requests are made and how the verdicts are counted, not
    #: what any request holds: out of the cache identity, in the calibration identity.
    scoring_params = ("score", "mode")

    def cache_identity(self) -> dict[str, Any]:
        """As :meth:`VerdictMetric.cache_identity`, without ``mode``: a request made in
        one mode is served from the cache in another (a calibration is not:
        :meth:`~ragbatch.judge.metric.JudgeMetric.calibration_identity` keeps it)."""
        identity = super().cache_identity()
        identity["params"] = {k: v for k, v in identity["params"].items() if k != "mode"}
        return identity

    def guards(self) -> tuple[Guard, ...]:
        return (missing(ANSWER), missing(REFERENCE), blank(ANSWER), blank(REFERENCE))

    def assumed_result(self, row: dict[str, Any], ask: Ask) -> Any:
        """Dry runs assume the judge's claims are the sentences of the text split."""
        return assumed_statements(row[REFERENCE] if ask.step == "reference_claims" else row[ANSWER])

    def _claims_ask(self, row: dict[str, Any], side: str) -> Ask:
        if side == "answer":
            messages = self.messages(row, ANSWER_CLAIMS)
        else:
            messages = self.messages(row, REFERENCE_CLAIMS, reference=row[REFERENCE])
        return statements_ask(messages, STATEMENTS_MAX_TOKENS, step=f"{side}_claims")

    def program(self, row: dict[str, Any]) -> Program:
        both = self.mode != "precision"
        asks = [self._claims_ask(row, "answer")]
        if both:
            asks.append(self._claims_ask(row, "reference"))
        claims = yield asks
        answer_claims: list[str] = claims[0]
        details: dict[str, Any] = {"answer_claims": answer_claims}
        if both:
            reference_claims: list[str] = claims[1]
            details["reference_claims"] = reference_claims
            if not reference_claims:
                why = "the reference makes no claims"
                if not answer_claims:
                    why = "neither the answer nor the reference makes claims"
                return PyCell(None, NOT_APPLICABLE, why, details=details)
        if not answer_claims:
            if not both:
                return PyCell(None, NOT_APPLICABLE, "the answer makes no claims", details=details)
            n = len(reference_claims)
            details.update(tp=0, fp=0, fn=n)
            return PyCell(
                0.0,
                reason=f"the answer makes no claims; none of the reference's {n} is stated",
                details=details,
            )
        verdict_asks = [
            self.verdicts_ask(
                row,
                ANSWER_VERDICTS,
                len(answer_claims),
                max_tokens_per_verdict=REASONED_VERDICT_MAX_TOKENS,
                step="answer_verdicts",
                reference=row[REFERENCE],
                statements=numbered(answer_claims),
            )
        ]
        if both:
            verdict_asks.append(
                self.verdicts_ask(
                    row,
                    REFERENCE_VERDICTS,
                    len(reference_claims),
                    max_tokens_per_verdict=REASONED_VERDICT_MAX_TOKENS,
                    step="reference_verdicts",
                    statements=numbered(reference_claims),
                )
            )
        verdicts = yield verdict_asks
        details["answer_verdicts"] = verdicts[0]
        tp = sum(verdicts[0])
        fp = len(answer_claims) - tp
        details.update(tp=tp, fp=fp)
        fn = 0
        if both:
            details["reference_verdicts"] = verdicts[1]
            fn = len(reference_claims) - sum(verdicts[1])
            details["fn"] = fn
        return PyCell(
            counts_score(self.mode, tp, fp, fn),
            reason=_reason(self.mode, tp, fp, fn),
            details=details,
        )

    def expected_score(self, expected: list[float], cell: PyCell) -> float:
        """``score: probability``: the mode's ratio of the expected counts.

        ``expected`` holds p(1) of each answer verdict, then (recall, f1) of each
        reference verdict, in the order of the program's requests; TP is the sum of the
        first, FP the answer's claims less TP, FN the sum of ``1 - p`` of the second.
        """
        n_answer = len((cell.details or {}).get("answer_verdicts", expected))
        tp = sum(expected[:n_answer])
        fn = sum(1.0 - p for p in expected[n_answer:])
        return counts_score(self.mode, tp, n_answer - tp, fn)


def _reason(mode: str, tp: int, fp: int, fn: int) -> str | None:
    """What kept the mode's score below 1 (None at 1): the answer's claims the reference
    does not support (precision, f1), the reference's claims the answer misses (recall,
    f1), or, for recall, that no answer claim is supported (TP = 0)."""
    parts = []
    if fp and mode != "recall":
        parts.append(f"{fp} of {tp + fp} answer claims not supported by the reference")
    if mode == "recall" and tp == 0:
        parts.append("no answer claim supported by the reference")
    if fn and mode != "precision":
        parts.append(f"{fn} reference claims not supported by the answer")
    return "; ".join(parts) or None
