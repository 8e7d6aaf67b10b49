"""What the input readers need of a plan, as a type (no import of the planner).

:class:`ragbatch.pipeline.plan.Plan` satisfies :class:`PlannedInput`; the readers of a planned
input (:mod:`ragbatch.io.sample`, :mod:`ragbatch.io.labels`) are typed against this
protocol so that the input layer does not import the layer that plans a run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ragbatch.config.job import JobConfig
    from ragbatch.io.read import ReadTask


class PlannedInput(Protocol):
    """A run's config, metrics and input as planned (structurally, a ``Plan``).

    Attributes
    ----------
    config : ragbatch.config.job.JobConfig
    metrics : list of ragbatch.scoring.base.Metric
        The run's metrics; readers use ``id`` and ``score_range``.
    read_tasks : list of ReadTask
        The input's read tasks, in read order (set when the input was inspected).
    slices : list of (str, str)
        Pass-through columns as (input name, output name).
    quote_values : bool
        Whether input values may be quoted in messages.
    """

    config: "JobConfig"
    metrics: list[Any]
    read_tasks: list["ReadTask"]
    slices: list[tuple[str, str]]

    @property
    def quote_values(self) -> bool: ...
