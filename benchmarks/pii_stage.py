"""PII-stage benchmark: detection quality against gold spans, and rows per second.

Usage (from the repository root, in the project's virtual environment)::

    python benchmarks/pii_stage.py                  # default detectors, both gold files
    python benchmarks/pii_stage.py --repeat 5 --out benchmarks/_data/pii_stage.json

Data: ``examples/data/pii_presidio_synthetic`` (1,600 Faker sentences with gold spans).
A row *contains type T* when one of its gold spans has ``entity_type`` T.

1. **Quality.** ``udfs.pii.PiiStage`` runs in this process (no Ray) over all rows, as the
   answer column, with one ``answer_contains_pii`` metric per entity type, each limited to
   that type, on an engine with ``entity_types: all`` (threshold 0.4). For every gold
   type and every type the detectors report, the table gives gold rows, rows flagged,
   true and false positives, precision and recall of "row contains T". Gold types the
   detectors cannot find (PERSON, LOCATION and the other named entities need a NER
   model) show recall 0 and no precision.
2. **Speed.** Two ways of scoring the same rows, alternated ``--repeat`` times after an
   untimed warm-up, medians reported:

   * *stage*: ``PiiStage.__call__`` on the rows in batches of ``--batch-size``, with one
     ``answer_contains_pii`` metric on an engine with ``entity_types: all`` (the types
     Presidio's recognizers reach at the threshold): guards in Polars, analysis of
     every distinct text once, overlap resolution, cells;
   * *baseline*: Presidio as a user would call it by hand: an ``AnalyzerEngine`` with
     Presidio's default recognizers for English on the same blank spaCy tokenizer (its
     NER recognizer removed, the email recognizer's suffix-list download avoided the same
     way) and ``analyze(text, language="en")`` per row.

   The texts are distinct (a real corpus often repeats contexts; the stage analyzes a
   repeated text once per batch, which this benchmark does not credit).

It prints the figures and writes ``--out`` (default ``benchmarks/_data/pii_stage.json``).
Speed figures belong in BENCHMARKS.md; nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "examples" / "data" / "pii_presidio_synthetic"
FILES = ("data__synth_dataset_v2.json", "tests__data__generated_small.json")


def load_rows() -> list[dict]:
    rows = []
    for name in FILES:
        rows += json.loads((DATA / name).read_text(encoding="utf-8"))
    return rows


def quality(rows: list[dict]) -> list[dict]:
    """Per entity type: gold rows, flagged rows, tp, fp, fn, precision, recall."""
    from ragbatch.engines.presidio import PresidioEngine
    from ragbatch.engines.presidio import supported_entities
    from udfs.pii import PiiStage

    engine = {"type": "presidio", "entity_types": "all"}
    supported = supported_entities(PresidioEngine(**engine))
    gold_types = sorted({s["entity_type"] for r in rows for s in r["spans"]})
    metrics = [
        {"name": "answer_contains_pii", "id": t, "params": {"pii_types": [t]}} for t in supported
    ]
    table = pa.table(
        {"row_id": [str(i) for i in range(len(rows))], "answer": [r["full_text"] for r in rows]}
    )
    out = PiiStage("pii", engine, metrics)(table)
    report = []
    for entity in sorted(set(gold_types) | set(supported)):
        gold = [any(s["entity_type"] == entity for s in r["spans"]) for r in rows]
        if entity in supported:
            found = [c["score"] == 1.0 for c in out.column(f"cell::{entity}").to_pylist()]
        else:
            found = [False] * len(rows)
        tp = sum(g and f for g, f in zip(gold, found))
        fp = sum(f and not g for g, f in zip(gold, found))
        fn = sum(g and not f for g, f in zip(gold, found))
        if entity == "URL":  # the gold data labels web addresses DOMAIN_NAME
            domain = [any(s["entity_type"] == "DOMAIN_NAME" for s in r["spans"]) for r in rows]
            extra = {
                "flagged_rows_with_gold_domain_name": sum(f and d for f, d in zip(found, domain))
            }
        else:
            extra = {}
        report.append(
            {
                **extra,
                "entity_type": entity,
                "detectable": entity in supported,
                "gold_rows": sum(gold),
                "flagged_rows": sum(found),
                "tp": tp,
                "fp": fp,
                "fn": fn,
                "precision": round(tp / (tp + fp), 3) if tp + fp else None,
                "recall": round(tp / (tp + fn), 3) if tp + fn else None,
            }
        )
    return report


def baseline_analyzer():
    """Presidio's default English recognizers on a blank spaCy tokenizer, as by hand."""
    import logging

    import spacy
    import tldextract
    from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
    from presidio_analyzer.nlp_engine import SpacyNlpEngine
    from presidio_analyzer.predefined_recognizers import EmailRecognizer

    logging.getLogger("presidio-analyzer").setLevel(logging.ERROR)
    extract = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)

    class LocalEmail(EmailRecognizer):
        def validate_result(self, pattern_text):
            return extract(pattern_text).fqdn != ""

    engine = SpacyNlpEngine(models=[{"lang_code": "en", "model_name": "blank"}])
    engine.nlp = {"en": spacy.blank("en")}
    registry = RecognizerRegistry(supported_languages=["en"])
    registry.load_predefined_recognizers(languages=["en"])
    registry.recognizers = [
        r
        for r in registry.recognizers
        if type(r).__name__ not in ("SpacyRecognizer", "EmailRecognizer")
    ]
    registry.add_recognizer(LocalEmail())
    return AnalyzerEngine(registry=registry, nlp_engine=engine, supported_languages=["en"])


