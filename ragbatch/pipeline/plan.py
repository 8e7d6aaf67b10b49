"""Turn a validated config into a plan: metrics with params, stages, input tasks.

Everything that can be checked before any metric runs is checked here (metric names and
params, engines, input reachability, mapped columns), and all problems are reported in
one error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
from ragbatch.config.engine_spec import engine_adapter
from ragbatch.config.job import JobConfig
from ragbatch.core.engine_registry import default_engine, engine_of, engines_providing
from ragbatch.core.errors import ConfigError, InputError
from ragbatch.judge.metric import JudgeMetric
from ragbatch.judge.panel import PanelMetric, PanelPlan
from ragbatch.scoring.base import ExpressionMetric, Metric, ModelMetric
from ragbatch.core.placement import Node, StageDemand, accelerator_problems
from ragbatch.core.pool_sizing import PoolChoice
from ragbatch.scoring.registry import get_metric
from ragbatch.core.stages import StageKind, stage_kind, stage_types


@dataclass
class Stage:
    """One pipeline stage: all expression metrics, or the metrics of one engine.

    ``kind`` is a registered stage kind (:mod:`ragbatch.core.stages`): a plain string is
    converted to its :class:`~ragbatch.core.stages.StageKind` member when it is a built-in
    kind (ValueError: not a registered kind)."""

    kind: StageKind | str
    name: str
    metrics: list[Metric]
    engine_name: str | None = None
    engine: Any = None  # validated engine spec (pydantic model) for model stages
    #: How the actor pool was sized (:meth:`Plan.size_pools`); None before, and for the
    #: expression stage.
    pool: PoolChoice | None = None

    def __post_init__(self) -> None:
        self.kind = stage_kind(self.kind)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "stage": self.name,
            "kind": str(self.kind),
            "metrics": [m.id for m in self.metrics],
        }
        if self.engine is not None:
            out["engine"] = self.engine_name
            out["engine_spec"] = self.engine.model_dump(mode="json")
        if self.pool is not None:
            out["pool"] = self.pool.describe()
        return out


@dataclass
class Plan:
    """What a run will do. ``read_tasks``, ``input_schema`` and ``input_fingerprint``
    (:func:`ragbatch.io.read.input_fingerprint` of the files the tasks read, from the
    same listing) are empty when the plan was built without touching the input."""

    config: JobConfig
    metrics: list[Metric]
    stages: list[Stage]
    engines: dict[str, Any]
    read_tasks: list = field(default_factory=list)
    input_schema: pa.Schema | None = None
    input_fingerprint: dict | None = None
    slices: list[tuple[str, str]] = field(default_factory=list)

    @property
    def quote_values(self) -> bool:
        """Whether reasons and normalizer notes may quote input values
        (:func:`quotes_allowed`)."""
        return quotes_allowed(self.metrics)

    @property
    def metric_ids(self) -> list[str]:
        return [m.id for m in self.metrics]

    @property
    def panels(self) -> list[PanelPlan]:
        """The judge panels' combine plans (:mod:`ragbatch.judge.panel`), in config order."""
        return [m.plan() for m in self.metrics if isinstance(m, PanelMetric)]

    @property
    def member_judges(self) -> dict[str, tuple[str, str]]:
        """Member key -> (the panel's metric id, the judge's engine) of every judge of a
        panel: how the scores table names a member's cells (``metric``, ``judge``)."""
        return {
            key: (p.id, judge) for p in self.panels for key, judge in zip(p.member_keys, p.judges)
        }

    @property
    def slice_names(self) -> list[str]:
        """Output names of every column that passes through to the scores table."""
        return [out for _, out in self.slices]

    @property
    def labels(self) -> dict[str, str]:
        """Metric id -> output name of its label column (config ``labels``); empty
        without labels or before the input is inspected."""
        if self.config.labels is None:
            return {}
        names = dict(self.slices)
        return {m: names[c] for m, c in self.config.labels.columns.items() if c in names}

    @property
    def summary_slice_names(self) -> list[str]:
        """The pass-through columns the summary slices by: all but the label columns."""
        labels = set(self.labels.values())
        return [s for s in self.slice_names if s not in labels]

    def size_pools(self, nodes: list[Node]) -> None:
        """Fill what each actor stage's engine spec leaves unset (``concurrency``,
        ``num_cpus``, ``num_gpus``, ``threads``, ``batch_size``) for the Ray nodes
        ``nodes``, with each engine type's pool rule (:mod:`ragbatch.core.pool_sizing`);
        set fields are kept. Each stage's :attr:`Stage.engine` becomes the sized spec
        (so does its entry in :attr:`engines`) and :attr:`Stage.pool` says what was
        chosen and why. Sizing a plan a second time changes nothing."""
        from ragbatch.core.pool_sizing import Cluster, PoolRequest, size_pools

        actor = [s for s in self.stages if s.engine is not None and s.pool is None]
        if not actor:
            return
        requests = [PoolRequest(s.name, s.engine, engine_of(s.engine).pool_rule) for s in actor]
        choices = size_pools(requests, Cluster.of(nodes))
        for stage in actor:
            choice = choices[stage.name]
            fields = type(stage.engine).model_fields
            update = {k: v for k, v in choice.values.items() if k in fields}
            stage.engine = stage.engine.model_copy(update=update)
            stage.pool = choice
            if stage.engine_name is not None:
                self.engines[stage.engine_name] = stage.engine

    def demands(self) -> list["StageDemand"]:
        """What each actor stage asks of the cluster (:mod:`ragbatch.core.placement`)."""
        from ragbatch.core.placement import stage_demand

        return [stage_demand(s.name, s.engine) for s in self.stages if s.engine is not None]


