"""Callbacks used by tests/test_input_projection.py (importable as
``support.projection_callbacks``)."""

from __future__ import annotations


def asks_about_paris(row: dict):
    """Row mode: whether the row's question mentions Paris (null question: None)."""
    question = row["question"]
    return None if question is None else "Paris" in question
