"""Where the actor stages run: the Ray resources each actor holds, the ``map_batches``
options that ask Ray Data for them, and a check that a cluster can hold them.

Every model, PII and judge stage is a Ray Data actor pool sized by its engine spec
(``num_cpus``, ``num_gpus``, ``concurrency``, ``batch_size``, ``accelerator_type``,
``resources``; see :class:`ragbatch.config.engine_spec.StageResources`). An actor holds one
*bundle* of resources, except a vLLM engine with ``tensor_parallel_size`` n > 1: its
actor reserves a placement group of n bundles with one GPU each, packed onto one node
(``STRICT_PACK``), and vLLM starts its n tensor-parallel workers inside it (vLLM's
``ray`` executor). The actor itself then asks Ray Data for no GPU, only its CPUs, and
runs in the first bundle.

An ``accelerator_type`` becomes the resource ``accelerator_type:<type>`` with amount
0.001 in each GPU bundle, which is how Ray marks a node's GPU model (Ray's own
``accelerator_type`` task option does the same).
"""

from __future__ import annotations

import difflib
import math
import os
from dataclasses import dataclass
from functools import partial
from typing import Any, Iterable

#: Resource amount that marks a node's accelerator type (Ray's convention).
ACCELERATOR_MARK = 0.001
#: Prefix of the resource that names a node's accelerator type.
ACCELERATOR_PREFIX = "accelerator_type:"


@dataclass(frozen=True)
class StageDemand:
    """What one actor stage asks of the cluster.

    Attributes
    ----------
    stage : str
        Stage name as in the plan (``model:<engine>``, ``judge:<engine>``, ``pii:<engine>``).
    bundles : tuple of dict
        Resources one actor holds, one dict per bundle (more than one only for a
        tensor-parallel vLLM engine); keys are Ray resource names (``CPU``, ``GPU``,
        ``accelerator_type:<type>``, custom names), values are amounts (> 0).
    min_actors, max_actors : int
        The pool size: equal for a fixed pool.
    """

    stage: str
    bundles: tuple[dict[str, float], ...]
    min_actors: int
    max_actors: int

    @property
    def per_actor(self) -> dict[str, float]:
        """All bundles of one actor summed (they share one node)."""
        total: dict[str, float] = {}
        for bundle in self.bundles:
            for name, amount in bundle.items():
                total[name] = total.get(name, 0.0) + amount
        return total


def _field(spec: Any, name: str, default: Any = None) -> Any:
    """``spec``'s field ``name``; ``default`` when it lacks it or leaves it unset (None:
    a spec not sized yet, :meth:`ragbatch.pipeline.plan.Plan.size_pools`)."""
    value = spec.get(name) if isinstance(spec, dict) else getattr(spec, name, None)
    return default if value is None else value


def pool_size(spec: Any) -> tuple[int, int]:
    """``(min, max)`` actors of a spec's ``concurrency`` (an int n means ``(n, n)``)."""
    concurrency = _field(spec, "concurrency", 1)
    if isinstance(concurrency, int):
        return concurrency, concurrency
    low, high = concurrency
    return int(low), int(high)


def actor_bundles(spec: Any) -> tuple[dict[str, float], ...]:
    """The resource bundles one actor of an engine holds (see the module docstring).

    Parameters
    ----------
    spec : engine spec (pydantic model or its ``model_dump``)

    Returns
    -------
    tuple of dict
        One bundle, or ``tensor_parallel_size`` bundles of one GPU each; zero amounts
        are left out.
    """
    cpus = float(_field(spec, "num_cpus", 1) or 0)
    gpus = float(_field(spec, "num_gpus", 0) or 0)
    accelerator = _field(spec, "accelerator_type")
    custom = {k: float(v) for k, v in (_field(spec, "resources") or {}).items()}
    tp = int(_field(spec, "tensor_parallel_size", 1) or 1)
    mark = {f"{ACCELERATOR_PREFIX}{accelerator}": ACCELERATOR_MARK} if accelerator else {}
    if tp > 1:
        first = {"CPU": cpus, "GPU": 1.0, **mark, **custom}
        rest = [{"GPU": 1.0, **mark} for _ in range(tp - 1)]
        bundles = [first, *rest]
    else:
        bundles = [{"CPU": cpus, "GPU": gpus, **(mark if gpus or accelerator else {}), **custom}]
    return tuple({k: v for k, v in b.items() if v > 0} for b in bundles)


