"""A benchmark-only stand-in for the embedding model: answers at once, without a model.

:func:`install` is a Ray worker setup hook (``runtime_env={"worker_process_setup_hook":
"instant_model.install"}``, with ``benchmarks/`` on the workers' ``PYTHONPATH``): in every
worker it replaces how ragbatch loads an ``embedding`` engine, so that the model stage's
actor gets a model whose ``encode`` costs nothing but a pass over the texts' lengths.
What is left of a batch's time is the pipeline's own: Ray Data, the Arrow to Polars to
Python conversion, the guards, the ledger, building the cells. Its scores mean nothing.
It is used by ``benchmarks/model_stage.py --parts instant`` and
``benchmarks/gpu/model_stage.py``; nothing in ragbatch imports it.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

#: The model id its cells record.
MODEL_ID = "instant-stand-in (benchmark only)"


class InstantEncoder:
    """Two numbers per text, from its length: unit vectors whose cosines vary by row."""

    def encode(self, texts: Sequence[str], **_: Any) -> np.ndarray:
        lengths = np.fromiter((len(t) for t in texts), dtype=np.float64, count=len(texts))
        return np.stack([np.cos(lengths / 50.0), np.sin(lengths / 50.0)], axis=1)

    def get_embedding_dimension(self) -> int:
        return 2


def instant_model(spec: Any, device: str) -> Any:
    """A :class:`ragbatch.engines.sentence_transformers.LoadedModel` around
    :class:`InstantEncoder` (the signature of the adapter's ``_load_embedding``)."""
    from ragbatch.engines.sentence_transformers import LoadedModel

    return LoadedModel(
        InstantEncoder(),
        kind="embedding",
        model_id=MODEL_ID,
        device=device,
        batch_size=getattr(spec, "encode_batch_size", None) or 32,
    )


def install() -> None:
    """Make every ``embedding`` engine loaded in this process the instant stand-in."""
    import ragbatch.engines.sentence_transformers as adapter
    from ragbatch.pipeline.ray_paths import enter_driver_folder

    enter_driver_folder()  # what ragbatch's own local Ray runs in every worker
    adapter._load_embedding = instant_model  # type: ignore[assignment]
