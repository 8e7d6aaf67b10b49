"""ragbatch: evaluate retrieval-augmented generation (RAG) traces at corpus scale.

The public entry points are the ``ragbatch`` command line (:mod:`ragbatch.cli`) and
:func:`ragbatch.pipeline.runner.run_job`; metric definitions live one per file under
:mod:`ragbatch.metrics`.
"""

__version__ = "0.1.0"
