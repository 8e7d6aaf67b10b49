"""The metric stages of a run as Ray Data operations: one builder per stage kind.

Each built-in stage kind's entry in the stage-kind registry (:mod:`ragbatch.core.stages`)
names its builder here as ``"ragbatch.pipeline.stage_builders:<function>"``; a stage kind
added by another distribution names its own. :func:`chain_stages` adds a plan's stages
in order, each through its kind's builder, then the wide-to-long stage. A builder is
``builder(ds, plan, stage, run) -> ds``: ``ds`` the Ray Data dataset so far, ``plan``
the :class:`~ragbatch.pipeline.plan.Plan`, ``stage`` its
:class:`~ragbatch.pipeline.plan.Stage` and ``run`` the run's :class:`StageRun`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace
from typing import Any

from ragbatch.core.columns import ROW_ID
from ragbatch.core.stages import StageKind, stage_type
from ragbatch.judge.metric import JudgeMetric
from ragbatch.pipeline.plan import Plan, Stage

#: An actor stage receives blocks of at most this many of its batches. A read task's block
#: (up to 100,000 rows) would otherwise go whole to one actor: on a slow model that is
#: one call of hours, the other actors of the pool idle beside it and the progress bar
#: still. A few batches a block keep Ray Data's cost per task small against the batches'.
ACTOR_BLOCK_BATCHES = 4


@dataclass(frozen=True)
class StageRun:
    """What a stage builder needs of the run besides the plan.

    Attributes
    ----------
    judge_ledger : Ray actor handle or None
        The judge stages' :class:`udfs.judge.JudgeLedger` (None when no judge stage runs).
    ledger : Ray actor handle or None
        The run's :class:`udfs.ledger.RunLedger` (fault counters, placement).
    run_id : str or None
        Stamps what judge stages write to the judgment cache.
    keep_columns : list of str or None
        The columns the stage passes on besides its cells; None: every column. Set for
        the last actor stage (:func:`chain_stages`), which passes on only what the scores
        table is built from.
    """

    judge_ledger: Any = None
    ledger: Any = None
    run_id: str | None = None
    keep_columns: list[str] | None = None


def chain_stages(ds: Any, plan: Plan, run: StageRun) -> Any:
    """``ds`` through every stage of ``plan`` in order, each added by its stage kind's
    builder (:meth:`ragbatch.core.stages.StageType.build`), then, with judge panels,
    through their combine step (:func:`udfs.panels.combine_panels`), then through the
    wide-to-long stage (:func:`udfs.scores.to_long`).

    Parameters
    ----------
    ds : ray.data.Dataset
        The normalized input rows.
    plan : Plan
        The run's plan.
    run : StageRun
        The ledgers and run id (its ``keep_columns`` is set here, per stage).

    Returns
    -------
    ray.data.Dataset
        The long scores rows (:mod:`udfs.scores`), not yet executed.
    """
    from udfs.scores import to_long

    kinds = [stage_type(stage.kind) for stage in plan.stages]
    last_actor = max((i for i, k in enumerate(kinds) if k.actors), default=-1)
    for i, (stage, kind) in enumerate(zip(plan.stages, kinds)):
        if kind.actors:
            ds = _cache_ordered(ds, plan, stage)
            ds = _actor_sized_blocks(ds, stage.engine.batch_size)
        # The last actor stage passes on only what the scores table is built from.
        keep = _long_table_columns(plan) if i == last_actor else None
        ds = kind.build(ds, plan, stage, replace(run, keep_columns=keep))
    if plan.panels:
        from udfs.panels import combine_panels

        ds = ds.map_batches(
            combine_panels, batch_format="pyarrow", fn_kwargs={"panels": plan.panels}
        )
    return ds.map_batches(
        to_long,
        batch_format="pyarrow",
        fn_kwargs={
            "metric_ids": plan.metric_ids,
            "slices": plan.slice_names,
            "judges": plan.member_judges,
        },
    )


def _long_table_columns(plan: Plan) -> list[str]:
    """The columns :func:`udfs.scores.to_long` reads besides the pipeline's own (cells,
    judge fields): ``row_id`` and the slice columns."""
    return [ROW_ID, *plan.slice_names]


def _cache_ordered(ds: Any, plan: Plan, stage: Stage) -> Any:
    """Before a judge stage with the judgment cache on, each block's rows sorted by the
    cache bucket of their group (:func:`udfs.cache_order.order_by_cache_bucket`), so that
    a batch's lookup reads a few bucket files instead of dozens. Left as it is for other
    stages, without a cache, or when the engine's identity cannot be worked out without
    loading it (an engine type without an ``identities`` hook, a server that cannot be
    reached): the order only saves requests."""
    from ragbatch.core.engine_registry import engine_of
    from ragbatch.judge.cache_probe import engine_identities

    if stage.kind is not StageKind.JUDGE or not plan.config.cache.enabled:
        return ds
    if engine_of(stage.engine).identities is None:
        return ds
    identities, _ = engine_identities(str(stage.engine_name), stage.engine)
    if not identities:
        return ds
    from udfs.cache_order import order_by_cache_bucket

    first = identities[0]
    return ds.map_batches(
        order_by_cache_bucket,
        batch_format="pyarrow",
        batch_size=None,
        fn_kwargs={"model_id": first.model_id, "sampling": first.sampling_key()},
    )


def _actor_sized_blocks(ds: Any, batch_size: int) -> Any:
    """``ds`` cut into blocks of at most ``ACTOR_BLOCK_BATCHES * batch_size`` rows (Ray
    Data's streaming repartition; smaller blocks pass as they are, or are joined up to
    that size). Ray Data versions without it return ``ds`` unchanged."""
    if "target_num_rows_per_block" not in inspect.signature(ds.repartition).parameters:
        return ds
    return ds.repartition(target_num_rows_per_block=ACTOR_BLOCK_BATCHES * batch_size)


def _actor_stage(ds: Any, stage: Stage, cls: type, **kwargs: Any) -> Any:
    """``ds`` through an actor pool of ``cls`` (an :class:`udfs.base.ActorStage`) for
    ``stage``, handed the stage's built metrics (pickled with its constructor
    arguments) and ``kwargs`` (``keep_columns`` among them)."""
    from udfs.base import stage_options

    spec = stage.engine.model_dump(mode="json")
    return ds.map_batches(
        cls,
        batch_format="pyarrow",
        fn_constructor_kwargs={
            "engine_name": stage.engine_name,
            "engine_spec": spec,
            "metrics": list(stage.metrics),
            **kwargs,
        },
        **stage_options(spec),
    )


def expression_stage(ds: Any, plan: Plan, stage: Stage, run: StageRun) -> Any:
    """Every expression metric in one Polars pass per batch, as Ray tasks
    (:func:`udfs.expressions.expression_stage`)."""
    from udfs.expressions import expression_stage as score_expressions

    return ds.map_batches(
        score_expressions, batch_format="pyarrow", fn_kwargs={"metrics": stage.metrics}
    )


def model_stage(ds: Any, plan: Plan, stage: Stage, run: StageRun) -> Any:
    """The model metrics of one embedding or cross-encoder engine, as an actor pool
    (:class:`udfs.similarity.ModelStage`)."""
    from udfs.similarity import ModelStage

    return _actor_stage(ds, stage, ModelStage, ledger=run.ledger, keep_columns=run.keep_columns)


def pii_stage(ds: Any, plan: Plan, stage: Stage, run: StageRun) -> Any:
    """The PII metrics of one PII engine, as an actor pool (:class:`udfs.pii.PiiStage`)."""
    from udfs.pii import PiiStage

    return _actor_stage(ds, stage, PiiStage, ledger=run.ledger, keep_columns=run.keep_columns)


def judge_stage(ds: Any, plan: Plan, stage: Stage, run: StageRun) -> Any:
    """The judge metrics of one judge engine, as an actor pool
    (:func:`udfs.judge.judge_stage_class`), with the specs of the embedding engines its
    metrics name and the judgment cache's location."""
    from udfs.judge import judge_stage_class

    embedders = {
        name: plan.engines[name].model_dump(mode="json")
        for m in stage.metrics
        if isinstance(m, JudgeMetric)
        for name in m.embedders()
    }
    cache = None
    if plan.config.cache.enabled:
        uri, options = plan.config.cache_location()
        cache = {
            "uri": uri,
            "storage_options": options,
            "run_id": run.run_id,
            "rejudge": list(plan.config.cache.rejudge or []),
        }
    return _actor_stage(
        ds,
        stage,
        judge_stage_class(stage.engine),
        embedders=embedders,
        cache=cache,
        ledger=run.judge_ledger,
        run_ledger=run.ledger,
        keep_columns=run.keep_columns,
    )
