"""Expression-stage benchmark: ragbatch against a plain Python loop, Tonic Validate's own
metric classes and a bare Polars I/O floor, on the same synthetic RAG traces.

Usage (from the repository root, in the project's virtual environment)::

    python benchmarks/expression_stage.py [--rows N] [--workdir DIR] [--peer-rows M]

What it does, in one run:

1. Writes ``N`` (default 1,000,000) seeded synthetic traces to
   ``<workdir>/input/traces.parquet`` (default workdir ``benchmarks/_data``, gitignored),
   unless a file from the same rows and seed is already there.
2. Reads them with ragbatch's own reader and normalizer (timed, reported apart), then
   over the same Arrow batches times

   * ragbatch's expression stage, ``udfs.expressions.expression_stage``, called directly
     (no Ray) for the six metrics Tonic Validate also has, and for those plus
     ``exact_match`` and ``json_valid``, which it has not;
   * (a) a plain Python per-row loop computing the same metrics with the same
     definitions (``str.lower``, ``in``, ``re.findall``, ``len``, ``json.loads``).
3. (b) Runs Tonic Validate's metric classes (``AnswerMatchMetric``,
   ``ContainsTextMetric``, ``RegexMetric``, ``ResponseLengthMetric``,
   ``ContextLengthMetric``, ``LatencyMetric``) on the first ``M`` rows (default: all)
   in a separate virtual environment, ``benchmarks/_venv_tonic`` (gitignored, created on
   first use with ``pip install tonic-validate==6.2.0 pyarrow``): one ``LLMResponse`` per
   row, then every metric's ``score`` awaited in turn inside one event loop. The scores
   of ragbatch, (a) and (b) are compared row by row.
4. (c) The I/O floor: a bare Polars script reads the input Parquet and writes a table
   with as many rows as the scores table (rows x metrics; the scores table's columns,
   constant values).
5. An expression-only ``ragbatch run`` of a generated config (local Ray), end to end,
   for both metric sets, next to the floor for the same number of metrics.

With ``--retrieval`` it measures instead the six ranking metrics (the "retrieval6" set,
``benchmarks/expression_ranking.py``) against ranx and a plain Python loop, on ``--rows``
synthetic rankings (default there 200,000), ``--repeat`` interleaved rounds (default 3),
and writes ``<workdir>/results_retrieval.json``.

It prints a table and writes ``<workdir>/results.json``. Speed figures belong in
BENCHMARKS.md; nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_WORKDIR = ROOT / "benchmarks" / "_data"
TONIC_VENV = ROOT / "benchmarks" / "_venv_tonic"
TONIC_REQUIREMENT = "tonic-validate==6.2.0"
SEED = 20240601
ROW_GROUP_ROWS = 100_000

#: The metrics, as ragbatch config entries. The first six have a Tonic Validate class.
METRICS = [
    {"name": "answer_match", "params": {"text": "I don't know."}},
    {"name": "contains_text", "id": "mentions_data_model", "params": {"text": ["data", "model"]}},
    {
        "name": "regex",
        "id": "two_citations",
        "params": {"pattern": r"\[\d+\]", "expected_count": 2},
    },
    {"name": "response_length", "params": {"min_chars": 1, "max_chars": 1500}},
    {"name": "context_length", "params": {"min_chars": 200, "max_chars": 1400}},
    {"name": "latency", "params": {"target_s": 5.0}},
    {"name": "exact_match", "params": {}},
    {"name": "json_valid", "params": {}},
]
TONIC_IDS = [
    "answer_match",
    "mentions_data_model",
    "two_citations",
    "response_length",
    "context_length",
    "latency",
]
METRIC_SETS = {"tonic6": METRICS[:6], "all8": METRICS}
COLUMNS = {
    "row_id": "trace_id",
    "question": "question",
    "contexts": "contexts",
    "answer": "answer",
    "reference": "reference",
    "latency_s": "latency_s",
}


def _metric_id(spec: dict) -> str:
    return spec.get("id") or spec["name"]


# --------------------------------------------------------------------------- data

_SYLLABLES = (
    "ka",
    "to",
    "ri",
    "men",
    "sa",
    "lo",
    "de",
    "vin",
    "ter",
    "po",
    "al",
    "ex",
    "qua",
    "ni",
    "ros",
    "bel",
    "um",
    "tra",
    "gen",
    "ol",
    "ces",
    "mar",
    "ti",
    "on",
    "ha",
    "re",
)
_TOPIC_WORDS = (
    "data",
    "model",
    "pipeline",
    "table",
    "query",
    "cluster",
    "latency",
    "index",
    "retrieval",
    "answer",
    "context",
    "token",
    "schema",
    "partition",
    "Paris",
    "France",
    "Spark",
    "Delta",
    "Databricks",
    "vector",
    "embedding",
    "storage",
)
_UNICODE_WORDS = (
    "café",
    "naïve",
    "Zürich",
    "東京",
    "数据",
    "🚀",
    "résumé",
    "straße",
    "Ωmega",
    "São Paulo",
    "Malmö",
    "niño",
    "Ελλάδα",
    "Москва",
    "✅",
    "€12",
)
_REFUSALS = ("I don't know.", "I DON'T KNOW.", "I don't know.")


def _vocabulary(rng, n_words: int = 5000) -> list[str]:
    words = set()
    while len(words) < n_words:
        k = int(rng.integers(1, 4))
        words.add("".join(_SYLLABLES[i] for i in rng.integers(0, len(_SYLLABLES), k)))
    return sorted(words)


def _corpus(rng, n_words: int) -> bytes:
    """One long UTF-8 text of words with Zipf-like frequencies, sentence punctuation and
    ~2 % non-ASCII words; texts are cut from it at spaces."""
    import numpy as np

    vocab = _vocabulary(rng) + list(_TOPIC_WORDS) * 3
    weights = 1.0 / np.arange(1, len(vocab) + 1) ** 0.9
    rng.shuffle(weights)
    base = rng.choice(len(vocab), size=n_words, p=weights / weights.sum())
    words = vocab + list(_UNICODE_WORDS)
    base = np.where(
        rng.random(n_words) < 0.02, len(vocab) + rng.integers(0, len(_UNICODE_WORDS), n_words), base
    )
    punct = np.where(rng.random(n_words) < 1 / 14, 1, np.where(rng.random(n_words) < 1 / 11, 2, 0))
    capital = np.roll(punct == 1, 1)
    variants = []
    for word in words:
        for cased in (word, word[:1].upper() + word[1:]):
            variants.extend((v + " ").encode() for v in (cased, cased + ".", cased + ","))
    # variant index: word * 6 + capital * 3 + punctuation
    index = base * 6 + capital * 3 + punct
    return b"".join(map(variants.__getitem__, index.tolist()))


def generate(n_rows: int, workdir: str | Path, seed: int = 20240601) -> dict:
    """Write ``n_rows`` synthetic RAG traces to ``<workdir>/input/traces.parquet``.

    Texts are cut at word boundaries from one seeded pseudo-English corpus (~2 % of words
    non-ASCII: accents, Greek, Cyrillic, CJK, emoji). Per row: a question of 60-120
    characters, an answer of 300-1500 (1 % a refusal, 2 % a JSON object, others with 0-3
    ``[n]`` citation markers), a reference (10 % the answer itself with surrounding
    whitespace), 3-5 contexts of 500-1500, a log-normal latency and two slice columns.
    Lengths are targets in bytes, cut back to the previous space.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    workdir = Path(workdir)
    path = workdir / "input" / "traces.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    corpus = _corpus(rng, 4_000_000)
    spaces = np.flatnonzero(np.frombuffer(corpus, np.uint8) == 32)
    usable = int(np.searchsorted(spaces, len(corpus) - 4000))
    schema = pa.schema(
        [
            ("trace_id", pa.string()),
            ("question", pa.string()),
            ("contexts", pa.list_(pa.string())),
            ("answer", pa.string()),
            ("reference", pa.string()),
            ("latency_s", pa.float64()),
            ("app", pa.string()),
            ("model_version", pa.string()),
        ]
    )
    apps = np.array(["support-bot", "docs-search", "sales-assist", "hr-helpdesk", "dev-copilot"])
    versions = np.array(["2024-05-rc1", "2024-06", "2024-06-hotfix"])

    def cuts(lengths):
        """(start, end) byte offsets of texts of about ``lengths`` bytes, at spaces."""
        begin = spaces[rng.integers(0, usable, len(lengths))] + 1
        end = spaces[np.searchsorted(spaces, begin + lengths) - 1]
        return begin, np.maximum(end, begin + 1)

    def texts(lengths) -> list[bytes]:
        b, e = cuts(lengths)
        return [corpus[i:j] for i, j in zip(b.tolist(), e.tolist())]

    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, n_rows, ROW_GROUP_ROWS):
            n = min(ROW_GROUP_ROWS, n_rows - start)
            questions = [t.rstrip(b".,") + b"?" for t in texts(rng.integers(60, 121, n))]
            answers = texts(rng.integers(300, 1501, n))
            kind = rng.random(n)
            cites = rng.integers(0, 4, n).tolist()
            for i in np.flatnonzero(kind < 0.03).tolist():
                if kind[i] < 0.01:
                    answers[i] = _REFUSALS[i % len(_REFUSALS)].encode()
                else:
                    body = answers[i][: len(answers[i]) // 3].decode("utf-8", "ignore")
                    answers[i] = json.dumps(
                        {"answer": body, "sources": cites[i : i + 3]}, ensure_ascii=False
                    ).encode()
            for i in np.flatnonzero(kind >= 0.03).tolist():
                a = answers[i]
                for j in range(cites[i]):
                    p = a.find(b" ", (len(a) * (2 * j + 1)) // 7)
                    if p > 0:
                        a = a[:p] + b" [%d]" % (j + 1) + a[p:]
                answers[i] = a
            same_ref = (rng.random(n) < 0.10).tolist()
            references = texts(rng.integers(300, 1501, n))
            references = [
                b"\n" + a + b" " if same else r for a, r, same in zip(answers, references, same_ref)
            ]
            n_ctx = rng.integers(3, 6, n)
            offsets = np.concatenate([[0], np.cumsum(n_ctx)]).astype(np.int32)
            items = pa.array(texts(rng.integers(500, 1501, int(n_ctx.sum()))), pa.binary())
            contexts = pa.ListArray.from_arrays(pa.array(offsets), items.cast(pa.string()))
            latency = np.round(rng.lognormal(np.log(2.0), 0.6, n), 3)
            table = pa.table(
                {
                    "trace_id": pa.array([f"t{seed % 1000:03d}-{start + i:08d}" for i in range(n)]),
                    "question": pa.array(questions, pa.binary()).cast(pa.string()),
                    "contexts": contexts,
                    "answer": pa.array(answers, pa.binary()).cast(pa.string()),
                    "reference": pa.array(references, pa.binary()).cast(pa.string()),
                    "latency_s": pa.array(latency, pa.float64()),
                    "app": pa.array(apps[rng.integers(0, len(apps), n)]),
                    "model_version": pa.array(versions[rng.integers(0, len(versions), n)]),
                },
                schema=schema,
            )
            writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
    return describe_input(path, seed)


def describe_input(path: str | Path, seed: int | None = None) -> dict:
    """Sizes of a generated input file: rows, bytes, mean characters per text column."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    path = Path(path)
    totals = {"question": 0, "answer": 0, "reference": 0, "context": 0}
    n_contexts = 0
    pf = pq.ParquetFile(path)
    for i in range(pf.num_row_groups):
        t = pf.read_row_group(i, columns=["question", "answer", "reference", "contexts"])
        for name in ("question", "answer", "reference"):
            totals[name] += pc.sum(pc.utf8_length(t[name])).as_py()
        flat = pc.list_flatten(t["contexts"])
        totals["context"] += pc.sum(pc.utf8_length(flat)).as_py()
        n_contexts += len(flat)
    meta = pf.metadata
    n_rows = meta.num_rows
    return {
        "path": str(path),
        "rows": n_rows,
        "row_groups": meta.num_row_groups,
        "file_bytes": path.stat().st_size,
        "uncompressed_bytes": sum(
            meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)
        ),
        "mean_chars": {
            "question": totals["question"] / n_rows,
            "answer": totals["answer"] / n_rows,
            "reference": totals["reference"] / n_rows,
            "context": totals["context"] / max(1, n_contexts),
        },
        "mean_contexts_per_row": n_contexts / n_rows,
        "seed": seed,
    }


def ensure_input(rows: int, workdir: Path, seed: int = SEED) -> dict:
    """The input file's description, generating the file when it is missing or was made
    with other rows or another seed."""
    meta_path = workdir / "input" / "traces.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("rows") == rows and meta.get("seed") == seed and Path(meta["path"]).exists():
            meta["generated_now"] = False
            return meta
    print(f"generating {rows:,} synthetic traces under {workdir / 'input'} ...", flush=True)
    t0 = time.perf_counter()
    meta = generate(rows, workdir, seed)
    meta["generate_s"] = round(time.perf_counter() - t0, 1)
    meta_path.write_text(json.dumps(meta, indent=2))
    meta["generated_now"] = True
    return meta


# --------------------------------------------------------------------------- (a) plain Python


def python_loop(cols: dict[str, list], with_extra: bool) -> dict[str, list]:
    """Scores of the benchmark metrics, row by row in plain Python, with the metrics'
    definitions (None where an input is missing: ragbatch's ``missing_input``)."""
    import re

    text = "I don't know.".lower()
    needles = ["data", "model"]
    pattern = re.compile(r"\[\d+\]")
    decoder = json.JSONDecoder(parse_constant=_no_constant)
    out: dict[str, list] = {
        k: [] for k in TONIC_IDS + (["exact_match", "json_valid"] if with_extra else [])
    }
    am, ct, rx, rl, cl, lt = (out[k] for k in TONIC_IDS)
    em, jv = (out["exact_match"], out["json_valid"]) if with_extra else (None, None)
    for answer, contexts, latency, reference in zip(
        cols["answer"], cols["contexts"], cols["latency_s"], cols["reference"]
    ):
        if answer is None:
            am.append(None), ct.append(None), rx.append(None), rl.append(None)
        else:
            lower = answer.lower()
            am.append(1.0 if lower == text else 0.0)
            ct.append(1.0 if all(n in lower for n in needles) else 0.0)
            rx.append(1.0 if len(pattern.findall(answer)) == 2 else 0.0)
            rl.append(1.0 if 1 <= len(answer) <= 1500 else 0.0)
        if not contexts or any(c is None for c in contexts):
            cl.append(None)
        else:
            cl.append(1.0 if all(200 <= len(c) <= 1400 for c in contexts) else 0.0)
        if latency is None or latency != latency or latency < 0:
            lt.append(None)
        else:
            lt.append(1.0 if latency <= 5.0 else 0.0)
        if with_extra:
            if answer is None or reference is None:
                em.append(None)
            else:
                em.append(1.0 if answer.strip() == reference.strip() else 0.0)
            if answer is None:
                jv.append(None)
            else:
                try:
                    (json.loads(answer) if answer.startswith("\ufeff") else decoder.decode(answer))
                    jv.append(1.0)
                except ValueError:
                    jv.append(0.0)
    return out


def _no_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


# --------------------------------------------------------------------------- stage + (a)


def measure_stage(input_path: str, peer_rows: int) -> tuple[dict, dict]:
    """Time ragbatch's expression stage and the plain loop over the same batches.

    Returns (figures, scores): scores maps "ragbatch"/"loop" to {metric id: list of the
    first ``peer_rows`` scores} for the row-by-row comparison.
    """
    import numpy as np
    import polars as pl
    import pyarrow.compute as pc

    from ragbatch.config.job import JobConfig
    from ragbatch.io.read import plan_read, read_task
    from ragbatch.io.schema import normalize, slice_columns
    from ragbatch.io.read import peek_schema
    from ragbatch.pipeline.plan import build_metrics
    from udfs.expressions import expression_stage

    cfg = JobConfig.from_dict(
        {
            "input": {"uri": input_path, "columns": COLUMNS},
            "output": {"uri": "unused"},
            "metrics": METRICS,
        }
    )
    metrics, _, problems = build_metrics(cfg)
    assert not problems, problems
    by_set = {"tonic6": metrics[:6], "all8": metrics}
    slices = slice_columns(cfg.input, peek_schema(cfg.input))
    figures: dict = {
        "read_normalize_s": 0.0,
        "rows": 0,
        "batches": 0,
        "stage": {k: {"wall_s": 0.0, "cpu_s": 0.0} for k in by_set},
        "loop": {k: {"convert_s": 0.0, "loop_s": 0.0, "cpu_s": 0.0} for k in by_set},
        "polars_threads": pl.thread_pool_size(),
    }
    scores: dict = {"ragbatch": {m: [] for m in TONIC_IDS}, "loop": {m: [] for m in TONIC_IDS}}
    tasks = plan_read(cfg.input)
    # Warm-up on 2,000 rows, untimed: one-time costs (the lowercase table of
    # contains_text, compiled regexes, the stage's thread pool). Tonic gets the same.
    first = normalize(read_task(tasks[0], cfg.input), cfg.input, tasks[0], slices=slices)
    warm = first.slice(0, 2000)
    for chosen in by_set.values():
        expression_stage(warm, chosen)
    python_loop(
        {c: warm.column(c).to_pylist() for c in ("answer", "contexts", "latency_s", "reference")},
        True,
    )
    del first, warm
    # Two passes over the input, each reading it again: ragbatch's stage, then the
    # plain loop, so that neither runs amid the other's garbage (the loop creates and
    # drops millions of Python strings, which slows whatever allocates next).
    for task in tasks:
        t0 = time.perf_counter()
        batch = normalize(read_task(task, cfg.input), cfg.input, task, slices=slices)
        figures["read_normalize_s"] += time.perf_counter() - t0
        figures["rows"] += batch.num_rows
        figures["batches"] += 1
        take = max(0, min(batch.num_rows, peer_rows - len(scores["ragbatch"]["latency"])))
        for name, chosen in by_set.items():
            w0, c0 = time.perf_counter(), time.process_time()
            out = expression_stage(batch, chosen)
            figures["stage"][name]["wall_s"] += time.perf_counter() - w0
            figures["stage"][name]["cpu_s"] += time.process_time() - c0
            if name == "tonic6" and take:
                for mid in TONIC_IDS:
                    cell = out.column(f"cell::{mid}").slice(0, take)
                    scores["ragbatch"][mid].extend(pc.struct_field(cell, "score").to_pylist())
            del out
        del batch
    for task in tasks:
        batch = normalize(read_task(task, cfg.input), cfg.input, task, slices=slices)
        take = max(0, min(batch.num_rows, peer_rows - len(scores["loop"]["latency"])))
        for name in by_set:
            extra = name == "all8"
            needed = ["answer", "contexts", "latency_s"] + (["reference"] if extra else [])
            t0, c0 = time.perf_counter(), time.process_time()
            cols = {c: batch.column(c).to_pylist() for c in needed}
            cols.setdefault("reference", [None] * batch.num_rows)
            t1 = time.perf_counter()
            got = python_loop(cols, extra)
            t2 = time.perf_counter()
            figures["loop"][name]["convert_s"] += t1 - t0
            figures["loop"][name]["loop_s"] += t2 - t1
            figures["loop"][name]["cpu_s"] += time.process_time() - c0
            if name == "tonic6" and take:
                for mid in TONIC_IDS:
                    scores["loop"][mid].extend(got[mid][:take])
            del cols, got
        del batch
    n = figures["rows"]
    for name in by_set:
        st = figures["stage"][name]
        st["rows_per_s"] = n / st["wall_s"]
        st["rows_per_cpu_s"] = n / st["cpu_s"]
        lp = figures["loop"][name]
        lp["total_s"] = lp["convert_s"] + lp["loop_s"]
        lp["rows_per_s"] = n / lp["total_s"]
        lp["loop_only_rows_per_s"] = n / lp["loop_s"]
        lp["rows_per_cpu_s"] = n / lp["cpu_s"]
    figures["read_normalize_rows_per_s"] = n / figures["read_normalize_s"]
    return figures, {
        k: {m: np.array(v, dtype=float) for m, v in d.items()} for k, d in scores.items()
    }


# --------------------------------------------------------------------------- (b) Tonic Validate


def ensure_tonic_venv() -> Path:
    """The Python of the Tonic Validate environment, created on first use."""
    python = TONIC_VENV / "bin" / "python"
    if not python.exists():
        print(f"creating {TONIC_VENV} with {TONIC_REQUIREMENT} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(TONIC_VENV)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", TONIC_REQUIREMENT, "pyarrow"], check=True
        )
    return python


def tonic_metrics() -> list:
    """Tonic Validate's six metric classes with the settings of ``METRIC_SETS["tonic6"]``
    (run inside the Tonic Validate environment)."""
    from tonic_validate.metrics import (
        AnswerMatchMetric,
        ContainsTextMetric,
        ContextLengthMetric,
        LatencyMetric,
        RegexMetric,
        ResponseLengthMetric,
    )

    return [
        AnswerMatchMetric("answer_match", "I don't know.", case_sensitive=False),
        ContainsTextMetric("mentions_data_model", ["data", "model"], case_sensitive=False),
        RegexMetric("two_citations", r"\[\d+\]", match_count=2),
        ResponseLengthMetric("response_length", min_length=1, max_length=1500),
        ContextLengthMetric("context_length", min_length=200, max_length=1400),
        LatencyMetric(target_time=5.0),
    ]


def tonic_worker(input_path: str, rows: int, out_dir: str) -> None:
    """Runs inside the Tonic Validate environment (no ragbatch, Polars or NumPy there)."""
    import asyncio
    from importlib import metadata

    import pyarrow as pa
    import pyarrow.parquet as pq
    from tonic_validate.classes.benchmark import BenchmarkItem
    from tonic_validate.classes.llm_response import LLMResponse

    metrics = tonic_metrics()

    async def score_all(responses: list) -> list[list[float]]:
        # One event loop for the whole batch; every score coroutine is awaited directly
        # (none of these metrics suspends), so no task or loop is created per row.
        out: list[list[float]] = [[] for _ in metrics]
        for response in responses:
            for column, metric in zip(out, metrics):
                column.append(await metric.score(response, None))
        return out

    timings = {"convert_s": 0.0, "construct_s": 0.0, "score_s": 0.0, "cpu_s": 0.0, "rows": 0}
    scores: list[list[float]] = [[] for _ in metrics]
    parquet = pq.ParquetFile(input_path)
    # Warm-up on 2,000 rows, untimed, as for ragbatch.
    warm = (
        parquet.read_row_group(
            0, columns=["question", "answer", "reference", "contexts", "latency_s"]
        )
        .slice(0, 2000)
        .to_pylist()
    )
    asyncio.run(
        score_all(
            [
                LLMResponse(
                    llm_answer=r["answer"],
                    llm_context_list=r["contexts"],
                    benchmark_item=BenchmarkItem(question=r["question"], answer=r["reference"]),
                    run_time=r["latency_s"],
                )
                for r in warm
            ]
        )
    )
    for group in range(parquet.num_row_groups):
        if timings["rows"] >= rows:
            break
        table = parquet.read_row_group(
            group, columns=["question", "answer", "reference", "contexts", "latency_s"]
        )
        table = table.slice(0, rows - timings["rows"])
        t0, c0 = time.perf_counter(), time.process_time()
        cols = {c: table.column(c).to_pylist() for c in table.column_names}
        t1 = time.perf_counter()
        responses = [
            LLMResponse(
                llm_answer=a,
                llm_context_list=c,
                benchmark_item=BenchmarkItem(question=q, answer=r),
                run_time=lat,
            )
            for q, a, r, c, lat in zip(
                cols["question"],
                cols["answer"],
                cols["reference"],
                cols["contexts"],
                cols["latency_s"],
            )
        ]
        t2 = time.perf_counter()
        got = asyncio.run(score_all(responses))
        t3 = time.perf_counter()
        timings["convert_s"] += t1 - t0
        timings["construct_s"] += t2 - t1
        timings["score_s"] += t3 - t2
        timings["cpu_s"] += time.process_time() - c0
        timings["rows"] += table.num_rows
        for column, values in zip(scores, got):
            column.extend(values)
        del cols, responses, table
    timings["versions"] = {
        p: metadata.version(p) for p in ("tonic-validate", "pydantic", "pyarrow")
    }
    timings["python"] = platform.python_version()
    out = Path(out_dir)
    # Columns named as the ragbatch metric ids (LatencyMetric calls itself "latency_metric").
    pq.write_table(
        pa.table({mid: pa.array(v, pa.float64()) for mid, v in zip(TONIC_IDS, scores)}),
        out / "tonic_scores.parquet",
    )
    (out / "tonic_timings.json").write_text(json.dumps(timings, indent=2))


def measure_tonic(input_path: str, rows: int, workdir: Path) -> tuple[dict, dict]:
    import numpy as np
    import pyarrow.parquet as pq

    python = ensure_tonic_venv()
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", TONIC_VALIDATE_DO_NOT_TRACK="true")
    env.pop("PYTHONPATH", None)
    t0 = time.perf_counter()
    subprocess.run(
        [
            str(python),
            __file__,
            "--tonic-worker",
            "--input",
            input_path,
            "--peer-rows",
            str(rows),
            "--workdir",
            str(workdir),
        ],
        check=True,
        env=env,
    )
    wall = time.perf_counter() - t0
    figures = json.loads((workdir / "tonic_timings.json").read_text())
    n = figures["rows"]
    figures["process_wall_s"] = wall
    figures["score_rows_per_s"] = n / figures["score_s"]
    figures["construct_score_rows_per_s"] = n / (figures["construct_s"] + figures["score_s"])
    figures["total_s"] = figures["convert_s"] + figures["construct_s"] + figures["score_s"]
    figures["rows_per_s"] = n / figures["total_s"]
    figures["rows_per_cpu_s"] = n / figures["cpu_s"]
    table = pq.read_table(workdir / "tonic_scores.parquet")
    scores = {m: np.array(table.column(m).to_pylist(), dtype=float) for m in TONIC_IDS}
    return figures, scores


def agreement(scores: dict[str, dict], n: int) -> dict:
    """Rows (of the first ``n``) where two implementations give different scores."""
    import numpy as np

    out = {}
    names = list(scores)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            out[f"{a} vs {b}"] = {
                m: int((~np.isclose(scores[a][m][:n], scores[b][m][:n], equal_nan=True)).sum())
                for m in TONIC_IDS
            }
    return out


# --------------------------------------------------------------------------- (c) floor + run

FLOOR_SCRIPT = r"""
import sys, time
t0 = time.perf_counter()
import polars as pl
src, dst, metrics = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
frame = pl.read_parquet(src)
t1 = time.perf_counter()
long = frame.select(row_id="trace_id", app="app", model_version="model_version").join(
    pl.DataFrame({"metric": metrics}), how="cross"
).select(
    "row_id", "metric", score=pl.lit(1.0), status=pl.lit("ok"), reason=pl.lit(None, pl.String),
    details=pl.lit(None, pl.String), model=pl.lit(None, pl.String), app="app",
    model_version="model_version",
)
long.write_parquet(dst)
t2 = time.perf_counter()
print(f"{t1 - t0:.3f} {t2 - t1:.3f} {long.height}")
"""


def measure_floor(input_path: str, metric_ids: list[str], workdir: Path) -> dict:
    out = workdir / "floor"
    out.mkdir(parents=True, exist_ok=True)
    dst = out / f"scores_{len(metric_ids)}.parquet"
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", FLOOR_SCRIPT, input_path, str(dst), ",".join(metric_ids)],
        check=True,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    read_s, write_s, rows = done.stdout.split()
    return {
        "wall_s": wall,
        "read_s": float(read_s),
        "build_write_s": float(write_s),
        "rows_written": int(rows),
        "file_bytes": dst.stat().st_size,
    }


def measure_run(
    input_path: str, name: str, metrics: list[dict], workdir: Path, executor: str | None = None
) -> dict:
    import yaml

    out = workdir / "out" / name
    shutil.rmtree(out, ignore_errors=True)
    run: dict = {"name": f"benchmark-{name}"}
    if executor is not None:
        run["executor"] = executor  # ragbatch.pipeline.in_process; default auto
    config = {
        "run": run,
        "input": {"uri": input_path, "columns": COLUMNS},
        "output": {"uri": str(out)},
        "metrics": metrics,
    }
    config_path = workdir / f"job_{name}.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    ragbatch = Path(sys.executable).with_name("ragbatch")
    command = [
        str(ragbatch) if ragbatch.exists() else "ragbatch",
        "run",
        str(config_path),
        "--run-id",
        "benchmark",
    ]
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"ragbatch run failed ({done.returncode})")
    from ragbatch.io.manifest_model import read_manifest

    manifest = read_manifest(str(next(out.glob("runs/run_date=*/run_id=benchmark/manifest.json"))))
    files = sorted(out.glob("scores/run_date=*/run_id=benchmark/*.parquet"))
    return {
        "wall_s": wall,
        "timings_s": manifest.timings_s,
        "read_tasks": manifest.input.read_tasks,
        "cells": sum(sum(v.values()) for v in manifest.counts.values()),
        "files": len(files),
        "scores_bytes": sum(f.stat().st_size for f in files),
        "config": str(config_path),
        "command": " ".join(["ragbatch", "run", str(config_path), "--run-id", "benchmark"]),
    }


# --------------------------------------------------------------------------- report


def machine() -> dict:
    info = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return info


def versions() -> dict:
    from importlib import metadata

    out = {}
    for name in ("ragbatch", "polars", "pyarrow", "ray", "duckdb", "numpy"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def report(results: dict) -> str:
    n = results["stage"]["rows"]
    st, lp, tv = results["stage"]["stage"], results["stage"]["loop"], results["tonic"]
    lines = [
        f"rows: {n:,} (input {results['input']['file_bytes'] / 1e9:.2f} GB Parquet, "
        f"{results['input']['uncompressed_bytes'] / 1e9:.2f} GB uncompressed); "
        f"Tonic Validate on {tv['rows']:,} of them",
        "",
        f"{'what':60s} {'rows/s':>10s} {'rows/CPU-s':>10s} {'seconds':>8s}",
        f"{'-' * 60} {'-' * 10} {'-' * 10} {'-' * 8}",
    ]

    def row(label: str, rows: int, seconds: float, cpu: float | None = None) -> None:
        per_cpu = f"{rows / cpu:10,.0f}" if cpu else f"{'':10s}"
        lines.append(f"{label:60s} {rows / seconds:10,.0f} {per_cpu} {seconds:8.2f}")

    row(
        "ragbatch read + normalize (not part of the stage)", n, results["stage"]["read_normalize_s"]
    )
    for name, label in (("tonic6", "6 Tonic metrics"), ("all8", "8 metrics")):
        row(f"ragbatch expression stage, {label}", n, st[name]["wall_s"], st[name]["cpu_s"])
        row(
            f"(a) Python loop, {label} (to_pylist + loop)",
            n,
            lp[name]["total_s"],
            lp[name]["cpu_s"],
        )
        row("    the loop alone", n, lp[name]["loop_s"])
    m = tv["rows"]
    row(
        "(b) Tonic Validate, 6 metrics (to_pylist + LLMResponse + score)",
        m,
        tv["total_s"],
        tv["cpu_s"],
    )
    row("    LLMResponse + score", m, tv["construct_s"] + tv["score_s"])
    row("    score only", m, tv["score_s"])
    lines.append("")
    r = results["ratios"]
    lines += [
        f"ragbatch stage / (a) loop, 6 metrics:                 {r['stage_vs_loop']:6.1f} x",
        f"ragbatch stage / (a) loop, 8 metrics:                 {r['stage_vs_loop_all8']:6.1f} x",
        f"ragbatch stage / (b) Tonic, 6 metrics:                {r['stage_vs_tonic']:6.1f} x   (target >= 30)",
        f"ragbatch stage / (b) Tonic, LLMResponse + score only: {r['stage_vs_tonic_construct_score']:6.1f} x",
        f"ragbatch stage / (b) Tonic, score calls only:         {r['stage_vs_tonic_score_only']:6.1f} x",
        f"ragbatch stage / (b) Tonic, rows per CPU-second:      {r['stage_vs_tonic_per_cpu']:6.1f} x",
    ]
    med = results.get("medians")
    if med:
        label = f"ragbatch stage / (b) Tonic, 6 metrics, median of {med['repetitions']}:"
        lines.append(
            f"{label:54s}{med['stage_vs_tonic']:6.1f} x   (stage "
            f"{med['stage_tonic6_wall_s']:.2f} s, Tonic {med['tonic_total_s']:.1f} s)"
        )
    lines += [
        "",
        f"{'end to end':10s} {'metrics':>7s} {'cells':>11s} {'floor (c) s':>11s} "
        f"{'ragbatch run s':>14s} {'ratio':>6s}",
    ]
    for name, e2e in results["end_to_end"].items():
        lines.append(
            f"{name:10s} {len(METRIC_SETS[name]):7d} {e2e['run']['cells']:11,d} "
            f"{e2e['floor']['wall_s']:11.1f} {e2e['run']['wall_s']:14.1f} "
            f"{e2e['run_vs_floor']:6.2f}   (target <= 3)"
        )
    lines.append("")
    for pair, diffs in results["agreement"].items():
        total = sum(diffs.values())
        lines.append(
            f"rows with different scores, {pair}: {total}" + (f" {diffs}" if total else "")
        )
    return "\n".join(lines)


def _fastest_stage(stages: list[tuple[dict, dict]]) -> tuple[dict, dict]:
    """The in-process figures with each measurement at its fastest repetition (every
    repetition covers the same rows); the scores of the first."""
    figures = json.loads(json.dumps(stages[0][0]))
    for other, _ in stages[1:]:
        for group in ("stage", "loop"):
            for name, values in other[group].items():
                if (
                    values["wall_s" if group == "stage" else "total_s"]
                    < figures[group][name]["wall_s" if group == "stage" else "total_s"]
                ):
                    figures[group][name] = values
        if other["read_normalize_s"] < figures["read_normalize_s"]:
            figures["read_normalize_s"] = other["read_normalize_s"]
            figures["read_normalize_rows_per_s"] = other["read_normalize_rows_per_s"]
    figures["repetitions"] = [
        {
            "stage_tonic6_wall_s": f["stage"]["tonic6"]["wall_s"],
            "stage_all8_wall_s": f["stage"]["all8"]["wall_s"],
            "loop_tonic6_total_s": f["loop"]["tonic6"]["total_s"],
        }
        for f, _ in stages
    ]
    return figures, stages[0][1]


def _medians(stages: list[tuple[dict, dict]], tonics: list[tuple[dict, dict]], rows: int) -> dict:
    """Median wall seconds over the repetitions (stage with 6 and 8 metrics, Tonic's full
    path) and the ratio of the medians, beside the best-of figures. Tonic's seconds are
    scaled to the stage's ``rows`` (they differ when ``--peer-rows`` is smaller)."""
    stage6 = statistics.median(f["stage"]["tonic6"]["wall_s"] for f, _ in stages)
    stage8 = statistics.median(f["stage"]["all8"]["wall_s"] for f, _ in stages)
    tonic_all = [t["total_s"] / t["rows"] * rows for t, _ in tonics]
    tonic = statistics.median(tonic_all)
    return {
        "repetitions": len(stages),
        "stage_tonic6_wall_s": stage6,
        "stage_all8_wall_s": stage8,
        "tonic_total_s": tonic,
        "tonic_total_s_all": tonic_all,
        "stage_vs_tonic": tonic / stage6,
    }


def _load() -> list[float] | None:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows", type=int, default=1_000_000, help="synthetic rows (default 1,000,000)"
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=DEFAULT_WORKDIR,
        help="where the input, outputs and results go (default benchmarks/_data)",
    )
    parser.add_argument(
        "--peer-rows",
        type=int,
        default=None,
        help="rows given to Tonic Validate and compared row by row (default: all)",
    )
    parser.add_argument(
        "--sets",
        default="all8,tonic6",
        help="metric sets for the end-to-end runs (default all8,tonic6)",
    )
    parser.add_argument("--skip-run", action="store_true", help="skip (c) and the ragbatch runs")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every measurement this many times and keep the fastest (default 1)",
    )
    parser.add_argument(
        "--retrieval",
        action="store_true",
        help="measure the ranking metrics (retrieval6) against ranx and a Python loop instead",
    )
    parser.add_argument("--tonic-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    workdir = args.workdir.resolve()
    peer_rows = args.peer_rows if args.peer_rows is not None else args.rows
    if args.tonic_worker:
        tonic_worker(args.input, peer_rows, str(workdir))
        return 0
    workdir.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    if args.retrieval:
        from benchmarks import expression_ranking

        given = argv if argv is not None else sys.argv[1:]
        rows = args.rows if "--rows" in given else 200_000
        return expression_ranking.main(rows, workdir, args.repeat if "--repeat" in given else 3)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    data = ensure_input(args.rows, workdir)
    input_path = data["path"]
    results: dict = {
        "started": started,
        "machine": machine(),
        "versions": versions(),
        "input": data,
        "metrics": METRICS,
        "tonic_metrics": TONIC_IDS,
        "repeat": args.repeat,
        "load_average_at_start": _load(),
    }
    # End to end first, while this process is still small.
    results["end_to_end"] = {}
    if not args.skip_run:
        for name in [s for s in args.sets.split(",") if s]:
            metrics = METRIC_SETS[name]
            floors, runs = [], []
            for rep in range(args.repeat):
                print(
                    f"(c) floor and ragbatch run, {name} ({rep + 1}/{args.repeat}) ...", flush=True
                )
                floors.append(measure_floor(input_path, [_metric_id(m) for m in metrics], workdir))
                runs.append(measure_run(input_path, name, metrics, workdir))
            floor = min(floors, key=lambda f: f["wall_s"])
            run = min(runs, key=lambda r: r["wall_s"])
            results["end_to_end"][name] = {
                "floor": floor,
                "run": run,
                "run_vs_floor": run["wall_s"] / floor["wall_s"],
                "floor_wall_s_all": [f["wall_s"] for f in floors],
                "run_wall_s_all": [r["wall_s"] for r in runs],
            }
    stages, tonics = [], []
    for rep in range(args.repeat):
        print(
            f"timing ragbatch's expression stage and the plain Python loop "
            f"({rep + 1}/{args.repeat}) ...",
            flush=True,
        )
        stages.append(measure_stage(input_path, peer_rows))
        print(f"timing Tonic Validate's metric classes ({rep + 1}/{args.repeat}) ...", flush=True)
        tonics.append(measure_tonic(input_path, peer_rows, workdir))
    stage, scores = _fastest_stage(stages)
    tonic = min((t for t, _ in tonics), key=lambda t: t["total_s"])
    results["stage"] = stage
    results["tonic"] = tonic
    results["versions"]["tonic-validate"] = tonic["versions"]["tonic-validate"]
    scores["tonic"] = tonics[0][1]
    results["agreement"] = agreement(scores, min(peer_rows, tonic["rows"]))
    six = stage["stage"]["tonic6"]["rows_per_s"]
    results["ratios"] = {
        "stage_vs_loop": six / stage["loop"]["tonic6"]["rows_per_s"],
        "stage_vs_loop_all8": stage["stage"]["all8"]["rows_per_s"]
        / stage["loop"]["all8"]["rows_per_s"],
        "stage_vs_tonic": six / tonic["rows_per_s"],
        "stage_vs_tonic_construct_score": six / tonic["construct_score_rows_per_s"],
        "stage_vs_tonic_score_only": six / tonic["score_rows_per_s"],
        "stage_vs_tonic_per_cpu": stage["stage"]["tonic6"]["rows_per_cpu_s"]
        / tonic["rows_per_cpu_s"],
    }
    results["medians"] = _medians(stages, tonics, stage["rows"])
    results["load_average_at_end"] = _load()
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    (workdir / "results.json").write_text(json.dumps(results, indent=2, default=str))
    print()
    print(report(results))
    print(f"\nresults: {workdir / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
