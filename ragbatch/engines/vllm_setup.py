"""Loading vLLM for the ``vllm`` judge engine (:func:`ragbatch.engines.vllm.load_vllm_engine`):
the process environment and thread count set before vLLM starts, the ``vllm.LLM``
arguments, the model's identity from its files, the structured-output settings the
engine runs with, and the cleanup after it. What each default is for, and the vLLM
release it was written against, is in docs/engines.md.
"""

from __future__ import annotations

import gc
import hashlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragbatch.core.errors import EngineError, describe_exception
from ragbatch.engines.vllm import (
    CPU_INSTALL,
    DEFAULT_CPU_BLOCK_SIZE,
    DEFAULT_CPU_KVCACHE_GIB,
    DEFAULT_CPU_MULTIPROCESSING,
    DEFAULT_STRUCTURED_OUTPUTS,
    GPU_INSTALL,
    MODEL_ID_FILES,
    TOKENIZER_ID_FILES,
)
from ragbatch.judge.protocol import EngineRequest, OutputSpec

if TYPE_CHECKING:
    from ragbatch.engines.vllm import VllmEngine, VllmJudgeEngine

logger = logging.getLogger(__name__)


def cpu_environment_defaults(spec: VllmEngine, cuda: bool) -> dict[str, str]:
    """The ``VLLM_*`` variables :func:`load_vllm_engine` sets in ``os.environ`` before it
    starts vLLM, each only where the variable is unset (``os.environ.setdefault``).

    Parameters
    ----------
    spec : ragbatch.engines.vllm.VllmEngine
    cuda : bool
        Whether a CUDA device is visible.

    Returns
    -------
    dict of str to str
        Empty with a GPU. Without one: ``VLLM_CPU_KVCACHE_SPACE`` =
        :data:`DEFAULT_CPU_KVCACHE_GIB` (GiB) unless ``engine_kwargs`` sets
        ``kv_cache_memory_bytes``, since vLLM's CPU build otherwise sizes its KV cache
        from a share of the machine's memory; and ``VLLM_ENABLE_V1_MULTIPROCESSING`` =
        :data:`DEFAULT_CPU_MULTIPROCESSING` (the engine in the calling process) when
        ``tensor_parallel_size`` is 1. docs/engines.md says why for both.

    Notes
    -----
    The variables stay set after loading; nothing restores them. Processes vLLM starts
    inherit them, and a later engine in the same process starts the same way (in the
    calling process vLLM stops reading them once its engine has started).
    """
    if cuda:
        return {}
    defaults = {}
    if "kv_cache_memory_bytes" not in spec.engine_kwargs:
        defaults["VLLM_CPU_KVCACHE_SPACE"] = DEFAULT_CPU_KVCACHE_GIB
    if spec.tensor_parallel_size == 1:
        defaults["VLLM_ENABLE_V1_MULTIPROCESSING"] = DEFAULT_CPU_MULTIPROCESSING
    return defaults


def set_cpu_threads(spec: VllmEngine, cuda: bool) -> None:
    """Without a GPU, give torch ``spec.threads`` threads, in every thread of the process,
    before vLLM starts (:func:`ragbatch.engines.threads.set_torch_threads`): its CPU worker
    keeps the count the process has then (it turns ``torch.set_num_threads`` into a
    no-op), and in a Ray actor that count is the CPUs the actor reserved, which the pool
    rule may set below the threads it gives the engine
    (:func:`ragbatch.core.pool_sizing.vllm_pool`). Nothing to do on a GPU, or when
    ``threads`` is unset."""
    if cuda or not spec.threads:
        return
    from ragbatch.engines.threads import set_torch_threads

    set_torch_threads(spec.threads)


def import_vllm(cuda: bool) -> Any:
    """The ``vllm`` module; an :class:`EngineError` naming the pip command for this
    machine when it is not installed, or the cause when it cannot be imported."""
    install = GPU_INSTALL if cuda else CPU_INSTALL
    try:
        import vllm
    except ImportError as exc:
        raise EngineError(
            f"the vllm judge engine needs vLLM, which is not installed "
            f"({describe_exception(exc)}); install it with: {install}"
        ) from exc
    except Exception as exc:  # a broken install, e.g. torchvision built for another torch
        hint = ""
        if "torchvision" in str(exc):
            hint = (
                "; torchvision does not match the installed torch: "
                "pip uninstall -y torchvision torchaudio torchcodec"
            )
        raise EngineError(f"vLLM cannot be imported: {describe_exception(exc)}{hint}") from exc
    return vllm


