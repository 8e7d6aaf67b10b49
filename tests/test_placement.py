"""Placement of the actor stages: the resources an actor holds, the map_batches options,
the fit check against a cluster's nodes, and the config checks on the placement fields.

The fit cases are worked by hand: each node list below is small enough to pack on paper.
"""

from __future__ import annotations

import pytest

from ragbatch.cli import main
from ragbatch.config.job import JobConfig
from ragbatch.core.errors import ConfigError
from ragbatch.core.placement import (
    Node,
    StageDemand,
    actor_bundles,
    fit_problems,
    free_cpus_after,
    local_nodes,
    map_batches_options,
    read_task_problem,
    stage_demand,
)
from ragbatch.pipeline.plan import build_plan


def _vllm(**extra):
    return {"type": "vllm", "model": "/models/judge", **extra}


# -- bundles -----------------------------------------------------------------------------------


def test_one_bundle_per_actor_with_accelerator_mark_and_custom_resources():
    spec = {
        "type": "embedding",
        "num_cpus": 2,
        "num_gpus": 0.5,
        "accelerator_type": "L4",
        "resources": {"gpu_node": 1},
    }
    assert actor_bundles(spec) == (
        {"CPU": 2.0, "GPU": 0.5, "accelerator_type:L4": 0.001, "gpu_node": 1.0},
    )


def test_cpu_only_actor_has_no_zero_entries():
    assert actor_bundles({"type": "embedding"}) == ({"CPU": 1.0},)
    assert actor_bundles({"type": "embedding", "num_cpus": 0}) == ({},)


def test_tensor_parallel_engine_holds_one_gpu_bundle_per_worker():
    bundles = actor_bundles(_vllm(tensor_parallel_size=4, num_gpus=4, accelerator_type="A100"))
    mark = {"accelerator_type:A100": 0.001}
    assert bundles == (
        {"CPU": 1.0, "GPU": 1.0, **mark},
        {"GPU": 1.0, **mark},
        {"GPU": 1.0, **mark},
        {"GPU": 1.0, **mark},
    )
    demand = stage_demand(
        "judge:big", _vllm(tensor_parallel_size=4, num_gpus=4, concurrency=[1, 3])
    )
    assert demand.per_actor == {"CPU": 1.0, "GPU": 4.0}
    assert (demand.min_actors, demand.max_actors) == (1, 3)


# -- map_batches options -----------------------------------------------------------------------


def test_options_pass_accelerator_type_and_resources():
    options = map_batches_options(
        {
            "type": "embedding",
            "num_gpus": 1,
            "accelerator_type": "A10G",
            "resources": {"gpu_node": 1},
            "concurrency": [2, 5],
            "batch_size": 32,
        }
    )
    assert options["accelerator_type"] == "A10G"
    assert options["resources"] == {"gpu_node": 1}
    assert (options["num_gpus"], options["num_cpus"], options["batch_size"]) == (1.0, 1.0, 32)
    assert (options["compute"].min_size, options["compute"].max_size) == (2, 5)
    assert "ray_remote_args_fn" not in options
    assert "ray_remote_args_fn" not in map_batches_options({"type": "embedding"})


def test_tensor_parallel_options_reserve_a_placement_group_per_actor(ray_local):
    from ray.util.placement_group import remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    options = map_batches_options(_vllm(tensor_parallel_size=2, num_gpus=2))
    assert options["num_gpus"] == 0 and "accelerator_type" not in options
    # The function Ray Data calls for each new actor reserves the bundles. This machine
    # has no GPU, so reserve CPU bundles through the same function to see it work.
    reserve = options["ray_remote_args_fn"]
    assert reserve.args == ([{"CPU": 1.0, "GPU": 1.0}, {"GPU": 1.0}],)
    args = reserve.func([{"CPU": 1.0}, {"CPU": 0.5}])
    strategy = args["scheduling_strategy"]
    assert isinstance(strategy, PlacementGroupSchedulingStrategy)
    assert strategy.placement_group_capture_child_tasks is True
    group = strategy.placement_group
    try:
        assert ray_local.get(group.ready(), timeout=30)
        assert group.bundle_specs == [{"CPU": 1.0}, {"CPU": 0.5}]
    finally:
        remove_placement_group(group)


# -- fit check ---------------------------------------------------------------------------------

CPU_NODE = Node("cpu", {"CPU": 8.0})
GPU_NODE = Node("gpu", {"CPU": 4.0, "GPU": 2.0, "accelerator_type:L4": 1.0, "gpu_node": 1.0})


def test_everything_fits():
    demands = [
        StageDemand("model:minilm", ({"CPU": 1.0},), 2, 4),
        StageDemand("judge:j", ({"CPU": 1.0, "GPU": 1.0, "accelerator_type:L4": 0.001},), 2, 2),
    ]
    assert fit_problems(demands, [CPU_NODE, GPU_NODE]) == []
    # 12 CPUs - 2 x 1 (minilm) - 2 x 1 (judge) = 8 left for tasks
    assert free_cpus_after(demands, [CPU_NODE, GPU_NODE]) == 8.0


