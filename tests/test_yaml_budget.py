"""YAML configs over a size, alias or expansion budget are refused at load, before any
object is built: a "billion laughs" file would otherwise expand until memory runs out."""

from __future__ import annotations

import pytest

from ragbatch.calibrate.config import load_calibration
from ragbatch.cli import main
from ragbatch.config.job import load_config
from ragbatch.core.errors import ConfigError
from ragbatch.config import safe_yaml
from ragbatch.config.safe_yaml import MAX_YAML_BYTES, load_yaml


def _laughs(levels: int = 9, width: int = 10) -> str:
    """A valid job config whose json_valid schema holds nested anchors: level k is a list
    of ``width`` aliases of level k-1, so it expands to about width**levels strings
    (10**9 here). Before the budget, validate walked it for minutes until memory ran out."""
    lines = ['a0: &a0 "lol"']
    for k in range(1, levels + 1):
        lines.append(f"a{k}: &a{k} [{', '.join(f'*a{k - 1}' for _ in range(width))}]")
    bomb = "\n".join(
        ("          - " if k == 0 else "            ") + line for k, line in enumerate(lines)
    )
    return (
        "run: {name: bomb}\ninput: {uri: in.jsonl, columns: {answer: a}}\n"
        "output: {uri: out}\nmetrics:\n  - name: json_valid\n    params:\n"
        f"      schema:\n        type: object\n        examples:\n{bomb}\n"
    )


def test_alias_bomb_config_is_refused(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(_laughs())
    with pytest.raises(ConfigError, match="expands to more than"):
        load_config(path)


def test_alias_bomb_exits_2_from_validate(tmp_path, capsys):
    path = tmp_path / "bomb.yaml"
    path.write_text(_laughs())
    assert main(["validate", str(path)]) == 2
    assert "aliases" in capsys.readouterr().err


def test_alias_bomb_calibration_config_is_refused(tmp_path):
    path = tmp_path / "calibration.yaml"
    path.write_text(_laughs())
    with pytest.raises(ConfigError, match="expands to more than"):
        load_calibration(path)


def test_too_many_aliases_is_refused():
    # 2,000 aliases of one small anchor: under the node budget, over the alias budget
    text = "a: &a x\nb: [" + ", ".join(["*a"] * 2000) + "]\n"
    with pytest.raises(ConfigError, match="more than 1,000 YAML aliases"):
        load_yaml(text.encode(), "aliases.yaml")


def test_recursive_anchor_is_refused():
    with pytest.raises(ConfigError, match="refers to itself"):
        load_yaml(b"a: &a [1, *a]\n", "loop.yaml")


def test_oversized_file_is_refused_before_reading(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("run: {name: x}\n# " + "x" * MAX_YAML_BYTES + "\n")
    with pytest.raises(ConfigError, match="-byte limit"):
        load_config(path)


def test_expansion_budget_counts_each_alias_copy(monkeypatch):
    # root 1 + keys a, b, c 3 + the list 101 + two copies 202 = 307 nodes; two more
    # copies (keys d, e) make 509
    monkeypatch.setattr(safe_yaml, "MAX_YAML_NODES", 400)
    text = "a: &a [" + ", ".join("1" for _ in range(100)) + "]\nb: *a\nc: *a\n"
    data = load_yaml(text.encode(), "ok.yaml")
    assert len(data["b"]) == 100 and data["b"] is data["c"]
    with pytest.raises(ConfigError, match="more than 400 values"):
        load_yaml((text + "d: *a\ne: *a\n").encode(), "over.yaml")


def test_ordinary_config_with_aliases_loads(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(
        "defaults: &opts {key: k, secret: s}\n"
        "input: {uri: in.jsonl, storage_options: *opts}\n"
        "output: {uri: out, storage_options: *opts}\n"
        "metrics: [{name: exact_match}]\n"
    )
    with pytest.raises(ConfigError, match="defaults"):  # an unknown top-level key, but parsed
        load_config(path)


def test_not_utf8_is_a_config_error(tmp_path):
    path = tmp_path / "latin.yaml"
    path.write_bytes("run: {name: caf\xe9}\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(path)
