"""Write the small OpenInference span export shipped in examples/data/openinference/.

Each trace is made by running the ``openinference-instrumentation`` package's own tracer
(``OITracer`` over the OpenTelemetry SDK's ``TracerProvider``) offline: a CHAIN root span
whose input is the question, a RETRIEVER span holding the retrieved document, and an LLM
span for a scripted stand-in model that replies with the answer recorded in the data (no
network, no model). The spans are collected by the SDK's in-memory exporter and written
one per line as the SDK writes a span (``ReadableSpan.to_json()``). Trace and span ids are
sequential and the times fixed, so the file is the same on every run.

The rows are the ARES traces of examples/data/nightly (Apache-2.0, see its SOURCE.md):
the 16 rows of the first night as complete traces, then 4 rows of the second night as
partial traces, one of each kind: an LLM call that failed (span status ERROR, no output),
no retriever span, a retriever span without documents, and spans whose root span is
missing from the export.

Run: .venv/bin/python benchmarks/openinference_traces.py [out.jsonl]
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "examples/data/openinference/traces.jsonl"
NIGHTS = REPO / "examples/data/nightly"
#: Start of the first trace: 2026-11-27T00:00:00Z, in nanoseconds since the epoch.
T0 = int(dt.datetime(2026, 11, 27, tzinfo=dt.timezone.utc).timestamp()) * 10**9
MODEL = "scripted-stand-in"

#: What each partial trace lacks (see the module notes).
DAMAGE = ("llm_error", "no_retriever", "no_documents", "no_root")


def read_night(night: str) -> list[dict[str, str]]:
    """The rows of one night's TSV (every field as text)."""
    path = NIGHTS / f"run_date={night}" / f"ares-{night}.tsv"
    with path.open(encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))


def build_spans(
    rows: list[dict[str, Any]], damage: dict[int, str] | None = None, session: str = "night-1"
) -> list[dict[str, Any]]:
    """One trace per row (``Question``, ``Document``, ``Answer``), as span dicts.

    Parameters
    ----------
    rows : list of dict
        ``Document`` is one text or a list of texts (the retrieved documents in rank order).
    damage : dict of int to str, optional
        Row index -> one of :data:`DAMAGE`, for a partial trace.
    session : str
        The root spans' ``session.id``.

    Returns
    -------
    list of dict
        Spans in the order they ended, each as ``json.loads(span.to_json())``. Trace ``i``
        (from 0) has id ``i + 1`` (32 hex digits) and starts ``10 * i`` seconds after
        :data:`T0`; its root span lasts ``0.25 + 0.001 * len(answer)`` seconds.
    """
    from openinference.instrumentation import (
        OITracer,
        TraceConfig,
        get_input_attributes,
        get_llm_attributes,
        get_output_attributes,
        get_retriever_attributes,
        get_session_attributes,
    )
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.id_generator import IdGenerator

    class Sequential(IdGenerator):
        def __init__(self) -> None:
            self.trace = self.span = 0

        def generate_trace_id(self) -> int:
            self.trace += 1
            return self.trace

        def generate_span_id(self) -> int:
            self.span += 1
            return self.span

    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        id_generator=Sequential(), resource=Resource({"service.name": "ragbatch-example"})
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = OITracer(provider.get_tracer("ragbatch.example"), config=TraceConfig())
    damage = damage or {}
    dropped: set[str] = set()
    for i, row in enumerate(rows):
        kind = damage.get(i)
        question, answer = row["Question"], row["Answer"]
        documents = row["Document"] if isinstance(row["Document"], list) else [row["Document"]]
        start = T0 + i * 10 * 10**9
        end = start + int((0.25 + 0.001 * len(answer)) * 10**9)
        root = tracer.start_span(
            "rag",
            start_time=start,
            openinference_span_kind="chain",
            attributes={
                **get_input_attributes(question),
                **get_session_attributes(session_id=session),
            },
        )
        if kind == "no_root":
            dropped.add(format(root.get_span_context().span_id, "#018x"))
        context = trace.set_span_in_context(root)
        if kind != "no_retriever":
            found = [] if kind == "no_documents" else documents
            retriever = tracer.start_span(
                "retrieve",
                context=context,
                start_time=start + 10**7,
                openinference_span_kind="retriever",
                attributes=get_retriever_attributes(
                    documents=[{"content": d, "id": f"doc-{i}-{r}"} for r, d in enumerate(found)]
                ),
            )
            retriever.end(end_time=start + 5 * 10**7)
        llm = tracer.start_span(
            "generate",
            context=context,
            start_time=start + 6 * 10**7,
            openinference_span_kind="llm",
            attributes=get_llm_attributes(
                model_name=MODEL,
                input_messages=[{"role": "user", "content": question}],
                output_messages=(
                    [] if kind == "llm_error" else [{"role": "assistant", "content": answer}]
                ),
            ),
        )
        if kind == "llm_error":
            llm.set_status(trace.Status(trace.StatusCode.ERROR, "the model did not reply"))
        llm.end(end_time=end - 10**7)
        if kind != "llm_error":
            root.set_attributes(get_output_attributes(answer))
        root.end(end_time=end)
    spans = [json.loads(s.to_json(indent=None)) for s in exporter.get_finished_spans()]
    return [s for s in spans if s["context"]["span_id"] not in dropped]


def main(out: Path = OUT) -> None:
    complete = read_night("2026-11-27")
    partial = read_night("2026-11-28")[-len(DAMAGE) :]
    damage = {len(complete) + k: kind for k, kind in enumerate(DAMAGE)}
    spans = build_spans(complete + partial, damage)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8", newline="\n") as fh:
        for span in spans:
            fh.write(json.dumps(span, ensure_ascii=False, sort_keys=True) + "\n")
    print(f"{out}: {len(spans)} spans of {len(complete) + len(partial)} traces")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
