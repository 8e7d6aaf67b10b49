"""udfs.base.SyncActorStage with a minimal subclass (no model), and the StageKind enum."""

from __future__ import annotations

import json
import pickle
from typing import ClassVar

import polars as pl
import pyarrow as pa
import pytest

from ragbatch.core.columns import CELL_TYPE, ISSUES_TYPE, cell_column
from ragbatch.core.errors import ConfigError, EngineError, StageBugError
from ragbatch.scoring.base import ExpressionMetric, ModelMetric
from ragbatch.scoring.cells import CELL_DTYPE
from ragbatch.metrics.exact_match import ExactMatch
from ragbatch.pipeline.plan import Stage
from ragbatch.core.stages import StageKind
from udfs.base import SyncActorStage, cell_array, engine_errors
from udfs.guard import BATCH_ATTEMPTS


class AnswerChars(ModelMetric):
    """Test metric: the answer's length in characters, from a "model" that is a number
    added to it. Null answers are ``missing_input``."""

    name: ClassVar[str] = "answer_chars"
    inputs: ClassVar[tuple[str, ...]] = ("answer",)
    engine_types: ClassVar[tuple[str, ...]] = ("embedding",)
    summary: ClassVar[str] = "answer length"
    source: ClassVar[str] = "test"

    def compute(self, model, frame: pl.DataFrame) -> pl.Series:
        cells = [
            {
                "score": None,
                "status": "missing_input",
                "reason": "answer is null",
                "details": None,
                "model": None,
            }
            if a is None
            else {
                "score": float(len(a) + model),
                "status": "ok",
                "reason": None,
                "details": None,
                "model": "chars",
            }
            for a in frame.get_column("answer").to_list()
        ]
        return pl.Series(self.id, cells, dtype=CELL_DTYPE)


class Broken(AnswerChars):
    """Fault injector: its "model" fails as an engine does (an EngineError)."""

    name: ClassVar[str] = "broken"

    def compute(self, model, frame: pl.DataFrame) -> pl.Series:
        raise EngineError("the model fell over")


class Buggy(AnswerChars):
    """Test-only fault injection: a bug in the metric's own code (a TypeError)."""

    name: ClassVar[str] = "buggy"

    def compute(self, model, frame: pl.DataFrame) -> pl.Series:
        raise TypeError("injected bug")


class CharStage(SyncActorStage):
    """Test stage: loads ``0`` as its model and appends each metric's cells."""

    kind = StageKind.MODEL
    metric_class = ModelMetric
    wrong_metric = "{metric} is not a model metric"

    def load(self) -> None:
        self.loads = getattr(self, "loads", 0) + 1
        self.model = 0

    def columns(self, batch, frame):
        for m in self.metrics:
            yield cell_column(m.id), cell_array(m.id, m.compute(self.model, frame), batch.num_rows)


SPEC = {"type": "embedding"}  # validated only: CharStage loads no model


def table() -> pa.Table:
    return pa.table(
        {
            "row_id": ["a", "b", "c"],
            "answer": ["cat", None, "猫🍕"],
            "app": ["x", "y", "z"],
            "_issues": pa.array([None, None, None], ISSUES_TYPE),
        }
    )


def chars(metric_id: str = "len", engine: str = "toy") -> AnswerChars:
    return AnswerChars.from_params({}, metric_id=metric_id, engine=engine)


def test_minimal_subclass_appends_cells_and_keeps_columns():
    stage = CharStage("toy", SPEC, [chars("len"), chars("len2")])
    assert stage.loads == 1 and stage.input_columns == ["answer"]
    batch = table()
    out = stage(batch)
    assert out.column_names == batch.column_names + [cell_column("len"), cell_column("len2")]
    assert out.select(batch.column_names).equals(batch)
    assert out.schema.field(cell_column("len")).type == CELL_TYPE
    cells = out.column(cell_column("len")).to_pylist()
    # "cat" has 3 characters, "猫🍕" 2 (code points, not bytes).
    assert [(c["score"], c["status"]) for c in cells] == [
        (3.0, "ok"),
        (None, "missing_input"),
        (2.0, "ok"),
    ]
    assert out.column(cell_column("len2")).to_pylist() == cells
    assert stage.heap.batches == 1


