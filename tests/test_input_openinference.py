"""OpenInference span exports as input (``input.format: openinference``,
:mod:`ragbatch.io.formats.openinference`): one row per trace.

The spans are real: made offline by the ``openinference-instrumentation`` package's own
tracer (benchmarks/openinference_traces.py, which also wrote the shipped
examples/data/openinference/traces.jsonl), from ARES rows the repository ships. A job
over a span export is compared cell by cell with the same job over a Parquet file of the
same rows, whose columns are worked out here from the rows.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from ragbatch.config.job import JobConfig
from ragbatch.core.errors import ConfigError, InputError
from ragbatch.pipeline.runner import run_job

pytest.importorskip("openinference.semconv")

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "examples/data/openinference/traces.jsonl"
ATTRIBUTES = {"model": "llm.model_name", "session": "session.id"}
METRICS = [
    {"name": "response_length", "params": {"min_chars": 1, "max_chars": 400}},
    {"name": "context_length", "params": {"max_chars": 2000}},
    {"name": "contains_text", "id": "mentions_spark", "params": {"text": ["spark"]}},
    {"name": "latency", "params": {"target_s": 0.7}},
]


def _script():
    spec = importlib.util.spec_from_file_location(
        "openinference_traces", REPO / "benchmarks/openinference_traces.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def trace_job(uri: str, out: Path, **input_fields) -> JobConfig:
    return JobConfig.from_dict(
        {
            "run": {"name": "traces", "executor": "in_process"},
            "input": {"uri": uri, **input_fields},
            "output": {"uri": str(out)},
            "metrics": METRICS,
        }
    )


def scores(out: Path, run_id: str) -> list[tuple]:
    return duckdb.sql(
        "SELECT row_id, metric, score, status, trace_status, trace_reason, model, session "
        f"FROM read_parquet('{out}/scores/**/*.parquet', hive_partitioning=true, "
        f"union_by_name=true) WHERE run_id = '{run_id}' ORDER BY row_id, metric"
    ).fetchall()


def test_the_shipped_export_gives_one_row_per_trace_with_its_status():
    from ragbatch.io.formats.openinference import assemble_traces

    spans = [json.loads(line) for line in SHIPPED.read_text(encoding="utf-8").splitlines()]
    table = assemble_traces(spans, ATTRIBUTES).to_pylist()
    assert len(table) == 20
    assert [r["trace_id"] for r in table] == [f"0x{i:032x}" for i in range(1, 21)]
    assert all(r["trace_status"] == "complete" and r["trace_reason"] is None for r in table[:16])
    assert [r["trace_reason"] for r in table[16:]] == [
        "no answer; span generate ended with status ERROR (the model did not reply)",
        "no retriever span",
        "retriever span without documents",
        "no root span",
    ]
    assert {r["trace_status"] for r in table[16:]} == {"partial"}
    # the partial rows keep what they have
    assert table[16]["answer"] is None and table[16]["question"]
    assert table[17]["contexts"] is None and table[17]["answer"]
    assert table[18]["contexts"] == []
    assert table[19]["question"] and table[19]["session"] is None
    assert table[19]["model"] == "scripted-stand-in"


def test_a_job_over_the_shipped_export_keeps_every_trace(tmp_path):
    cfg = trace_job(
        str(SHIPPED), tmp_path / "out", format="openinference", trace_attributes=ATTRIBUTES
    )
    result = run_job(cfg, run_id="shipped")
    got = scores(tmp_path / "out", "shipped")
    assert len(got) == 20 * len(METRICS)
    by_row = {(r[0], r[1]): r[3] for r in got}
    assert by_row[(f"0x{17:032x}", "response_length")] == "missing_input"  # no answer
    assert by_row[(f"0x{18:032x}", "context_length")] == "missing_input"  # no contexts
    assert result.check.n_rows == 20


def expected_rows(rows: list[dict], session: str) -> pa.Table:
    """The rows :func:`assemble_traces` must give for complete traces of ``rows``,
    worked out from the rows and the script's documented ids and times."""
    script = _script()
    return pa.table(
        {
            "trace_id": [f"0x{i + 1:032x}" for i in range(len(rows))],
            "question": [r["Question"] for r in rows],
            "contexts": [[r["Document"]] for r in rows],
            "answer": [r["Answer"] for r in rows],
            "latency_s": [int((0.25 + 0.001 * len(r["Answer"])) * 10**9) / 10**9 for r in rows],
            "trace_status": ["complete"] * len(rows),
            "trace_reason": pa.nulls(len(rows), pa.string()),
            "model": [script.MODEL] * len(rows),
            "session": [session] * len(rows),
        }
    )