def quotes_allowed(metrics: list[Metric]) -> bool:
    """Whether a run of ``metrics`` may quote input values in reasons and notes.

    False when any metric looks for PII (kind ``"pii"``): then no reason of any metric
    and no normalizer note shows input text, as docs/pii.md says. This is the one place
    that decides it; :func:`build_metrics` sets each metric's ``quote_values`` from it and
    the runner passes :attr:`Plan.quote_values` to :func:`ragbatch.io.schema.normalize`.
    """
    return not any(m.kind == "pii" for m in metrics)


def build_metrics(config: JobConfig) -> tuple[list[Metric], dict[str, Any], list[str]]:
    """Instantiate every metric; resolve engines. Returns (metrics, engines, problems).

    Every metric's ``quote_values`` is set from :func:`quotes_allowed` over all of them.
    """
    metrics: list[Metric] = []
    engines: dict[str, Any] = dict(config.engines)
    problems: list[str] = []
    for i, spec in enumerate(config.metrics):
        where = f"metrics[{i}]"
        try:
            cls = get_metric(spec.name, where=f"{where}.name")
            if spec.judges is not None:
                metrics.extend(_panel_metrics(cls, spec, engines, where))
                continue
            engine_name = _resolve_engine(cls, spec.single_engine, engines, where)
            metric = cls.from_params(
                spec.params, metric_id=spec.metric_id, engine=engine_name, where=f"{where}.params"
            )
            if isinstance(metric, JudgeMetric):
                _resolve_embedders(metric, engines, f"{where}.params")
            metrics.append(metric)
        except ConfigError as exc:
            problems.extend(exc.problems)
    allowed = quotes_allowed(metrics)
    for metric in metrics:
        metric.quote_values = allowed
    return metrics, engines, problems


def _panel_metrics(
    cls: type[Metric], spec: Any, engines: dict[str, Any], where: str
) -> list[Metric]:
    """A judge panel's metrics (:mod:`ragbatch.judge.panel`): the panel, then one member
    per judge with the member key as its id, on that judge's engine.

    Raises
    ------
    ConfigError
        The metric is not a judge metric, a judge's engine is not of a type the metric
        runs on (``<where>.engines[j]``), a param is invalid, or the combine rule needs
        0/1 scores the metric does not give (``<where>.panel.combine``).
    """
    from ragbatch.config.panel import member_key
    from ragbatch.judge.panel import default_combine, panel_metric

    if not issubclass(cls, JudgeMetric):
        raise ConfigError(
            f"{where}.engines: {cls.name} is not a judge metric; a panel of judges "
            "(`engines: [...]`) is for judge metrics only"
        )
    problems, members = [], []
    for j, name in enumerate(spec.judges):
        spec_j = engines[name]
        if spec_j.type not in cls.engine_types:
            problems.append(
                f"{where}.engines[{j}]: engine {name!r} has type {spec_j.type!r}, but "
                f"{cls.name} needs {' or '.join(repr(t) for t in cls.engine_types)}"
            )
            continue
        member = cls.from_params(
            spec.params,
            metric_id=member_key(spec.metric_id, name),
            engine=name,
            where=f"{where}.params",
        )
        if isinstance(member, JudgeMetric):
            _resolve_embedders(member, engines, f"{where}.params")
        members.append(member)
    if problems:
        raise ConfigError(problems)
    boolean = bool(members[0].boolean)
    combine = (spec.panel.combine if spec.panel else None) or default_combine(boolean)
    if combine != "mean" and not boolean:
        raise ConfigError(
            f"{where}.panel.combine: {combine!r} needs a metric scored 0/1, and "
            f"{cls.name}'s scores are continuous; use `combine: mean`"
        )
    panel = panel_metric(spec.metric_id, members, list(spec.judges), combine)
    return [panel, *members]


