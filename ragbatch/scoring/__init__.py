"""What metrics and judges both stand on: the metric base classes (:mod:`.base`), the
cell helpers that build a metric's score, status and reason (:mod:`.cells`) and the
metric registry (:mod:`.registry`).

A layer of its own below :mod:`ragbatch.metrics` and :mod:`ragbatch.judge`, so that
neither needs the other for these.
"""
