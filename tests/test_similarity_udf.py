"""ModelStage through real local Ray Data, and its errors in process."""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import pytest

from ragbatch.core.columns import CELL_TYPE, ISSUES_TYPE, cell_column
from ragbatch.engines.sentence_transformers import CrossEncoderEngine, EmbeddingEngine
from ragbatch.engines.sentence_transformers import load_model
from ragbatch.core.errors import ConfigError, EngineError
from ragbatch.core.heap import TRIM_INTERVAL_S, HeapTrimmer, heap_trim_available
from ragbatch.scoring.base import ModelMetric
from ragbatch.metrics.semantic_similarity import SemanticSimilarity
from ragbatch.scoring.registry import all_metrics
from test_semantic_similarity import write_tiny_bert
from udfs.base import stage_options
from udfs.similarity import ModelStage

CAT = "The cat sat on the mat."

ROWS = [
    ("r0", "A cat was sitting on the mat.", CAT, None),
    ("r1", None, CAT, {"answer": "answer: not a string (int)"}),
    ("r2", "Quarterly revenue grew by 5%.", CAT, None),
    ("r3", "Paris is the capital of France.", None, None),
    ("r4", "   ", "France's capital city is Paris.", None),
    ("r5", "A cat was sitting on the mat.", CAT, None),  # duplicate of r0
    ("r6", "猫坐在垫子上。", "猫がマットの上に座った。", None),
    ("r7", "I love pizza 🍕", "Pizza is my favourite food 😋", None),
    ("r8", "", "", None),
    ("r9", "France's capital city is Paris.", "Paris is the capital of France.", None),
]
METRICS = [
    {"name": "semantic_similarity", "id": "sim", "params": {}},
    {"name": "semantic_similarity", "id": "sim_again", "params": {}},
]


def canonical_table() -> pa.Table:
    return pa.table(
        {
            "row_id": pa.array([r[0] for r in ROWS], pa.string()),
            "answer": pa.array([r[1] for r in ROWS], pa.string()),
            "reference": pa.array([r[2] for r in ROWS], pa.string()),
            "_issues": pa.array([r[3] for r in ROWS], ISSUES_TYPE),
            "app": pa.array([f"app-{i % 3}" for i in range(len(ROWS))], pa.string()),
        }
    )


def direct_cells(spec, metric_id: str, table: pa.Table) -> list[dict]:
    metric = SemanticSimilarity.from_params({}, metric_id=metric_id)
    return metric.compute(load_model(spec), pl.from_arrow(table)).to_list()


def run_through_ray(table: pa.Table, engine_name: str, spec: dict, metrics: list) -> pa.Table:
    import ray

    context = ray.data.DataContext.get_current()
    previous = context.execution_options.preserve_order
    context.execution_options.preserve_order = True
    try:
        ds = ray.data.from_arrow(table).map_batches(
            ModelStage,
            batch_format="pyarrow",
            fn_constructor_kwargs={
                "engine_name": engine_name,
                "engine_spec": spec,
                "metrics": metrics,
            },
            **stage_options(spec),
        )
        return pa.concat_tables(ray.get(ds.to_arrow_refs()))
    finally:
        context.execution_options.preserve_order = previous


def assert_same_cells(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g["status"], g["reason"], g["model"]) == (w["status"], w["reason"], w["model"])
        if w["score"] is None:
            assert g["score"] is None and g["details"] is None
        else:
            # Different batch composition can change float rounding in the forward pass.
            assert g["score"] == pytest.approx(w["score"], abs=1e-5)


@pytest.fixture(scope="module")
def tiny_cross_encoder_dir(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("udf_ce") / "model")


# --------------------------------------------------------------------------- through Ray