#: Name under which the packaged embedding model is added when a judge metric's
#: ``embedder`` param names ``default_embedding`` and ``engines`` has no such entry.
DEFAULT_EMBEDDER = "default_embedding"


def _resolve_embedders(metric: JudgeMetric, engines: dict[str, Any], where: str) -> None:
    for name in metric.embedders():
        if name not in engines and name == DEFAULT_EMBEDDER:
            engines[name] = engine_adapter().validate_python(default_engine("embed"))
        spec = engines.get(name)
        if spec is None:
            raise ConfigError(
                f"{where}.embedder: engine {name!r} is not defined under `engines`; "
                f"add `{name}: {default_engine('embed')}` there (an engine that embeds texts)"
            )
        embedders = engines_providing("embed")
        if spec.type not in embedders:
            raise ConfigError(
                f"{where}.embedder: engine {name!r} has type {spec.type!r}; it must be "
                f"an engine that embeds texts ({' or '.join(embedders)})"
            )


def _resolve_engine(
    cls: type[Metric], name: str | None, engines: dict[str, Any], where: str
) -> str | None:
    if not issubclass(cls, (ModelMetric, JudgeMetric)):
        if name is not None:
            raise ConfigError(
                f"{where}.engine: {cls.name} is computed without a model; remove `engine:`"
            )
        return None
    if name is None and cls.kind == "pii":
        # A PII metric without `engine:` uses the one presidio engine the config defines.
        configured = [n for n, s in engines.items() if s.type in cls.engine_types]
        if len(configured) == 1:
            name = configured[0]
    if name is None:
        if cls.default_engine is None:
            raise ConfigError(
                f"{where}.engine: {cls.name} needs an engine of type "
                f"{' or '.join(cls.engine_types)}; define one under `engines`"
            )
        default = engine_adapter().validate_python(cls.default_engine)
        name = f"default_{default.type}"
        engines.setdefault(name, default)
    spec = engines[name]
    if spec.type not in cls.engine_types:
        raise ConfigError(
            f"{where}.engine: engine {name!r} has type {spec.type!r}, but {cls.name} needs "
            f"{' or '.join(repr(t) for t in cls.engine_types)}"
        )
    return name


def _pii_problems(metrics: list[Metric], engines: dict[str, Any]) -> list[str]:
    """``pii_types`` the configured detectors cannot find, and unreadable NER models."""
    from ragbatch.core.errors import EngineError
    from ragbatch.metrics.pii_base import PiiMetric

    pii = [m for m in metrics if isinstance(m, PiiMetric)]
    problems: list[str] = []
    for name in dict.fromkeys(m.engine for m in pii if m.engine is not None):
        from ragbatch.engines.presidio import supported_entities, unsupported_reason

        try:
            supported = supported_entities(engines[name])
        except EngineError as exc:
            problems.append(f"engines.{name}: {exc}")
            continue
        why = partial(unsupported_reason, engines[name])
        problems += [
            p
            for m in pii
            if m.engine == name
            for p in m.check_engine(engines[name], supported, why)
        ]
    return problems


def _engine_problems(engines: dict[str, Any]) -> list[str]:
    problems = []
    for name, spec in engines.items():
        model = getattr(spec, "model", None)
        if not engine_of(spec).local_model:  # a served model name, not a path
            continue
        if model and "://" not in model and not Path(model).expanduser().exists():
            problems.append(
                f"engines.{name}.model: {model!r} does not exist; engine type {spec.type!r} "
                "loads its model from a local directory: give one "
                "(`ragbatch models build --help` lists the small judge models ragbatch builds "
                "into one, e.g. `ragbatch models build smollm2 --out models/smollm2` for the "
                "shipped judge configs)"
            )
    return problems


