"""A YAML config that gives one key twice in a mapping is refused, naming the key, both
lines and the fix, instead of the last value silently replacing the first."""

from __future__ import annotations

import pytest

from ragbatch.calibrate.config import load_calibration
from ragbatch.cli import main
from ragbatch.config.job import load_config
from ragbatch.config.safe_yaml import load_yaml
from ragbatch.core.errors import ConfigError
from ragbatch.io.options import parse_storage_option

# Lines: 1 input, 2 output, 3 engines, 4 judge_a, 5 judge_b, 6 judge_a again, 7 metrics, ...
TWO_JUDGE_A = """\
input: {uri: in.jsonl, columns: {answer: a}}
output: {uri: out}
engines:
  judge_a: {kind: openai, base_url: http://127.0.0.1:9/v1, model: llama}
  judge_b: {kind: openai, base_url: http://127.0.0.1:9/v1, model: qwen}
  judge_a: {kind: openai, base_url: http://127.0.0.1:9/v1, model: mistral}
metrics:
  - name: hate_speech
    engines: [judge_a, judge_b]
"""

JUDGE_A_MESSAGE = (
    "line 6: key 'judge_a' is given twice in the same mapping (lines 4 and 6); "
    "YAML would keep only the last value, so remove or rename one"
)


def test_a_repeated_engine_name_is_refused_naming_both_lines(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(TWO_JUDGE_A)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: {JUDGE_A_MESSAGE}"


def test_validate_exits_2_on_a_repeated_key(tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text(TWO_JUDGE_A)
    assert main(["validate", str(path)]) == 2
    assert JUDGE_A_MESSAGE in capsys.readouterr().err


def test_a_repeated_key_two_levels_deep_is_refused(tmp_path):
    # engines -> judge_a -> model, given on lines 6 and 8
    text = (
        "input: {uri: in.jsonl, columns: {answer: a}}\n"  # 1
        "output: {uri: out}\n"  # 2
        "engines:\n"  # 3
        "  judge_a:\n"  # 4
        "    kind: openai\n"  # 5
        "    model: llama\n"  # 6
        "    base_url: http://127.0.0.1:9/v1\n"  # 7
        "    model: qwen\n"  # 8
        "metrics: [{name: hate_speech, engine: judge_a}]\n"  # 9
    )
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (
        f"{path}: line 8: key 'model' is given twice in the same mapping (lines 6 and 8); "
        "YAML would keep only the last value, so remove or rename one"
    )


def test_the_same_key_in_different_mappings_is_fine():
    text = b"a: {x: 1, y: 2}\nb: {x: 3}\nx: 4\n"
    assert load_yaml(text, "ok.yaml") == {"a": {"x": 1, "y": 2}, "b": {"x": 3}, "x": 4}


def test_two_spellings_of_one_key_are_one_key():
    # YAML 1.1 reads `on` and `true` as the boolean true
    with pytest.raises(ConfigError) as err:
        load_yaml(b"on: 1\ntrue: 2\n", "b.yaml")
    assert str(err.value) == (
        "b.yaml: line 2: key 'true' is given twice in the same mapping (lines 1 and 2, "
        "the same key as 'on'); YAML would keep only the last value, so remove or rename one"
    )


def test_a_repeated_key_in_a_flow_mapping_on_one_line():
    with pytest.raises(ConfigError) as err:
        load_yaml(b"engines: {a: 1, b: 2, a: 3}\n", "f.yaml")
    assert str(err.value) == (
        "f.yaml: line 1: key 'a' is given twice in the same mapping (twice on line 1); "
        "YAML would keep only the last value, so remove or rename one"
    )


def test_a_repeated_key_in_a_list_item_is_refused():
    text = b"metrics:\n  - name: exact_match\n  - name: regex\n    name: exact_match\n"
    with pytest.raises(ConfigError, match=r"key 'name' .* \(lines 3 and 4\)"):
        load_yaml(text, "m.yaml")


def test_merge_keys_still_merge_and_may_be_overridden(tmp_path):
    """PyYAML's SafeLoader merged ``<<:`` before the check existed; it still does, and a
    key of the mapping's own overrides a merged one without counting as a repeat."""
    path = tmp_path / "job.yaml"
    path.write_text(
        "judge: &judge {kind: openai, base_url: http://127.0.0.1:9/v1, model: llama}\n"
        "input: {uri: in.jsonl, columns: {answer: a}}\n"
        "output: {uri: out}\n"
        "engines:\n"
        "  judge_a: *judge\n"
        "  judge_b:\n"
        "    <<: *judge\n"
        "    model: qwen\n"
        "metrics: [{name: hate_speech, engines: [judge_a, judge_b]}]\n"
    )
    data = load_yaml(path.read_bytes(), str(path))
    assert data["engines"]["judge_b"] == {
        "kind": "openai",
        "base_url": "http://127.0.0.1:9/v1",
        "model": "qwen",
    }
    assert data["engines"]["judge_a"]["model"] == "llama"
    # a list of merged mappings: an earlier one wins a key, as YAML's merge defines
    text = b"a: &a {x: 1}\nb: &b {x: 2, y: 2}\nc: {<<: [*a, *b], z: 3}\n"
    assert load_yaml(text, "m.yaml")["c"] == {"x": 1, "y": 2, "z": 3}
    # a mapping that is merged elsewhere is checked once, before merging rewrites it
    text = b"a: &a {x: 1}\nb: &b {<<: *a, x: 2}\nc: {<<: *b, y: 3}\n"
    assert load_yaml(text, "m.yaml")["b"] == {"x": 2}


def test_two_merge_keys_in_one_mapping_are_refused():
    text = b"a: &a {x: 1}\nb: &b {y: 1}\nc:\n  <<: *a\n  <<: *b\n"
    with pytest.raises(ConfigError) as err:
        load_yaml(text, "m.yaml")
    assert str(err.value) == (
        "m.yaml: line 5: key '<<' is given twice in the same mapping (lines 4 and 5); "
        "give one merge key a list instead: `<<: [*a, *b]`"
    )


def test_a_calibration_config_with_a_repeated_key_is_refused(tmp_path):
    path = tmp_path / "calibration.yaml"
    path.write_text("name: c\nlabels: {}\nname: d\n")
    with pytest.raises(ConfigError, match=r"line 3: key 'name' .* \(lines 1 and 3\)"):
        load_calibration(path)


def test_a_storage_option_flag_holding_a_mapping_is_refused_repeated_key_or_not():
    """A flag's value is one scalar, not a config: a mapping is refused whatever it holds,
    so ``{region: a, region: b}`` cannot pass with one value dropped."""
    with pytest.raises(ValueError, match="must be a single value"):
        parse_storage_option("client_kwargs={region: a, region: b}")