def stage_demand(stage: str, spec: Any) -> StageDemand:
    """The :class:`StageDemand` of one actor stage."""
    low, high = pool_size(spec)
    return StageDemand(stage, actor_bundles(spec), low, high)


def map_batches_options(spec: Any) -> dict[str, Any]:
    """The ``map_batches`` keyword arguments that place one actor stage: ``compute``
    (a ``ray.data.ActorPoolStrategy``), ``num_cpus``, ``num_gpus``, ``batch_size``, and
    where set ``accelerator_type`` and ``resources`` (Ray Data's named parameters); for a
    tensor-parallel vLLM engine, ``num_gpus`` 0 and a ``ray_remote_args_fn`` that
    reserves each actor's placement group.

    Notes
    -----
    Ray 2.60 marks both ``ray_remote_args_fn`` and the catch-all ``**ray_remote_args``
    deprecated (removal announced for Ray 2.64), with named parameters as the
    replacement; none of them reserves a placement group per actor, so a
    tensor-parallel engine still needs ``ray_remote_args_fn`` and Ray Data warns once
    for its stage. Every other stage uses named parameters only. Task retries are Ray
    Data's own (a batch whose actor died runs again on a replacement, without limit);
    :class:`udfs.guard.BatchGuard` is what bounds them, marking a batch ``error`` after
    :data:`udfs.guard.MAX_LOST_STARTS` lost starts.
    """
    import ray.data

    low, high = pool_size(spec)
    if low == high:
        compute = ray.data.ActorPoolStrategy(size=low)
    else:
        compute = ray.data.ActorPoolStrategy(min_size=low, max_size=high)
    options: dict[str, Any] = {
        "compute": compute,
        "num_cpus": float(_field(spec, "num_cpus", 1) or 0),
        "num_gpus": float(_field(spec, "num_gpus", 0) or 0),
        "batch_size": int(_field(spec, "batch_size", 64)),
    }
    bundles = actor_bundles(spec)
    group = None
    if len(bundles) > 1:
        # The GPUs, the accelerator mark and the custom resources are in the bundles.
        options["num_gpus"] = 0
        group = list(bundles)
    else:
        if _field(spec, "accelerator_type"):
            options["accelerator_type"] = _field(spec, "accelerator_type")
        if _field(spec, "resources"):
            options["resources"] = dict(_field(spec, "resources"))
    if group is not None:
        options["ray_remote_args_fn"] = partial(actor_remote_args, group)
    return options


def actor_remote_args(bundles: list[dict[str, float]]) -> dict[str, Any]:
    """Ray options of one new actor, called by Ray Data as each actor is created: a
    placement group reserving ``bundles`` on one node (``STRICT_PACK``) that the actor
    and its child tasks run in."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = ray.util.placement_group(bundles, strategy="STRICT_PACK")
    return {
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            group, placement_group_capture_child_tasks=True
        )
    }


def known_accelerator_types() -> list[str]:
    """Accelerator type names Ray knows (the constants of ``ray.util.accelerators``)."""
    import ray.util.accelerators as accelerators

    return sorted({v for k, v in vars(accelerators).items() if k.isupper() and isinstance(v, str)})


def accelerator_problems(engines: dict[str, Any]) -> list[str]:
    """``engines.<name>.accelerator_type`` values Ray does not know, with near misses."""
    problems = []
    known = None
    for name, spec in engines.items():
        value = _field(spec, "accelerator_type")
        if not value:
            continue
        known = known or known_accelerator_types()
        if value not in known:
            close = difflib.get_close_matches(value, known, n=3, cutoff=0.5)
            hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
            problems.append(
                f"engines.{name}.accelerator_type: {value!r} is not an accelerator "
                f"type Ray knows{hint}; see ray.util.accelerators for the names"
            )
    return problems


# -- fit against a cluster ----------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    """A node's total resources (Ray resource name -> amount) and its id."""

    node_id: str
    resources: dict[str, float]