def _stages(metrics: list[Metric], engines: dict[str, Any]) -> list[Stage]:
    """The plan's stages, in the order of the stage-kind registry
    (:func:`ragbatch.core.stages.stage_types`): the stage without actors holds every
    expression metric; each stage kind with actors gets one stage per engine whose
    engine type runs in it (:attr:`ragbatch.core.engine_registry.EngineType.stage`),
    holding the metrics that name that engine."""
    stages: list[Stage] = []
    named = list(dict.fromkeys(m.engine for m in metrics if m.engine is not None))
    for kind in stage_types():
        if not kind.actors:
            expression: list[Metric] = [m for m in metrics if isinstance(m, ExpressionMetric)]
            if expression:
                stages.append(Stage(kind.name, "expressions", expression))
            continue
        for name in [n for n in named if engine_of(engines[n]).stage == kind.name]:
            members = [m for m in metrics if m.engine == name]
            stages.append(Stage(kind.name, f"{kind.name}:{name}", members, name, engines[name]))
    return stages


def build_plan(config: JobConfig, *, inspect_input: bool = True) -> Plan:
    """Validate metrics, engines and (unless ``inspect_input`` is false) the input.

    Raises
    ------
    ConfigError
        Unknown metrics, bad params, engine mismatches, unmapped columns a metric needs.
    InputError
        The input cannot be listed or read, or a mapped column does not exist.
    """
    from ragbatch.io.labels import label_problems
    from ragbatch.io.listing import discover
    from ragbatch.io.read import input_fingerprint, peek_schema, plan_read
    from ragbatch.io.schema import check_columns, slice_columns

    metrics, engines, problems = build_metrics(config)
    problems += _engine_problems(engines)
    problems += accelerator_problems(engines)
    if inspect_input:  # reported with the other problems of the config, in one error
        problems += _unmapped_inputs(config, metrics)
    if not problems:
        problems += _pii_problems(metrics, engines)
    if problems:
        raise ConfigError(problems)
    plan = Plan(config, metrics, _stages(metrics, engines), engines)
    if not inspect_input:
        return plan
    listing = discover(config.input)  # the one listing of the input a run makes
    plan.read_tasks = plan_read(config.input, listing=listing)
    plan.input_schema = peek_schema(config.input, listing=listing)
    plan.input_fingerprint = input_fingerprint(config.input, plan.read_tasks, listing=listing)
    column_problems = check_columns(config.input, plan.input_schema)
    column_problems += label_problems(config, plan.input_schema)
    if column_problems:
        raise InputError("\n".join(column_problems))
    labels = list(config.labels.columns.values()) if config.labels is not None else []
    plan.slices = slice_columns(config.input, plan.input_schema, extra=labels)
    return plan


def _unmapped_inputs(config: JobConfig, metrics: list[Metric]) -> list[str]:
    """The metrics' problems with the canonical columns ``input.columns`` leaves unmapped
    (:meth:`~ragbatch.scoring.base.Metric.check_input`), each after the metric's place in
    the config (``metrics[i]: ...``)."""
    mapped = {c for c, v in config.input.columns.model_dump().items() if v is not None}
    where = {spec.metric_id: f"metrics[{i}]" for i, spec in enumerate(config.metrics)}
    # A panel's judges read the same columns: its first judge reports for the panel.
    quiet = {m.id for p in metrics if isinstance(p, PanelMetric) for m in p.members[1:]}
    return [
        f"{where[m.id]}: {problem}" if m.id in where else problem
        for m in metrics
        if m.id not in quiet
        for problem in m.check_input(mapped)
    ]


def preflight_engines(plan: Plan) -> None:
    """Run, from this process and before any actor starts, the ``preflight`` hook of every
    judge engine of the plan (:mod:`ragbatch.core.engine_registry`): for an OpenAI-compatible
    server, that it answers and serves its model (a few seconds at most).

    Engines of other stage kinds run their ``preflight`` hook too (the built-in ones
    have none).

    Raises
    ------
    EngineError
        A check failed (a server cannot be reached, refuses the key, or does not serve
        the model); the message starts with ``engines.<name>`` and names the cause.
    """
    from ragbatch.core.errors import EngineError

    for stage in plan.stages:
        if stage.engine is None:
            continue
        try:
            engine_of(stage.engine).check(stage.engine)
        except EngineError as exc:
            raise EngineError(f"engines.{stage.engine_name}: {exc}") from None
