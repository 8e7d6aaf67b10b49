"""Actor pools sized to the cluster: the defaults an engine gets for what it leaves unset.

An engine spec may leave ``concurrency``, ``num_cpus``, ``num_gpus``, ``threads`` and
``batch_size`` unset (None). Before a run starts its stages, :func:`size_pools` fills
them from what Ray offers the job (its nodes' CPUs and GPUs), with the *pool rule* of
the engine's type (:attr:`ragbatch.core.engine_registry.EngineType.pool_rule`); what the
config sets is kept as written. The choice, and the sentence that explains it, go into
the dry run and the run manifest.

The rules
---------
* :func:`torch_pool` (embedding and cross-encoder engines): with GPUs, one actor per GPU
  (``num_gpus: 1``, one CPU each); on CPUs only, actors x threads = the CPUs the stage
  gets, at most :data:`MAX_THREADS` torch threads per actor (intra-op parallelism gains
  little past a few threads on batches of short texts, while actors scale with cores).
* :func:`single_thread_pool` (Presidio): one single-threaded actor per CPU.
* :func:`vllm_pool`: with GPUs, one actor per ``tensor_parallel_size`` GPUs; on CPUs
  only, one actor per node that owns its node's threads (vLLM's CPU build runs its own
  thread pool over them).
* :func:`network_pool` (OpenAI-compatible servers): one actor holding a fraction of a
  CPU; the server does the work, and the engine's own request concurrency is what scales.

Sharing the cluster
-------------------
Ray Data runs every stage at once, so the CPUs are shared: the stages whose sizes are
fully set keep their CPUs, one CPU is kept for the read, expression and write tasks
(:data:`TASK_RESERVE_CPUS`; Ray Data cannot start a task without a whole CPU on one
node), and the rest is split evenly among the CPU-bound stages sized here. An actor's
``num_cpus`` (what Ray reserves) can therefore be below its ``threads`` (what it runs):
on a 2-CPU machine one model actor runs 2 torch threads and reserves 1 CPU, and the
task CPU it shares is idle while the model computes. GPUs are split evenly among the
stages that run on them; with fewer GPUs than such stages, each gets a fraction of one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

#: Most torch threads one actor is given by default (CPU-only pools).
MAX_THREADS = 4
#: CPUs kept for Ray Data's read, expression and write tasks.
TASK_RESERVE_CPUS = 1.0
#: The CPU an actor holds beside its GPU (GPU pools), and a network-bound actor's share.
GPU_ACTOR_CPUS = 1.0
NETWORK_ACTOR_CPUS = 0.25

#: The sizable fields of an engine spec (``batches_in_flight``: vLLM engines only).
SIZED_FIELDS = (
    "concurrency",
    "num_cpus",
    "num_gpus",
    "threads",
    "batch_size",
    "batches_in_flight",
)
#: Batches a vLLM actor judges at once unless its spec says: enough that the engine
#: always has the next batch's requests queued while a batch's last ones finish
#: (docs/benchmarks/judge-stage.md, "Batches in flight").
VLLM_BATCHES_IN_FLIGHT = 4


@dataclass(frozen=True)
class Share:
    """What one stage's pool may use.

    Attributes
    ----------
    cpus : float
        CPUs the stage's actors may run threads on (its share of the cluster's).
    reservable : float
        CPUs the stage's actors may reserve from Ray (``cpus`` less the stage's part of
        :data:`TASK_RESERVE_CPUS`), >= 0.
    node_cpus : float
        The stage's share of the largest node's CPUs: the most threads one actor can
        run on one machine.
    nodes : int
        Nodes with CPUs.
    gpus : float
        GPUs the stage may use (0 on a cluster without GPUs, or for a CPU stage).
    """

    cpus: float
    reservable: float
    node_cpus: float
    nodes: int = 1
    gpus: float = 0.0


@dataclass(frozen=True)
class PoolChoice:
    """The sized pool of one actor stage.

    Attributes
    ----------
    values : dict
        ``concurrency`` (int, or ``[min, max]``), ``num_cpus`` (float), ``num_gpus``
        (float), ``threads`` (int or None: the engine's own), ``batch_size`` (rows per
        call) and for vLLM ``batches_in_flight``, as the stage will run with them.
    chosen : tuple of str
        The fields this rule filled in (the others were set in the config).
    rule : str
        One sentence: why these values.
    """

    values: dict[str, Any]
    chosen: tuple[str, ...]
    rule: str
    extra: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        """A JSON-ready dict: the values, ``chosen`` and ``rule``."""
        return {**self.values, **self.extra, "chosen": list(self.chosen), "rule": self.rule}


#: ``size(spec, share) -> (values of every sizable field, sentence)``.
SizeFunction = Callable[[Any, Share], tuple[dict[str, Any], str]]


@dataclass(frozen=True)
class PoolRule:
    """How an engine type's pool is sized (an entry of the engine registry).

    Attributes
    ----------
    size : callable
        ``size(spec, share) -> (values, sentence)``: every sizable field
        (:data:`SIZED_FIELDS`; the set ones unchanged) and why.
    cpu_bound : bool
        Whether its actors compute on their CPUs, and so take part in the split of the
        CPUs (False for an engine that waits on a server).
    gpu_capable : bool
        Whether its actors can run on a GPU.
    """

    size: SizeFunction
    cpu_bound: bool = True
    gpu_capable: bool = True


def _get(spec: Any, name: str) -> Any:
    return spec.get(name) if isinstance(spec, dict) else getattr(spec, name, None)


def _max_actors(concurrency: Any) -> int:
    return concurrency if isinstance(concurrency, int) else int(concurrency[1])


def _round_cpus(value: float) -> float:
    """CPUs rounded down to Ray's precision (1/10,000), never below 0."""
    return max(0.0, math.floor(value * 10_000) / 10_000)


