"""LLM-judge machinery shared by the judge metrics and the judge engines.

* :mod:`ragbatch.judge.protocol` - what a metric asks a judge (:class:`Ask`), what an
  engine is sent (:class:`EngineRequest`) and returns (:class:`Completion`), and the
  :class:`JudgeEngine` interface every engine adapter implements.
* :mod:`ragbatch.judge.prompt` - the prefix-friendly prompt layout.
* :mod:`ragbatch.judge.metric` - the :class:`JudgeMetric` base class.
* :mod:`ragbatch.judge.run` - runs the judge metrics of a batch against one engine
  (multi-step programs in lockstep, structured-output checks, parse retries, cache).
* :mod:`ragbatch.judge.cache` - the judgment cache.
"""
