"""placeholder"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

ROW_GROUP_ROWS = 100_000

_SYLLABLES = ("ka", "to", "ri", "men", "sa", "lo", "de", "vin", "ter", "po", "al", "ex", "qua",
              "ni", "ros", "bel", "um", "tra", "gen", "ol", "ces", "mar", "ti", "on", "ha", "re")
_TOPIC_WORDS = ("data", "model", "pipeline", "table", "query", "cluster", "latency", "index",
                "retrieval", "answer", "context", "token", "schema", "partition", "Paris",
                "France", "Spark", "Delta", "Databricks", "vector", "embedding", "storage")
_UNICODE_WORDS = ("café", "naïve", "Zürich", "東京", "数据", "🚀", "résumé", "straße", "Ωmega",
                  "São Paulo", "Malmö", "niño", "Ελλάδα", "Москва", "✅", "€12")
_REFUSALS = ("I don't know.", "I DON'T KNOW.", "I don't know.")


def _vocabulary(rng: np.random.Generator, n_words: int = 5000) -> list[str]:
    words = set()
    while len(words) < n_words:
        k = int(rng.integers(1, 4))
        words.add("".join(_SYLLABLES[i] for i in rng.integers(0, len(_SYLLABLES), k)))
    return sorted(words)


def _corpus(rng: np.random.Generator, n_words: int) -> bytes:
    """One long UTF-8 text of words with Zipf-like frequencies, sentence punctuation and
    ~2 % non-ASCII words; texts are cut from it at spaces."""
    vocab = _vocabulary(rng) + list(_TOPIC_WORDS) * 3
    weights = 1.0 / np.arange(1, len(vocab) + 1) ** 0.9
    rng.shuffle(weights)
    base = rng.choice(len(vocab), size=n_words, p=weights / weights.sum())
    words = vocab + list(_UNICODE_WORDS)
    base = np.where(rng.random(n_words) < 0.02,
                    len(vocab) + rng.integers(0, len(_UNICODE_WORDS), n_words), base)
    punct = np.where(rng.random(n_words) < 1 / 14, 1, np.where(rng.random(n_words) < 1 / 11, 2, 0))
    capital = np.roll(punct == 1, 1)
    variants = []
    for w in words:
        for cap in (w, w[:1].upper() + w[1:]):
            variants.extend((cap + " ").encode() for cap in (cap, cap + ".", cap + ","))
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
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    workdir = Path(workdir)
    path = workdir / "input" / "traces.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    corpus = _corpus(rng, 4_000_000)
    spaces = np.flatnonzero(np.frombuffer(corpus, np.uint8) == 32)
    usable = int(np.searchsorted(spaces, len(corpus) - 4000))
    schema = pa.schema([
        ("trace_id", pa.string()), ("question", pa.string()),
        ("contexts", pa.list_(pa.string())), ("answer", pa.string()),
        ("reference", pa.string()), ("latency_s", pa.float64()),
        ("app", pa.string()), ("model_version", pa.string()),
    ])
    apps = np.array(["support-bot", "docs-search", "sales-assist", "hr-helpdesk", "dev-copilot"])
    versions = np.array(["2024-05-rc1", "2024-06", "2024-06-hotfix"])

    def cuts(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(start, end) byte offsets of texts of about ``lengths`` bytes, at spaces."""
        begin = spaces[rng.integers(0, usable, len(lengths))] + 1
        end = spaces[np.searchsorted(spaces, begin + lengths) - 1]
        return begin, np.maximum(end, begin + 1)

    def texts(lengths: np.ndarray) -> list[bytes]:
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
                    answers[i] = json.dumps({"answer": body, "sources": cites[i:i + 3]},
                                            ensure_ascii=False).encode()
            for i in np.flatnonzero(kind >= 0.03).tolist():
                a = answers[i]
                for j in range(cites[i]):
                    p = a.find(b" ", (len(a) * (2 * j + 1)) // 7)
                    if p > 0:
                        a = a[:p] + b" [%d]" % (j + 1) + a[p:]
                answers[i] = a
            same_ref = (rng.random(n) < 0.10).tolist()
            references = texts(rng.integers(300, 1501, n))
            references = [b"\n" + a + b" " if same else r
                          for a, r, same in zip(answers, references, same_ref)]
            n_ctx = rng.integers(3, 6, n)
            offsets = np.concatenate([[0], np.cumsum(n_ctx)]).astype(np.int32)
            items = pa.array(texts(rng.integers(500, 1501, int(n_ctx.sum()))), pa.binary())
            contexts = pa.ListArray.from_arrays(pa.array(offsets), items.cast(pa.string()))
            latency = np.round(rng.lognormal(np.log(2.0), 0.6, n), 3)
            table = pa.table({
                "trace_id": pa.array([f"t{seed % 1000:03d}-{start + i:08d}" for i in range(n)]),
                "question": pa.array(questions, pa.binary()).cast(pa.string()),
                "contexts": contexts,
                "answer": pa.array(answers, pa.binary()).cast(pa.string()),
                "reference": pa.array(references, pa.binary()).cast(pa.string()),
                "latency_s": pa.array(latency, pa.float64()),
                "app": pa.array(apps[rng.integers(0, len(apps), n)]),
                "model_version": pa.array(versions[rng.integers(0, len(versions), n)]),
            }, schema=schema)
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
        "uncompressed_bytes": sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)),
        "mean_chars": {
            "question": totals["question"] / n_rows,
            "answer": totals["answer"] / n_rows,
            "reference": totals["reference"] / n_rows,
            "context": totals["context"] / max(1, n_contexts),
        },
        "mean_contexts_per_row": n_contexts / n_rows,
        "seed": seed,
    }
