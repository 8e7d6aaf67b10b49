"""Callbacks used by tests/test_bad_inputs.py (importable as ``support.bad_input_callbacks``)."""

from __future__ import annotations


def raises_on_boom(row: dict):
    """Row mode: raises for answers that say "boom", else whether the answer is non-empty."""
    answer = row["answer"]
    if answer is not None and "boom" in answer:
        raise RuntimeError(f"cannot score {row['row_id']}")
    return answer is not None and answer != ""