@pytest.mark.slow
def test_embedding_stage_through_ray(ray_local):
    table = canonical_table()
    spec = {"type": "embedding", "batch_size": 4, "concurrency": 1, "num_cpus": 1}
    out = run_through_ray(table, "minilm", spec, METRICS)

    assert out.num_rows == table.num_rows
    assert out.column_names == table.column_names + [cell_column("sim"), cell_column("sim_again")]
    assert out.select(table.column_names).to_pylist() == table.to_pylist()
    assert out.schema.field(cell_column("sim")).type == CELL_TYPE

    want = direct_cells(EmbeddingEngine(**spec), "sim", table)
    sim = out.column(cell_column("sim")).to_pylist()
    assert_same_cells(sim, want)
    assert out.column(cell_column("sim_again")).to_pylist() == sim
    assert [c["status"] for c in sim] == [
        "ok",
        "missing_input",
        "ok",
        "missing_input",
        "missing_input",
        "ok",
        "ok",
        "ok",
        "missing_input",
        "ok",
    ]
    assert sim[1]["reason"] == "answer: not a string (int)"
    # Rows 0 and 5 are the same pair, scored in different batches (4 rows a call): the
    # padding of a forward pass moves the last digits. Within one call a text is embedded
    # once, so duplicates there are equal exactly (test_semantic_similarity).
    assert sim[0]["status"] == sim[5]["status"] == "ok"
    assert sim[0]["score"] == pytest.approx(sim[5]["score"], abs=1e-6)
    assert sim[0]["score"] > sim[2]["score"]


@pytest.mark.slow
def test_cross_encoder_stage_through_ray(ray_local, tiny_cross_encoder_dir):
    table = canonical_table()
    spec = {
        "type": "cross_encoder",
        "model": str(tiny_cross_encoder_dir),
        "batch_size": 3,
        "concurrency": [1, 1],
    }
    out = run_through_ray(table, "tiny", spec, METRICS[:1])

    assert out.column("row_id").to_pylist() == [r[0] for r in ROWS]
    assert out.schema.field(cell_column("sim")).type == CELL_TYPE
    want = direct_cells(CrossEncoderEngine(**spec), "sim", table)
    got = out.column(cell_column("sim")).to_pylist()
    assert_same_cells(got, want)
    assert all(0.0 <= c["score"] <= 1.0 for c in got if c["status"] == "ok")


@pytest.mark.slow
@pytest.mark.release  # the default suite: every e2e run passes built metrics (tests/test_e2e.py)
def test_built_metrics_go_to_the_actors_as_a_run_passes_them(ray_local, tiny_cross_encoder_dir):
    # A run hands the stage the plan's Metric objects; Ray pickles them for each actor.
    table = canonical_table()
    spec = {
        "type": "cross_encoder",
        "model": str(tiny_cross_encoder_dir),
        "batch_size": 4,
        "concurrency": 1,
    }
    metrics = [
        SemanticSimilarity.from_params({}, metric_id=mid, engine="tiny")
        for mid in ("sim", "sim_again")
    ]
    out = run_through_ray(table, "tiny", spec, metrics)

    assert out.column_names == table.column_names + [cell_column("sim"), cell_column("sim_again")]
    want = direct_cells(CrossEncoderEngine(**spec), "sim", table)
    assert_same_cells(out.column(cell_column("sim")).to_pylist(), want)
    assert_same_cells(out.column(cell_column("sim_again")).to_pylist(), want)


# --------------------------------------------------------------------------- in process


def test_call_in_process_keeps_columns_and_rows(tiny_cross_encoder_dir):
    spec = {"type": "cross_encoder", "model": str(tiny_cross_encoder_dir)}
    stage = ModelStage("tiny", spec, METRICS[:1])
    table = canonical_table()
    out = stage(table)
    assert out.num_rows == table.num_rows
    assert out.select(table.column_names).equals(table)
    assert out.schema.field(cell_column("sim")).type == CELL_TYPE

    empty = stage(table.slice(0, 0))
    assert empty.num_rows == 0
    assert empty.schema.field(cell_column("sim")).type == CELL_TYPE


def test_actor_trims_heap_after_batches(tiny_cross_encoder_dir):
    stage = ModelStage(
        "tiny", {"type": "cross_encoder", "model": str(tiny_cross_encoder_dir)}, METRICS[:1]
    )
    assert stage.heap.interval_s == TRIM_INTERVAL_S
    stage.heap = HeapTrimmer(interval_s=0)  # every batch, so the count is known
    table = canonical_table()
    for _ in range(3):
        assert stage(table).num_rows == table.num_rows
    assert stage.heap.batches == 3
    assert stage.heap.trims == (3 if heap_trim_available() else 0)


