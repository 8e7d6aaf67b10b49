"""Prompt tokens per row that a judge must compute, for ragbatch (both prompt layouts),
Tonic Validate and Ragas, on the rows of ``benchmarks/vs_peers.py``: what the judge's work
per row is when every reply parses, counted rather than timed.

Usage (from the repository root, in the project's virtual environment)::

    python benchmarks/prompt_accounting.py                        # the tiny judge's tokenizer
    python benchmarks/prompt_accounting.py --tokenizer models/smollm2 --block-size 16
    python benchmarks/prompt_accounting.py --ragas-source /tmp/ragas-0.4.3   # Ragas too

Two comparisons, each tool with its own metric set:

* ``tonic``: ragbatch's answer_similarity, retrieval_precision and augmentation_accuracy
  against Tonic Validate 6.2.0's three metrics of those names: its prompt texts
  (``tonic_validate.utils.llm_calls``, read in its own virtual environment,
  :func:`vs_peers.ensure_peer_venv`) put together the way its metrics do, with its
  system message, for all 1 + 2K calls of a row with K contexts (answer similarity once,
  retrieval precision and augmentation accuracy once per context);
* ``ragas``: ragbatch's faithfulness, answer_relevancy, context_precision and
  context_recall against Ragas 0.4.3's Faithfulness, ResponseRelevancy,
  LLMContextPrecisionWithReference and LLMContextRecall: their prompts
  (``PydanticPrompt`` subclasses: instruction, input and output models, worked
  examples) read from Ragas's source without importing it (``--ragas-source``: its
  package directory; by default the one in ``benchmarks/_venv_ragas`` when that exists)
  and rendered as Ragas renders a prompt (the instruction, the output's JSON Schema,
  the examples, then the input as indented JSON), one user message each, as its
  ``llm_factory`` judge sends them: 2 + 1 + K + 1 calls of a row (statements, then their
  verdicts against the joined contexts; one question generation, strictness 3 being one
  call with that judge; one usefulness verdict per context; one attribution of the
  reference's sentences). What the ``instructor`` library adds to a request (in its
  tool-calling modes, the schema again) is not counted: Ragas's figures are a floor.

ragbatch's chats are built by the metrics' own code, every judge step of every metric
(a later step with the reply a dry run assumes: the statements are the text's
sentences, ``JudgeMetric.assumed_result``), in ``prompt_layout: row_first`` and in
``instructions_first`` (the stage's instruction block bound as the judge stage binds
it). Peer rows take the same assumption for Ragas's statements.

It renders every chat with the tokenizer's chat template and counts the prompt tokens,
for ragbatch those after the row's shared block (each metric's task or ask), and the
tokens that an unbounded prefix cache with ``--block-size`` blocks could not serve
("computed"; a request reuses the longest run of whole blocks that an earlier request
began with, never its last token); "cached" is the rest. Requests are taken in the
order the judge stage sends them, step by step, each metric for a batch of 64 rows in
turn. The cache is ideal (nothing evicted, every earlier request already computed), so
the figures are the least each tool's prompts can cost the judge, not a timing.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import vs_peers  # noqa: E402

#: Tonic Validate's system message (``OpenAIService.get_response``, 6.2.0).
TONIC_SYSTEM = "You are a helpful assistant. Respond using markdown."
TONIC_METRICS = ("answer_similarity", "retrieval_precision", "augmentation_accuracy")
#: ragbatch's metrics that score what Ragas's four metrics below score.
RAGAS_METRICS = ("faithfulness", "answer_relevancy", "context_precision", "context_recall")
#: Ragas 0.4.3's legacy metric modules and the prompt classes their metrics use.
RAGAS_PROMPTS = {
    "_faithfulness.py": ("StatementGeneratorPrompt", "NLIStatementPrompt"),
    "_answer_relevance.py": ("ResponseRelevancePrompt",),
    "_context_precision.py": ("ContextPrecisionPrompt",),
    "_context_recall.py": ("ContextRecallClassificationPrompt",),
}
#: Rows per batch, as in the judge stage's default ``batch_size``.
BATCH_ROWS = 64


def tonic_templates() -> dict[str, str]:
    """Tonic Validate's three prompt texts, read from its own environment."""
    python = vs_peers.ensure_peer_venv("tonic")
    code = (
        "import json; from tonic_validate.utils import llm_calls as c; print(json.dumps("
        "{'sim': c.similarity_score_prompt(), 'rel': c.context_relevancy_prompt(), "
        "'contains': c.answer_contains_context_prompt()}))"
    )
    out = subprocess.run([str(python), "-c", code], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def tonic_chats(row: dict[str, Any], t: dict[str, str]) -> list[list[dict[str, str]]]:
    """The 1 + 2K chats Tonic Validate sends for ``row`` when every reply parses, in its
    metrics' order."""
    users = [
        t["sim"] + f"\nQUESTION: {row['question']}\nREFERENCE ANSWER: {row['reference']}"
        f"\nNEW ANSWER: {row['answer']}\n"
    ]
    users += [t["rel"] + f"\nQUESTION: {row['question']}\nCONTEXT: {c}\n" for c in row["contexts"]]
    users += [t["contains"] + f"\nANSWER: {row['answer']}\nCONTEXT: {c}\n" for c in row["contexts"]]
    return [
        [{"role": "system", "content": TONIC_SYSTEM}, {"role": "user", "content": u}] for u in users
    ]


def ragbatch_chats(row: dict[str, Any], metrics: list[Any]) -> list[list[dict[str, str]]]:
    """Every judge request of each metric for ``row``, step by step (all metrics' first
    step, then their second...), a later step with the reply a dry run assumes."""
    from ragbatch.judge.protocol import Ask

    steps: list[list[list[dict[str, str]]]] = []
    for metric in metrics:
        program = metric.program(dict(row))
        try:
            requests = next(program)
        except StopIteration:
            continue
        k = 0
        while True:
            asks = [a for a in requests if isinstance(a, Ask)]
            if len(steps) <= k:
                steps.append([])
            steps[k] += [[{"role": m.role, "content": m.content} for m in a.messages] for a in asks]
            if k + 1 >= metric.judge_steps:
                break
            try:
                values = [metric.assumed_result(row, a) for a in asks]
                requests = program.send(values)
            except (NotImplementedError, StopIteration):
                break
            k += 1
    return [chat for step in steps for chat in step]


# -- Ragas ---------------------------------------------------------------------------------


class _PromptBase:
    """Stands in for Ragas's ``PydanticPrompt`` generic base when its prompt classes are
    read from source: they only set class attributes."""

    def __class_getitem__(cls, item: Any) -> type:
        return cls


def ragas_prompts(package: Path) -> dict[str, Any]:
    """Ragas's prompt classes (:data:`RAGAS_PROMPTS`) built from the source in
    ``package`` (the ``ragas`` directory): each module's top-level classes are executed
    with pydantic and a stand-in base, nothing else of Ragas is imported."""
    from pydantic import BaseModel, Field

    out: dict[str, Any] = {}
    for module, names in RAGAS_PROMPTS.items():
        tree = ast.parse((package / "metrics" / module).read_text(encoding="utf-8"))
        classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
        wanted = [
            n
            for n in classes
            if any(ast.unparse(b).startswith(("BaseModel", "PydanticPrompt")) for b in n.bases)
        ]
        space: dict[str, Any] = {
            "__name__": f"ragas_source_{module[1:-3]}",
            "BaseModel": BaseModel,
            "Field": Field,
            "t": typing,
            "PydanticPrompt": _PromptBase,
        }
        exec(
            compile(ast.Module(body=wanted, type_ignores=[]), module, "exec", dont_inherit=True),
            space,
        )
        out.update({name: space[name] for name in names})
    return out


def ragas_text(prompt: Any, data: Any) -> str:
    """A Ragas prompt as its ``PydanticPrompt.to_string`` (0.4.3) writes it: the
    instruction, the request to follow the output model's JSON Schema, the worked
    examples (input and output as JSON indented by 4), then the input."""
    schema = json.dumps(prompt.output_model.model_json_schema())
    signature = (
        "Please return the output in a JSON format that complies with the following schema "
        f"as specified in JSON Schema:\n{schema}Do not use single quotes in your response "
        "but double quotes,properly escaped with a backslash."
    )
    shown = [
        f"Example {i}\nInput: {x.model_dump_json(indent=4)}\nOutput: {y.model_dump_json(indent=4)}"
        for i, (x, y) in enumerate(getattr(prompt, "examples", []) or [], start=1)
    ]
    examples = "\n--------EXAMPLES-----------\n" + "\n\n".join(shown) if shown else ""
    given = data.model_dump_json(indent=4, exclude_none=True)
    return (
        f"{prompt.instruction}\n{signature}\n{examples}\n-----------------------------\n"
        f"\nNow perform the same with the following input\ninput: {given}\nOutput: "
    )


def ragas_chats(row: dict[str, Any], p: dict[str, Any]) -> list[list[dict[str, str]]]:
    """The 4 + K chats Ragas's four metrics send for ``row`` when every reply parses,
    step by step; the statements of faithfulness's second step are the answer's
    sentences (as ragbatch's dry run assumes)."""
    from ragbatch.judge.assumed import assumed_statements

    faith, nli = p["StatementGeneratorPrompt"], p["NLIStatementPrompt"]
    rel, prec = p["ResponseRelevancePrompt"], p["ContextPrecisionPrompt"]
    recall = p["ContextRecallClassificationPrompt"]
    joined = "\n".join(row["contexts"])
    first = [
        ragas_text(faith, faith.input_model(question=row["question"], answer=row["answer"])),
        ragas_text(rel, rel.input_model(response=row["answer"])),
    ]
    first += [
        ragas_text(
            prec, prec.input_model(question=row["question"], context=c, answer=row["reference"])
        )
        for c in row["contexts"]
    ]
    first.append(
        ragas_text(
            recall,
            recall.input_model(question=row["question"], context=joined, answer=row["reference"]),
        )
    )
    statements = assumed_statements(row["answer"])
    second = [ragas_text(nli, nli.input_model(context=joined, statements=statements))]
    return [[{"role": "user", "content": text}] for text in first + second]


def find_ragas(explicit: Path | None) -> Path | None:
    """Ragas's package directory: ``explicit`` (a directory holding ``ragas`` or the
    ``ragas`` directory itself), else the one in ``benchmarks/_venv_ragas``, else None."""
    candidates = [explicit] if explicit else []
    candidates += sorted(vs_peers.PEER_VENVS["ragas"].glob("lib/python*/site-packages"))
    for c in candidates:
        for d in (c, c / "ragas"):
            if (d / "metrics" / "_faithfulness.py").exists():
                return d
    return None


class PrefixCache:
    """An unbounded prefix cache of ``block``-token blocks: a request reuses the whole
    blocks of the longest prefix an earlier request began with, never its last token."""

    def __init__(self, block: int) -> None:
        self.block = block
        self.seen: set[tuple[int, ...]] = set()

    def served(self, ids: list[int]) -> int:
        """Tokens of ``ids`` served from the cache; then ``ids`` is cached."""
        g, k = self.block, 0
        while (k + 1) * g <= len(ids) - 1 and tuple(ids[: (k + 1) * g]) in self.seen:
            k += 1
        self.seen.update(tuple(ids[: j * g]) for j in range(1, len(ids) // g + 1))
        return k * g


#: Where a ragbatch judge prompt's task begins, in both layouts
#: (``ragbatch.judge.prompt.build_messages``).
TASK_HEADING = "\n\n## Task\n"


def task_tokens(chat: list[dict[str, str]], encode, ids: list[int] | None = None) -> int:
    """Tokens of a ragbatch chat after its shared block (the metric's task: instructions,
    row-specific fields such as the reference answer, reply format); 0 for other chats.
    ``ids``: the chat's tokens when the caller has them already."""
    user = chat[-1]["content"]
    cut = user.find(TASK_HEADING)
    if cut < 0:
        return 0
    if ids is None:
        ids = encode(chat)
    head = encode(chat[:-1] + [{"role": "user", "content": user[:cut]}])
    common = next((i for i, (a, b) in enumerate(zip(ids, head)) if a != b), len(head))
    return len(ids) - common


def account(rows: list[dict[str, Any]], chats_of, encode, block: int) -> dict[str, float]:
    """Calls, prompt tokens, tokens not served from the cache, and tokens after a ragbatch
    prompt's shared block, per row."""
    cache = PrefixCache(block)
    calls = total = computed = after = 0
    for start in range(0, len(rows), BATCH_ROWS):
        batch = [chats_of(r) for r in rows[start : start + BATCH_ROWS]]
        for m in range(max(len(c) for c in batch)):
            for chats in batch:
                if m < len(chats):
                    ids = encode(chats[m])
                    calls += 1
                    total += len(ids)
                    computed += len(ids) - cache.served(ids)
                    after += task_tokens(chats[m], encode, ids)
    n = len(rows)
    return {
        "calls_per_row": calls / n,
        "prompt_tokens_per_row": total / n,
        "computed_tokens_per_row": computed / n,
        "task_tokens_per_row": after / n,
    }


def _metrics(names: tuple[str, ...], layout: str) -> list[Any]:
    """ragbatch's metrics ``names`` in ``layout``, bound as one judge stage."""
    from ragbatch.scoring.registry import get_metric
    from ragbatch.judge.metric import bind_instructions

    params = {"prompt_layout": layout}
    metrics = [
        get_metric(n).from_params(
            params | ({"embedder": "embedder"} if n == "answer_relevancy" else {}),
            metric_id=n,
            engine="judge",
            where="--metrics",
        )
        for n in names
    ]
    bind_instructions(metrics)
    return metrics


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--tokenizer",
        type=Path,
        default=vs_peers.DEFAULT_MODEL_DIR,
        help="a model directory with the judge's tokenizer and chat template "
        "(default: the tiny test model, built if missing)",
    )
    p.add_argument(
        "--rows",
        type=int,
        default=1000,
        help="synthetic rows, the first of vs_peers.py's (default 1000)",
    )
    p.add_argument("--contexts-per-row", default="1,5", help="comma-separated (default 1,5)")
    p.add_argument(
        "--block-size",
        type=int,
        default=32,
        help="prefix-cache block in tokens (default 32; vLLM on a GPU: 16)",
    )
    p.add_argument(
        "--peers",
        default="tonic,ragas",
        help="comparisons to make: tonic, ragas (default both; ragas needs its source)",
    )
    p.add_argument(
        "--ragas-source",
        type=Path,
        default=None,
        help="Ragas 0.4.3's package directory (or one holding it), e.g. an unpacked "
        "`pip download ragas==0.4.3 --no-deps` wheel; default: benchmarks/_venv_ragas's",
    )
    p.add_argument("--out", type=Path, default=HERE / "_data" / "prompt_accounting.json")
    args = p.parse_args(argv)

    from transformers import AutoTokenizer

    if args.tokenizer == vs_peers.DEFAULT_MODEL_DIR:
        vs_peers.build_tiny_model(args.tokenizer)
    tok = AutoTokenizer.from_pretrained(str(args.tokenizer))

    def encode(chat: list[dict[str, str]]) -> list[int]:
        text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        return tok(text, add_special_tokens=False)["input_ids"]

    peers = [x.strip() for x in args.peers.split(",") if x.strip()]
    chats_of: dict[str, Any] = {}
    metric_sets: dict[str, tuple[str, ...]] = {}
    if "tonic" in peers:
        templates = tonic_templates()
        chats_of["tonic"] = lambda r: tonic_chats(r, templates)
        metric_sets["tonic"] = TONIC_METRICS
    if "ragas" in peers:
        package = find_ragas(args.ragas_source)
        if package is None:
            raise SystemExit(
                "no Ragas source: pass --ragas-source (the ragas package directory of "
                "ragas 0.4.3, e.g. an unpacked `pip download ragas==0.4.3 --no-deps` "
                "wheel) or create benchmarks/_venv_ragas (vs_peers.py does)"
            )
        prompts = ragas_prompts(package)
        chats_of["ragas"] = lambda r: ragas_chats(r, prompts)
        metric_sets["ragas"] = RAGAS_METRICS

    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "by_k": {}}
    for k in [int(x) for x in args.contexts_per_row.split(",")]:
        base = vs_peers.build_rows(
            max(args.rows, 201), vs_peers.parse_args([]).context_chars, 1000, contexts_per_row=k
        )
        rows = base.slice(0, args.rows).to_pylist()
        by_peer: dict[str, Any] = {}
        for peer, names in metric_sets.items():
            tools = {peer: account(rows, chats_of[peer], encode, args.block_size)}
            for layout in ("row_first", "instructions_first"):
                metrics = _metrics(names, layout)
                tools[f"ragbatch_{layout}"] = account(
                    rows, lambda r, ms=metrics: ragbatch_chats(r, ms), encode, args.block_size
                )
            for f in tools.values():
                f["cached_tokens_per_row"] = (
                    f["prompt_tokens_per_row"] - f["computed_tokens_per_row"]
                )
            by_peer[peer] = tools
            for tool, f in tools.items():
                print(
                    f"K={k} {peer:5s} {tool:29s} calls/row {f['calls_per_row']:5.2f}  prompt "
                    f"tokens/row {f['prompt_tokens_per_row']:8.1f}  computed "
                    f"{f['computed_tokens_per_row']:8.1f}  cached {f['cached_tokens_per_row']:8.1f}"
                    + (
                        f"  after the shared block {f['task_tokens_per_row']:7.1f}"
                        if f["task_tokens_per_row"]
                        else ""
                    ),
                    flush=True,
                )
            for layout in ("row_first", "instructions_first"):
                ours = tools[f"ragbatch_{layout}"]
                for key in ("computed_tokens_per_row", "prompt_tokens_per_row"):
                    ratio = ours[key] / tools[peer][key]
                    ours[f"{key}_vs_{peer}"] = ratio
                print(
                    f"K={k} {peer:5s} ragbatch {layout} computes {ours[f'computed_tokens_per_row_vs_{peer}']:.2f}x "
                    f"{peer}'s prompt tokens per row (all prompt tokens: "
                    f"{ours[f'prompt_tokens_per_row_vs_{peer}']:.2f}x)",
                    flush=True,
                )
        results["by_k"][str(k)] = by_peer
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    main()
