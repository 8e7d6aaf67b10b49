"""The kinds of metric stage a plan chains, as one enum.

A module of its own, importing nothing from ragbatch, so that the planner, the runner,
the CLI, the manifest and the stages under ``udfs/`` can all use it without import
cycles.
"""

from __future__ import annotations

from enum import Enum


class StageKind(str, Enum):
    """What runs a stage of the pipeline (:class:`ragbatch.pipeline.plan.Stage`).

    A ``str`` enum: each member equals, formats as and serialises to its value
    (``"expression"``, ``"model"``, ``"pii"``, ``"judge"``), the text the manifest,
    the dry-run listing and stage names (``<kind>:<engine>``) show.

    Members
    -------
    EXPRESSION
        All expression metrics, as Ray tasks (:func:`udfs.expressions.expression_stage`).
    MODEL
        The model metrics of one embedding or cross-encoder engine, as an actor pool
        (:class:`udfs.similarity.ModelStage`).
    PII
        The PII metrics of one ``presidio`` engine, as an actor pool
        (:class:`udfs.pii.PiiStage`).
    JUDGE
        The LLM-judge metrics of one judge engine, as an actor pool
        (:class:`udfs.judge.JudgeStage`).
    """

    EXPRESSION = "expression"
    MODEL = "model"
    PII = "pii"
    JUDGE = "judge"

    # What enum.StrEnum (Python 3.11+) does, on Python 3.10 as well: str() and format()
    # give the value, not "StageKind.MODEL".
    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return self.value.__format__(spec)

    @property
    def uses_actors(self) -> bool:
        """True for the stages that run as an actor pool on an engine (all but
        :attr:`EXPRESSION`)."""
        return self is not StageKind.EXPRESSION