def cluster_nodes() -> list[Node]:
    """The alive nodes of the Ray cluster this process is connected to."""
    import ray

    return [
        Node(
            n["NodeID"],
            {k: float(v) for k, v in n.get("Resources", {}).items() if not k.startswith("node:")},
        )
        for n in ray.nodes()
        if n.get("Alive")
    ]


def nodes_at(address: str) -> list[Node]:
    """The alive nodes of the Ray cluster at ``address``: a dashboard URL
    (``http://head:8265``, read through Ray's state API) or a cluster address
    (``head:6379``, ``auto``; a short-lived driver connects and disconnects).

    Raises
    ------
    ConfigError
        The cluster cannot be reached; the message names the address.
    """
    from ragbatch.core.errors import ConfigError

    try:
        if address.startswith(("http://", "https://")):
            from ray.util.state import list_nodes

            return [
                Node(
                    n.node_id,
                    {
                        k: float(v)
                        for k, v in (n.resources_total or {}).items()
                        if not k.startswith("node:")
                    },
                )
                for n in list_nodes(address=address, limit=10_000, raise_on_missing_output=False)
                if n.state == "ALIVE"
            ]
        import ray

        if ray.is_initialized():
            return cluster_nodes()
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        try:
            return cluster_nodes()
        finally:
            ray.shutdown()
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to reach the cluster
        raise ConfigError(
            f"--address {address}: cannot read the cluster's nodes: "
            f"{type(exc).__name__}: {str(exc)[:300]}; check the address (a "
            "dashboard URL such as http://head:8265, or head:6379)"
        ) from None


def local_nodes(without_ray: bool = False) -> list[Node]:
    """This machine as a local Ray instance would see it: its CPUs, and its GPUs and
    their type where Ray's accelerator detection finds them.

    With ``without_ray`` (a dry run, which imports neither Ray nor torch) the GPUs are
    counted without Ray: the devices ``CUDA_VISIBLE_DEVICES`` names when it is set, else
    the NVIDIA driver's device folders (``/proc/driver/nvidia/gpus``), and their type is
    not looked up."""
    resources: dict[str, float] = {"CPU": float(os.cpu_count() or 1)}
    if without_ray:
        gpus = _visible_nvidia_gpus()
        if gpus:
            resources["GPU"] = float(gpus)
        return [Node("local", resources)]
    try:
        from ray._private.accelerators import get_accelerator_manager_for_resource

        manager = get_accelerator_manager_for_resource("GPU")
        gpus = manager.get_current_node_num_accelerators() or 0
        if gpus:
            resources["GPU"] = float(gpus)
            kind = manager.get_current_node_accelerator_type()
            if kind:
                resources[f"{ACCELERATOR_PREFIX}{kind}"] = 1.0
    except Exception:  # noqa: BLE001 - detection is best effort; CPUs are always known
        pass
    return [Node("local", resources)]


