"""Actor pools sized for what an engine leaves unset (ragbatch.core.pool_sizing).

Every expected pool below is worked out by hand from the rule in the module docstring:
the stage's share of the CPUs is split into actors x threads (at most 4 threads an actor
on CPUs), one CPU is kept for Ray Data's tasks, and each actor reserves its share of the
rest (never more than its threads); with GPUs, one actor per GPU and one CPU each.
"""

from __future__ import annotations

import pytest

from ragbatch.config.job import JobConfig
from ragbatch.config.engine_spec import engine_adapter
from ragbatch.core.placement import Node, actor_bundles, map_batches_options
from ragbatch.core.pool_sizing import (
    NETWORK_POOL,
    SINGLE_THREAD_POOL,
    TORCH_POOL,
    VLLM_POOL,
    Cluster,
    PoolRequest,
    size_pools,
)
from ragbatch.pipeline.plan import build_plan

ALL = ["concurrency", "num_cpus", "num_gpus", "threads", "batch_size"]


def _cluster(*nodes: tuple[float, float]) -> Cluster:
    """Nodes given as (CPUs, GPUs)."""
    return Cluster(
        {f"n{i}": c for i, (c, _) in enumerate(nodes)},
        {f"n{i}": g for i, (_, g) in enumerate(nodes)},
    )


def _values(choice) -> dict:
    return {k: choice.values[k] for k in ("concurrency", "num_cpus", "num_gpus", "threads")}


@pytest.mark.parametrize(
    "cpus, want",
    [
        # 2 CPUs: one actor of 2 threads; 2 - 1 kept = 1 CPU to reserve.
        (2, {"concurrency": 1, "num_cpus": 1.0, "num_gpus": 0.0, "threads": 2}),
        # 4 CPUs: one actor of 4 threads (the most an actor gets), reserving 4 - 1 = 3.
        (4, {"concurrency": 1, "num_cpus": 3.0, "num_gpus": 0.0, "threads": 4}),
        # 16 CPUs: 16 / 4 = 4 actors of 4 threads, each reserving (16 - 1) / 4 = 3.75.
        (16, {"concurrency": 4, "num_cpus": 3.75, "num_gpus": 0.0, "threads": 4}),
        # 1 CPU: one thread, and nothing left to reserve beside the tasks' CPU.
        (1, {"concurrency": 1, "num_cpus": 0.0, "num_gpus": 0.0, "threads": 1}),
    ],
)
def test_cpu_only_pool_fills_the_node(cpus, want):
    choice = size_pools(
        [PoolRequest("model:m", {"type": "embedding"}, TORCH_POOL)], _cluster((cpus, 0))
    )["model:m"]
    assert _values(choice) == want
    assert choice.values["batch_size"] == 4096
    assert choice.chosen == tuple(ALL)
    assert f"x {want['threads']} thread(s)" in choice.rule


def test_two_cpu_stages_share_the_cpus():
    # 16 CPUs, two CPU-bound stages: 8 each; 15 reservable, 7.5 each.
    # model: 8 / 4 = 2 actors x 4 threads, 7.5 / 2 = 3.75 CPU each;
    # presidio: one thread an actor, 8 actors, 7.5 / 8 = 0.9375 CPU each.
    pools = size_pools(
        [
            PoolRequest("model:m", {"type": "embedding"}, TORCH_POOL),
            PoolRequest("pii:p", {"type": "presidio"}, SINGLE_THREAD_POOL),
        ],
        _cluster((16, 0)),
    )
    assert _values(pools["model:m"]) == {
        "concurrency": 2,
        "num_cpus": 3.75,
        "num_gpus": 0.0,
        "threads": 4,
    }
    assert _values(pools["pii:p"]) == {
        "concurrency": 8,
        "num_cpus": 0.9375,
        "num_gpus": 0.0,
        "threads": 1,
    }
    assert pools["pii:p"].values["batch_size"] == 256


def test_network_engine_takes_a_fraction_and_no_share():
    # The openai stage does not count in the split: the model stage keeps both CPUs.
    pools = size_pools(
        [
            PoolRequest("model:m", {"type": "embedding"}, TORCH_POOL),
            PoolRequest("judge:j", {"type": "openai"}, NETWORK_POOL),
        ],
        _cluster((2, 0)),
    )
    assert _values(pools["model:m"])["threads"] == 2
    assert pools["judge:j"].values["concurrency"] == 1
    assert pools["judge:j"].values["num_cpus"] == 0.25
    assert pools["judge:j"].values["threads"] is None


