"""Hostile rubric configs: values a lax reading would take for something else are refused
with the param's path, before any judge runs."""

from __future__ import annotations

import pytest

from ragbatch.core.errors import ConfigError
from ragbatch.metrics.rubric import Rubric

CHOICES = {
    "criteria": "The answer is supported by the contexts.",
    "inputs": ["contexts", "answer"],
    "choices": ["supported", "unsupported"],
    "reasons": False,
}


@pytest.mark.parametrize("score", [True, "1"])
def test_a_choice_score_is_a_number_as_written(score):
    # YAML `supported: yes` is True; a lax float takes it (or the text "1") for 1.0
    params = {**CHOICES, "choice_scores": {"supported": score, "unsupported": 0}}
    with pytest.raises(
        ConfigError, match="params.choice_scores.supported: Input should be a valid number"
    ):
        Rubric.from_params(params)


def test_integer_choice_scores_are_still_numbers():
    params = {**CHOICES, "choice_scores": {"supported": 1, "unsupported": 0}}
    assert Rubric.from_params(params).validate_notes() == [
        "rubric on contexts, answer; choices supported=1, unsupported=0; without reasons; "
        "score verdict"
    ]


SCALE = {"criteria": "The answer uses the contexts.", "scale": {"min": 1, "max": 5}}


@pytest.mark.parametrize(
    "contexts,fix",
    [
        ("Apollo 11 landed in 1969.", "give a list of texts"),
        ([], "give at least one text"),
    ],
)
def test_an_example_gives_its_contexts_as_a_list_of_texts(contexts, fix):
    # a row with no contexts never reaches the judge (missing_input), and a bare string
    # would be shown unnumbered, unlike every row's contexts
    example = {"inputs": {"contexts": contexts, "answer": "1969"}, "score": 5, "reason": "r"}
    params = {**SCALE, "inputs": ["contexts", "answer"], "examples": [example]}
    with pytest.raises(ConfigError, match=rf"params.examples\[0\].inputs.contexts: {fix}"):
        Rubric.from_params(params)
