"""OpenInference traces as input (``input.format: openinference``): exported spans, one
row per trace (``pip install 'ragbatch[traces]'`` for the semantic conventions package).

A span export is a JSON lines file (one span per line) or a Parquet file (one span per
row) of OpenTelemetry spans in the OpenInference convention, as the OpenTelemetry SDK
writes a span (``ReadableSpan.to_json()``, the console exporter's form):
``context.trace_id``, ``context.span_id``, ``parent_id``, ``name``, ``start_time`` and
``end_time`` (ISO 8601 text, or integer nanoseconds since the epoch), ``status``
(``{"status_code", "description"}``) and ``attributes`` (an object of OpenInference
attributes, with flat dotted keys such as ``retrieval.documents.0.document.content``, or
nested objects, or their JSON text). Flat columns ``context.trace_id``,
``context.span_id`` and ``status_code`` are read too. All spans of a trace must be in one
file.

Each trace becomes one row (:func:`assemble_traces`):

=================  ==========================================================================
column             from
=================  ==========================================================================
``trace_id``       the trace id, as written (``0x`` + 32 hex digits)
``question``       the root span's ``input.value``; else the last ``user`` message of the
                   LLM span's ``llm.input_messages``; else the LLM span's ``input.value``
``contexts``       the documents (``retrieval.documents.N.document.content``) of the
                   RETRIEVER spans, spans in start order and documents in rank order N
``answer``         the first message of the last-ending LLM span's
                   ``llm.output_messages``; else its ``output.value``; else the root span's
``latency_s``      the root span's end minus start, in seconds (without a root span: the
                   trace's last end minus its first start)
``trace_status``   ``complete``, or ``partial`` when anything below is missing
``trace_reason``   null, or what is missing, ``; ``-separated: ``no root span``, ``no
                   retriever span``, ``retriever span without documents``, ``no LLM span``,
                   ``no question``, ``no answer``, ``span <name> ended with status ERROR
                   (<description>)``
=================  ==========================================================================

then one ``string`` column per entry of ``input.trace_attributes`` (column name -> span
attribute key): the value on the root span, else on the first span (in start order) that
has it, as text. A partial trace is still a row: the metrics whose inputs it lacks
report ``missing_input`` for it.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import re
from dataclasses import dataclass
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from ragbatch.config.job import InputSection
from ragbatch.core.errors import InputError
from ragbatch.io.listing import display_path, split_extension

__all__ = ["TRACE_COLUMNS", "assemble_traces", "read_spans"]

#: The columns :func:`assemble_traces` gives before the ``input.trace_attributes`` ones.
TRACE_COLUMNS = pa.schema(
    [
        ("trace_id", pa.string()),
        ("question", pa.string()),
        ("contexts", pa.list_(pa.string())),
        ("answer", pa.string()),
        ("latency_s", pa.float64()),
        ("trace_status", pa.string()),
        ("trace_reason", pa.string()),
    ]
)

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


@dataclass(frozen=True)
class _Keys:
    """The OpenInference attribute keys and span kinds the assembly reads, taken from
    the ``openinference-semantic-conventions`` package."""

    input_value: str
    output_value: str
    span_kind: str
    retriever: str
    llm: str
    document: re.Pattern[str]
    message: re.Pattern[str]


@functools.lru_cache(maxsize=1)
def _keys() -> _Keys:
    try:
        from openinference.semconv.trace import (
            DocumentAttributes,
            MessageAttributes,
            OpenInferenceSpanKindValues,
            SpanAttributes,
        )
    except ImportError:  # the config check names the extra first; this is the fallback
        raise InputError(
            "input.format 'openinference' needs the openinference-semantic-conventions "
            "package: pip install 'ragbatch[traces]'"
        ) from None
    documents = re.escape(SpanAttributes.RETRIEVAL_DOCUMENTS)
    content = re.escape(DocumentAttributes.DOCUMENT_CONTENT)
    inputs = re.escape(SpanAttributes.LLM_INPUT_MESSAGES)
    outputs = re.escape(SpanAttributes.LLM_OUTPUT_MESSAGES)
    role, text = MessageAttributes.MESSAGE_ROLE, MessageAttributes.MESSAGE_CONTENT
    return _Keys(
        input_value=SpanAttributes.INPUT_VALUE,
        output_value=SpanAttributes.OUTPUT_VALUE,
        span_kind=SpanAttributes.OPENINFERENCE_SPAN_KIND,
        retriever=OpenInferenceSpanKindValues.RETRIEVER.value,
        llm=OpenInferenceSpanKindValues.LLM.value,
        document=re.compile(rf"^{documents}\.(\d+)\.{content}$"),
        message=re.compile(
            rf"^(?:({inputs})|{outputs})\.(\d+)\.({re.escape(role)}|{re.escape(text)})$"
        ),
    )


def read_spans(fs: fsspec.AbstractFileSystem, path: str, cfg: InputSection) -> pa.Table:
    """One span export file, assembled into one row per trace.

    Parameters
    ----------
    fs : fsspec.AbstractFileSystem
    path : str
        A ``.jsonl`` (optionally compressed) or ``.parquet`` file, path inside ``fs``.
    cfg : InputSection
        ``encoding`` and ``trace_attributes`` are used.

    Returns
    -------
    pyarrow.Table
        As :func:`assemble_traces`.

    Raises
    ------
    InputError
        The file is neither JSON lines nor Parquet, a line is not a JSON object (the
        message gives the line number), or a span has no trace id.
    """
    from ragbatch.io.text_formats import _decode, _read_bytes

    where = display_path(fs, path)
    kind = split_extension(path)[0]
    if kind == "parquet":
        try:
            with fs.open(path, "rb") as handle:
                records = pq.read_table(handle).to_pylist()
        except pa.ArrowException as exc:
            raise InputError(f"{where}: not a readable Parquet span export ({exc})") from None
    elif kind in ("jsonl", "json"):
        text = _decode(_read_bytes(fs, path), cfg.encoding, where)
        records = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(
                    f"{where}, line {number}: not a JSON span ({exc.msg}); an OpenInference "
                    "span export holds one span object per line"
                ) from None
            if not isinstance(record, dict):
                raise InputError(f"{where}, line {number}: a span is a JSON object")
            records.append(record)
    else:
        raise InputError(
            f"{where}: an OpenInference span export is a JSON lines (.jsonl) or Parquet "
            "(.parquet) file"
        )
    return assemble_traces(records, cfg.trace_attributes or {}, where)


def assemble_traces(
    records: list[dict[str, Any]], attributes: dict[str, str], where: str = "spans"
) -> pa.Table:
    """Spans grouped into one row per trace (see the module notes for each column).

    Parameters
    ----------
    records : list of dict
        Spans as the module notes describe them, in file order.
    attributes : dict of str to str
        ``input.trace_attributes``: output column -> span attribute key.
    where : str
        Names the source in messages.

    Returns
    -------
    pyarrow.Table
        :data:`TRACE_COLUMNS`, then one ``string`` column per ``attributes`` entry; one
        row per trace, traces in the order their first span appears.

    Raises
    ------
    InputError
        A span has no trace id, or a time that is neither ISO 8601 text nor an integer.
    """
    keys = _keys()
    traces: dict[str, list[dict[str, Any]]] = {}
    for index, record in enumerate(records):
        span = _span(record, f"{where}, span {index + 1}")
        traces.setdefault(span["trace_id"], []).append(span)
    rows = [_trace_row(keys, trace_id, spans, attributes) for trace_id, spans in traces.items()]
    schema = TRACE_COLUMNS
    for name in attributes:
        schema = schema.append(pa.field(name, pa.string()))
    return pa.Table.from_pylist(rows, schema=schema)


def _span(record: dict[str, Any], where: str) -> dict[str, Any]:
    context = record.get("context") or {}
    trace_id = context.get("trace_id") or record.get("context.trace_id") or record.get("trace_id")
    if not trace_id:
        raise InputError(
            f"{where}: the span has no trace id (context.trace_id); export spans with their context"
        )
    status = record.get("status") or {}
    raw = record.get("attributes") or {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            raise InputError(f"{where}: attributes is text but not a JSON object") from None
    return {
        "trace_id": str(trace_id),
        "span_id": context.get("span_id") or record.get("context.span_id"),
        "parent_id": record.get("parent_id") or None,
        "name": record.get("name"),
        "start": _time(record.get("start_time"), where),
        "end": _time(record.get("end_time"), where),
        "status": str(status.get("status_code") or record.get("status_code") or "UNSET"),
        "status_message": status.get("description") or record.get("status_message"),
        "attributes": _flatten(raw if isinstance(raw, dict) else {}),
    }


def _flatten(value: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested attribute objects (and lists) as flat dotted keys; nulls left out."""
    flat: dict[str, Any] = {}
    for key, item in value.items():
        name = f"{prefix}{key}"
        if isinstance(item, dict):
            flat.update(_flatten(item, f"{name}."))
        elif isinstance(item, list) and any(isinstance(x, dict) for x in item):
            for i, x in enumerate(item):
                flat.update(_flatten(x, f"{name}.{i}.") if isinstance(x, dict) else {})
        elif item is not None:
            flat[name] = item
    return flat


