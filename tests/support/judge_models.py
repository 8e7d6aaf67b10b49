"""A tiny random-weight causal LM for judge-engine tests.

No model hub is reachable from the test machines, so the judge tests build their own
model: a two-layer Llama with random weights and a byte-level BPE tokenizer trained on
the example data shipped in ``examples/data``. Its replies are nonsense, but structured
outputs (a choice or a JSON schema) still force them into a parseable shape, which is all
the engine tests need.

The model fits vLLM's CPU build: the attention head size is 64 (the CPU attention
backend rejects 16) and the window is 4096 tokens. vLLM also needs a KV-cache budget that
fits this machine: the ``tiny_judge_model`` fixture in ``conftest.py`` sets
``VLLM_CPU_KVCACHE_SPACE=1`` (GiB), and :func:`ragbatch.engines.vllm.load_vllm_engine`
sets the same default when no GPU is present.
"""

from __future__ import annotations

import json
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "data"

BOS = "<|bos|>"
EOS = "<|eos|>"
PAD = "<|pad|>"
#: Role markers of the chat template; special tokens, so they never split.
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")

#: ``<|bos|>`` once, then ``<|role|>content<|eos|>`` per message, then ``<|assistant|>``
#: when a reply is to follow.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

VOCAB_SIZE = 2048
#: Characters of example text the tokenizer is trained on (enough for a 2k vocabulary,
#: little enough to train in well under a second).
TRAINING_CHARS = 400_000
SEED = 0


def _training_text() -> list[str]:
    """Lines of the example data files, sorted by path, cut at :data:`TRAINING_CHARS`."""
    lines: list[str] = []
    total = 0
    files = sorted(p for p in EXAMPLES.rglob("*") if p.suffix in {".csv", ".tsv", ".md"})
    for file in files:
        for line in file.read_text(encoding="utf-8", errors="replace").splitlines():
            lines.append(line)
            total += len(line)
            if total >= TRAINING_CHARS:
                return lines
    return lines


def _train_tokenizer():
    """A byte-level BPE (every byte is in the alphabet, so any text encodes and decodes
    back to the same bytes) with the special tokens of the chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[PAD, BOS, EOS, *ROLE_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_text(), trainer=trainer)
    return tokenizer


def build_tiny_judge_model(path: Path) -> Path:
    """Write a tiny random-weight Llama chat model that vLLM can load into ``path``.

    Parameters
    ----------
    path : pathlib.Path
        Target directory; created if missing. Existing files of the same names are
        overwritten.

    Returns
    -------
    pathlib.Path
        ``path``, now holding ``config.json``, ``generation_config.json``,
        ``model.safetensors`` (float32 weights, about 3.5 MB) and the tokenizer files
        (``tokenizer.json``, ``tokenizer_config.json`` and the chat template).

    Notes
    -----
    Deterministic: the tokenizer is trained on fixed text and the weights are drawn
    after ``torch.manual_seed(0)``, so two calls write the same config, tokenizer and
    weights. The architecture is a Llama with hidden size 128, 2 heads of size 64,
    2 layers, MLP width 256 and a 4096-token window. Takes about a second.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers import PreTrainedTokenizerFast

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_train_tokenizer(),
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=list(ROLE_TOKENS),
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=16384,  # room for long RAG prompts plus reply budgets
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    model.save_pretrained(path)
    GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    ).save_pretrained(path)
    return path


if (
    __name__ == "__main__"
):  # pragma: no cover - manual use: python tests/support/judge_models.py DIR
    import sys

    out = build_tiny_judge_model(Path(sys.argv[1]))
    print(json.dumps(sorted(p.name for p in out.iterdir())))
