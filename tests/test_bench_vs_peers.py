"""The rows and defaults of ``benchmarks/vs_peers.py`` (the peers themselves are not
installed here; the script's own runs are recorded in BENCHMARKS.md)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def vs_peers():
    spec = importlib.util.spec_from_file_location("vs_peers", ROOT / "benchmarks" / "vs_peers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def documents(vs_peers):
    return [r["document"] for r in vs_peers._ares()]


def digest(table) -> str:
    text = json.dumps(table.to_pylist(), ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# Digests of the tables that the script built before it had --contexts-per-row (at
# commit b3aa7f4), which every run in BENCHMARKS.md up to 2026-12-01 used: one context
# per row must still give exactly those rows.
ONE_CONTEXT_DIGESTS = {50: "00b025ec70c76276", 1000: "915d111f313dc2e0"}


@pytest.mark.parametrize("n", sorted(ONE_CONTEXT_DIGESTS))
def test_one_context_rows_are_the_recorded_ones(vs_peers, n):
    assert digest(vs_peers.build_rows(n, 300, 300)) == ONE_CONTEXT_DIGESTS[n]


def test_sample_rows_take_the_next_rows_documents_as_distractors(vs_peers, documents):
    table = vs_peers.build_rows(3, 300, 40, contexts_per_row=3).to_pylist()
    assert [r["row_id"] for r in table] == ["ares-0", "ares-1", "ares-2"]
    for i, row in enumerate(table):
        assert row["contexts"] == [documents[i][:40], documents[i + 1][:40],
                                   documents[i + 2][:40]]
        assert row["reference"] == row["answer"]


def test_more_contexts_keep_each_synthetic_rows_own_parts(vs_peers, documents):
    one = vs_peers.build_rows(400, 300, 300).to_pylist()
    five = vs_peers.build_rows(400, 300, 300, contexts_per_row=5).to_pylist()
    assert len(five) == 400
    for a, b in zip(one, five):
        assert (a["row_id"], a["question"], a["answer"]) == (b["row_id"], b["question"],
                                                           b["answer"])
        assert b["contexts"][0] == a["contexts"][0]
        assert len(b["contexts"]) == 5
        for context in b["contexts"]:
            # a window of 300 characters of one document, or the whole of a shorter one
            assert any(context in d and len(context) == min(300, len(d)) for d in documents)
    # the distractors are drawn, not copies of the row's own context
    assert sum(b["contexts"][1] != b["contexts"][0] for b in five) > 390


def test_rows_are_deterministic_and_seeded(vs_peers):
    a = vs_peers.build_rows(300, 300, 300, contexts_per_row=2)
    assert digest(a) == digest(vs_peers.build_rows(300, 300, 300, contexts_per_row=2))
    assert digest(a) != digest(vs_peers.build_rows(300, 300, 300, seed=1, contexts_per_row=2))


def test_device_defaults_follow_num_gpus(vs_peers):
    cpu = vs_peers.parse_args([])
    assert (cpu.max_num_seqs, cpu.batch_size, cpu.ragbatch_concurrency) == (32, 64, 32)
    assert (cpu.ragas_workers, cpu.tonic_workers) == ("16,48", "16,64")
    gpu = vs_peers.parse_args(["--num-gpus", "1"])
    assert (gpu.max_num_seqs, gpu.batch_size, gpu.ragbatch_concurrency) == (None, 256, 256)
    assert (gpu.ragas_workers, gpu.tonic_workers) == ("16,64,256", "16,64,256")
    # what is given on the command line stays
    given = vs_peers.parse_args(["--num-gpus", "1", "--batch-size", "8", "--max-num-seqs", "4"])
    assert (given.batch_size, given.max_num_seqs) == (8, 4)


def test_contexts_per_row_below_one_is_refused(vs_peers, capsys):
    with pytest.raises(SystemExit):
        vs_peers.parse_args(["--contexts-per-row", "0"])
    assert "--contexts-per-row must be 1 or more" in capsys.readouterr().err