def test_with_gpus_one_actor_per_gpu():
    pools = size_pools(
        [PoolRequest("model:m", {"type": "embedding"}, TORCH_POOL)], _cluster((16, 4))
    )
    assert _values(pools["model:m"]) == {
        "concurrency": 4,
        "num_cpus": 1.0,
        "num_gpus": 1.0,
        "threads": 1,
    }
    assert pools["model:m"].values["batch_size"] == 16384  # GPU_MODEL_BATCH_ROWS
    assert "one actor per GPU" in pools["model:m"].rule


def test_gpus_split_between_gpu_stages_and_tensor_parallel():
    # 2 nodes x 4 GPUs: model and judge get 4 GPUs each; the judge spans 2 GPUs an actor.
    pools = size_pools(
        [
            PoolRequest("model:m", {"type": "embedding"}, TORCH_POOL),
            PoolRequest("judge:j", {"type": "vllm", "tensor_parallel_size": 2}, VLLM_POOL),
        ],
        _cluster((16, 4), (16, 4)),
    )
    assert pools["model:m"].values["concurrency"] == 4
    assert pools["model:m"].values["num_gpus"] == 1.0
    assert pools["judge:j"].values["concurrency"] == 2
    assert pools["judge:j"].values["num_gpus"] == 2.0
    assert pools["judge:j"].values["batch_size"] == 256


def test_fewer_gpus_than_gpu_stages_share_one():
    pools = size_pools(
        [
            PoolRequest("model:m", {"type": "embedding"}, TORCH_POOL),
            PoolRequest("judge:j", {"type": "vllm"}, VLLM_POOL),
        ],
        _cluster((8, 1)),
    )
    assert pools["model:m"].values["num_gpus"] == 0.5
    assert pools["judge:j"].values["num_gpus"] == 0.5
    assert pools["model:m"].values["concurrency"] == pools["judge:j"].values["concurrency"] == 1


def test_device_cpu_stays_on_cpus_beside_gpus():
    pools = size_pools(
        [PoolRequest("model:m", {"type": "embedding", "device": "cpu"}, TORCH_POOL)],
        _cluster((4, 2)),
    )
    assert pools["model:m"].values["num_gpus"] == 0.0
    assert pools["model:m"].values["threads"] == 4


def test_vllm_on_cpus_owns_the_node_threads():
    pools = size_pools([PoolRequest("judge:j", {"type": "vllm"}, VLLM_POOL)], _cluster((2, 0)))
    assert _values(pools["judge:j"]) == {
        "concurrency": 1,
        "num_cpus": 1.0,
        "num_gpus": 0.0,
        "threads": 2,
    }
    assert pools["judge:j"].values["batch_size"] == 64


def test_several_nodes():
    # 2 nodes x 8 CPUs: threads capped at 4; 16 / 4 = 4 actors; (16 - 1) / 4 = 3.75 CPU.
    pools = size_pools(
        [PoolRequest("model:m", {"type": "embedding"}, TORCH_POOL)], _cluster((8, 0), (8, 0))
    )
    assert _values(pools["model:m"]) == {
        "concurrency": 4,
        "num_cpus": 3.75,
        "num_gpus": 0.0,
        "threads": 4,
    }


def test_explicit_settings_are_kept():
    spec = {"type": "embedding", "concurrency": 2, "batch_size": 64}
    choice = size_pools([PoolRequest("model:m", spec, TORCH_POOL)], _cluster((16, 0)))["model:m"]
    # concurrency and batch_size as written; threads 16 / 2 = 8, CPUs (16 - 1) / 2 = 7.5
    assert choice.values["concurrency"] == 2 and choice.values["batch_size"] == 64
    assert choice.values["threads"] == 8 and choice.values["num_cpus"] == 7.5
    assert choice.chosen == ("num_cpus", "num_gpus", "threads")
    full = {
        "type": "embedding",
        "concurrency": 1,
        "num_cpus": 1,
        "num_gpus": 0,
        "threads": 3,
        "batch_size": 10,
    }
    choice = size_pools([PoolRequest("model:m", full, TORCH_POOL)], _cluster((2, 0)))["model:m"]
    assert _values(choice) == {"concurrency": 1, "num_cpus": 1, "num_gpus": 0.0, "threads": 3}
    assert choice.chosen == ()


