"""An OpenAI-compatible stand-in judge that answers at once, without a model: for measuring
the most rows per second a judge client can reach, whatever the judge behind it.

Usage (from the repository root, in the project's virtual environment)::

    python benchmarks/instant_judge.py --port 8011 &
    python benchmarks/vs_peers.py --base-url http://127.0.0.1:8011/v1 --model instant \\
        --tools tonic,ragbatch-openai --ragbatch-metrics tonic --rows 1000

Every reply parses, so every tool makes all the calls its metrics make with a working
judge (Tonic Validate asks once per context; faithfulness and context_recall take their
second step): the run measures each client's own cost per row, the floor under its time
with any judge, on the same cores as the client. It is not a judge: the replies are the
same for every row.

Replies:

* a request with vLLM's ``structured_outputs`` (``choice`` or ``json``) or an OpenAI
  ``response_format`` JSON schema gets the first choice, or the smallest instance of
  the schema (:func:`instance`: arrays at their ``minItems``, at least one item; the
  last value of an ``enum``, so 0/1 verdicts are 1; ``"ok"`` for strings);
* any other request (Tonic Validate's prompts): ``4`` when the prompt holds
  ``REFERENCE ANSWER:`` (its answer-similarity score), else ``true`` (its relevance and
  contains-context questions).

Ragas's prompts are not answered in its formats; it is not measured this way.

Endpoints: ``GET /health``, ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST
/tokenize`` (``{"count": ...}``, as vLLM's; 404 with ``--no-tokenize``, as servers
other than vLLM), ``POST /reset_prefix_cache`` (nothing to reset; answers 200 as
vLLM's does), and ``GET /metrics`` with vLLM's counter names (``vllm:request_success_total``,
``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``). Token counts are not
tokenizer counts: a prompt counts one token per 4 characters of its messages, a reply
one per 4 characters (at least 1).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

#: Served model name unless ``--model`` says otherwise.
MODEL = "instant"


def instance(schema: dict[str, Any]) -> Any:
    """The smallest value valid against the JSON Schema subset the judge metrics use
    (``object`` with ``properties``/``required``, ``array`` with ``items`` and
    ``minItems``, ``enum``, ``string``, ``integer``, ``number``, ``boolean``,
    ``anyOf``/``oneOf``)."""
    if "enum" in schema:
        return schema["enum"][-1]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return instance(schema[key][0])
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        return {name: instance(props.get(name, {})) for name in schema.get("required", props)}
    if kind == "array":
        return [instance(schema.get("items", {})) for _ in range(max(1, schema.get("minItems", 1)))]
    if kind == "integer":
        return int(schema.get("minimum", 0))
    if kind == "number":
        return float(schema.get("minimum", 0))
    if kind == "boolean":
        return True
    return "ok"


def reply_text(body: dict[str, Any]) -> str:
    """What the stand-in answers to one chat-completions request body."""
    constraint = body.get("structured_outputs")
    if constraint:
        if constraint.get("choice"):
            return str(constraint["choice"][0])
        if "json" in constraint:
            return json.dumps(instance(constraint["json"]))
    fmt = body.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        return json.dumps(instance(fmt["json_schema"]["schema"]))
    prompt = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
    return "4" if "REFERENCE ANSWER:" in prompt else "true"


class Counters:
    """Requests and (estimated) tokens answered since the start."""

    def __init__(self) -> None:
        self.requests = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.tokenize_requests = 0

    def prometheus(self) -> str:
        return "".join(
            f"{name} {value}\n"
            for name, value in (
                ("vllm:request_success_total", self.requests),
                ("vllm:prompt_tokens_total", self.prompt_tokens),
                ("vllm:generation_tokens_total", self.completion_tokens),
                ("instant:tokenize_requests_total", self.tokenize_requests),
            )
        )


def prompt_tokens(messages: list[dict[str, Any]]) -> int:
    """The stand-in's token count of a chat: one per 4 characters of its messages."""
    return sum(len(str(m.get("content", ""))) for m in messages) // 4


#: Context window the stand-in reports unless ``--max-model-len`` says otherwise.
MAX_MODEL_LEN = 1 << 20


def make_app(model: str, tokenize: bool = True, max_model_len: int = MAX_MODEL_LEN):
    """The aiohttp application serving the endpoints of the module docstring, reporting
    a context window of ``max_model_len`` tokens (a client that counts first refuses
    longer prompts itself; the stand-in answers whatever it is sent)."""
    from aiohttp import web

    counters = Counters()

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        text = reply_text(body)
        prompt = prompt_tokens(body.get("messages", []))
        done = max(1, len(text) // 4)
        counters.requests += 1
        counters.prompt_tokens += prompt
        counters.completion_tokens += done
        return web.json_response(
            {
                "id": f"instant-{counters.requests}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", model),
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": text},
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": done,
                    "total_tokens": prompt + done,
                },
            }
        )

    async def count(request: web.Request) -> web.Response:
        if not tokenize:
            return web.json_response({"detail": "Not Found"}, status=404)
        body = await request.json()
        counters.tokenize_requests += 1
        return web.json_response(
            {"count": prompt_tokens(body.get("messages", [])), "max_model_len": max_model_len}
        )

    async def models(_: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": model,
                        "object": "model",
                        "owned_by": "instant",
                        "max_model_len": max_model_len,
                    }
                ],
            }
        )

    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=counters.prometheus())

    app = web.Application(client_max_size=64 << 20)
    app.add_routes(
        [
            web.post("/v1/chat/completions", completions),
            web.get("/v1/models", models),
            web.post("/tokenize", count),
            web.get("/health", ok),
            web.post("/reset_prefix_cache", ok),
            web.get("/metrics", metrics),
        ]
    )
    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8011)
    p.add_argument("--model", default=MODEL, help=f"served model name (default {MODEL})")
    p.add_argument(
        "--no-tokenize",
        action="store_true",
        help="answer POST /tokenize with 404, as servers other than vLLM do",
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        default=MAX_MODEL_LEN,
        help=f"context window to report, in tokens (default {MAX_MODEL_LEN})",
    )
    args = p.parse_args(argv)
    from aiohttp import web

    web.run_app(
        make_app(args.model, tokenize=not args.no_tokenize, max_model_len=args.max_model_len),
        host=args.host,
        port=args.port,
        access_log=None,
        print=lambda *_: print(f"instant judge at http://{args.host}:{args.port}/v1", flush=True),
    )


if __name__ == "__main__":
    main()
