"""Turn a GGUF checkpoint into a Hugging Face model folder that vLLM loads.

transformers reads GGUF files (with the ``gguf`` package) but keeps the weights quantized
when loading with ``from_pretrained(..., gguf_file=...)`` and then refuses to save them.
This module builds the model from the GGUF's config instead, loads the dequantized tensors
into it, and saves that: ``config.json``, ``generation_config.json``, ``model.safetensors``
and the tokenizer files with the chat template the GGUF carries.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from ragbatch.core.errors import RagbatchError

logger = logging.getLogger(__name__)

#: Packages the conversion needs beyond transformers and torch, with the pins of the
#: ``judge-cpu`` and ``test`` extras.
CONVERT_REQUIREMENTS = {"gguf": "gguf>=0.10", "accelerate": "accelerate>=1.0"}

#: dtype the weights are saved in: half the size of float32; vLLM's CPU and GPU builds
#: run it.
SAVE_DTYPE = "bfloat16"

#: Weights a checkpoint may lack because the model ties them to another one.
TIED_WEIGHTS = {"lm_head.weight"}


def check_convert_requirements() -> None:
    """Raise unless the packages the conversion needs are importable.

    Raises
    ------
    RagbatchError
        One or more of ``gguf`` and ``accelerate`` is missing; the message holds the pip
        command that installs them.
    """
    missing = [pin for module, pin in CONVERT_REQUIREMENTS.items()
               if importlib.util.find_spec(module) is None]
    if missing:
        pins = " ".join(f"'{p}'" for p in missing)
        raise RagbatchError(f"building a model from GGUF needs {', '.join(missing)}, not "
                            f"installed here; install with: pip install {pins} "
                            f"(or: pip install 'ragbatch[judge-cpu]')")


def convert_gguf(gguf_file: Path, out: Path, *, max_model_len: int) -> None:
    """Write the Hugging Face folder of the GGUF checkpoint ``gguf_file`` into ``out``.

    Parameters
    ----------
    gguf_file : pathlib.Path
        A GGUF file of an architecture transformers can read (Llama, Mistral, Qwen2, ...).
    out : pathlib.Path
        Target directory; created if missing.
    max_model_len : int
        Context window written as the tokenizer's ``model_max_length``.

    Raises
    ------
    RagbatchError
        A required package is missing (:func:`check_convert_requirements`), or the GGUF
        tensors do not cover the model's weights.

    Notes
    -----
    Dequantizes every tensor to float32, then saves in :data:`SAVE_DTYPE` (a 135M model:
    about 30-90 s on two CPU cores, peak memory about 1.5 GB).
    """
    check_convert_requirements()
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, name = str(gguf_file.parent), gguf_file.name
    # local_files_only: the file is here, and the tokenizer writes this load argument into
    # tokenizer_config.json, so passing it always keeps the output the same whether or not
    # HF_HUB_OFFLINE is set
    config = AutoConfig.from_pretrained(folder, gguf_file=name, local_files_only=True)
    model = AutoModelForCausalLM.from_config(config)
    tensors = load_gguf_checkpoint(str(gguf_file), return_tensors=True,
                                   model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    untied = set(missing) - (TIED_WEIGHTS if config.tie_word_embeddings else set())
    if untied or unexpected:
        raise RagbatchError(f"{name}: the GGUF tensors do not fit the model it describes "
                            f"(missing: {sorted(untied) or 'none'}; "
                            f"unexpected: {sorted(unexpected) or 'none'})")
    model.tie_weights()
    model = model.to(getattr(torch, SAVE_DTYPE)).eval()
    model.save_pretrained(out)
    GenerationConfig.from_model_config(model.config).save_pretrained(out)

    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    tokenizer.model_max_length = max_model_len
    if not tokenizer.chat_template:
        raise RagbatchError(f"{name} carries no chat template; a judge needs one")
    tokenizer.save_pretrained(out)