def test_a_fully_set_stage_keeps_its_cpus_out_of_the_split():
    # 4 CPUs; the model stage holds 1 (set); presidio gets 4 - 1 = 3 CPUs, 3 - 1 = 2 to
    # reserve: 3 actors of 1 thread, 2 / 3 CPU each.
    pools = size_pools(
        [
            PoolRequest(
                "model:m", {"type": "embedding", "concurrency": 1, "num_cpus": 1}, TORCH_POOL
            ),
            PoolRequest("pii:p", {"type": "presidio"}, SINGLE_THREAD_POOL),
        ],
        _cluster((4, 0)),
    )
    assert pools["pii:p"].values["concurrency"] == 3
    assert pools["pii:p"].values["num_cpus"] == pytest.approx(2 / 3, abs=1e-4)
    assert pools["model:m"].values["threads"] == 1


def _plan(tmp_path, engines: dict, metrics: list) -> object:
    config = JobConfig.from_dict(
        {
            "input": {"uri": str(tmp_path / "x.csv"), "columns": {"answer": "a", "reference": "r"}},
            "output": {"uri": str(tmp_path / "out")},
            "metrics": metrics,
            "engines": engines,
        }
    )
    return build_plan(config, inspect_input=False)


def test_plan_sizes_its_stages_and_says_so(tmp_path):
    plan = _plan(
        tmp_path,
        {"m": {"type": "embedding"}},
        [{"name": "semantic_similarity", "engine": "m"}],
    )
    (stage,) = plan.stages
    assert stage.engine.threads is None and stage.pool is None
    plan.size_pools([Node("n", {"CPU": 4.0})])
    assert stage.engine.threads == 4 and stage.engine.num_cpus == 3.0
    assert plan.engines["m"] is stage.engine
    assert actor_bundles(stage.engine) == ({"CPU": 3.0},)
    options = map_batches_options(stage.engine)
    assert options["num_cpus"] == 3.0 and options["batch_size"] == 4096
    described = stage.describe()
    assert described["pool"]["chosen"] == ALL
    assert described["engine_spec"]["threads"] == 4
    # a second sizing changes nothing
    plan.size_pools([Node("n", {"CPU": 64.0})])
    assert stage.engine.threads == 4


def test_unsized_spec_validates_and_keeps_none():
    spec = engine_adapter().validate_python({"type": "embedding"})
    assert (spec.concurrency, spec.num_cpus, spec.num_gpus, spec.threads, spec.batch_size) == (
        None,
        None,
        None,
        None,
        None,
    )


def test_dry_run_says_how_the_pool_was_sized(tmp_path, capsys):
    from ragbatch.cli import main

    (tmp_path / "in.csv").write_text("a,r\nx,y\n", encoding="utf-8")
    (tmp_path / "job.yaml").write_text(
        f"input: {{uri: {tmp_path / 'in.csv'}, columns: {{answer: a, reference: r}}}}\n"
        f"output: {{uri: {tmp_path / 'out'}}}\n"
        "engines: {e: {type: embedding}}\n"
        "metrics: [{name: semantic_similarity, engine: e}]\n",
        encoding="utf-8",
    )
    assert main(["run", str(tmp_path / "job.yaml"), "--dry-run"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "sized for this machine:" in out
    assert "(chosen: concurrency, num_cpus, num_gpus, threads, batch_size)" in out


def test_torch_threads_are_the_default_of_every_thread_of_a_fresh_process():
    # In a fresh process (torch not yet imported) the count becomes every thread's
    # default, a thread started afterwards (an actor's event loop) included.
    import subprocess
    import sys

    script = (
        "import threading\n"
        "from ragbatch.engines.threads import set_torch_threads\n"
        "print(set_torch_threads(3))\n"
        "import torch\n"
        "seen = []\n"
        "t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))\n"
        "t.start(); t.join()\n"
        "print(torch.get_num_threads(), seen[0])\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "OMP_NUM_THREADS"}
    env["OMP_NUM_THREADS"] = "1"  # what Ray gives an actor that reserved one CPU
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    ).stdout.split()
    assert out == ["False", "3", "3"]
