"""A small real run for the summary and output-schema tests, made once per test session.

Nine rows with slice values chosen to exercise the summary: CJK and emoji text, the same
word precomposed (U+00E9) and with a combining mark (e + U+0301), a null slice value, an
integer slice column, and two identical rows. Two boolean metrics whose values are worked
out by hand in the tests: ``exact_match`` (case-insensitive; a null reference gives
``missing_input``) and ``latency`` with ``target_s: 1.0`` (a null latency gives
``missing_input``).
"""

from __future__ import annotations

import json

from ragbatch.config.job import JobConfig
from ragbatch.pipeline.runner import RunResult, run_job

PRECOMPOSED = "caf\u00e9"
COMBINING = "cafe\u0301"

#: (app, tier, answer, reference, latency_s)
ROWS = [
    ("检索", 1, "Paris", "paris", 0.5),
    ("检索", 1, "Rome", "Paris", 1.5),
    ("检索", 2, "x", None, 0.2),
    ("😀 bot", 2, "yes", "yes", None),
    ("😀 bot", 2, "no", "yes", 3.0),
    (PRECOMPOSED, 1, "a", "a", 0.1),
    (COMBINING, 1, "b", "a", 0.1),
    (None, 1, "same", "same", 0.9),
    (None, 1, "same", "same", 0.9),
]

RUN_ID = "summary-small"
RUN_DATE = "2026-01-15"
_RUNS: dict[str, RunResult] = {}


def small_run(tmp_path_factory, ray_local) -> RunResult:
    """Run the small job once per test session (under a session temp dir) and return it."""
    if RUN_ID not in _RUNS:
        base = tmp_path_factory.mktemp("summary_run")
        data = base / "traces.jsonl"
        with data.open("w", encoding="utf-8") as fh:
            for i, (app, tier, answer, reference, latency) in enumerate(ROWS):
                fh.write(
                    json.dumps(
                        {
                            "question": f"q{i}",
                            "answer": answer,
                            "reference": reference,
                            "latency_s": latency,
                            "app": app,
                            "tier": tier,
                        },
                        ensure_ascii=False,
                    )
                    + "\n"
                )
        config = JobConfig.model_validate(
            {
                "run": {"name": "summary-small", "run_date": RUN_DATE},
                "input": {
                    "uri": str(data),
                    "format": "jsonl",
                    "columns": {
                        "question": "question",
                        "answer": "answer",
                        "reference": "reference",
                        "latency_s": "latency_s",
                    },
                    "slice_columns": ["app", "tier"],
                },
                "output": {"uri": str(base / "out")},
                "metrics": [
                    {"name": "exact_match", "params": {"case_sensitive": False}},
                    {"name": "latency", "params": {"target_s": 1.0}},
                ],
            }
        )
        _RUNS[RUN_ID] = run_job(config, run_id=RUN_ID)
    return _RUNS[RUN_ID]
