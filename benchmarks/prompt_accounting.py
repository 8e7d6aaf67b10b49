"""Prompt tokens per row that a judge must compute, for ragbatch and Tonic Validate, on the
rows of ``benchmarks/vs_peers.py``: what the judge's work per row is when every reply
parses, counted rather than timed.

Usage (from the repository root, in the project's virtual environment)::

    python benchmarks/prompt_accounting.py                        # the tiny judge's tokenizer
    python benchmarks/prompt_accounting.py --tokenizer /models/judge --block-size 16

For each row the script builds the chats each tool sends:

* ragbatch: the first request of each judge metric (``--metrics``, default Tonic
  Validate's three: answer_similarity, retrieval_precision, augmentation_accuracy), from
  the metrics' own code;
* Tonic Validate 6.2.0: its prompt texts (``tonic_validate.utils.llm_calls``, read in
  its own virtual environment, :func:`vs_peers.ensure_peer_venv`) put together the way
  its metrics do, with its system message, for all 1 + 2K calls of a row with K
  contexts (answer similarity once, retrieval precision and augmentation accuracy once
  per context): the calls it makes when every reply parses.

It renders them with the tokenizer's chat template and counts the prompt tokens, for
ragbatch those after the row's shared block (each metric's task), and the tokens that
an unbounded prefix cache with ``--block-size`` blocks could not serve (a
request reuses the longest run of whole blocks that an earlier request began with, never
its last token). Requests are taken in the order the judge stage sends them, each metric
for a batch of 64 rows in turn. The cache is ideal (nothing evicted, every earlier
request already computed), so the figures are the least each tool's prompts can cost
the judge, not a timing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import vs_peers  # noqa: E402

#: Tonic Validate's system message (``OpenAIService.get_response``, 6.2.0).
TONIC_SYSTEM = "You are a helpful assistant. Respond using markdown."
TONIC_METRICS = ("answer_similarity", "retrieval_precision", "augmentation_accuracy")
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
    """The first request of each metric for ``row``."""
    chats = []
    for metric in metrics:
        asks = [a for a in next(metric.program(row)) if hasattr(a, "messages")]
        chats += [[{"role": m.role, "content": m.content} for m in a.messages] for a in asks]
    return chats


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


#: Where a ragbatch judge prompt's task begins (``ragbatch.judge.prompt.build_messages``).
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
        "--metrics",
        default=",".join(TONIC_METRICS),
        help="ragbatch judge metrics (default Tonic Validate's three)",
    )
    p.add_argument("--out", type=Path, default=HERE / "_data" / "prompt_accounting.json")
    args = p.parse_args(argv)

    from transformers import AutoTokenizer

    from ragbatch.core.registry import get_metric

    if args.tokenizer == vs_peers.DEFAULT_MODEL_DIR:
        vs_peers.build_tiny_model(args.tokenizer)
    tok = AutoTokenizer.from_pretrained(str(args.tokenizer))

    def encode(chat: list[dict[str, str]]) -> list[int]:
        text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        return tok(text, add_special_tokens=False)["input_ids"]

    names = [m.strip() for m in args.metrics.split(",") if m.strip()]
    metrics = [
        get_metric(n).from_params(
            {"embedder": "embedder"} if n == "answer_relevancy" else None,
            metric_id=n,
            engine="judge",
            where="--metrics",
        )
        for n in names
    ]
    templates = tonic_templates()
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "by_k": {}}
    for k in [int(x) for x in args.contexts_per_row.split(",")]:
        base = vs_peers.build_rows(
            max(args.rows, 201), vs_peers.parse_args([]).context_chars, 1000, contexts_per_row=k
        )
        rows = base.slice(0, args.rows).to_pylist()
        tools = {
            "tonic": account(rows, lambda r: tonic_chats(r, templates), encode, args.block_size),
            "ragbatch": account(
                rows, lambda r: ragbatch_chats(r, metrics), encode, args.block_size
            ),
        }
        results["by_k"][str(k)] = tools
        for tool, f in tools.items():
            print(
                f"K={k}  {tool:9s} calls/row {f['calls_per_row']:5.2f}  prompt tokens/row "
                f"{f['prompt_tokens_per_row']:8.1f}  computed (not from the cache) "
                f"{f['computed_tokens_per_row']:8.1f}"
                + (
                    f"  after the shared block {f['task_tokens_per_row']:7.1f}"
                    if f["task_tokens_per_row"]
                    else ""
                ),
                flush=True,
            )
        ratio = (
            tools["tonic"]["computed_tokens_per_row"] / tools["ragbatch"]["computed_tokens_per_row"]
        )
        print(
            f"K={k}  Tonic Validate computes {ratio:.2f}x ragbatch's prompt tokens per row",
            flush=True,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    main()
