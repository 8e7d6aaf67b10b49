"""The peer side of ``benchmarks/vs_peers.py``: runs in a peer's own environment
(``benchmarks/_venv_ragas``, ``benchmarks/_venv_tonic``), never in the project's.

Each worker reads the rows Parquet file, builds the peer's own inputs, times only the
peer's evaluation call (imports, model loading and input conversion are outside the
timed span; the caller's wall time covers everything), and writes a JSON result:
``eval_s``, ``rows``, per-metric ``failed`` cells (a score the peer returned as missing:
an unparseable reply or a failed request, with parse retries at the peer's minimum) and
``parse_failures`` (their sum), ``judged_cells`` (rows x LLM metrics, the denominator of
the parse-failure rate), and the peer's versions.
"""

from __future__ import annotations

import json
import math
import os
import time
from importlib import metadata
from pathlib import Path
from typing import Any


def _rows(path: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def _versions(names: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


# -- Ragas ----------------------------------------------------------------------------------


def ragas(args) -> dict[str, Any]:
    """``ragas.evaluate`` with Faithfulness, ResponseRelevancy and LLMContextRecall.

    The judge is what ``evaluate`` builds by default, ``llm_factory`` over an
    ``AsyncOpenAI`` client, here pointed at ``args.base_url`` (``max_tokens`` and
    temperature 0 in its model arguments, the client's own HTTP retries off). Embeddings:
    LangChain's sentence-transformers ``HuggingFaceEmbeddings`` over the local
    all-MiniLM-L6-v2 directory ``args.embedder_dir``. ``RunConfig(max_workers=args.workers, max_retries=1,
    timeout=600)``: one attempt per call (tenacity ``stop_after_attempt(1)``).
    """
    os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")
    from openai import AsyncOpenAI
    from ragas import EvaluationDataset, RunConfig, evaluate
    from langchain_community.embeddings import HuggingFaceEmbeddings
    from ragas.llms import llm_factory
    from ragas.metrics import Faithfulness, LLMContextRecall, ResponseRelevancy

    client = AsyncOpenAI(base_url=args.base_url, api_key="unused", max_retries=0, timeout=600)
    llm = llm_factory(args.model, client=client, max_tokens=args.max_tokens, temperature=0.0)
    # evaluate() wraps a LangChain embeddings object in its LangchainEmbeddingsWrapper.
    embeddings = HuggingFaceEmbeddings(model_name=args.embedder_dir)
    rows = _rows(args.input)
    dataset = EvaluationDataset.from_list(
        [
            {
                "user_input": r["question"],
                "retrieved_contexts": r["contexts"],
                "response": r["answer"],
                "reference": r["reference"],
            }
            for r in rows
        ]
    )
    metrics = [Faithfulness(), ResponseRelevancy(), LLMContextRecall()]
    config = RunConfig(max_workers=args.workers, max_retries=1, timeout=600)
    start = time.perf_counter()
    result = evaluate(
        dataset,
        metrics=metrics,
        llm=llm,
        embeddings=embeddings,
        run_config=config,
        raise_exceptions=False,
        show_progress=False,
    )
    eval_s = time.perf_counter() - start
    scores = result.scores  # one dict per row
    failed = {m.name: sum(_missing(s.get(m.name)) for s in scores) for m in metrics}
    return {
        "eval_s": eval_s,
        "rows": len(rows),
        "failed": failed,
        "parse_failures": sum(failed.values()),
        "judged_cells": len(rows) * len(metrics),
        "settings": {
            "llm": "llm_factory(AsyncOpenAI)",
            "max_tokens": args.max_tokens,
            "temperature": 0.0,
            "run_config": {"max_workers": args.workers, "max_retries": 1, "timeout": 600},
            "client_max_retries": 0,
            "strictness": metrics[1].strictness,
        },
        "versions": _versions(
            ("ragas", "openai", "instructor", "langchain-core", "sentence-transformers", "torch")
        ),
    }


# -- Tonic Validate -------------------------------------------------------------------------


def tonic(args) -> dict[str, Any]:
    """``ValidateScorer.score_responses`` with three LLM metrics and four deterministic
    ones; ``max_parsing_retries=1`` and ``max_llm_retries=1`` (one attempt each, the
    least the scorer allows), ``parallelism=args.workers``."""
    os.environ.setdefault("TONIC_VALIDATE_DO_NOT_TRACK", "true")
    if "TIKTOKEN_CACHE_DIR" not in os.environ:
        # The scorer loads tiktoken's cl100k_base for token counts; litellm (a Tonic
        # dependency) ships that file, so no download is needed.
        import litellm

        os.environ["TIKTOKEN_CACHE_DIR"] = str(
            Path(litellm.__file__).parent / "litellm_core_utils" / "tokenizers"
        )
    from tonic_validate import BenchmarkItem, LLMResponse, ValidateScorer
    from tonic_validate.metrics import (
        AnswerSimilarityMetric,
        AugmentationAccuracyMetric,
        ContainsTextMetric,
        ContextLengthMetric,
        RegexMetric,
        ResponseLengthMetric,
        RetrievalPrecisionMetric,
    )

    llm_metrics = [
        AnswerSimilarityMetric(),
        RetrievalPrecisionMetric(),
        AugmentationAccuracyMetric(),
    ]
    metrics = llm_metrics + [
        ResponseLengthMetric("response_length", min_length=1, max_length=1500),
        ContextLengthMetric("context_length", min_length=200, max_length=6000),
        ContainsTextMetric("mentions_data", ["data"], case_sensitive=False),
        RegexMetric("has_number", r"\d+", match_count=1),
    ]
    scorer = ValidateScorer(
        metrics, model_evaluator=args.model, max_parsing_retries=1, max_llm_retries=1, quiet=True
    )
    rows = _rows(args.input)
    responses = [
        LLMResponse(
            llm_answer=r["answer"],
            llm_context_list=r["contexts"],
            benchmark_item=BenchmarkItem(question=r["question"], answer=r["reference"]),
        )
        for r in rows
    ]
    start = time.perf_counter()
    run = scorer.score_responses(responses, parallelism=args.workers)
    eval_s = time.perf_counter() - start
    failed = {m.name: sum(_missing(d.scores.get(m.name)) for d in run.run_data) for m in metrics}
    return {
        "eval_s": eval_s,
        "rows": len(rows),
        "failed": failed,
        "parse_failures": sum(failed[m.name] for m in llm_metrics),
        "judged_cells": len(rows) * len(llm_metrics),
        "settings": {
            "max_parsing_retries": 1,
            "max_llm_retries": 1,
            "parallelism": args.workers,
            "model_evaluator": args.model,
            "max_tokens": "server cap (Tonic sends none)",
        },
        "versions": _versions(("tonic-validate", "openai", "litellm")),
    }


def run_worker(args) -> None:
    """Run the peer named by ``args.peer_worker`` and write its result to ``args.result``."""
    result = {"ragas": ragas, "tonic": tonic}[args.peer_worker](args)
    Path(args.result).write_text(json.dumps(result, indent=2) + "\n")
