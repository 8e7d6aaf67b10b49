"""LLM-judge machinery shared by the judge metrics and the judge engines.

* :mod:`ragbatch.judge.protocol` - what a metric asks a judge (:class:`Ask`), what an
  engine is sent (:class:`EngineRequest`) and returns (:class:`Completion`), and the
  :class:`JudgeEngine` interface every engine adapter implements.
* :mod:`ragbatch.judge.prompt` - the prefix-friendly prompt layout.
* :mod:`ragbatch.judge.metric` - the :class:`JudgeMetric` base class.
* :mod:`ragbatch.judge.run` - runs the judge metrics of a batch against one engine
  (multi-step programs in lockstep, structured-output checks, parse retries, cache).
* :mod:`ragbatch.judge.cache` - the judgment cache, with :mod:`~ragbatch.judge.cache_store`
  (its files and lookups), :mod:`~ragbatch.judge.cache_parquet` (its files as bytes, and
  what counts as a damaged one), :mod:`~ragbatch.judge.cache_upkeep` (fold, compact,
  prune, check) and :mod:`~ragbatch.judge.rejudge` (asking failed replies again).
* :mod:`ragbatch.judge.estimate` - judge calls and tokens of a stage estimated on a
  sample without a judge (``run --dry-run``), with :mod:`~ragbatch.judge.tokens` (prompt
  counts from the judge's tokenizer), :mod:`~ragbatch.judge.cache_probe` (cache lookups
  without an engine) and :mod:`~ragbatch.judge.assumed` (what is assumed about replies
  not yet given).
"""
