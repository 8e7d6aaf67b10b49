"""The per-run manifest: what ran, on what, with what result."""

from __future__ import annotations

import datetime as dt
import platform
import sys
from importlib import metadata
from typing import Any, cast

from ragbatch import __version__
from ragbatch.config.job import JobConfig
from ragbatch.io.write import OutputLayout, RunCheck
from ragbatch.io.manifest_model import FAULT_COUNTERS, SCHEMA_VERSION, JudgeTally, Manifest
from ragbatch.pipeline.plan import Plan
from ragbatch.core.redact import redact
from ragbatch.core.stages import StageKind

#: Distributions whose versions every manifest records (absent ones are skipped); each
#: engine's own packages follow (:attr:`ragbatch.core.engine_registry.EngineType.packages`).
PACKAGES = (
    "ragbatch",
    "ray",
    "polars",
    "pyarrow",
    "duckdb",
    "fsspec",
    "s3fs",
    "gcsfs",
    "pydantic",
    "jsonschema",
)


def package_versions() -> dict[str, str]:
    """Installed versions of :data:`PACKAGES`, then of the ``packages`` of every
    registered engine type (:mod:`ragbatch.core.engine_registry`) not already listed."""
    from ragbatch.core.engine_registry import engine_types

    extra = [p for e in engine_types() for p in e.packages if p not in PACKAGES]
    out = {}
    for name in (*PACKAGES, *dict.fromkeys(extra)):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def build_manifest(
    plan: Plan,
    layout: OutputLayout,
    check: RunCheck,
    *,
    started: dt.datetime,
    timings: dict[str, float],
    ray_info: dict[str, Any],
    judge: dict[str, Any] | None = None,
    resume: Any = None,
    faults: dict[str, dict[str, int]] | None = None,
    placement: dict[str, dict[str, Any]] | None = None,
    summary: Any = None,
    uri_templates: dict[str, str] | None = None,
) -> Manifest:
    """Assemble the manifest written as ``manifest.json``: a
    :class:`~ragbatch.io.manifest_model.Manifest`.

    Keys: ``schema_version`` (:data:`ragbatch.io.manifest_model.SCHEMA_VERSION`), ``run``
    (id, name, date, times, and ``uri_templates``: the URI fields written with
    ``{run_date}`` placeholders, as written), ``config`` (as run: URIs rendered for the
    run date),
    ``input`` (uri, read tasks, row count, fingerprint), ``output`` (paths), ``stages``,
    ``metrics`` (params, regex engine per regex metric), ``models`` (model ids per
    metric), ``counts`` (metric -> status -> cells), ``rows``, ``timings_s``,
    ``packages``, ``python``, ``platform``, ``ray``, and ``judge`` (per judge metric
    and in total: ``judge_calls`` the engine served in this run, ``cache_hits``,
    ``prompt_tokens``, ``completion_tokens`` and ``cached_prompt_tokens`` of the calls
    served, ``refused_too_long`` (requests refused as ``context_too_long``, never
    served) and ``refused_prompt_tokens`` (their prompt tokens); per engine its
    counters, for vLLM the prefix-cache hit rate; ``cache_files_set_aside``, the judgment
    cache's files this run could not read and moved under ``v2/damaged/``), ``pii`` (per
    PII engine, the detectors that ran) and
    ``resume`` (attempt number, whether the run resumed an interrupted one, rows and
    files reused from earlier attempts, files set aside), ``faults`` (the error
    budget, and per actor stage and in total: batches, batch starts, in-process batch
    retries, actors lost mid-batch and replaced, batches and rows marked ``error``; see
    :meth:`udfs.ledger.RunLedger.faults`), ``placement`` (per actor stage, by plan
    stage name such as ``model:<engine>``: the Ray ``node_ids`` its actors ran on, how
    many ``actors`` there were and how often they started (``actor_starts``: Ray restarts
    a dead actor under its id), plus what one actor asked for: ``bundles`` and the pool size
    ``min_actors``/``max_actors``), and ``summary`` (the settings
    of ``summary.parquet``'s intervals and slicing, and per slice column its number of
    distinct values and how many were pooled:
    :meth:`ragbatch.analysis.summary.RunSummary.manifest_info`; empty without ``summary``),
    and ``diagnostics`` (the judge health thresholds, and per judge metric whether its
    all-rows result is degenerate, why, and its measures:
    :meth:`~ragbatch.analysis.summary.RunSummary.diagnostics_info`; empty without ``summary``).

    The sections built from what the user wrote (``run``, ``config``, ``input``,
    ``output``, ``stages``, ``ray``) pass through :func:`ragbatch.core.redact.redact`: no
    credential key's value and no URL's credentials reach the manifest (docs/secrets.md).
    """
    from ragbatch.io.read import input_fingerprint

    manifest = {
        "schema_version": SCHEMA_VERSION,
        "ragbatch_version": __version__,
        "run": {
            "id": layout.run_id,
            "name": plan.config.run.name,
            "date": layout.run_date.isoformat(),
            "status": "committed",
            "started_at": started.isoformat(),
            "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(),
            "uri_templates": dict(uri_templates or {}),
        },
        "config": plan.config.model_dump(mode="json", by_alias=True),
        "input": {
            "uri": plan.config.input.uri,
            "read_tasks": len(plan.read_tasks),
            "rows": check.n_rows,
            "fingerprint": plan.input_fingerprint
            or input_fingerprint(plan.config.input, plan.read_tasks),
            "slice_columns": [{"input": i, "output": o} for i, o in plan.slices],
        },
        "output": {
            "root": layout.root,
            "scores": layout.uri(layout.scores_path),
            "summary": layout.uri(layout.summary_path),
            "manifest": layout.uri(layout.manifest_path),
        },
        "stages": [s.describe() for s in plan.stages],
        "metrics": [{**m.manifest_info(), **m.facts()} for m in plan.metrics],
        "models": check.models,
        "counts": check.counts,
        "rows": {"input": check.n_rows, "scores": check.n_cells},
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
        "packages": package_versions(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "ray": ray_info,
        "judge": judge_summary(plan, judge or {}),
        "pii": pii_summary(plan),
        "resume": {
            "attempt": resume.attempt if resume else 1,
            "resumed": bool(resume and resume.resumed),
            "rows_reused": len(resume.done_rows) if resume else 0,
            "files_reused": len(resume.accepted) if resume else 0,
            "files_set_aside": len(resume.set_aside) if resume else 0,
        },
        "faults": fault_summary(plan, faults or {}),
        "placement": placement_summary(plan, placement or {}),
        "summary": summary.manifest_info() if summary is not None else {},
        "diagnostics": summary.diagnostics_info() if summary is not None else {},
    }
    for section in _USER_SECTIONS:
        manifest[section] = redact(manifest[section])
    return Manifest.model_validate(manifest)


#: Manifest sections built from what the user wrote (config, URIs, engine specs, the Ray
#: address): :func:`build_manifest` redacts them.
_USER_SECTIONS = ("run", "config", "input", "output", "stages", "ray")


def placement_summary(plan: Plan, placement: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The manifest's ``placement`` section: per actor stage what one actor asked for and
    where the actors ran (:meth:`udfs.ledger.RunLedger.placement`)."""
    out: dict[str, Any] = {}
    for demand in plan.demands():
        ran = placement.get(demand.stage, {})
        out[demand.stage] = {
            "bundles": [dict(b) for b in demand.bundles],
            "min_actors": demand.min_actors,
            "max_actors": demand.max_actors,
            "actors": ran.get("actors", 0),
            "actor_starts": ran.get("actor_starts", 0),
            "node_ids": ran.get("node_ids", []),
        }
    return out


def fault_summary(plan: Plan, faults: dict[str, dict[str, int]]) -> dict[str, Any]:
    """The manifest's ``faults`` section: the error budget, the counters per actor stage
    (:meth:`udfs.ledger.RunLedger.faults`) and their sums."""
    return {
        "error_budget": plan.config.run.error_budget,
        "stages": faults,
        "total": {k: sum(int(f.get(k, 0)) for f in faults.values()) for k in FAULT_COUNTERS},
    }


def pii_summary(plan: Plan) -> dict[str, Any]:
    """The manifest's ``pii`` section: per PII engine, the detectors that ran
    (:func:`ragbatch.engines.presidio.describe_detectors`) and the metrics they served."""
    stages = [s for s in plan.stages if s.kind is StageKind.PII]
    if not stages:
        return {}
    from ragbatch.engines.presidio import describe_detectors

    # a PII stage always names its engine (plan._stages)
    return {
        cast(str, s.engine_name): {
            **describe_detectors(s.engine),
            "metrics": [m.id for m in s.metrics],
        }
        for s in stages
    }


#: The judge counters of the manifest's ``judge`` section, per metric and in total.
_TALLY_KEYS = tuple(JudgeTally.model_fields)


def judge_summary(plan: Plan, totals: dict[str, Any]) -> dict[str, Any]:
    """The manifest's ``judge`` section from the judge ledger's totals."""
    judge_ids = [s.metrics for s in plan.stages if s.kind is StageKind.JUDGE]
    ids = [m.id for metrics in judge_ids for m in metrics]
    per_metric = {
        mid: {k: int((totals.get("metrics", {}).get(mid) or {}).get(k, 0)) for k in _TALLY_KEYS}
        for mid in ids
    }
    total = {k: sum(v[k] for v in per_metric.values()) for k in _TALLY_KEYS}
    engines = {}
    for name, stats in (totals.get("engines") or {}).items():
        entry = dict(stats)
        queries, hits = stats.get("prefix_cache_queries"), stats.get("prefix_cache_hits")
        if queries:
            entry["prefix_cache_hit_rate"] = round(hits / queries, 4) if hits is not None else None
        engines[name] = entry
    return {
        "metrics": per_metric,
        "total": total,
        "engines": engines,
        "cache_files_set_aside": list(totals.get("cache_files_set_aside") or []),
    }


def pin_input_version(config: JobConfig, run_id: str, run_date: dt.date) -> JobConfig:
    """``config`` with the table version pinned, for a table input that leaves it unset
    (``input.version`` of a Delta table, ``input.snapshot_id`` of an Iceberg table: the
    format's ``pin`` field in :data:`ragbatch.config.formats.TABLE_FORMATS`): the version an
    earlier attempt of ``run_id`` read (so that a resume reads the same one, even if the
    table moved on since), else the table's current version.

    Parameters
    ----------
    config : JobConfig
        Rendered (no ``{run_date}`` placeholders left).
    run_id : str
    run_date : datetime.date
        The run's date (:func:`ragbatch.pipeline.runner.run_date_for`), which locates an
        earlier attempt's staging under ``output.uri``.

    Returns
    -------
    JobConfig
        ``config`` itself when the input is files or the version is set; else a copy with
        the version pinned. The run's fingerprint, manifest and resume all see it.

    Raises
    ------
    InputNotFoundError, InputError
        The table cannot be opened (:meth:`ragbatch.io.formats.TableFormat.current_version`).
    """
    from ragbatch.config.formats import TABLE_FORMATS
    from ragbatch.io.formats import table_format
    from ragbatch.io.staging import Staging

    reader = table_format(config.input.format)
    if reader is None:
        return config
    field = TABLE_FORMATS[reader.name].pin
    if getattr(config.input, field) is not None:
        return config
    recorded = Staging(OutputLayout.for_run(config.output, run_date, run_id)).input_version()
    if recorded is not None and recorded.get("format") == reader.name and field in recorded:
        version = int(recorded[field])
    else:
        version = reader.current_version(config.input)
    pinned = config.model_copy(deep=True)
    setattr(pinned.input, field, version)
    return pinned