def speed(rows: list[dict], repeat: int, batch_size: int) -> dict:
    from udfs.pii import PiiStage

    texts = [r["full_text"] for r in rows]
    stage = PiiStage(
        "pii",
        {"type": "presidio", "entity_types": "all"},
        [{"name": "answer_contains_pii", "id": "pii", "params": {}}],
    )
    analyzer = baseline_analyzer()
    batches = [
        pa.table(
            {
                "row_id": [str(i) for i in range(s, min(s + batch_size, len(texts)))],
                "answer": texts[s : s + batch_size],
            }
        )
        for s in range(0, len(texts), batch_size)
    ]

    def run_stage() -> float:
        t = time.perf_counter()
        for b in batches:
            stage(b)
        return time.perf_counter() - t

    def run_baseline() -> float:
        t = time.perf_counter()
        for text in texts:
            analyzer.analyze(text, language="en")
        return time.perf_counter() - t

    stage(batches[0].slice(0, 16))
    for text in texts[:16]:
        analyzer.analyze(text, language="en")
    stage_s, base_s = [], []
    for i in range(repeat):
        order = (run_stage, run_baseline) if i % 2 == 0 else (run_baseline, run_stage)
        for fn in order:
            (stage_s if fn is run_stage else base_s).append(fn())
    n = len(texts)
    stage_med, base_med = statistics.median(stage_s), statistics.median(base_s)
    return {
        "rows": n,
        "batch_size": batch_size,
        "repeat": repeat,
        "stage_s": stage_s,
        "baseline_s": base_s,
        "stage_rows_per_s": round(n / stage_med, 1),
        "baseline_rows_per_s": round(n / base_med, 1),
        "stage_over_baseline": round(base_med / stage_med, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "_data" / "pii_stage.json"
    )
    args = parser.parse_args()
    rows = load_rows()
    report = {
        "machine": platform.platform(),
        "quality": quality(rows),
        "speed": speed(rows, args.repeat, args.batch_size),
    }
    print(
        f"{'entity type':20s} {'gold':>5s} {'flag':>5s} {'tp':>5s} {'fp':>5s} {'fn':>5s} "
        f"{'P':>6s} {'R':>6s}"
    )
    for q in report["quality"]:
        p = "-" if q["precision"] is None else f"{q['precision']:.3f}"
        r = "-" if q["recall"] is None else f"{q['recall']:.3f}"
        mark = "" if q["detectable"] else "  (not a type the default detectors report)"
        print(
            f"{q['entity_type']:20s} {q['gold_rows']:5d} {q['flagged_rows']:5d} {q['tp']:5d} "
            f"{q['fp']:5d} {q['fn']:5d} {p:>6s} {r:>6s}{mark}"
        )
        if "flagged_rows_with_gold_domain_name" in q:
            print(
                f"{'':20s} ({q['flagged_rows_with_gold_domain_name']} of the {q['flagged_rows']} "
                "URL rows hold a gold DOMAIN_NAME span)"
            )
    s = report["speed"]
    print(
        f"stage {s['stage_rows_per_s']} rows/s, baseline {s['baseline_rows_per_s']} rows/s, "
        f"stage/baseline speed {s['stage_over_baseline']}x"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
