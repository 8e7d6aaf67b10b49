"""Helpers of the test suite: fixtures, stand-in servers, tiny models and callbacks.

``tests/`` is on ``sys.path`` while the tests run (pytest puts it there, and the Ray
workers of the ``ray_local`` fixture get it on ``PYTHONPATH``), so the helpers import as
``support.<module>``: ``from support.metric_frames import run_metric``, and a ``binary``
metric's callback is ``"support.binary_callbacks:answer_has_digit"``. Nothing here is
collected as a test.
"""
