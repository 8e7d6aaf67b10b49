"""``ragbatch run CONFIG --dry-run``: what a run would do and cost, without running it.

A dry run validates the config and the input like ``ragbatch validate``, then reports
the plan: the stages in order with their metrics; for each actor stage its pool
(concurrency) and per-actor resources; the input's row count; and for each judge stage,
per metric and in total, the judge calls, prompt tokens and a completion-token bound,
estimated on a sample of the input (:mod:`ragbatch.judge.estimate`) and scaled to the
whole input. It starts no Ray (no tasks, no actors), loads no model weights and writes
nothing: it reads the input sample, the judges' tokenizers, and the judgment cache when
one exists (an ``openai`` judge's server is asked for its model card only then, to build
cache keys).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ragbatch.config.job import JobConfig
from ragbatch.io.sample import InputSize
from ragbatch.judge.estimate import MetricEstimate
from ragbatch.core.stages import StageKind

#: Rows sampled by default.
DEFAULT_SAMPLE_ROWS = 200


@dataclass
class StagePlan:
    """One stage of the pipeline as a run would start it.

    Attributes
    ----------
    name : str
        ``read``, ``expressions``, ``<kind>:<engine>`` or ``write``.
    kind : str
        ``read``, ``expression``, ``model``, ``pii``, ``judge`` or ``write``.
    metrics : list of str
        Metric ids scored in the stage.
    engine : str or None
        Engine name and type, for actor stages.
    actors : str or None
        The actor pool: ``"2 (fixed)"`` or ``"1..4 (autoscaling)"``; None for stages
        that run as Ray tasks.
    resources : dict
        Per actor: ``num_cpus``, ``num_gpus``, ``batch_size``, and when the engine spec
        has them ``accelerator_type``, ``resources`` (custom resources) and
        ``tensor_parallel_size``.
    notes : list of str
        Anything else worth knowing (read tasks, embedders loaded in each actor).
    """

    name: str
    kind: str
    metrics: list[str] = field(default_factory=list)
    engine: str | None = None
    actors: str | None = None
    resources: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PilotSpend:
    """The real judge calls a pilot made (``ragbatch run --dry-run --pilot-rows N``).

    Attributes
    ----------
    rows : int
        Rows piloted per multi-step metric (at most this many).
    calls, prompt_tokens, completion_tokens : int
        Requests sent and their tokens as the engine reported them.
    """

    rows: int
    calls: int
    prompt_tokens: int
    completion_tokens: int


@dataclass
class JudgeStageEstimate:
    """The judge estimate of one judge engine.

    Attributes
    ----------
    engine : str
    token_counter : str
        ``tokenizer`` (exact counts) or ``chars/4`` (approximate).
    token_source : str
        The tokenizer used, or why there is none.
    window : int or None
        The model's window in tokens; ``window_source`` says where it comes from.
    cache_note : str
        What the judgment-cache lookup did.
    parse_retries : int
        The engine's ``parse_retries`` (not included in the estimate).
    metrics : list of MetricEstimate
        Counts for the sample; multiply by :attr:`DryRun.scale` for the whole input.
    pilot : PilotSpend or None
        What the pilot sent to this judge (``--pilot-rows``); None without a pilot or
        when no metric of the stage has more than one step.
    """

    engine: str
    token_counter: str
    token_source: str
    window: int | None
    window_source: str
    cache_note: str
    parse_retries: int
    metrics: list[MetricEstimate]
    pilot: "PilotSpend | None" = None

    def total(self, key: str) -> int:
        """Sum of ``key`` over the metrics' steps, for the sample."""
        return sum(m.total(key) for m in self.metrics)


@dataclass
class DryRun:
    """Everything a dry run found.

    Attributes
    ----------
    config : JobConfig
    read_tasks : int
    input_size : InputSize
    sample_rows : int
        Rows actually sampled (fewer than asked when the input is smaller).
    stages : list of StagePlan
        In the order the run chains them.
    judges : list of JudgeStageEstimate
        One per judge stage.
    """

    config: JobConfig
    read_tasks: int
    input_size: InputSize
    sample_rows: int
    stages: list[StagePlan]
    judges: list[JudgeStageEstimate]

    @property
    def scale(self) -> float:
        """Input rows per sampled row (1.0 when the sample is the whole input)."""
        return self.input_size.rows / self.sample_rows if self.sample_rows else 0.0

    def scaled(self, sample_value: int) -> int:
        """``sample_value`` scaled to the whole input, rounded."""
        return round(sample_value * self.scale)


def dry_run(
    config: JobConfig,
    sample_rows: int = DEFAULT_SAMPLE_ROWS,
    pilot_rows: int = 0,
    address: str | None = None,
) -> DryRun:
    """Plan a run and estimate its judge cost without running anything.

    Parameters
    ----------
    config : JobConfig
    sample_rows : int
        Rows of the input (its first rows, in read order) the judge estimate is made on;
        at least 1.
    pilot_rows : int
        0 (the default) sends nothing to any judge. Above 0, the first ``pilot_rows``
        sampled rows of each multi-step judge metric get real replies for their earlier
        steps (:mod:`ragbatch.judge.pilot`): the judge engine is loaded in this process
        (a ``vllm`` engine loads its model here) and those calls are paid for.
    address : str, optional
        A Ray cluster (dashboard URL or address): the actor pools are sized for its
        nodes, as a run there would size them. Without one (or when it cannot be
        reached, which a stage note then says), for this machine as a local Ray sees it.

    Returns
    -------
    DryRun

    Raises
    ------
    ConfigError, InputError
        As :func:`ragbatch.pipeline.plan.build_plan` (the checks ``ragbatch validate`` makes).
    EngineError
        With a pilot: the judge engine cannot be loaded.
    ValueError
        ``sample_rows`` is below 1 or ``pilot_rows`` below 0.
    """
    import polars as pl

    from ragbatch.io.sample import sample_input
    from ragbatch.pipeline.plan import build_plan

    if sample_rows < 1:
        raise ValueError(f"--sample-rows must be at least 1, got {sample_rows}")
    if pilot_rows < 0:
        raise ValueError(f"--pilot-rows must be 0 or more, got {pilot_rows}")
    plan = build_plan(config)
    where = _size_pools(plan, address)
    sample = sample_input(plan, sample_rows)
    frame = pl.from_arrow(sample.table) if sample.table.num_rows else pl.DataFrame()
    judges = [
        _judge_estimate(config, stage, frame, pilot_rows)
        for stage in plan.stages
        if stage.kind is StageKind.JUDGE and frame.height
    ]
    return DryRun(
        config,
        len(plan.read_tasks),
        sample.size,
        sample.table.num_rows,
        _stage_plans(plan, where),
        judges,
    )