def test_batch_without_issues_column(tiny_cross_encoder_dir):
    stage = ModelStage(
        "tiny", {"type": "cross_encoder", "model": str(tiny_cross_encoder_dir)}, METRICS[:1]
    )
    out = stage(canonical_table().drop_columns(["_issues", "app", "row_id"]))
    cells = out.column(cell_column("sim")).to_pylist()
    assert cells[1]["reason"] == "answer is null"


def test_missing_input_column_is_an_error(tiny_cross_encoder_dir):
    stage = ModelStage(
        "tiny", {"type": "cross_encoder", "model": str(tiny_cross_encoder_dir)}, METRICS[:1]
    )
    with pytest.raises(ValueError, match="reference"):
        stage(canonical_table().drop_columns(["reference"]))
    with pytest.raises(TypeError, match="pyarrow"):
        stage(canonical_table().to_pylist())


def test_invalid_engine_spec_names_the_field():
    with pytest.raises(ConfigError, match=r"engines\.minilm\.batch_size"):
        ModelStage("minilm", {"type": "embedding", "batch_size": 0}, METRICS[:1])
    with pytest.raises(ConfigError, match=r"engines\.minilm"):
        ModelStage("minilm", {"type": "embedding", "modle": "x"}, METRICS[:1])


def test_missing_model_path_names_engine_and_path(tmp_path):
    path = tmp_path / "absent"
    with pytest.raises(EngineError, match=r"^engines\.ce: ") as info:
        ModelStage("ce", {"type": "cross_encoder", "model": str(path)}, METRICS[:1])
    assert str(path) in str(info.value)


def test_unknown_or_non_model_metric_is_rejected():
    with pytest.raises(ConfigError, match="semantic_similarity"):
        ModelStage("minilm", {"type": "embedding"}, [{"name": "semantic_similarty", "id": "x"}])
    others = [cls for cls in all_metrics() if not issubclass(cls, ModelMetric)]
    if others:
        with pytest.raises(ConfigError, match="not a model metric"):
            ModelStage("minilm", {"type": "embedding"}, [{"name": others[0].name, "id": "x"}])


def test_stage_options():
    import ray.data

    fixed = stage_options({"type": "embedding", "concurrency": 2, "num_gpus": 1, "batch_size": 32})
    assert isinstance(fixed["compute"], ray.data.ActorPoolStrategy)
    assert (fixed["compute"].min_size, fixed["compute"].max_size) == (2, 2)
    assert (fixed["num_gpus"], fixed["num_cpus"], fixed["batch_size"]) == (1, 1, 32)
    assert "batch_format" not in fixed
    # Named Ray Data parameters only: no deprecated ray_remote_args_fn / **ray_remote_args.
    assert "ray_remote_args_fn" not in fixed and "max_task_retries" not in fixed

    scaling = stage_options(CrossEncoderEngine(type="cross_encoder", model="m", concurrency=(1, 4)))
    assert (scaling["compute"].min_size, scaling["compute"].max_size) == (1, 4)
    assert scaling["batch_size"] == 64


def test_actor_stage_blocks_are_cut_to_batches(ray_local):
    # One 1,000-row block (as one read task gives) reaches an actor stage of batch_size 4
    # as blocks of at most ACTOR_BLOCK_BATCHES * 4 rows, every row once.
    import ray.data

    from ragbatch.pipeline.stage_builders import ACTOR_BLOCK_BATCHES, _actor_sized_blocks

    table = pa.table({"row_id": [f"r{i}" for i in range(1000)], "answer": ["猫 🍕"] * 1000})
    ds = _actor_sized_blocks(ray.data.from_arrow(table), 4).materialize()
    sizes = [ray_local.get(ref).num_rows for ref in ds.get_internal_block_refs()]
    assert max(sizes) <= ACTOR_BLOCK_BATCHES * 4 and sum(sizes) == 1000
    assert len(sizes) >= 1000 // (ACTOR_BLOCK_BATCHES * 4)
    assert sorted(r["row_id"] for r in ds.iter_rows()) == sorted(table["row_id"].to_pylist())
