"""``answer_relevancy``: how closely questions written from the answer match the real question."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from pydantic import Field

from ragbatch.core.columns import ANSWER, CONTEXTS, QUESTION
from ragbatch.core.engine_registry import EnginesProviding
from ragbatch.judge.policy import SHARED_BLOCK, failure_policy
from ragbatch.judge.health import HealthFields
from ragbatch.judge.metric import Embed, JudgeExample, JudgeMetric, JudgeParams, Program
from ragbatch.judge.parse import parse_json
from ragbatch.judge.prompt import StepPrompt
from ragbatch.judge.protocol import Ask, OutputSpec, ParseError
from ragbatch.scoring.cells import Guard, PyCell, blank, missing
from ragbatch.scoring.registry import register
from ragbatch.core.status import MISSING_INPUT

#: Longest generated question, in characters.
QUESTION_MAX_CHARS = 300

TASK = """\
Write {n} questions to which the answer above would be a fitting reply, working from the
answer alone: each question asks for the information the answer gives. Do not copy or
rephrase the question shown above; derive the questions from the answer's content.
Write them as a user would ask them, one question per item, each different from the
others.

Also decide whether the answer is noncommittal: 1 when it evades or declines to answer
("I don't know", "I'm not sure", "it depends" with nothing definite), 0 when it commits
to an answer.

Reply with JSON: {{"noncommittal": 0 or 1, "questions": ["...", ...]}} with exactly {n}
questions."""

#: The ``instructions_first`` layout's instruction set of this step (plain text).
INSTRUCTIONS = """\
Write as many questions as the task asks for, to which the answer would be a fitting
reply, working from the answer alone: each question asks for the information the answer
gives. Do not copy or rephrase the question the user asked; derive the questions from
the answer's content. Write them as a user would ask them, one question per item, each
different from the others.

Also decide whether the answer is noncommittal: 1 when it evades or declines to answer
("I don't know", "I'm not sure", "it depends" with nothing definite), 0 when it commits
to an answer.

