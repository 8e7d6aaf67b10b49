"""Model engine adapters, one module per backend library.

Every call into a backend library lives in its adapter module, so that a change in that
library's API between releases touches one file. Adapter modules import their backend
lazily (inside the functions that need it): importing :mod:`ragbatch.engines` or a
metric that uses it never pulls in torch.

* :mod:`ragbatch.engines.sentence_transformers`: bi-encoders (``embedding`` engines) and
  cross-encoders (``cross_encoder`` engines) through sentence-transformers.
* :mod:`ragbatch.engines.vllm`: the offline ``vllm.LLM`` judge engine (``vllm``).
* :mod:`ragbatch.engines.openai`: any OpenAI-compatible judge server (``openai``).
"""

from __future__ import annotations

from typing import Any


def load_judge_engine(spec: Any) -> Any:
    """Load the judge engine a validated ``vllm`` or ``openai`` engine spec describes.

    Returns
    -------
    ragbatch.judge.protocol.JudgeEngine

    Raises
    ------
    EngineError
        The backend is not installed (the message gives the pip command), the model
        cannot be loaded, or the server cannot be reached.
    ValueError
        ``spec`` is not a judge engine spec.
    """
    kind = getattr(spec, "type", None)
    if kind == "vllm":
        from ragbatch.engines.vllm import load_vllm_engine

        return load_vllm_engine(spec)
    if kind == "openai":
        from ragbatch.engines.openai import load_openai_engine

        return load_openai_engine(spec)
    raise ValueError(f"engine type {kind!r} is not a judge engine (vllm or openai)")
