"""``ragbatch validate``: a config, its input, params, placement and output checked without running."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ragbatch.config.job import JobConfig
from ragbatch.core.exit_codes import EXIT_INVALID, EXIT_OK
from ragbatch.core.redact import redact_url
from ragbatch.core.run_date import choose_run_date
from ragbatch.cli.common import _load


def cmd_validate(args: argparse.Namespace) -> int:
    from ragbatch.pipeline.in_process import choose_executor
    from ragbatch.pipeline.plan import build_plan, preflight_engines
    from ragbatch.pipeline.runner import prepare_import_paths
    from ragbatch.config.templating import render_config, uri_templates

    config = _load(args)
    templates = uri_templates(config)
    if templates:
        run_date = choose_run_date(config.run.run_date)
        config = render_config(config, run_date)
        print(f"run date {run_date.isoformat()} fills in {', '.join(templates)}")
    prepare_import_paths(Path(args.config).parent)
    plan = build_plan(config)
    choose_executor(plan, None)  # run.executor: in_process refuses a job that needs Ray
    preflight_engines(plan)
    _check_output_writable(config)
    schema = plan.input_schema
    print(f"config {args.config}: ok")
    print(
        f"input  {redact_url(config.input.uri)}: {len(plan.read_tasks)} read task(s); "
        f"columns: {', '.join(schema.names) if schema is not None else '?'}"
    )
    mapping = {k: v for k, v in config.input.columns.model_dump().items() if v}
    print(f"mapping: {json.dumps(mapping, ensure_ascii=False)}")
    print(f"slice columns: {', '.join(o for _, o in plan.slices) or '(none)'}")
    for stage in plan.stages:
        desc = stage.describe()
        extra = (
            f" on engine {desc['engine']} ({desc['engine_spec']['type']})"
            if "engine" in desc
            else ""
        )
        print(f"stage {stage.name}{extra}: {', '.join(desc['metrics'])}")
    from ragbatch.core.stages import StageKind

    for stage in plan.stages:
        if stage.kind is StageKind.PII:
            from ragbatch.engines.presidio import validate_note

            print(f"  engine {stage.engine_name} {validate_note(stage.engine)}")
    for m in plan.metrics:
        for note in m.validate_notes():
            print(f"  {m.id}: {note}")
    print(
        f"output {redact_url(config.output.uri)}: writable (a probe object was written and deleted)"
    )
    return _print_placement(plan, args.address or os.environ.get("RAY_ADDRESS"))


def _print_placement(plan, address: str | None) -> int:
    """The actor stages' resources and whether they fit the cluster (or this machine)."""
    from ragbatch.core.placement import (
        fit_problems,
        free_cpus_after,
        local_nodes,
        nodes_at,
        read_task_problem,
    )

    if not any(stage.engine is not None for stage in plan.stages):
        return EXIT_OK
    nodes = nodes_at(address) if address else local_nodes()
    plan.size_pools(nodes)
    demands = plan.demands()
    where = f"the cluster at {address}" if address else "this machine (local Ray)"
    for d in demands:
        pool = (
            f"{d.min_actors}" if d.min_actors == d.max_actors else f"{d.min_actors}..{d.max_actors}"
        )
        bundles = " + ".join(
            "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(b.items())) + "}" for b in d.bundles
        )
        print(f"placement {d.stage}: {pool} actor(s), each {bundles}")
        stage = next(s for s in plan.stages if s.name == d.stage)
        if stage.pool is not None and stage.pool.chosen:
            print(f"  sized for {where}: {stage.pool.rule}")
    problems = fit_problems(demands, nodes)
    if problems:
        print(f"placement on {where} ({len(nodes)} node(s)): will not fit", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        return EXIT_INVALID
    starved = read_task_problem(demands, nodes)
    if starved:
        # a local Ray cannot grow (`ragbatch run` stops too); a cluster's autoscaler may
        verdict = "will not run" if not address else "would wait for more nodes"
        print(f"placement on {where} ({len(nodes)} node(s)): {verdict}", file=sys.stderr)
        print(f"  {starved}", file=sys.stderr)
        return EXIT_OK if address else EXIT_INVALID
    spare = free_cpus_after(demands, nodes)
    print(
        f"placement on {where} ({len(nodes)} node(s)): fits; {spare:g} CPU(s) left for read "
        "and expression tasks"
    )
    return EXIT_OK


def _check_output_writable(config: JobConfig) -> None:
    """Write and delete a probe object under the output root (:mod:`ragbatch.io.probe`)."""
    from ragbatch.io.probe import probe_output

    probe_output(config.output.uri, config.output.storage_options)
