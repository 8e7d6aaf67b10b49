"""Character-length bounds shared by ``response_length`` and ``context_length``."""

from __future__ import annotations

import polars as pl
from pydantic import Field, model_validator

from ragbatch.scoring.base import StrictParams


class LengthBounds(StrictParams):
    """``[min_chars, max_chars]``, both inclusive; a missing bound is unbounded.

    0 is a real bound (``max_chars: 0`` admits only empty text), unlike Tonic Validate
    where a falsy 0 disables the check.
    """

    min_chars: int | None = Field(None, ge=0, description="smallest length that passes")
    max_chars: int | None = Field(None, ge=0, description="largest length that passes")

    @model_validator(mode="after")
    def _consistent(self) -> "LengthBounds":
        if self.min_chars is None and self.max_chars is None:
            raise ValueError("set min_chars, max_chars or both")
        if (
            self.min_chars is not None
            and self.max_chars is not None
            and self.min_chars > self.max_chars
        ):
            raise ValueError(
                f"min_chars ({self.min_chars}) is greater than max_chars ({self.max_chars})"
            )
        return self

    def admits(self, length: pl.Expr) -> pl.Expr:
        """Boolean expression: ``length`` lies within the bounds."""
        ok = pl.lit(True)
        if self.min_chars is not None:
            ok = ok & (length >= self.min_chars)
        if self.max_chars is not None:
            ok = ok & (length <= self.max_chars)
        return ok

    def label(self) -> str:
        """The interval as text, e.g. ``[1, 4000]`` or ``[0, inf)``."""
        low = "0" if self.min_chars is None else str(self.min_chars)
        high = "inf)" if self.max_chars is None else f"{self.max_chars}]"
        return f"[{low}, {high}"
