"""Model engines, one module per engine: its spec model, its adapter and its registration.

Each module registers its engine type with
:func:`ragbatch.core.engine_registry.register_engine` when imported; the registry imports
every module of this package (and the ``ragbatch.engines`` entry points of other
installed distributions) the first time it is asked anything. Every call into a backend
library lives in its adapter module, so that a change in that library's API between
releases touches one file. Adapter modules import their backend lazily (inside the
functions that need it): importing an engine module, or validating a config, never pulls
in torch, vLLM or Presidio.

* :mod:`ragbatch.engines.sentence_transformers`: bi-encoders (``embedding`` engines) and
  cross-encoders (``cross_encoder`` engines) through sentence-transformers.
* :mod:`ragbatch.engines.vllm`: the offline ``vllm.LLM`` judge engine (``vllm``).
* :mod:`ragbatch.engines.openai`: any OpenAI-compatible judge server (``openai``).
* :mod:`ragbatch.engines.presidio`: local PII detection (``presidio``).
* :mod:`ragbatch.core.engine_registry`: one entry per engine ``type`` (its config model,
  stage kind, loader and judge hooks); every site that differs by engine asks it.
"""

from __future__ import annotations

from typing import Any


def load_judge_engine(spec: Any) -> Any:
    """Load the judge engine a validated judge engine spec (``vllm``, ``openai`` or any
    registered engine type of stage ``judge``) describes.

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
    from ragbatch.core.engine_registry import engine_names, engine_type

    kind = getattr(spec, "type", None)
    judges = engine_names("judge")
    if kind not in judges:
        raise ValueError(f"engine type {kind!r} is not a judge engine ({' or '.join(judges)})")
    return engine_type(kind).load(spec)