def test_failing_batch_gets_error_cells_through_the_guard():
    stage = CharStage("toy", SPEC, [Broken.from_params({}, metric_id="b", engine="toy")])
    out = stage(table())
    cells = out.column(cell_column("b")).to_pylist()
    reason = f"engine toy: batch failed {BATCH_ATTEMPTS} times: EngineError: the model fell over"
    assert [c["status"] for c in cells] == ["error"] * 3
    assert {c["reason"] for c in cells} == {reason}
    assert out.select(table().column_names).equals(table())


def test_a_bug_fails_the_call_naming_the_stage_without_error_cells():
    stage = CharStage("toy", SPEC, [Buggy.from_params({}, metric_id="b", engine="toy")])
    with pytest.raises(StageBugError) as caught:
        stage(table())
    message = str(caught.value)
    assert message.startswith(
        "stage model:toy failed with a bug in ragbatch's own code: TypeError: injected bug "
        "(traceback follows)\nTraceback (most recent call last):"
    )
    assert 'raise TypeError("injected bug")' in message
    assert isinstance(caught.value.__cause__, TypeError)


def test_a_stage_without_its_required_hooks_cannot_be_made():
    class NoColumns(SyncActorStage):
        kind = StageKind.MODEL

        def load(self) -> None:
            pass

    with pytest.raises(TypeError, match="abstract method '?columns"):
        NoColumns("toy", SPEC, [chars()])


def test_batch_errors_that_are_not_batch_faults():
    stage = CharStage("toy", SPEC, [chars()])
    with pytest.raises(
        ValueError, match=r"engine 'toy': batch lacks input column\(s\) \['answer'\]"
    ):
        stage(table().drop_columns(["answer"]))
    with pytest.raises(TypeError, match=r"^CharStage expects pyarrow\.Table batches, got list"):
        stage(table().to_pylist())


def test_metrics_as_dicts_are_built_in_the_actor():
    stage = CharStage(
        "toy", {"type": "embedding"}, [{"name": "semantic_similarity", "id": "sim", "params": {}}]
    )
    (metric,) = stage.metrics
    assert (metric.name, metric.id, metric.engine) == ("semantic_similarity", "sim", "toy")


def test_wrong_metrics_are_config_errors():
    with pytest.raises(ConfigError, match=r"^metrics\[0\]: exact_match is not a model metric$"):
        CharStage("toy", SPEC, [ExactMatch.from_params({}, metric_id="em")])
    assert issubclass(ExactMatch, ExpressionMetric)
    with pytest.raises(
        ConfigError,
        match=r"^metrics\[1\]: len runs on engine 'other', not on "
        r"engines\.toy",
    ):
        CharStage("toy", SPEC, [chars("ok"), chars("len", engine="other")])
    with pytest.raises(ConfigError, match=r"engines\.toy\.batch_size"):
        CharStage("toy", {"type": "embedding", "batch_size": 0}, [chars()])


def test_built_metrics_survive_pickling():
    # Ray hands an actor stage its constructor arguments pickled.
    metric = pickle.loads(pickle.dumps(chars()))
    out = CharStage("toy", SPEC, [metric])(table())
    assert out.column(cell_column("len")).to_pylist()[0]["score"] == 3.0


def test_cell_array_checks_the_row_count():
    cells = chars().compute(0, pl.DataFrame({"answer": ["ab"]}))
    assert cell_array("len", cells, 1).type == CELL_TYPE
    with pytest.raises(RuntimeError, match=r"^len: compute returned 1 cells for 2 rows$"):
        cell_array("len", cells, 2)


def test_engine_errors_name_the_engine():
    with pytest.raises(EngineError, match=r"^engines\.toy: no such model$"):
        with engine_errors("toy"):
            raise EngineError("no such model")


def test_stage_kind_values_are_the_strings_outputs_show():
    assert [k.value for k in StageKind] == ["expression", "model", "pii", "judge"]
    assert StageKind("pii") is StageKind.PII and StageKind.PII == "pii"
    assert f"{StageKind.JUDGE}:j" == "judge:j" and str(StageKind.MODEL) == "model"
    assert json.dumps({"kind": StageKind.PII}) == '{"kind": "pii"}'
    assert [k.uses_actors for k in StageKind] == [False, True, True, True]
    with pytest.raises(ValueError):
        StageKind("models")


def test_plan_stage_takes_a_kind_or_its_string():
    stage = Stage("model", "model:toy", [chars()], "toy")
    assert stage.kind is StageKind.MODEL
    described = stage.describe()
    assert described["kind"] == "model" and type(described["kind"]) is str