def _wants_gpu(spec: Any, share: Share) -> bool:
    gpus = _get(spec, "num_gpus")
    if gpus is not None:
        return gpus > 0
    return share.gpus > 0 and (_get(spec, "device") or "cuda").startswith("cuda")


def _gpu_pool(spec: Any, share: Share, per_actor: float) -> dict[str, Any]:
    """One actor per ``per_actor`` GPUs of the share (a fraction of one GPU when the
    share is smaller), one CPU each."""
    gpus = _get(spec, "num_gpus")
    if gpus is None:
        gpus = per_actor if share.gpus >= per_actor else share.gpus
    concurrency = _get(spec, "concurrency")
    if concurrency is None:
        concurrency = max(1, int(share.gpus // gpus)) if gpus else 1
    num_cpus = _get(spec, "num_cpus")
    if num_cpus is None:
        num_cpus = _round_cpus(min(GPU_ACTOR_CPUS, share.reservable / _max_actors(concurrency)))
    return {"num_gpus": float(gpus), "concurrency": concurrency, "num_cpus": float(num_cpus)}


def _cpu_pool(spec: Any, share: Share, max_threads: int) -> dict[str, Any]:
    """actors x threads = the share's CPUs, at most ``max_threads`` threads an actor;
    set fields are kept and the others follow from them."""
    concurrency = _get(spec, "concurrency")
    threads = _get(spec, "threads")
    num_cpus = _get(spec, "num_cpus")
    if threads is None:
        if num_cpus is not None and num_cpus >= 1:
            threads = int(num_cpus)  # what Ray itself gives an actor of whole CPUs
        elif concurrency is not None:
            threads = int(share.cpus // _max_actors(concurrency))
        else:
            threads = int(min(max_threads, share.node_cpus))
        threads = max(1, min(threads, int(share.node_cpus)))
    if concurrency is None:
        concurrency = max(1, int(share.cpus // threads))
    if num_cpus is None:
        num_cpus = _round_cpus(min(threads, share.reservable / _max_actors(concurrency)))
    return {
        "num_gpus": float(_get(spec, "num_gpus") or 0.0),
        "concurrency": concurrency,
        "num_cpus": float(num_cpus),
        "threads": threads,
    }


def _describe_cpu(values: dict[str, Any], share: Share) -> str:
    actors = values["concurrency"]
    return (
        f"{actors} actor(s) x {values['threads']} thread(s) on the {share.cpus:g} CPUs "
        f"this stage gets, each reserving {values['num_cpus']:g} CPU "
        f"({TASK_RESERVE_CPUS:g} CPU kept for the read, expression and write tasks)"
    )


def torch_pool(spec: Any, share: Share) -> tuple[dict[str, Any], str]:
    """Pool rule of sentence-transformers engines (see the module docstring).

    Returns
    -------
    values : dict
        Every sizable field (the set ones unchanged), plus ``batch_size`` (rows per
        call: :data:`GPU_MODEL_BATCH_ROWS` on a GPU, :data:`CPU_MODEL_BATCH_ROWS` on CPUs).
    rule : str
    """
    if _wants_gpu(spec, share):
        values = _gpu_pool(spec, share, 1.0)
        values["threads"] = _get(spec, "threads") or max(1, int(values["num_cpus"]))
        values["batch_size"] = _get(spec, "batch_size") or GPU_MODEL_BATCH_ROWS
        return values, (
            f"one actor per GPU ({share.gpus:g} GPU(s) for this stage), "
            f"{values['num_cpus']:g} CPU each"
        )
    values = _cpu_pool(spec, share, MAX_THREADS)
    values["batch_size"] = _get(spec, "batch_size") or CPU_MODEL_BATCH_ROWS
    return values, _describe_cpu(values, share)


def single_thread_pool(spec: Any, share: Share) -> tuple[dict[str, Any], str]:
    """Pool rule of engines that compute on one thread (Presidio): one actor per CPU of
    the share; ``batch_size`` defaults to :data:`PII_BATCH_ROWS`."""
    values = _cpu_pool(spec, share, 1)
    values["batch_size"] = _get(spec, "batch_size") or PII_BATCH_ROWS
    return values, _describe_cpu(values, share)


def vllm_pool(spec: Any, share: Share) -> tuple[dict[str, Any], str]:
    """Pool rule of vLLM engines: one actor per ``tensor_parallel_size`` GPUs, or on CPUs
    one actor per node running as many threads as the stage's share of the node; each
    actor judges :data:`VLLM_BATCHES_IN_FLIGHT` batches at once."""
    tp = int(_get(spec, "tensor_parallel_size") or 1)
    in_flight = _get(spec, "batches_in_flight") or VLLM_BATCHES_IN_FLIGHT
    if _wants_gpu(spec, share):
        values = _gpu_pool(spec, share, float(tp))
        values["threads"] = _get(spec, "threads")
        values["batch_size"] = _get(spec, "batch_size") or GPU_JUDGE_BATCH_ROWS
        values["batches_in_flight"] = in_flight
        return values, (
            f"one actor per {tp} GPU(s) ({share.gpus:g} GPU(s) for this stage), "
            f"{values['num_cpus']:g} CPU each"
        )
    concurrency = _get(spec, "concurrency") or share.nodes
    threads = _get(spec, "threads") or max(1, int(share.node_cpus))
    num_cpus = _get(spec, "num_cpus")
    if num_cpus is None:
        num_cpus = _round_cpus(min(threads, share.reservable / _max_actors(concurrency)))
    values = {
        "num_gpus": float(_get(spec, "num_gpus") or 0.0),
        "concurrency": concurrency,
        "num_cpus": float(num_cpus),
        "threads": threads,
        "batch_size": _get(spec, "batch_size") or CPU_JUDGE_BATCH_ROWS,
        "batches_in_flight": in_flight,
    }
    return values, (
        f"one actor per node whose vLLM engine runs {threads} thread(s) (the stage's share "
        f"of a node's CPUs), reserving {values['num_cpus']:g} CPU"
    )


def network_pool(spec: Any, share: Share) -> tuple[dict[str, Any], str]:
    """Pool rule of engines that wait on a server: one actor reserving
    :data:`NETWORK_ACTOR_CPUS`; the engine's own request concurrency does the scaling."""
    values = {
        "num_gpus": float(_get(spec, "num_gpus") or 0.0),
        "concurrency": _get(spec, "concurrency") or 1,
        "num_cpus": float(
            _get(spec, "num_cpus") if _get(spec, "num_cpus") is not None else NETWORK_ACTOR_CPUS
        ),
        "threads": _get(spec, "threads"),
        "batch_size": _get(spec, "batch_size") or NETWORK_BATCH_ROWS,
    }
    return values, (
        "network-bound: one actor reserving a fraction of a CPU; requests in flight scale "
        "with the engine's own concurrency"
    )


#: Rows per call of a model actor on CPUs, and on a GPU: enough that a call's fixed cost
#: (Polars calls, the ledger's round trip, Ray Data's batching: a few milliseconds) is a
#: few per cent of it even with a fast model (docs/benchmarks/model-stage.md). On a GPU
#: the call is larger because the model pads each forward pass to its longest text and
#: sorts texts by length only within a call: on an H200, calls of 1,024 rows ran at 0.85
#: of 4,096-row calls and 16,384 rows padded 1 % more than one call over everything;
#: at 16,384 the stage ran at 0.95 of raw sentence-transformers (docs/benchmarks/gpu.md).
CPU_MODEL_BATCH_ROWS = 4096
GPU_MODEL_BATCH_ROWS = 16384
#: Rows per call of a Presidio actor.
PII_BATCH_ROWS = 256
#: Rows per call of a vLLM judge actor on CPUs, and on GPUs.
CPU_JUDGE_BATCH_ROWS = 64
GPU_JUDGE_BATCH_ROWS = 256
#: Rows per call of a judge actor that sends requests to a server.
NETWORK_BATCH_ROWS = 64


@dataclass(frozen=True)
class Cluster:
    """The CPUs and GPUs of each node Ray offers the job (node id -> amount)."""

    cpus: dict[str, float]
    gpus: dict[str, float]

    @classmethod
    def of(cls, nodes: list[Any]) -> "Cluster":
        """From :class:`ragbatch.core.placement.Node` objects."""
        return cls(
            {n.node_id: float(n.resources.get("CPU", 0.0)) for n in nodes},
            {n.node_id: float(n.resources.get("GPU", 0.0)) for n in nodes},
        )


#: The rules of the built-in engine types.
TORCH_POOL = PoolRule(torch_pool)
SINGLE_THREAD_POOL = PoolRule(single_thread_pool, gpu_capable=False)
VLLM_POOL = PoolRule(vllm_pool)
NETWORK_POOL = PoolRule(network_pool, cpu_bound=False, gpu_capable=False)


@dataclass(frozen=True)
class PoolRequest:
    """One actor stage to size: its name, engine spec and pool rule."""

    stage: str
    spec: Any
    rule: PoolRule


def _fully_set(spec: Any) -> bool:
    return all(_get(spec, f) is not None for f in ("concurrency", "num_cpus"))


def _on_gpus(request: PoolRequest, total_gpus: float) -> bool:
    """Whether the stage runs on GPUs: it may, and either asks for them or leaves
    ``num_gpus`` unset on a cluster that has some (and no ``device`` other than CUDA)."""
    if not request.rule.gpu_capable:
        return False
    return _wants_gpu(request.spec, Share(0.0, 0.0, 0.0, 1, total_gpus))


def size_pools(requests: list[PoolRequest], cluster: Cluster) -> dict[str, PoolChoice]:
    """Size every stage's pool for what it leaves unset.

    Parameters
    ----------
    requests : list of PoolRequest
    cluster : Cluster
        The nodes Ray offers the job.

    Returns
    -------
    dict
        Stage name -> :class:`PoolChoice`.

    Notes
    -----
    A stage whose ``concurrency`` and ``num_cpus`` are both set keeps its CPUs
    (``num_cpus`` x its largest pool) out of the split. Every other ``cpu_bound`` stage
    that runs on CPUs gets an equal part of the rest, and of the rest less
    :data:`TASK_RESERVE_CPUS` to reserve; GPU stages get an equal part of the GPUs.
    """
    total_cpus = sum(cluster.cpus.values())
    largest = max(cluster.cpus.values(), default=0.0)
    nodes = sum(1 for c in cluster.cpus.values() if c > 0) or 1
    total_gpus = sum(cluster.gpus.values())
    fixed = sum(
        float(_get(r.spec, "num_cpus")) * _max_actors(_get(r.spec, "concurrency"))
        for r in requests
        if _fully_set(r.spec)
    )
    free = max(0.0, total_cpus - fixed)
    reservable = max(0.0, free - TASK_RESERVE_CPUS)
    on_gpus = [r.stage for r in requests if _on_gpus(r, total_gpus)]
    splitting = [
        r.stage
        for r in requests
        if r.stage not in on_gpus and r.rule.cpu_bound and not _fully_set(r.spec)
    ]
    out: dict[str, PoolChoice] = {}
    for r in requests:
        if r.stage in on_gpus:
            share = Share(free, reservable, largest, nodes, total_gpus / len(on_gpus))
        elif r.stage in splitting:
            n = len(splitting)
            share = Share(free / n, reservable / n, largest / n, nodes)
        else:
            share = Share(free, reservable, largest, nodes)
        values, sentence = r.rule.size(r.spec, share)
        chosen = tuple(f for f in SIZED_FIELDS if _get(r.spec, f) is None and f in values)
        out[r.stage] = PoolChoice(values, chosen, sentence)
    return out
