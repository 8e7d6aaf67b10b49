"""The typed manifest (ragbatch.io.manifest_model): what it reads, what it writes back, what
it refuses, and that docs/output-schema.md's table is the model's."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from ragbatch.core.errors import InputError
from ragbatch.io.manifest_model import (
    SCHEMA_VERSION,
    Manifest,
    manifest_doc_table,
    parse_manifest,
    read_manifest,
)

DOC = Path(__file__).resolve().parents[1] / "docs" / "output-schema.md"

#: A manifest as a run before ``schema_version`` wrote it (values made up, shape real).
OLD = {
    "ragbatch_version": "0.9.0",
    "run": {
        "id": "r1",
        "name": "demo",
        "date": "2026-11-28",
        "status": "committed",
        "started_at": "2026-11-28T01:00:00+00:00",
        "finished_at": "2026-11-28T01:02:03+00:00",
        "uri_templates": {"input.uri": "in/run_date={run_date}/"},
    },
    "config": {"input": {"uri": "in/run_date=2026-11-28/", "storage_options": {"key": "***"}}},
    "input": {
        "uri": "in/run_date=2026-11-28/",
        "read_tasks": 2,
        "rows": 3,
        "fingerprint": {"sha256": "ab12", "files": [["a.parquet", 10, "e1"]]},
        "slice_columns": [{"input": "App", "output": "app"}],
    },
    "output": {
        "root": "out",
        "scores": "out/scores/x",
        "summary": "out/summary/x/summary.parquet",
        "manifest": "out/runs/x/manifest.json",
    },
    "stages": [{"kind": "expression", "metrics": ["exact_match"]}],
    "metrics": [{"id": "em", "name": "exact_match", "kind": "expression", "params": {}}],
    "models": {},
    "counts": {"em": {"ok": 2, "missing_input": 1}},
    "rows": {"input": 3, "scores": 3},
    "timings_s": {"plan_s": 0.25, "total_s": 1.5},
    "packages": {"ragbatch": "0.9.0"},
    "python": "3.12.3",
    "platform": "Linux-x86_64",
    "ray": {"address": "local", "started_locally": True},
    "judge": {
        "metrics": {},
        "total": {
            k: 0
            for k in (
                "judge_calls",
                "cache_hits",
                "prompt_tokens",
                "completion_tokens",
                "cached_prompt_tokens",
                "refused_too_long",
                "refused_prompt_tokens",
            )
        },
        "engines": {},
    },
    "pii": {},
    "resume": {
        "attempt": 2,
        "resumed": True,
        "rows_reused": 1,
        "files_reused": 1,
        "files_set_aside": 0,
    },
    "faults": {
        "error_budget": 0.01,
        "stages": {"engine m": {"batches": 1, "failed_rows": 0}},
        "total": {"batches": 1, "failed_rows": 0},
    },
    "placement": {
        "model:m": {
            "bundles": [{"CPU": 1.0}],
            "min_actors": 1,
            "max_actors": 2,
            "actors": 1,
            "actor_starts": 1,
            "node_ids": ["n1"],
        }
    },
    "summary": {"confidence": 0.95},
    "diagnostics": {},
}


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_an_old_manifest_reads_as_version_1_and_writes_back_the_same(tmp_path):
    manifest = read_manifest(str(_write(tmp_path, OLD)))
    assert manifest.schema_version == 1 == SCHEMA_VERSION
    assert manifest.run.date.isoformat() == "2026-11-28"
    assert manifest.input.slice_columns[0].output == "app"
    assert manifest.resume.attempt == 2 and manifest.placement["model:m"].max_actors == 2
    assert manifest.metric_names == {"em": "exact_match"}
    written = manifest.to_json_dict()
    assert list(written) == ["schema_version", *OLD]
    assert json.dumps({k: v for k, v in written.items() if k != "schema_version"}) == json.dumps(
        OLD
    )


def test_numbers_keep_their_json_type(tmp_path):
    data = copy.deepcopy(OLD)
    data["placement"]["model:m"]["bundles"] = [{"CPU": 1, "GPU": 0.5}]
    data["timings_s"] = {"total_s": 2.0}
    text = json.dumps(read_manifest(str(_write(tmp_path, data))).to_json_dict())
    assert '"bundles": [{"CPU": 1, "GPU": 0.5}]' in text and '"total_s": 2.0' in text


def test_sections_added_later_read_as_empty_and_unknown_keys_are_kept():
    data = {k: v for k, v in OLD.items() if k not in ("diagnostics", "placement", "pii")}
    data["run"] = {**OLD["run"], "queue": "nightly"}
    data["lineage"] = {"parent": "r0"}
    manifest = parse_manifest(json.dumps(data), "m.json")
    assert (manifest.diagnostics, manifest.placement, manifest.pii) == ({}, {}, {})
    written = manifest.to_json_dict()
    assert written["run"]["queue"] == "nightly" and written["lineage"] == {"parent": "r0"}


def test_a_newer_schema_version_is_refused_with_the_fix(tmp_path):
    path = _write(tmp_path, {**OLD, "schema_version": SCHEMA_VERSION + 1})
    with pytest.raises(
        InputError,
        match=rf"{re.escape(str(path))} cannot be read: schema_version: .*"
        "newer than this ragbatch reads.*upgrade ragbatch",
    ):
        read_manifest(str(path))


def test_a_section_of_the_wrong_shape_is_named():
    data = {**OLD, "rows": {"input": "three", "scores": 3}}
    with pytest.raises(InputError, match=r"m\.json cannot be read: rows\.input: "):
        parse_manifest(json.dumps(data), "m.json")


def test_text_that_is_not_json_is_refused():
    with pytest.raises(
        InputError,
        match=r"the manifest m\.json is not valid JSON \(.*\); the run "
        "cannot be read",
    ):
        parse_manifest("{", "m.json")


def test_the_doc_table_is_the_models():
    section = DOC.read_text(encoding="utf-8").split("\n## Manifest\n", 1)[1].split("\n## ", 1)[0]
    table = "\n".join(ln for ln in section.splitlines() if ln.startswith("|"))
    assert table == manifest_doc_table()
    keys = re.findall(r"^\| `([a-z_]+)` \|", table, flags=re.M)
    assert keys == list(Manifest.model_fields) and keys[:2] == [
        "schema_version",
        "ragbatch_version",
    ]
    assert len(keys) == 23  # the 22 keys written before schema_version, and it