def test_no_node_has_the_accelerator():
    demands = [
        StageDemand("judge:j", ({"CPU": 1.0, "GPU": 1.0, "accelerator_type:A100": 0.001},), 1, 1)
    ]
    (problem,) = fit_problems(demands, [CPU_NODE, GPU_NODE])
    assert problem.startswith(
        "stage judge:j: one actor needs {CPU: 1, GPU: 1, accelerator_type:A100: 0.001}"
    )
    assert "largest amounts on one node: {CPU: 8, GPU: 2, accelerator_type:A100: 0}" in problem


def test_tensor_parallel_bundles_must_share_one_node():
    # Two nodes with 2 GPUs each hold 4 GPUs, but a 4-way engine needs them on one node.
    nodes = [GPU_NODE, Node("gpu2", dict(GPU_NODE.resources))]
    demand = stage_demand("judge:tp4", _vllm(tensor_parallel_size=4, num_gpus=4))
    (problem,) = fit_problems([demand], nodes)
    assert "one actor needs {CPU: 1, GPU: 4}" in problem and "{CPU: 4, GPU: 2}" in problem


def test_pool_larger_than_the_cluster_holds():
    # 1-GPU actors: 2 fit on the GPU node; a pool of at least 3 does not.
    demands = [StageDemand("model:ce", ({"CPU": 1.0, "GPU": 1.0},), 3, 6)]
    (problem,) = fit_problems(demands, [CPU_NODE, GPU_NODE])
    assert problem == (
        "stage model:ce: concurrency asks for at least 3 actors of {CPU: 1, GPU: 1}, "
        "but the nodes hold 2 at most"
    )


def test_stages_that_fit_alone_but_not_together():
    # Each stage alone fits the GPU node (2 GPUs); together they need 3.
    demands = [
        StageDemand("model:ce", ({"CPU": 1.0, "GPU": 1.0},), 1, 1),
        StageDemand("judge:j", ({"CPU": 1.0, "GPU": 2.0},), 1, 1),
    ]
    (problem,) = fit_problems(demands, [CPU_NODE, GPU_NODE])
    assert problem.startswith("the actor stages together need {CPU: 2, GPU: 3}")
    assert "model:ce x1, judge:j x1" in problem and "stage model:ce is left without room" in problem


def test_custom_resource_pins_a_stage_to_the_nodes_that_have_it():
    demands = [StageDemand("model:m", ({"CPU": 1.0, "gpu_node": 1.0},), 1, 1)]
    assert fit_problems(demands, [CPU_NODE, GPU_NODE]) == []
    (problem,) = fit_problems(demands, [CPU_NODE])
    assert "gpu_node: 0" in problem


# -- config checks -----------------------------------------------------------------------------


def _config(engine: dict) -> dict:
    return {
        "input": {"uri": "x.csv"},
        "output": {"uri": "out"},
        "engines": {"e": engine},
        "metrics": [{"name": "semantic_similarity", "engine": "e"}],
    }


@pytest.mark.parametrize("name", ["GPU", "CPU", "memory", "accelerator_type:A100"])
def test_builtin_resources_are_refused_under_resources(name):
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict(_config({"type": "embedding", "resources": {name: 1}}))
    assert str(err.value) == (
        f"engines.e.resources: {name!r} is one of Ray's built-in resources, "
        "not a custom one; use num_cpus, num_gpus or accelerator_type instead"
    )


def test_tensor_parallel_needs_one_gpu_per_worker():
    config = _config(_vllm(tensor_parallel_size=2, num_gpus=1))
    config["metrics"] = [{"name": "faithfulness", "engine": "e"}]
    with pytest.raises(ConfigError) as err:
        JobConfig.from_dict(config)
    assert "tensor_parallel_size 2 runs one worker per GPU" in str(err.value)
    assert "set num_gpus: 2 (it is 1)" in str(err.value)


def test_tensor_parallel_without_num_gpus_is_sized_to_its_workers(tmp_path):
    # num_gpus left unset: the pool rule gives each actor tensor_parallel_size GPUs.
    (tmp_path / "judge").mkdir()
    config = _config({**_vllm(tensor_parallel_size=2), "model": str(tmp_path / "judge")})
    config["metrics"] = [{"name": "faithfulness", "engine": "e"}]
    job = JobConfig.from_dict(config)
    job.input.uri = str(tmp_path / "x.csv")
    plan = build_plan(job, inspect_input=False)
    plan.size_pools([Node("n", {"CPU": 8.0, "GPU": 4.0})])
    assert plan.engines["e"].num_gpus == 2.0
    assert plan.engines["e"].concurrency == 2
    assert actor_bundles(plan.engines["e"]) == ({"CPU": 1.0, "GPU": 1.0}, {"GPU": 1.0})


def test_unknown_accelerator_type_is_named_with_a_suggestion(tmp_path):
    config = JobConfig.from_dict(_config({"type": "embedding", "accelerator_type": "A10"}))
    config.input.uri = str(tmp_path / "x.csv")
    with pytest.raises(ConfigError) as err:
        build_plan(config, inspect_input=False)
    assert "engines.e.accelerator_type: 'A10' is not an accelerator type Ray knows" in str(
        err.value
    )
    assert "did you mean 'A10G'" in str(err.value)


