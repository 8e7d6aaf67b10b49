"""``binary``: a user-supplied Python callback decides pass or fail."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any, Callable, Literal

import polars as pl
from pydantic import Field, PrivateAttr, field_validator, model_validator

from ragbatch.core.columns import ANSWER, CONTEXTS, LATENCY_S, QUESTION, REFERENCE, ROW_ID
from ragbatch.scoring.cells import CELL_DTYPE, PyCell, to_cell_dict
from ragbatch.metrics.callback_import import find_module_file, import_callback_module
from ragbatch.scoring.base import ExpressionMetric, StrictParams
from ragbatch.core.reasons import NOT_QUOTED, cut, quote
from ragbatch.scoring.registry import register
from ragbatch.core.status import ERROR, NOT_APPLICABLE

#: Columns the callback sees, in this order.
CALLBACK_COLUMNS = (ROW_ID, QUESTION, CONTEXTS, ANSWER, REFERENCE, LATENCY_S)


class BinaryParams(StrictParams):
    callback: str = Field(
        description='"module:function"; the module is a file next to the '
        "config or in the working folder, or is importable on every worker"
    )
    mode: Literal["batch", "row"] = Field(
        "batch",
        description="batch: fn(polars.DataFrame) -> boolean Series of the same length; "
        "row: fn(dict) -> bool or None",
    )
    #: The file the callback's module was found in (:func:`find_module_file`), or None
    #: when it is imported by name. Travels with the params to the Ray workers.
    _origin: str | None = PrivateAttr(None)

    @field_validator("callback")
    @classmethod
    def _importable(cls, value: str) -> str:
        load_callback(value, _origin_of(value))
        return value

    @model_validator(mode="after")
    def _record_origin(self) -> "BinaryParams":
        self._origin = _origin_of(self.callback)
        return self


def _origin_of(spec: str) -> str | None:
    module_name = spec.partition(":")[0]
    found = find_module_file(module_name) if module_name else None
    return None if found is None else str(found)


def load_callback(spec: str, origin: str | None = None) -> Callable[..., Any]:
    """Import ``"module:function"`` and return the function.

    Parameters
    ----------
    spec : str
        ``"module:function"`` (``function`` may be dotted: ``Class.method``).
    origin : str, optional
        The file of the module's top level, imported from there under a private name
        (:func:`ragbatch.metrics.callback_import.import_callback_module`); when None or
        no longer there, the module is imported by its name.

    Raises
    ------
    ValueError
        The spec is malformed, the module cannot be imported, or the attribute is
        missing or not callable. The message says which.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"callback {spec!r} must look like 'package.module:function'")
    if origin is not None and not Path(origin).is_file():
        origin = None  # a worker on another machine: by name, as Ray's working_dir has it
    try:
        module = import_callback_module(module_name, origin)
    except Exception as exc:  # ImportError, or an error raised while importing it
        raise ValueError(
            f"cannot import module {module_name!r} for callback {spec!r}: "
            f"{type(exc).__name__}: {exc}. Put {module_name.partition('.')[0]}.py next to the "
            "config file or in the working folder, or install it"
        ) from None
    where = f" (imported from {module.__file__})" if getattr(module, "__file__", None) else ""
    fn: Any = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise ValueError(f"module {module_name!r}{where} has no attribute {attr!r}")
    if not callable(fn):
        raise ValueError(f"callback {spec!r} is not callable")
    return fn


@register
class Binary(ExpressionMetric):
    """1.0 / 0.0 as decided by a user function.

    Follows Tonic Validate's ``BinaryMetric``. In ``batch`` mode the function receives a
    ``polars.DataFrame`` with the canonical columns (row_id, question, contexts, answer,
    reference, latency_s) of a batch and returns a boolean ``polars.Series`` (or list) of
    the same length; in ``row`` mode it receives one row as a dict and returns a bool.

    A null result gives ``not_applicable``; an exception, a wrong length or a non-boolean
    value gives ``error`` with the reason (for a batch-mode exception, on every row of
    that batch). Nulls in the inputs are passed to the callback as they are. The reason
    quotes the exception's message or the returned value cut to
    :data:`ragbatch.core.reasons.QUOTE_MAX_CHARS`, and not at all in runs with PII metrics
    (``quote_values`` false): either can hold input text.
    """

    name = "binary"
    inputs = ()
    Params = BinaryParams
    summary = "a user callback `module:function` returns True/False"
    source = "Tonic Validate BinaryMetric"
    policy = (
        ("callback returns null", "not_applicable"),
        ("callback raises / wrong length / non-bool", "error with the message"),
        ("null inputs", "passed to the callback unchanged"),
    )

    def user_modules(self) -> tuple[str, ...]:
        """The callback's module."""
        return (self.params.callback.partition(":")[0],)

    def expression(self) -> pl.Expr:
        fn = load_callback(self.params.callback, self.params._origin)
        runner = _batch_runner if self.params.mode == "batch" else _row_runner
        run = runner(fn, self.quote_values)
        packed = pl.struct([pl.col(c) for c in CALLBACK_COLUMNS])
        return packed.map_batches(run, return_dtype=CELL_DTYPE)


def _batch_runner(
    fn: Callable[[pl.DataFrame], Any], quote_values: bool = True
) -> Callable[[pl.Series], pl.Series]:
    def run(series: pl.Series) -> pl.Series:
        frame = series.struct.unnest()
        try:
            result = fn(frame)
        except Exception as exc:
            return _all_error(len(frame), f"callback raised {_describe(exc, quote_values)}")
        values = result.to_list() if hasattr(result, "to_list") else list(result)
        if len(values) != len(frame):
            return _all_error(
                len(frame), f"callback returned {len(values)} values for {len(frame)} rows"
            )
        return _cells([_judge(v, quote_values) for v in values])

    return run


def _row_runner(
    fn: Callable[[dict[str, Any]], Any], quote_values: bool = True
) -> Callable[[pl.Series], pl.Series]:
    def run(series: pl.Series) -> pl.Series:
        out = []
        for row in series.to_list():
            try:
                out.append(_judge(fn(row), quote_values))
            except Exception as exc:
                out.append(PyCell(None, ERROR, f"callback raised {_describe(exc, quote_values)}"))
        return _cells(out)

    return run


def _judge(value: Any, quote_values: bool = True) -> PyCell:
    """The cell of one returned value; a value that is not a bool or None is quoted
    (:func:`ragbatch.core.reasons.quote`) only when ``quote_values``."""
    if value is None:
        return PyCell(None, NOT_APPLICABLE, "callback returned null")
    if isinstance(value, bool) or type(value).__name__ == "bool_":  # numpy.bool_
        return PyCell(float(bool(value)))
    kind = type(value).__name__
    shown = f"{quote(value)} ({kind})" if quote_values else f"a {kind} ({NOT_QUOTED})"
    return PyCell(None, ERROR, f"callback returned {shown}; expected True, False or None")


def _describe(exc: BaseException, quote_values: bool = True) -> str:
    """``"<type>: <message> at <file>:<line>"``; the message (which can quote the input
    the callback got) is cut, or left out when not ``quote_values``."""
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" at {frame.filename}:{frame.lineno}" if frame else ""
    message = cut(str(exc)) if quote_values else f"({NOT_QUOTED})"
    return f"{type(exc).__name__}: {message}{where}"


def _all_error(n: int, reason: str) -> pl.Series:
    return _cells([PyCell(None, ERROR, reason)] * n)


def _cells(cells: list[PyCell]) -> pl.Series:
    return pl.Series([to_cell_dict(c) for c in cells], dtype=CELL_DTYPE)