def _size_pools(plan: Any, address: str | None) -> str:
    """Size the plan's actor pools for the cluster at ``address`` or this machine; the
    words that say for which."""
    from ragbatch.core.errors import ConfigError
    from ragbatch.core.placement import local_nodes, nodes_at

    where = "this machine"
    nodes = None
    if address:
        try:
            nodes = nodes_at(address)
            where = f"the cluster at {address}"
        except ConfigError as exc:
            where = f"this machine (the cluster could not be read: {exc.problems[0]})"
    plan.size_pools(nodes if nodes is not None else local_nodes(without_ray=True))
    return where


def _judge_estimate(
    config: JobConfig, stage: Any, frame: Any, pilot_rows: int
) -> JudgeStageEstimate:
    from ragbatch.judge.cache_probe import probe_cache
    from ragbatch.judge.estimate import estimate_stage, judge_window
    from ragbatch.judge.tokens import prompt_counter

    spec = stage.engine
    counter = prompt_counter(spec)
    probe = probe_cache(config, stage.engine_name, spec, stage.metrics)
    window, window_source = judge_window(spec)
    pilot = _pilot(stage, pilot_rows)
    try:
        metrics = estimate_stage(stage.metrics, spec, frame, counter, probe, window, pilot)
    finally:
        if pilot is not None:
            pilot.engine.close()
    spend = (
        PilotSpend(pilot.rows, pilot.calls, pilot.prompt_tokens, pilot.completion_tokens)
        if pilot is not None
        else None
    )
    return JudgeStageEstimate(
        stage.engine_name,
        counter.method,
        counter.source,
        window,
        window_source,
        probe.note,
        spec.parse_retries,
        metrics,
        spend,
    )


def _pilot(stage: Any, pilot_rows: int) -> Any:
    """A pilot on the stage's judge engine, or None when not asked for or not needed."""
    if pilot_rows == 0 or all(m.judge_steps == 1 for m in stage.metrics):
        return None
    from ragbatch.engines import load_judge_engine
    from ragbatch.core.errors import EngineError
    from ragbatch.judge.pilot import Pilot

    spec = stage.engine
    try:
        engine = load_judge_engine(spec)
    except EngineError as exc:
        raise EngineError(
            f"engines.{stage.engine_name}: --pilot-rows needs the judge: {exc}"
        ) from exc
    return Pilot(engine, pilot_rows, seed=spec.seed, max_tokens=spec.max_tokens)


def _stage_plans(plan: Any, where: str = "this machine") -> list[StagePlan]:
    out = [
        StagePlan(
            "read",
            "read",
            notes=[
                f"{len(plan.read_tasks)} read task(s) as Ray tasks, normalized to the canonical columns"
            ],
        )
    ]
    for stage in plan.stages:
        metrics = [m.id for m in stage.metrics]
        if stage.engine is None:
            out.append(
                StagePlan(
                    stage.name,
                    str(stage.kind),
                    metrics,
                    notes=["Ray tasks, no actors (one Polars pass per batch)"],
                )
            )
            continue
        spec = stage.engine
        item = StagePlan(
            stage.name,
            str(stage.kind),
            metrics,
            f"{stage.engine_name} ({spec.type})",
            _actors(spec.concurrency),
            _resources(spec),
        )
        if stage.pool is not None and stage.pool.chosen:
            item.notes.append(
                f"sized for {where}: {stage.pool.rule} (chosen: {', '.join(stage.pool.chosen)})"
            )
        if stage.kind is StageKind.JUDGE:
            embedders = sorted({n for m in stage.metrics for n in m.embedders()})
            if embedders:
                item.notes.append(
                    f"each actor also loads the embedding engine(s) {', '.join(embedders)}"
                )
        out.append(item)
    out.append(
        StagePlan(
            "write",
            "write",
            notes=[
                f"long scores table, staged under {plan.config.output.uri.rstrip('/')}/_staging/ "
                "and published on commit"
            ],
        )
    )
    return out


def _actors(concurrency: int | tuple[int, int]) -> str:
    if isinstance(concurrency, int):
        return f"{concurrency} (fixed)"
    low, high = concurrency
    return f"{low}..{high} (autoscaling)"


def _resources(spec: Any) -> dict[str, Any]:
    """Per-actor resources of an engine spec; fields a spec may lack are read with a
    default of None and left out when unset."""
    out: dict[str, Any] = {
        "num_cpus": spec.num_cpus,
        "num_gpus": spec.num_gpus,
        "batch_size": spec.batch_size,
    }
    for name in (
        "threads",
        "batches_in_flight",
        "accelerator_type",
        "resources",
        "tensor_parallel_size",
    ):
        value = getattr(spec, name, None)
        if value is not None and value != {}:
            out[name] = value
    return out
