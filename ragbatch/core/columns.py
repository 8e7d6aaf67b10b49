"""Column names and Arrow types shared by every stage.

Canonical input columns (after normalization, see :mod:`ragbatch.io.schema`):

==============  ==================  =====================================================
column          Arrow type          meaning
==============  ==================  =====================================================
``row_id``      ``string``          unique per input row, stable across reruns
``question``    ``string``          the user question
``contexts``    ``list<string>``    retrieved chunks, in retrieval order
``answer``      ``string``          the generated answer
``reference``   ``string``          reference ("ground truth") answer
``latency_s``   ``float64``         end-to-end latency of the RAG call, seconds
``_issues``     ``struct<string>``  per canonical column, why the value is null (or null)
==============  ==================  =====================================================

The ranking columns (:data:`RANKING`) follow ``_issues``, and ``_issues`` gains a field
for each, only in jobs whose config maps at least one of them
(:func:`ranking_mapped`); a job that maps none reads exactly the columns above:

================  ===================================  ===================================
column            Arrow type                           meaning
================  ===================================  ===================================
``context_ids``   ``list<string>``                     retrieved ids, in retrieval order,
                                                       one per item of ``contexts``
``relevant_ids``  ``list<string>``                     ids known relevant (binary)
``relevance``     ``list<struct<id: string,``          graded relevance, one entry per
                  ``grade: float64>>``                 judged id
================  ===================================  ===================================

Ids are strings: integer ids become their decimal text (``7`` -> ``"7"``).

Every other input column passes through unchanged as a *slice* column.

Inside the pipeline each metric adds one struct column named ``__ragbatch_cell::<metric
id>`` whose fields are :data:`CELL_FIELDS`; the final stage turns these into the long
scores table. Every column the pipeline adds for itself is named with
:data:`INTERNAL_PREFIX` (:func:`internal`); an input column whose name starts with it is
refused when the input is read (:mod:`ragbatch.io.names`), so no input column can collide
with one.
"""

from __future__ import annotations

import pyarrow as pa

#: Start of every column name the pipeline adds for itself; no input column may use it.
INTERNAL_PREFIX = "__ragbatch_"


def internal(name: str) -> str:
    """The pipeline-internal column name for ``name`` (``INTERNAL_PREFIX + name``)."""
    return INTERNAL_PREFIX + name


def is_internal(name: str) -> bool:
    """Whether ``name`` lies in the pipeline's own namespace (:data:`INTERNAL_PREFIX`)."""
    return name.startswith(INTERNAL_PREFIX)


ROW_ID = "row_id"
QUESTION = "question"
CONTEXTS = "contexts"
ANSWER = "answer"
REFERENCE = "reference"
LATENCY_S = "latency_s"
ISSUES = "_issues"
CONTEXT_IDS = "context_ids"
RELEVANT_IDS = "relevant_ids"
RELEVANCE = "relevance"

#: The optional ranking columns, present only in jobs that map one of them.
RANKING: tuple[str, ...] = (CONTEXT_IDS, RELEVANT_IDS, RELEVANCE)

#: Canonical columns a config may map (``input.columns``), in schema order.
CANONICAL: tuple[str, ...] = (ROW_ID, QUESTION, CONTEXTS, ANSWER, REFERENCE, LATENCY_S) + RANKING

#: The canonical columns whose values can be null for a row, with the reason kept in
#: ``_issues`` (``row_id`` is never null).
NULLABLE_INPUTS: tuple[str, ...] = (QUESTION, CONTEXTS, ANSWER, REFERENCE, LATENCY_S)

ISSUES_TYPE = pa.struct([(name, pa.string()) for name in NULLABLE_INPUTS])

#: Arrow type of ``relevance``: one ``{id, grade}`` entry per judged id, ids distinct.
RELEVANCE_TYPE = pa.list_(pa.struct([("id", pa.string()), ("grade", pa.float64())]))

#: The ranking columns as they follow ``_issues`` (see the module doc).
RANKING_SCHEMA = pa.schema(
    [
        (CONTEXT_IDS, pa.list_(pa.string())),
        (RELEVANT_IDS, pa.list_(pa.string())),
        (RELEVANCE, RELEVANCE_TYPE),
    ]
)