def test_validate_reports_what_will_not_fit_on_this_machine(tmp_path, capsys):
    (tmp_path / "in.csv").write_text("a,r\nx,y\n", encoding="utf-8")
    (tmp_path / "job.yaml").write_text(
        f"input: {{uri: {tmp_path / 'in.csv'}, columns: {{answer: a, reference: r}}}}\n"
        f"output: {{uri: {tmp_path / 'out'}}}\n"
        "engines: {e: {type: embedding, num_gpus: 1, concurrency: 2}}\n"
        "metrics: [{name: semantic_similarity, engine: e}]\n",
        encoding="utf-8",
    )
    assert main(["validate", str(tmp_path / "job.yaml")]) == 2
    out, err = capsys.readouterr()
    # num_cpus left unset: 2 actors share the CPU the read tasks do not keep (2 - 1).
    assert "placement model:e: 2 actor(s), each {CPU: 0.5, GPU: 1}" in out
    assert "will not fit" in err and "stage model:e: one actor needs {CPU: 0.5, GPU: 1}" in err


@pytest.mark.parametrize(
    "num_cpus, concurrency, fails", [(1, 2, True), (1.5, 1, True), (0.5, 2, False), (1, 1, False)]
)
def test_run_refuses_actor_pools_that_leave_no_cpu_for_read_tasks(
    ray_local, tmp_path, num_cpus, concurrency, fails
):
    # The session's local Ray has 2 CPUs; a read task needs 1 (so 2 x 1 and 1 x 1.5 leave
    # none: Ray Data would queue the read behind the actors forever).
    from ragbatch.pipeline.runner import check_fit

    config = JobConfig.from_dict(
        _config({"type": "embedding", "num_cpus": num_cpus, "concurrency": concurrency})
    )
    config.input.uri = str(tmp_path / "x.csv")
    plan = build_plan(config, inspect_input=False)
    if not fails:
        check_fit(plan, started_locally=True)
        return
    with pytest.raises(ConfigError) as err:
        check_fit(plan, started_locally=True)
    assert (
        f"hold {num_cpus * concurrency:g} of the 2 CPUs and leave no node a whole CPU "
        f"({2 - num_cpus * concurrency:g} left in all)"
    ) in str(err.value)
    assert "Lower an engine's concurrency or its num_cpus" in str(err.value)
    check_fit(plan, started_locally=False)  # on a cluster: a warning, the autoscaler may add nodes


def test_read_tasks_need_a_whole_cpu_on_one_node():
    # 0.2 x 3 + 0.8 x 3 = 3 of 4 CPUs: one is left, exactly (no float rounding refusal)
    exact = [
        StageDemand("model:a", ({"CPU": 0.2},), 3, 3),
        StageDemand("model:b", ({"CPU": 0.8},), 3, 3),
    ]
    assert read_task_problem(exact, [Node("n", {"CPU": 4.0})]) is None
    # two 2-CPU nodes, one 1.5-CPU actor on each: 1 CPU left in all, but 0.5 per node
    split = [StageDemand("model:a", ({"CPU": 1.5},), 2, 2)]
    nodes = [Node("n1", {"CPU": 2.0}), Node("n2", {"CPU": 2.0})]
    assert fit_problems(split, nodes) == []
    assert read_task_problem(split, nodes) == (
        "the actor stages' smallest pools hold 3 of the 4 CPUs and leave no node a whole CPU "
        "(1 left in all): the read, expression and write tasks need 1 CPU each on one node and "
        "would wait for the actors forever. Lower an engine's concurrency or its num_cpus "
        "(fractions such as 0.5 are allowed)"
    )
    # GPU-only actors (num_cpus: 0) hold no CPU
    gpu_only = [StageDemand("judge:j", ({"GPU": 1.0},), 2, 2)]
    assert read_task_problem(gpu_only, [Node("g", {"CPU": 1.0, "GPU": 2.0})]) is None
    assert read_task_problem([], nodes) is None


def test_validate_refuses_pools_that_leave_no_cpu_for_read_tasks(tmp_path, capsys):
    cpus = sum(n.resources.get("CPU", 0.0) for n in local_nodes())
    (tmp_path / "in.csv").write_text("a,r\nx,y\n", encoding="utf-8")
    (tmp_path / "job.yaml").write_text(
        f"input: {{uri: {tmp_path / 'in.csv'}, columns: {{answer: a, reference: r}}}}\n"
        f"output: {{uri: {tmp_path / 'out'}}}\n"
        f"engines: {{e: {{type: embedding, num_cpus: {cpus / 2:g}, concurrency: 2}}}}\n"
        "metrics: [{name: semantic_similarity, engine: e}]\n",
        encoding="utf-8",
    )
    assert main(["validate", str(tmp_path / "job.yaml")]) == 2
    out, err = capsys.readouterr()
    assert "placement on this machine (local Ray) (1 node(s)): will not run" in err
    assert f"hold {cpus:g} of the {cpus:g} CPUs and leave no node a whole CPU" in err