def _time(value: Any, where: str) -> float | None:
    """Seconds since the epoch of an ISO 8601 text or integer nanoseconds."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
        return (moment - _EPOCH).total_seconds()
    if isinstance(value, int):
        return value / 1e9
    try:
        moment = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise InputError(
            f"{where}: span time {value!r} is neither ISO 8601 text nor integer nanoseconds"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return (moment - _EPOCH).total_seconds()


def _kind(keys: _Keys, span: dict[str, Any]) -> str:
    return str(span["attributes"].get(keys.span_kind, "")).upper()


def _order(span: dict[str, Any]) -> float:
    return span["start"] if span["start"] is not None else float("inf")


def _trace_row(
    keys: _Keys, trace_id: str, spans: list[dict[str, Any]], attributes: dict[str, str]
) -> dict[str, Any]:
    reasons: list[str] = []
    ids = {s["span_id"] for s in spans}
    roots = [s for s in spans if s["parent_id"] is None or s["parent_id"] not in ids]
    root = next((s for s in roots if s["parent_id"] is None), None)
    if root is None:
        reasons.append("no root span")
    ordered = sorted(spans, key=_order)
    retrievers = [s for s in ordered if _kind(keys, s) == keys.retriever]
    llms = [s for s in ordered if _kind(keys, s) == keys.llm]
    llm = max(llms, key=lambda s: s["end"] or 0.0) if llms else None

    contexts: list[str] | None = None
    if not retrievers:
        reasons.append("no retriever span")
    else:
        contexts = []
        for span in retrievers:
            documents = _numbered(span["attributes"], keys.document)
            contexts.extend(str(documents[i]) for i in sorted(documents))
        if not contexts:
            reasons.append("retriever span without documents")
    if llm is None:
        reasons.append("no LLM span")

    question = _text(root["attributes"].get(keys.input_value)) if root else None
    if question is None and llm is not None:
        question = _last_user_message(keys, llm["attributes"]) or _text(
            llm["attributes"].get(keys.input_value)
        )
    if question is None:
        reasons.append("no question")
    answer = None
    if llm is not None:
        output = _messages(keys, llm["attributes"], inputs=False)
        answer = _text(output[0].get("content")) if output else None
        answer = answer or _text(llm["attributes"].get(keys.output_value))
    if answer is None and root is not None:
        answer = _text(root["attributes"].get(keys.output_value))
    if answer is None:
        reasons.append("no answer")
    for span in ordered:
        if span["status"].upper().endswith("ERROR"):
            detail = f" ({span['status_message']})" if span["status_message"] else ""
            reasons.append(f"span {span['name']} ended with status ERROR{detail}")

    timed = root if root is not None else None
    if timed is not None and timed["start"] is not None and timed["end"] is not None:
        latency: float | None = timed["end"] - timed["start"]
    else:
        starts = [s["start"] for s in spans if s["start"] is not None]
        ends = [s["end"] for s in spans if s["end"] is not None]
        latency = max(ends) - min(starts) if starts and ends else None
    row: dict[str, Any] = {
        "trace_id": trace_id,
        "question": question,
        "contexts": contexts,
        "answer": answer,
        "latency_s": latency,
        "trace_status": "partial" if reasons else "complete",
        "trace_reason": "; ".join(reasons) or None,
    }
    carriers = ([root] if root is not None else []) + [s for s in ordered if s is not root]
    for column, key in attributes.items():
        value = next((s["attributes"][key] for s in carriers if key in s["attributes"]), None)
        row[column] = None if value is None else _text(value)
    return row


def _numbered(attributes: dict[str, Any], pattern: re.Pattern[str]) -> dict[int, Any]:
    found = {}
    for key, value in attributes.items():
        match = pattern.match(key)
        if match:
            found[int(match.group(1))] = value
    return found


def _messages(keys: _Keys, attributes: dict[str, Any], inputs: bool) -> list[dict[str, Any]]:
    """The LLM span's input (or output) messages in index order, each ``{"role",
    "content"}``."""
    messages: dict[int, dict[str, Any]] = {}
    for key, value in attributes.items():
        match = keys.message.match(key)
        if match and (match.group(1) is not None) == inputs:
            field = "role" if match.group(3).endswith("role") else "content"
            messages.setdefault(int(match.group(2)), {})[field] = value
    return [messages[i] for i in sorted(messages)]


def _last_user_message(keys: _Keys, attributes: dict[str, Any]) -> str | None:
    users = [m for m in _messages(keys, attributes, inputs=True) if m.get("role") == "user"]
    return _text(users[-1].get("content")) if users else None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)
