"""``ragbatch metrics``: every metric with its inputs, params, range and source; with
``--config``, the metrics one job config defines, with their judge prompts."""

from __future__ import annotations

import argparse
import json
import sys

from typing import Any

from ragbatch.core.exit_codes import EXIT_INVALID, EXIT_OK


def cmd_metrics(args: argparse.Namespace) -> int:
    from ragbatch.scoring.registry import all_metrics

    examples = getattr(args, "examples", False)
    if getattr(args, "config", None):
        if args.markdown or examples:
            flag = "--markdown" if args.markdown else "--examples"
            print(f"ragbatch metrics: --config lists a job's metrics; drop {flag}", file=sys.stderr)
            return EXIT_INVALID
        return _configured(args.config, args.json)
    if args.markdown:
        from ragbatch.cli.metrics_doc import render_markdown

        sys.stdout.write(render_markdown())
        return EXIT_OK
    if examples:
        from ragbatch.cli.examples_doc import render_examples_markdown

        sys.stdout.write(render_examples_markdown())
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


def configured_metrics(path: str) -> list[dict[str, Any]]:
    """What ``ragbatch metrics --config PATH`` shows of each metric of a job config.

    Returns
    -------
    list of dict
        Per metric, in config order: ``id``, ``name``, ``kind``, ``engine``, ``inputs``
        (the columns it reads), ``params`` (validated, defaults filled in) and, for a
        judge metric, ``prompts``: ``{"name", "instructions"}`` per judge step, the text
        the ``instructions_first`` layout shows (and the ``row_first`` task without the
        row's own values).

    Raises
    ------
    ConfigError
        The config does not load, or a metric's params are invalid (every problem, each
        naming its field).
    """
    from ragbatch.config.job import load_config
    from ragbatch.core.errors import ConfigError
    from ragbatch.judge.metric import JudgeMetric
    from ragbatch.pipeline.plan import build_metrics

    metrics, _, problems = build_metrics(load_config(path))
    if problems:
        raise ConfigError(problems)
    out = []
    for m in metrics:
        entry: dict[str, Any] = {**m.manifest_info(), "inputs": list(m.inputs)}
        if isinstance(m, JudgeMetric):
            entry["prompts"] = [
                {"name": name, "instructions": text} for name, text in m.instruction_sets()
            ]
        out.append(entry)
    return out


def _configured(path: str, as_json: bool) -> int:
    described = configured_metrics(path)
    if as_json:
        print(json.dumps(described, indent=2, ensure_ascii=False))
        return EXIT_OK
    for d in described:
        print(
            f"{d['id']}  ({d['name']}, {d['kind']}{', engine ' + d['engine'] if d['engine'] else ''})"
        )
        print(f"    inputs: {', '.join(d['inputs']) or '(all canonical columns)'}")
        print(f"    params: {json.dumps(d['params'], ensure_ascii=False)}")
        for step in d.get("prompts", ()):
            print(f"    instructions \"{step['name']}\":")
            for line in step["instructions"].splitlines():
                print(f"      {line}".rstrip())
    return EXIT_OK