@pytest.mark.parametrize(
    ("container", "executor"),
    [
        ("jsonl", "in_process"),
        ("jsonl.gz", "in_process"),
        ("parquet", "in_process"),
        pytest.param("jsonl", "ray", marks=pytest.mark.slow),
    ],
)
def test_cells_from_a_span_export_equal_those_from_parquet(tmp_path, request, container, executor):
    if executor == "ray":
        request.getfixturevalue("ray_local")  # the export is read through Ray Data
    script = _script()
    rows = script.read_night("2026-11-28")
    spans = script.build_spans(rows, session="night-2")
    export = tmp_path / "spans" / f"export.{container}"
    export.parent.mkdir()
    if container == "parquet":
        flat = [{**s, "attributes": json.dumps(s["attributes"])} for s in spans]
        pq.write_table(pa.Table.from_pylist(flat), export)
    else:
        text = "".join(json.dumps(s) + "\n" for s in spans).encode("utf-8")
        export.write_bytes(gzip.compress(text) if container.endswith(".gz") else text)
    cfg = trace_job(
        str(export.parent), tmp_path / "out", format="openinference", trace_attributes=ATTRIBUTES
    )
    cfg.run.executor = executor
    assert run_job(cfg, run_id="spans").manifest.ray["executor"] == executor

    src = tmp_path / "rows.parquet"
    pq.write_table(expected_rows(rows, "night-2"), src)
    columns = {
        "row_id": "trace_id",
        "question": "question",
        "contexts": "contexts",
        "answer": "answer",
        "latency_s": "latency_s",
    }
    run_job(trace_job(str(src), tmp_path / "pq", columns=columns), run_id="rows")
    got = scores(tmp_path / "out", "spans")
    assert len(got) == 16 * len(METRICS)
    assert got == scores(tmp_path / "pq", "rows")


def test_nested_attributes_read_as_flat_ones():
    from ragbatch.io.formats.openinference import assemble_traces

    script = _script()
    rows = script.read_night("2026-11-27")[:2]
    flat = script.build_spans(rows)
    nested = []
    for span in flat:
        tree: dict = {}
        for key, value in span["attributes"].items():
            node = tree
            *parents, leaf = key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        # lists of objects, as Phoenix exports documents and messages
        for parent in (tree.get("retrieval", {}), tree.get("llm", {})):
            for name, value in list(parent.items()):
                if isinstance(value, dict) and value and all(k.isdigit() for k in value):
                    parent[name] = [value[k] for k in sorted(value, key=int)]
        nested.append({**span, "attributes": tree})
    assert assemble_traces(nested, ATTRIBUTES) == assemble_traces(flat, ATTRIBUTES)


def _cli(tmp_path: Path, cfg: JobConfig) -> tuple[int, str]:
    from support.nightly_runs import run_cli

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)))
    code, _, err = run_cli(["run", str(path), "--run-id", "bad"])
    return code, err


def test_a_line_that_is_not_json_exits_2_naming_it(tmp_path):
    lines = SHIPPED.read_text(encoding="utf-8").splitlines()
    lines[2] = lines[2][:40]
    export = tmp_path / "spans.jsonl"
    export.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, err = _cli(tmp_path, trace_job(str(export), tmp_path / "out", format="openinference"))
    assert code == 2
    assert "spans.jsonl, line 3: not a JSON span" in err
    assert not (tmp_path / "out" / "_staging").exists()


def test_a_span_without_a_trace_id_is_an_input_error(tmp_path):
    from ragbatch.io.formats.openinference import assemble_traces

    with pytest.raises(InputError, match="span 1: the span has no trace id"):
        assemble_traces([{"name": "rag", "context": {"span_id": "0x1"}}], {})


def test_a_mapped_column_the_export_lacks_exits_2(tmp_path):
    cfg = trace_job(
        str(SHIPPED), tmp_path / "out", format="openinference", columns={"reference": "gold"}
    )
    code, err = _cli(tmp_path, cfg)
    assert code == 2 and "gold" in err


def test_the_trace_columns_are_mapped_by_default(tmp_path):
    cfg = trace_job(str(SHIPPED), tmp_path / "out", format="openinference")
    assert cfg.input.columns.row_id == "trace_id"
    assert cfg.input.columns.question == "question"
    assert cfg.input.columns.latency_s == "latency_s"
    mapped = trace_job(
        str(SHIPPED), tmp_path / "out", format="openinference", columns={"answer": "model"}
    )
    assert mapped.input.columns.answer == "model"


def test_trace_attributes_need_the_openinference_format(tmp_path):
    with pytest.raises(
        ConfigError, match="input.trace_attributes applies to input.format openinference"
    ):
        trace_job(str(SHIPPED), tmp_path / "out", trace_attributes=ATTRIBUTES)


def test_a_missing_package_names_the_extra(tmp_path, monkeypatch):
    real = importlib.util.find_spec

    def find_spec(name, *args):
        if name.startswith("openinference"):
            raise ModuleNotFoundError(name)
        return real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(ConfigError, match=r"pip install 'ragbatch\[traces\]'"):
        trace_job(str(SHIPPED), tmp_path / "out", format="openinference")