def llm_kwargs(spec: VllmEngine, cuda: bool) -> dict[str, Any]:
    """The keyword arguments of ``vllm.LLM``: the config's fields, the adapter's defaults
    (see :func:`load_vllm_engine`), then ``engine_kwargs``, which win."""
    kwargs: dict[str, Any] = {
        "model": spec.model,
        "tokenizer": spec.tokenizer,
        "max_model_len": spec.max_model_len,
        "tensor_parallel_size": spec.tensor_parallel_size,
        "gpu_memory_utilization": spec.gpu_memory_utilization,
        "enable_prefix_caching": spec.enable_prefix_caching,
        "dtype": spec.dtype,
        "seed": spec.seed,
        "disable_log_stats": False,
        "structured_outputs_config": dict(DEFAULT_STRUCTURED_OUTPUTS),
    }
    if not cuda:
        kwargs["block_size"] = DEFAULT_CPU_BLOCK_SIZE
    if spec.tensor_parallel_size > 1:
        # The workers go into the placement group the actor runs in
        # (ragbatch.core.placement), one per GPU bundle.
        kwargs["distributed_executor_backend"] = "ray"
    kwargs.update(spec.engine_kwargs)
    return kwargs


def model_id_of(spec: VllmEngine) -> str:
    """``"<model>@<12 hex digits>"`` (:attr:`VllmJudgeEngine.model_id`), from the model's
    and the tokenizer's files, found as a directory or in the Hugging Face cache."""
    model_dir = local_path(spec.model) or cached_model_dir(spec.model)
    tokenizer_path = spec.tokenizer or spec.model
    tokenizer_dir = local_path(tokenizer_path) or cached_model_dir(tokenizer_path)
    return f"{spec.model.rstrip('/')}@{model_files_id(model_dir, tokenizer_dir)}"


def check_chat_template(engine: VllmJudgeEngine) -> None:
    """Render a one-message chat; close ``engine`` and raise :class:`EngineError` when its
    tokenizer cannot."""
    try:
        engine.prompt_token_ids(
            EngineRequest(messages=(_probe_message(),), output=OutputSpec.of_choice(["a"]))
        )
    except Exception as exc:
        engine.close()
        raise EngineError(
            f"the tokenizer of judge model {engine.spec.model!r} cannot render a "
            f"chat: {describe_exception(exc)}; use a chat (instruct) model or a "
            f"tokenizer with a chat template"
        ) from exc


def model_files_id(model_dir: Path | None, tokenizer_dir: Path | None = None) -> str:
    """12 hex digits identifying a model by its config and tokenizer files.

    Parameters
    ----------
    model_dir : pathlib.Path or None
        Directory holding ``config.json`` (and maybe ``generation_config.json``).
    tokenizer_dir : pathlib.Path, optional
        Directory holding the tokenizer files (:data:`TOKENIZER_ID_FILES`); defaults
        to ``model_dir``.

    Returns
    -------
    str
        The first 12 hex digits of a SHA-256 over each present file's role
        (``model`` or ``tokenizer``), name and bytes, in a fixed order. Absolute paths
        do not enter it. ``"000000000000"`` when neither directory is known (a model id
        vLLM resolved in a way this function cannot see).
    """
    if tokenizer_dir is None:
        tokenizer_dir = model_dir
    if model_dir is None and tokenizer_dir is None:
        return "0" * 12
    digest = hashlib.sha256()
    for role, folder, names in (
        ("model", model_dir, MODEL_ID_FILES),
        ("tokenizer", tokenizer_dir, TOKENIZER_ID_FILES),
    ):
        if folder is None:
            continue
        for name in names:
            file = folder / name
            if file.is_file():
                digest.update(f"{role}/{name}".encode("utf-8") + b"\0")
                digest.update(file.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def structured_settings(llm: Any) -> dict[str, Any]:
    """The structured-output settings the engine runs with."""
    config = getattr(
        getattr(llm.llm_engine, "vllm_config", None), "structured_outputs_config", None
    )
    if config is None:
        return {"backend": "auto", "disable_any_whitespace": False}
    return {
        "backend": str(getattr(config, "backend", "auto")),
        "disable_any_whitespace": bool(getattr(config, "disable_any_whitespace", False)),
    }


def cleanup_vllm() -> None:
    """Tear down what a vLLM engine left in this process (its torch process group when it
    ran in-process, cached memory) and collect garbage; never raises."""
    try:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    except Exception as exc:
        logger.debug("vLLM cleanup failed: %s", describe_exception(exc))
    gc.collect()


def _probe_message() -> Any:
    from ragbatch.judge.protocol import Message

    return Message("user", "ping")


def local_path(name: str | None) -> Path | None:
    """``name`` as a path when it names one (exists, or is written as a path), else None
    (a model id such as ``org/model``)."""
    if not name:
        return None
    path = Path(name).expanduser()
    if path.exists() or path.is_absolute() or name.startswith((".", "~")):
        return path
    return None


def cached_model_dir(name: str | None) -> Path | None:
    """The local snapshot directory of model id ``name`` in the Hugging Face cache, if
    one is there (never downloads)."""
    if not name:
        return None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:
        return None


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (False when torch cannot be imported)."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False
