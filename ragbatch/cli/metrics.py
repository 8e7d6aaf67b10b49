"""``ragbatch metrics``: every metric with its inputs, params, range and source."""

from __future__ import annotations

import argparse
import json
import sys

from ragbatch.core.exit_codes import EXIT_OK


def cmd_metrics(args: argparse.Namespace) -> int:
    from ragbatch.core.registry import all_metrics

    if args.markdown:
        from ragbatch.cli.metrics_doc import render_markdown

        sys.stdout.write(render_markdown())
        return EXIT_OK
    described = [cls.describe() for cls in all_metrics()]
    if args.json:
        print(json.dumps(described, indent=2, default=str))
        return EXIT_OK
    for d in described:
        print(
            f"{d['name']}  [{d['kind']}]  range {d['range']}"
            f"{' boolean' if d['boolean'] else ''}, "
            f"{'higher' if d['higher_is_better'] else 'lower'} is better"
        )
        print(f"    {d['summary']}")
        print(f"    engine: {_engine_text(d)}")
        print(f"    inputs: {', '.join(d['inputs']) or '(all canonical columns)'}")
        for pname, p in d["params"].items():
            req = "required" if p["required"] else f"default {p['default']!r}"
            print(f"    param {pname} ({req}): {p['description']}")
        print(f"    source: {d['source']}")
    return EXIT_OK


def _engine_text(described: dict) -> str:
    """The engine types a metric runs on, for ``ragbatch metrics``: "vllm or openai",
    "vllm or openai, and embedding", or "none"."""
    text = " or ".join(described["engine"]) or "none"
    if described["second_engine"]:
        text += f", and {' or '.join(described['second_engine'])}"
    return text