def _visible_nvidia_gpus() -> int:
    """NVIDIA GPUs this process may use, counted without importing a GPU library."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def _fits(need: dict[str, float], have: dict[str, float]) -> bool:
    return all(have.get(k, 0.0) + 1e-9 >= v for k, v in need.items())


def _actors_fitting(need: dict[str, float], have: dict[str, float]) -> int:
    counts = [math.floor((have.get(k, 0.0) + 1e-9) / v) for k, v in need.items() if v > 0]
    return min(counts) if counts else 1_000_000


def _describe(resources: dict[str, float]) -> str:
    def amount(v: float) -> str:
        return f"{v:g}"

    return "{" + ", ".join(f"{k}: {amount(v)}" for k, v in sorted(resources.items())) + "}"


def fit_problems(demands: Iterable[StageDemand], nodes: list[Node]) -> list[str]:
    """What will not fit on ``nodes``: each stage alone, then all stages' smallest pools
    together (Ray Data keeps every stage's actors up at once).

    Parameters
    ----------
    demands : iterable of StageDemand
    nodes : list of Node
        Alive nodes with their total resources.

    Returns
    -------
    list of str
        One sentence per problem, naming the stage, what one actor needs and what the
        cluster has; empty when everything fits.

    Notes
    -----
    A stage's actors are placed whole on one node each (a tensor-parallel engine's
    bundles are packed onto one node). The joint check packs the actors first-fit,
    largest GPU need first, so it can report a problem that a cleverer packing would
    avoid only when resources are fragmented across nodes; it never misses one.
    """
    demands = list(demands)
    problems: list[str] = []
    for d in demands:
        need = d.per_actor
        capacity = sum(_actors_fitting(need, n.resources) for n in nodes)
        if not any(_fits(need, n.resources) for n in nodes):
            problems.append(
                f"stage {d.stage}: one actor needs {_describe(need)}, but no node has "
                f"that; the largest amounts on one node: {_largest(need, nodes)}"
            )
        elif capacity < d.min_actors:
            problems.append(
                f"stage {d.stage}: concurrency asks for at least {d.min_actors} actors "
                f"of {_describe(need)}, but the nodes hold {capacity} at most"
            )
    if problems:
        return problems
    free, left_out = _pack(demands, nodes)
    if left_out is not None:
        total = _sum(x.per_actor for x in demands for _ in range(x.min_actors))
        return [
            f"the actor stages together need {_describe(total)} for their smallest "
            f"pools ({', '.join(f'{x.stage} x{x.min_actors}' for x in demands)}), "
            f"but the nodes cannot hold them all at once; stage {left_out.stage} is left "
            "without room. Lower concurrency or num_cpus/num_gpus, or add nodes"
        ]
    return problems


def _pack(
    demands: list[StageDemand], nodes: list[Node]
) -> tuple[dict[str, dict[str, float]], StageDemand | None]:
    """Place every stage's smallest pool first-fit, largest GPU need first: the resources
    left on each node, and the first stage that found no room (None when all fit)."""
    free = {n.node_id: dict(n.resources) for n in nodes}
    order = sorted(demands, key=lambda d: -d.per_actor.get("GPU", 0.0))
    for d in order:
        need = d.per_actor
        for _ in range(d.min_actors):
            host = next((nid for nid, have in free.items() if _fits(need, have)), None)
            if host is None:
                return free, d
            for k, v in need.items():
                free[host][k] = free[host].get(k, 0.0) - v
    return free, None


def _sum(bundles: Iterable[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            total[k] = total.get(k, 0.0) + v
    return total


def _largest(need: dict[str, float], nodes: list[Node]) -> str:
    best = {k: max((n.resources.get(k, 0.0) for n in nodes), default=0.0) for k in need}
    return _describe(best)


def free_cpus_after(demands: Iterable[StageDemand], nodes: list[Node]) -> float:
    """CPUs left in all for read, expression and write tasks once every stage's smallest
    pool holds its CPUs (rounded to Ray's resource precision, 1/10,000)."""
    total = sum(n.resources.get("CPU", 0.0) for n in nodes)
    used = sum(d.per_actor.get("CPU", 0.0) * d.min_actors for d in demands)
    return round(total - used, _PRECISION)


#: Ray counts resources in units of 1/10,000.
_PRECISION = 4


def read_task_problem(demands: Iterable[StageDemand], nodes: list[Node]) -> str | None:
    """Why the read, expression and write tasks could never run beside the actor pools,
    or None when some node keeps a whole CPU for them.

    Each of those tasks needs one CPU on one node. The smallest pools are placed as
    :func:`fit_problems` places them (first fit); if no node then has a CPU left, Ray Data
    queues the read behind actors that wait for its rows: the run would never finish
    (for example two ``num_cpus: 1`` actors on a 2-CPU machine). Only meaningful once
    :func:`fit_problems` found nothing.
    """
    demands = list(demands)
    if not demands:
        return None
    free, left_out = _pack(demands, nodes)
    most = max((have.get("CPU", 0.0) for have in free.values()), default=0.0)
    if left_out is None and round(most, _PRECISION) >= 1:
        return None
    total = sum(n.resources.get("CPU", 0.0) for n in nodes)
    spare = free_cpus_after(demands, nodes)
    return (
        f"the actor stages' smallest pools hold {round(total - spare, _PRECISION):g} of the "
        f"{total:g} CPUs and leave no node a whole CPU ({max(spare, 0):g} left in all): "
        "the read, expression and write tasks need 1 CPU each on one node and would wait "
        "for the actors forever. Lower an engine's concurrency or its num_cpus (fractions "
        "such as 0.5 are allowed)"
    )
