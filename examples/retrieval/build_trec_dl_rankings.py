"""Build trec_dl_rankings.jsonl, one row per (retriever, query), from the shipped TREC DL
judgments (examples/data/trec_dl/trec_dl_2021_2022_benchmark.csv).

Two made-up retrievers rank each query's judged passages: ``shuffled`` puts them in a
seeded random order (seed 20261202 plus the query id), ``by_grade`` in decreasing grade
(ties by doc id), an ideal ranking. ``relevance`` lists every judged passage with its
grade (0, 1/3, 2/3 or 1). Run from the repository root:

    .venv/bin/python examples/retrieval/build_trec_dl_rankings.py
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parent / "data" / "trec_dl" / "trec_dl_2021_2022_benchmark.csv"
TARGET = HERE / "trec_dl_rankings.jsonl"
SEED = 20261202


def main() -> None:
    queries: dict[str, dict] = {}
    with SOURCE.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            query = queries.setdefault(row["query_id"], {"query": row["query"], "grades": {}})
            query["grades"][row["doc_id"]] = float(row["expected_score"])
    with TARGET.open("w", encoding="utf-8") as out:
        for query_id, query in queries.items():
            grades = query["grades"]
            shuffled = sorted(grades)
            random.Random(SEED + int(query_id)).shuffle(shuffled)
            by_grade = sorted(grades, key=lambda d: (-grades[d], d))
            relevance = [{"id": d, "grade": g} for d, g in grades.items()]
            for retriever, ranking in (("shuffled", shuffled), ("by_grade", by_grade)):
                record = {
                    "row_id": f"{retriever}:{query_id}",
                    "retriever": retriever,
                    "query_id": query_id,
                    "query": query["query"],
                    "doc_ids": ranking,
                    "grades": relevance,
                }
                out.write(json.dumps(record, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
