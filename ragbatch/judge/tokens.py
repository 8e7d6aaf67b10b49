"""Prompt token counts of judge requests, without a judge engine.

A dry run counts the prompts a run would send with the judge's own tokenizer, loaded
from local files with ``transformers`` (no model weights): the chat is rendered with the
tokenizer's chat template, the assistant turn opened (``add_generation_prompt=True``),
and the text encoded without adding special tokens, as vLLM does (offline and served).
The tokenizer comes from the engine's ``tokenizer`` field, or for a ``vllm`` engine from
its ``model`` directory (or the local Hugging Face cache of a model id).

When no tokenizer can be loaded (an ``openai`` engine without ``tokenizer``, no
``transformers``, files missing), counts fall back to :data:`CHARS_PER_TOKEN` characters
of the rendered chat per token, and say so: a rough figure, often off by 20 % or more.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ragbatch.judge.protocol import Message

log = logging.getLogger(__name__)

#: Characters per token assumed when no tokenizer is available (a common rule of thumb
#: for English with byte-level BPE vocabularies).
CHARS_PER_TOKEN = 4
#: Chats tokenized per call to the tokenizer (its Rust core encodes a batch in parallel).
ENCODE_BATCH = 64


@dataclass
class PromptCounter:
    """Counts the prompt tokens of judge chats.

    Attributes
    ----------
    method : str
        ``"tokenizer"`` (exact: the judge's tokenizer and chat template) or
        ``"chars/4"`` (an approximation).
    source : str
        Where the tokenizer came from, or why there is none.
    """

    method: str
    source: str
    tokenizer: Any = None

    @property
    def exact(self) -> bool:
        """Whether counts come from the judge's own tokenizer."""
        return self.method == "tokenizer"

    def count(self, chats: Sequence[tuple[Message, ...]]) -> list[int]:
        """Prompt tokens of each chat.

        Parameters
        ----------
        chats : sequence of tuple of Message
            ``n`` chats, each as an :class:`~ragbatch.judge.protocol.Ask` holds them.

        Returns
        -------
        list of int
            ``n`` counts, in order: with the tokenizer, the tokens of the chat rendered
            with its template and an open assistant turn; otherwise the characters of
            the messages' contents divided by :data:`CHARS_PER_TOKEN`, rounded up.
        """
        if self.tokenizer is None:
            return [-(-sum(len(m.content) for m in chat) // CHARS_PER_TOKEN) for chat in chats]
        counts: list[int] = []
        for start in range(0, len(chats), ENCODE_BATCH):
            texts = [
                self.tokenizer.apply_chat_template(
                    [m.as_dict() for m in chat], add_generation_prompt=True, tokenize=False
                )
                for chat in chats[start : start + ENCODE_BATCH]
            ]
            encoded = self.tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
            counts.extend(len(ids) for ids in encoded)
        return counts


def prompt_counter(spec: Any) -> PromptCounter:
    """The prompt counter of a judge engine spec.

    Parameters
    ----------
    spec : judge engine spec (ragbatch.engines.vllm.VllmEngine, OpenAIEngine, ...)
        ``tokenizer`` is used when set; otherwise the engine type's ``tokenizer`` hook
        (``model`` for ``vllm`` engines, none for ``openai``).

    Returns
    -------
    PromptCounter
        Backed by the tokenizer when one loads from local files and has a chat template;
        else the ``chars/4`` approximation, with ``source`` saying why.
    """
    from ragbatch.core.engine_registry import engine_of

    path = engine_of(spec).tokenizer_path(spec)
    if path is None:
        return PromptCounter(
            "chars/4", f"no tokenizer: engine type {spec.type} without a `tokenizer` directory"
        )
    try:
        tokenizer = _load(path)
    except ImportError as exc:
        return PromptCounter("chars/4", f"no tokenizer: transformers is not installed ({exc})")
    except Exception as exc:  # missing files, an unknown model id: fall back, and say why
        log.debug("no tokenizer at %s: %r", path, exc)
        return PromptCounter(
            "chars/4", f"no tokenizer: cannot load one from {path!r} ({type(exc).__name__})"
        )
    if not getattr(tokenizer, "chat_template", None):
        return PromptCounter(
            "chars/4", f"no tokenizer: the tokenizer in {path!r} has no chat template"
        )
    return PromptCounter("tokenizer", f"tokenizer of {path}", tokenizer)


def _load(path: str) -> Any:
    """The tokenizer at ``path`` (a local directory or a model id in the local Hugging
    Face cache). A directory with ``tokenizer.json`` loads as a fast tokenizer directly,
    which spares importing torch (``AutoTokenizer`` imports it, tens of seconds on a busy
    machine); anything else goes through ``AutoTokenizer``."""
    if (Path(path).expanduser() / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)