Reply with JSON: {"noncommittal": 0 or 1, "questions": ["...", ...]}"""

#: The ``instructions_first`` layout's ask of this step.
ASK = "Write {n} questions."

PROMPT = StepPrompt("answer_relevancy", TASK, INSTRUCTIONS, ASK)


class AnswerRelevancyParams(JudgeParams):
    """Params of ``answer_relevancy``."""

    embedder: str = Field(
        "default_embedding",
        description="name of the embedding engine under `engines` that embeds the questions "
        "(the packaged all-MiniLM-L6-v2 when `default_embedding` is not defined)",
    )
    n_questions: int = Field(
        3,
        ge=1,
        le=10,
        description="how many questions the judge writes from the answer",
    )


def questions_schema(n: int) -> dict[str, Any]:
    """``{"noncommittal": 0 | 1, "questions": [str, ...]}`` with exactly ``n`` questions."""
    return {
        "type": "object",
        "properties": {
            "noncommittal": {"type": "integer", "enum": [0, 1]},
            "questions": {
                "type": "array",
                "items": {"type": "string", "minLength": 1, "maxLength": QUESTION_MAX_CHARS},
                "minItems": n,
                "maxItems": n,
            },
        },
        "required": ["noncommittal", "questions"],
        "additionalProperties": False,
    }


def parse_questions(text: str, n: int) -> tuple[list[str], bool]:
    """``(questions, noncommittal)`` of a :func:`questions_schema` reply.

    Raises
    ------
    ParseError
        Not JSON, not of the schema's shape (a number of questions other than ``n``, a
        blank question, a noncommittal flag other than 0 or 1).
    """
    value = parse_json(text, questions_schema(n))
    questions = [q.strip() for q in value["questions"]]
    if not all(questions):
        raise ParseError("a generated question is blank")
    return questions, bool(value["noncommittal"])


def mean_cosine(vectors: np.ndarray) -> tuple[float, list[float]]:
    """Mean cosine of rows ``1..`` to row ``0`` of ``vectors`` (rows are normalised
    again, so a small drift from unit length does not matter), and the cosines."""
    v = np.asarray(vectors, dtype=np.float64)
    if v.ndim != 2 or v.shape[0] < 2:
        raise ValueError(f"expected an embedding matrix with at least 2 rows, got shape {v.shape}")
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    v = v / np.maximum(norms, 1e-12)
    cosines = v[1:] @ v[0]
    return float(cosines.mean()), [float(c) for c in cosines]


@register
class AnswerRelevancy(JudgeMetric):
    """Relevancy of the answer to the question, in [0, 1].

    One judge step and one embedding step per row: the judge writes ``n_questions``
    questions that the answer would reply to and flags a noncommittal answer; the real
    question and the generated ones are embedded by the ``embedder`` engine, and the
    score is the mean cosine similarity of the generated questions to the real one,
    clipped to [0, 1]. A noncommittal answer scores 0.0. ``details`` holds the
    questions, the cosines and the raw (unclipped) mean.

    Parameters
    ----------
    embedder : str
        Embedding engine name under ``engines`` (default ``default_embedding``).
    n_questions : int
        Questions to generate, 1 to 10 (default 3).

    Notes
    -----
    Source: Ragas ``answer_relevancy`` (Es et al., "RAGAS: Automated Evaluation of
    Retrieval Augmented Generation", 2023, section 3; the noncommittal rule follows the
    Ragas docs). The shared prompt block shows the real question to the judge; the task
    tells it to work from the answer only. Cost: one judge call and one embedding call
    of ``n_questions + 1`` texts per row (none for the embedding when noncommittal).
    """

    name: ClassVar[str] = "answer_relevancy"
    prompts: ClassVar[tuple[StepPrompt, ...]] = (PROMPT,)
    health: ClassVar[HealthFields] = HealthFields(
        extraction="questions", extraction_void="noncommittal"
    )
    second_engine_types: ClassVar[tuple[str, ...]] = EnginesProviding("embed")  # type: ignore[assignment]
    version: ClassVar[int] = 1
    inputs: ClassVar[tuple[str, ...]] = (QUESTION, ANSWER)
    Params = AnswerRelevancyParams
    boolean: ClassVar[bool] = False
    summary: ClassVar[str] = (
        "Mean cosine similarity of questions generated from the answer to "
        "the real question; 0 when the answer is noncommittal"
    )
    source: ClassVar[str] = "Ragas answer_relevancy (Es et al. 2023, RAGAS, section 3; Ragas docs)"
    policy: ClassVar[tuple[tuple[str, str], ...]] = (
        ("question or answer is null", "missing_input"),
        ("question empty or only whitespace", "missing_input; reason 'question is empty'"),
        ("answer empty or only whitespace", "missing_input; reason 'answer is empty'"),
        ("contexts null or an empty list", "not read: relevancy compares answer and question only"),
        (
            "answer is noncommittal (a refusal, 'I don't know')",
            "score 0.0; reason 'the answer "
            "is noncommittal' (the Ragas rule; a measured 0, with the judge's flag in details)",
        ),
        ("reference is null", "not read: the metric does not use the reference"),
        (
            "a context chunk is junk (markup, boilerplate)",
            "no effect: the questions come from "
            "the answer (the contexts stay in the shared prompt block)",
        ),
        *failure_policy(
            "question count differs from n_questions, a flag other than 0/1, or a reply cut at "
            "max_tokens",
            SHARED_BLOCK,
        ),
        ("embedding engine fails or returns the wrong number of rows", "error, with the exception"),
    )
    judge_examples: ClassVar[tuple[JudgeExample, ...]] = (
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land on the Moon?",
                CONTEXTS: ["Apollo 11 landed on 20 July 1969."],
                ANSWER: "Apollo 11 landed on the Moon on 20 July 1969.",
            },
            replies=(
                '{"noncommittal": 0, "questions": ["When did Apollo 11 land on the Moon?", '
                '"What date was the Apollo 11 Moon landing?", "Which mission landed on the '
                'Moon on 20 July 1969?"]}',
            ),
            embeddings=([[1.0, 0.0], [1.0, 0.0], [0.8, 0.6], [0.6, 0.8]],),
            score=0.8,
            note="cosines 1.0, 0.8 and 0.6 to the real question",
        ),
        JudgeExample(
            inputs={
                QUESTION: "When did Apollo 11 land on the Moon?",
                ANSWER: "I'm not sure; it depends on what you mean.",
            },
            replies=('{"noncommittal": 1, "questions": ["What does it depend on?"]}',),
            params={"n_questions": 1},
            score=0.0,
            note="noncommittal: 0 without embedding (Ragas)",
        ),
        JudgeExample(
            inputs={QUESTION: "When did Apollo 11 land?", ANSWER: "In 1969."},
            replies=('{"noncommittal": 0, "questions": ["In which year did Apollo 11 land?"]}',),
            params={"n_questions": 1},
            embeddings=([[1.0, 0.0], [-0.6, 0.8]],),
            score=0.0,
            note="a negative mean cosine (-0.6) clips to 0",
        ),
        JudgeExample(
            inputs={QUESTION: "When did Apollo 11 land?", ANSWER: ""},
            replies=(),
            score=None,
            status=MISSING_INPUT,
            note="blank answer: no judge call",
        ),
        JudgeExample(
            inputs={QUESTION: "When did Apollo 11 land?", ANSWER: "In 1969."},
            replies=(
                '{"noncommittal": 0, "questions": ["When did Apollo 11 land?"]}',
                '{"noncommittal": 0, "questions": ["When did it land?", "Which year?"]}',
            ),
            score=None,
            status="parse_failure",
            note="one question, then two, where three are asked for",
        ),
    )

    def guards(self) -> tuple[Guard, ...]:
        return (missing(QUESTION), missing(ANSWER), blank(QUESTION), blank(ANSWER))

    def embedders(self) -> tuple[str, ...]:
        return (self.params.embedder,)

    def program(self, row: dict[str, Any]) -> Program:
        n = self.params.n_questions
        [(questions, noncommittal)] = yield [
            Ask(
                self.messages(row, PROMPT, n=n),
                OutputSpec.of_schema(
                    questions_schema(n), max_tokens=n * (QUESTION_MAX_CHARS // 3 + 8) + 24
                ),
                lambda text: parse_questions(text, n),
                step="questions",
            )
        ]
        if noncommittal:
            return PyCell(
                0.0,
                reason="the answer is noncommittal",
                details={"questions": questions, "noncommittal": True},
            )
        [vectors] = yield [Embed((row[QUESTION], *questions), self.params.embedder)]
        if len(vectors) != n + 1:
            raise ValueError(f"expected {n + 1} embeddings, got {len(vectors)}")
        mean, cosines = mean_cosine(vectors)
        score = min(max(mean, 0.0), 1.0)
        return PyCell(
            score,
            details={
                "questions": questions,
                "noncommittal": False,
                "cosines": cosines,
                "mean_cosine": mean,
            },
        )
