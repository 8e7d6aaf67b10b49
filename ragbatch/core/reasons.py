"""How a cell's ``reason`` (and a normalizer note) shows a value taken from the input.

A reason may quote a bit of the input to say what was wrong with it (``answer: expected
a string, got object ({"text": ...})``). Every such quote goes through :func:`quote`, so it
is never longer than :data:`QUOTE_MAX_CHARS`; in a run that holds PII metrics nothing
is quoted at all (:data:`NOT_QUOTED` stands in), as docs/pii.md says. Numbers go through
:func:`number_text`, which drops floating-point noise (``7.1``, not
``7.1000000000000005``).
"""

from __future__ import annotations

import json
from typing import Any

#: Longest quote of an input value in a reason, in characters (the cut ends in ``...``).
QUOTE_MAX_CHARS = 60
#: What a reason shows instead of an input value in runs with PII metrics.
NOT_QUOTED = "value not quoted: the run has PII metrics"
#: Significant digits a number in a reason keeps; float noise sits beyond them.
NUMBER_DIGITS = 12


def cut(text: str, limit: int = QUOTE_MAX_CHARS) -> str:
    """``text`` when it has at most ``limit`` characters, else its first ``limit - 3``
    characters followed by ``...``."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def quote(value: Any, allowed: bool = True) -> str:
    """A short quote of an input value for a reason.

    Parameters
    ----------
    value : Any
        A string (shown with ``repr``) or a JSON-like value (shown as JSON).
    allowed : bool
        False in runs with PII metrics: the value is not shown.

    Returns
    -------
    str
        At most :data:`QUOTE_MAX_CHARS` characters, or :data:`NOT_QUOTED`.
    """
    if not allowed:
        return NOT_QUOTED
    text = (
        repr(value)
        if isinstance(value, str)
        else json.dumps(value, ensure_ascii=False, default=str)
    )
    return cut(text)


def number_text(value: float | int) -> str:
    """A number as a reason shows it: shortest text of the value rounded to
    :data:`NUMBER_DIGITS` significant digits, without a trailing ``.0`` (``7.1``, ``5``,
    ``1e-07``, ``inf``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    rounded = float(f"{value:.{NUMBER_DIGITS}g}")
    text = repr(rounded)
    return text[:-2] if text.endswith(".0") else text
