"""Which judge requests the judgment cache already answers, asked without a judge engine.

A cache key (:func:`ragbatch.judge.cache.cache_key`) holds the engine's model id and
sampling settings. A dry run works them out without loading the judge:

* ``vllm`` engines: from the config and the model's config and tokenizer files
  (:func:`ragbatch.engines.vllm.identities_without_loading`). With ``dtype: auto`` vLLM
  picks the dtype when it loads, so a request counts as cached when the cache holds it
  under any dtype vLLM runs in.
* ``openai`` engines: the server's model card names the model a served name stands for,
  so the probe connects once, as ``ragbatch validate`` and ``ragbatch run`` do before they
  start; when the server cannot be reached, nothing is counted as cached and the reason
  is reported.
* any other engine: its registry entry's ``identities`` hook
  (:class:`ragbatch.core.engine_registry.EngineType`); an engine type that is not registered
  is an error, never taken for another engine.

A request counts as cached when the run would answer its first attempt from the cache:
its key, or the key of the generation the run would use
(:func:`ragbatch.judge.rejudge.first_generation`). With ``cache.rejudge`` naming
``parse_failure``, a request whose cached replies all fail to parse is a call, as the run
will ask it again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from ragbatch.judge.cache import JudgmentCache, cache_key, group_key
from ragbatch.judge.metric import JudgeMetric
from ragbatch.judge.protocol import Ask, Completion
from ragbatch.judge.rejudge import Found, first_generation, reasks_parse_failures, rejudge_key


@dataclass(frozen=True)
class _Identity:
    """The two things a cache key takes from an engine."""

    model_id: str
    sampling: dict[str, Any] = field(hash=False)

    def sampling_key(self) -> dict[str, Any]:
        return self.sampling


@dataclass
class CacheProbe:
    """Looks requests up in the judgment cache of one judge engine.

    Attributes
    ----------
    note : str
        What was checked, or why nothing could be (cache disabled, empty, engine
        identity unknown).
    enabled : bool
        Whether the run will use the judgment cache (``cache.enabled``).
    seed : int
        The engine's seed (of the first attempt).
    attempts : int
        1 + the engine's ``parse_retries``.
    rejudge : bool
        Whether the run asks again for requests whose cached replies fail to parse
        (``cache.rejudge`` names ``parse_failure``).
    """

    note: str
    enabled: bool = True
    cache: JudgmentCache | None = None
    identities: list[_Identity] = field(default_factory=list)
    seed: int = 0
    attempts: int = 1
    rejudge: bool = False

    @property
    def active(self) -> bool:
        """Whether lookups can find anything."""
        return self.cache is not None and bool(self.identities) and not self.cache.empty

    def cached(self, metric: JudgeMetric, ask: Ask, row: dict[str, Any]) -> bool:
        """Whether the run answers the first attempt of ``ask`` (already capped to the
        engine's ``max_tokens``), asked for ``row``, from the cache: under the
        generation of keys it would use (:func:`~ragbatch.judge.rejudge.first_generation`;
        the row's groups are looked up once,
        :meth:`~ragbatch.judge.cache.JudgmentCache.prefetch`)."""
        if not self.active:
            return False
        identity = metric.cache_identity()
        cache = cast(JudgmentCache, self.cache)  # not None when active
        cache.prefetch(group_key(engine, row) for engine in self.identities)
        return any(self._answered(cache, engine, identity, ask) for engine in self.identities)

    def _answered(
        self, cache: JudgmentCache, engine: _Identity, identity: dict[str, Any], ask: Ask
    ) -> bool:
        """Whether the first attempt of ``ask`` under ``engine`` is a cache hit."""
        from ragbatch.judge.run import parse_reply

        def key(attempt: int) -> str:
            return cache_key(engine, identity, ask, self.seed + attempt)

        def lookup(k: str) -> Found | None:
            completion = cache.get(k)
            return None if completion is None else (completion, True)

        def parses(completion: Completion) -> bool:
            return parse_reply(ask, completion)[1] is None

        generation = first_generation(key, self.attempts, lookup, parses, self.rejudge)
        return cache.get(rejudge_key(key(0), generation)) is not None


def probe_cache(config: Any, engine_name: str, spec: Any, metrics: list[JudgeMetric]) -> CacheProbe:
    """A :class:`CacheProbe` for the judge stage of ``engine_name``.

    Parameters
    ----------
    config : ragbatch.config.job.JobConfig
        ``cache`` and ``output`` locate the cache.
    engine_name : str
    spec : ragbatch.engines.vllm.VllmEngine or ragbatch.engines.openai.OpenAIEngine
    metrics : list of JudgeMetric
        The stage's metrics (accepted for symmetry; entries are found by row).

    Returns
    -------
    CacheProbe
        Inactive, with a note saying why, when the cache is disabled or holds nothing,
        or the engine's identity cannot be worked out.

    Raises
    ------
    OutputError
        The cache exists but cannot be read (the message names the URI).
    """
    if not config.cache.enabled:
        return CacheProbe("judgment cache disabled (cache.enabled: false)", enabled=False)
    uri, options = config.cache_location()
    cache = JudgmentCache(uri, options, repair=False)  # a dry run moves nothing
    if cache.empty:
        return CacheProbe(f"judgment cache {uri}: no entries")
    identities, why = engine_identities(engine_name, spec)
    if not identities:
        return CacheProbe(f"judgment cache {uri}: not checked ({why})")
    rejudge = reasks_parse_failures(config.cache.rejudge)
    return CacheProbe(
        f"judgment cache {uri}: entries checked{why}"
        + ("; failed replies asked again (cache.rejudge)" if rejudge else ""),
        cache=cache,
        identities=identities,
        seed=spec.seed,
        attempts=spec.parse_retries + 1,
        rejudge=rejudge,
    )


def engine_identities(engine_name: str, spec: Any) -> tuple[list[_Identity], str]:
    """The (model id, sampling key) pairs a judge engine will record, worked out without
    loading a model, by the engine type's ``identities`` hook
    (:class:`ragbatch.core.engine_registry.EngineType`): from the model directory's config
    for a vllm engine (two pairs when ``dtype`` is ``auto``), from the server's model
    list for an openai engine.

    Returns
    -------
    tuple
        ``(identities, note)``: ``note`` is text to append to a message (``""`` when
        there is nothing to add), or, when ``identities`` is empty, why none could be
        worked out (the engine could not be reached or configured).

    Raises
    ------
    ConfigError
        ``spec.type`` is not a registered engine type (never taken for another one).
    """
    from ragbatch.core.engine_registry import engine_of
    from ragbatch.core.errors import EngineError

    entry = engine_of(spec)
    try:
        pairs = entry.engine_identities(spec)
    except EngineError as exc:
        return [], f"engines.{engine_name}: {exc}"
    note = "" if len(pairs) <= 1 else f" ({entry.identities_note})"
    return [_Identity(m, s) for m, s in pairs], note