#: ``_issues`` in a job that maps a ranking column: a field for each of them too.
RANKING_ISSUES_TYPE = pa.struct([(name, pa.string()) for name in NULLABLE_INPUTS + RANKING])


def ranking_mapped(mapped: "set[str] | frozenset[str]") -> bool:
    """Whether the canonical columns ``mapped`` (those ``input.columns`` names) include a
    ranking column, so the canonical table carries :data:`RANKING_SCHEMA`."""
    return any(name in mapped for name in RANKING)


CANONICAL_SCHEMA = pa.schema(
    [
        (ROW_ID, pa.string()),
        (QUESTION, pa.string()),
        (CONTEXTS, pa.list_(pa.string())),
        (ANSWER, pa.string()),
        (REFERENCE, pa.string()),
        (LATENCY_S, pa.float64()),
        (ISSUES, ISSUES_TYPE),
    ]
)

#: Fields of one score cell, in scores-table order.
CELL_FIELDS: tuple[tuple[str, pa.DataType], ...] = (
    ("score", pa.float64()),
    ("status", pa.string()),
    ("reason", pa.string()),
    ("details", pa.string()),  # JSON object with metric-specific extras, or null
    ("model", pa.string()),  # model id for model-based metrics, else null
)
CELL_TYPE = pa.struct(list(CELL_FIELDS))

#: Judge record of a cell (null for metrics without a judge), in scores-table order:
#: the raw reply (truncated), a hash of the prompt(s), tokens of the judgments behind the
#: cell, judge requests made in this run for it, judgments served from the cache, and the
#: mean probability of the cell's verdicts (:mod:`ragbatch.judge.confidence`).
JUDGE_FIELDS: tuple[tuple[str, pa.DataType], ...] = (
    ("judge_reply", pa.string()),
    ("prompt_hash", pa.string()),
    ("prompt_tokens", pa.int64()),
    ("completion_tokens", pa.int64()),
    ("judge_calls", pa.int32()),
    ("cache_hits", pa.int32()),
    ("confidence", pa.float64()),
)
JUDGE_TYPE = pa.struct(list(JUDGE_FIELDS))
JUDGE_PREFIX = internal("judge::")

CELL_PREFIX = internal("cell::")

#: Scores-table column naming the engine of a judge panel's member cell (docs/panels.md);
#: null for every other cell, a panel's own cell included. Score files written before
#: panels existed lack it: readers take it as null.
JUDGE = "judge"

#: Columns of the long scores table written to Parquet (partition keys ``run_date`` and
#: ``run_id`` are hive directories, not file columns), before the slice columns.
SCORES_COLUMNS: tuple[str, ...] = (
    (ROW_ID, "metric")
    + tuple(n for n, _ in CELL_FIELDS)
    + tuple(n for n, _ in JUDGE_FIELDS)
    + (JUDGE,)
)

#: Names an input slice column may not keep; a clashing slice column is renamed with
#: :data:`SLICE_RENAME_PREFIX`. Names are compared as DuckDB compares identifiers
#: (:func:`identifier_key`), so ``Score`` clashes with ``score`` too.
#: The ranking columns are reserved only in jobs that map one of them
#: (:func:`ragbatch.io.schema.slice_columns`), so a job that maps none keeps a slice
#: column named ``relevance`` as it is.
RESERVED: frozenset[str] = frozenset(
    (set(CANONICAL) - set(RANKING))
    | {ISSUES, "metric", JUDGE, "run_id", "run_date"}
    | {n for n, _ in CELL_FIELDS}
    | {n for n, _ in JUDGE_FIELDS}
)
SLICE_RENAME_PREFIX = "input_"


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def identifier_key(name: str) -> str:
    """``name`` as DuckDB compares column names: ASCII letters in lower case, every other
    character as it is. Two names with the same key are one column to DuckDB's SQL
    (``Score`` and ``score``; not ``É`` and ``é``), and its Parquet reader renames the
    later of two such columns of a file (``Score`` -> ``Score_1``)."""
    return name.translate(_ASCII_LOWER)


def cell_column(metric_id: str) -> str:
    """Name of the in-pipeline struct column holding ``metric_id``'s cells."""
    return f"{CELL_PREFIX}{metric_id}"


def judge_column(metric_id: str) -> str:
    """Name of the in-pipeline struct column holding ``metric_id``'s judge records."""
    return f"{JUDGE_PREFIX}{metric_id}"
