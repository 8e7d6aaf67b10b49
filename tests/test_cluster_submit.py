"""``ragbatch submit / status / logs`` and ``ray job submit`` on a real two-node Ray cluster.

The module starts its own cluster (``tests/support/ray_cluster.py``): a head node and a second
node with the custom resource ``stage_node``, both ``ray start --block`` processes on
this machine, stopped at the end, with this checkout on their PYTHONPATH (ragbatch
installed in the cluster's Python, as an image would have it). It never connects a
driver to it from this process (the session's ``ray_local`` lives here); everything goes
through the job server's HTTP API.

The demo job scores six Paul Graham rows (two systems x three questions; one answer
replaced by its reference in upper case) with ``semantic_similarity`` on the packaged
MiniLM, whose engine is pinned to ``stage_node``, plus ``exact_match`` and
``response_length``. It is submitted twice at once: through ``ragbatch submit --wait`` and
through ``ray job submit``, both shipping a checkout. A second job is submitted from a
folder that is not a checkout: only its config and the ``binary`` callback module next to
it are shipped, and the cluster runs its installed ragbatch.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

from ragbatch.cli import main
from ragbatch.core.errors import ConfigError
from support.ray_cluster import STAGE_NODE_RESOURCE, cluster_env, start_two_node_cluster

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
TONIC = REPO / "examples/data/tonic_validate_paul_graham"
BIN = Path(sys.executable).parent
ROWS_PER_SYSTEM = 3
METRICS = ("semantic_similarity", "exact_match", "response_length")
MAX_CHARS = 1500
#: The one row whose answer is replaced by its reference in upper case.
SAME_AS_REFERENCE = "system=openai/part.csv:1"


@pytest.fixture(scope="module")
def cluster():
    c = start_two_node_cluster(python_path=str(REPO), second_cpus=2, stage_slots=2)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """What a job ships: the code (ragbatch/, udfs/, jobs/), six input rows and the config.
    The output root is outside it (an absolute path both nodes of this machine write)."""
    root = tmp_path_factory.mktemp("cluster_job")
    work = root / "work"
    for part in ("ragbatch", "udfs", "jobs"):
        shutil.copytree(REPO / part, work / part, ignore=shutil.ignore_patterns("__pycache__"))
    for system in ("openai", "cohere"):
        source = next((TONIC / f"system={system}").glob("*.csv"))
        with source.open(newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))[:ROWS_PER_SYSTEM]
        if system == "openai":
            rows[1]["llm_answer"] = rows[1]["reference_answer"].upper()
        target = work / f"data/system={system}/part.csv"
        target.parent.mkdir(parents=True)
        with target.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    config = {
        "run": {"name": "cluster-submit"},
        "input": {
            "uri": "data/",
            "format": "csv",
            "contexts_format": "json",
            "columns": {
                "question": "reference_question",
                "contexts": "llm_context",
                "answer": "llm_answer",
                "reference": "reference_answer",
            },
        },
        "output": {"uri": str(root / "out")},
        "metrics": [
            {"name": "semantic_similarity", "engine": "minilm"},
            {"name": "exact_match", "params": {"case_sensitive": False}},
            {"name": "response_length", "params": {"min_chars": 1, "max_chars": MAX_CHARS}},
        ],
        "engines": {
            "minilm": {
                "type": "embedding",
                "num_cpus": 1,
                "concurrency": 1,
                "batch_size": 8,
                "resources": {STAGE_NODE_RESOURCE: 1},
            }
        },
    }
    (work / "job.yaml").write_text(yaml.safe_dump(config))
    return work


def _client_env() -> dict[str, str]:
    """The cluster's environment, plus this checkout on PYTHONPATH for the ``ragbatch``
    command itself (the job imports what the working dir ships)."""
    return dict(cluster_env(), PYTHONPATH=str(REPO))


def _expected(work: Path) -> dict[tuple[str, str], float]:
    """exact_match and response_length per (row_id, metric), worked out from the CSVs."""
    out = {}
    for path in sorted((work / "data").glob("system=*/part.csv")):
        with path.open(newline="", encoding="utf-8") as fh:
            for i, row in enumerate(csv.DictReader(fh)):
                rid = f"{path.parent.name}/part.csv:{i}"
                answer, reference = row["llm_answer"], row["reference_answer"]
                out[rid, "exact_match"] = float(answer.strip().lower() == reference.strip().lower())
                out[rid, "response_length"] = float(1 <= len(answer) <= MAX_CHARS)
    return out


def _in_process(monkeypatch, cwd: Path) -> None:
    """Run the CLI here: auth off, in ``cwd``; ``sys.path`` restored afterwards (a
    submission puts the working dir on it, for metric callbacks)."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "path", list(sys.path))


def _check_run(output_root: Path, run_id: str, work: Path, second_node: str) -> None:
    scores = (
        pl.scan_parquet(f"{output_root}/scores/**/*.parquet", hive_partitioning=True)
        .filter(pl.col("run_id") == run_id)
        .collect()
    )
    assert scores.height == 2 * ROWS_PER_SYSTEM * len(METRICS)
    assert scores["status"].unique().to_list() == ["ok"]
    by_cell = {(r["row_id"], r["metric"]): r["score"] for r in scores.iter_rows(named=True)}
    for key, value in _expected(work).items():
        assert by_cell[key] == value, key
    similarity = {rid: s for (rid, m), s in by_cell.items() if m == "semantic_similarity"}
    assert len(similarity) == 2 * ROWS_PER_SYSTEM
    # The uncased MiniLM embeds an answer equal to its reference up to case identically.
    assert similarity.pop(SAME_AS_REFERENCE) == pytest.approx(1.0, abs=1e-5)
    assert all(0.0 <= s < 0.99 for s in similarity.values()), similarity

    manifest = json.loads(
        next(output_root.glob(f"runs/run_date=*/run_id={run_id}/manifest.json")).read_text()
    )
    assert manifest["rows"]["input"] == 2 * ROWS_PER_SYSTEM
    assert manifest["placement"]["model:minilm"]["node_ids"] == [second_node]


@pytest.mark.release
def test_demo_job_through_ragbatch_submit_and_ray_job_submit(cluster, workdir, capsys, monkeypatch):
    env = _client_env()
    # Both at once: each polls its job to the end while the other's runs.
    via_ragbatch = subprocess.Popen(
        [
            str(BIN / "ragbatch"),
            "submit",
            "job.yaml",
            "--address",
            cluster.dashboard_url,
            "--working-dir",
            ".",
            "--wait",
            "--run-id",
            "via-ragbatch",
            "--run-date",
            "2026-11-28",
        ],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    via_ray = subprocess.Popen(
        [
            str(BIN / "ray"),
            "job",
            "submit",
            "--address",
            cluster.dashboard_url,
            "--working-dir",
            str(workdir),
            "--submission-id",
            "rb-via-ray",
            "--",
            "python",
            "jobs/run.py",
            "job.yaml",
            "--run-id",
            "via-ray",
        ],
        cwd=workdir.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out_a, err_a = via_ragbatch.communicate(timeout=400)
    out_b, err_b = via_ray.communicate(timeout=400)
    assert via_ragbatch.returncode == 0, out_a[-3000:] + err_a[-3000:]
    assert via_ray.returncode == 0, out_b[-3000:] + err_b[-3000:]

    output_root = workdir.parent / "out"
    job_line = next(line for line in out_a.splitlines() if line.startswith("submitted job "))
    job_id = job_line.split()[2]
    assert (
        f"  manifest:  {output_root}/runs/run_date=2026-11-28/run_id=via-ragbatch/manifest.json"
        in out_a
    )
    assert f"  dashboard: {cluster.dashboard_url}/#/jobs/{job_id}" in out_a
    assert out_a.rstrip().endswith(f"job {job_id} SUCCEEDED: Job finished successfully.")

    _in_process(monkeypatch, workdir)
    assert _client(cluster).get_job_status("rb-via-ray") == "SUCCEEDED"

    second_node = cluster.node_id_with(STAGE_NODE_RESOURCE)
    _check_run(output_root, "via-ragbatch", workdir, second_node)
    _check_run(output_root, "via-ray", workdir, second_node)

    code = main(["status", job_id, "--address", cluster.dashboard_url])
    out = capsys.readouterr().out
    assert code == 0
    assert f"job {job_id}: SUCCEEDED" in out and "driver exit code: 0" in out
    assert "run: via-ragbatch (run date 2026-11-28), config job.yaml" in out

    assert main(["logs", job_id, "--address", cluster.dashboard_url]) == 0
    assert "run via-ragbatch committed (6 rows x 3 metrics = 18 cells)" in capsys.readouterr().out
    # --follow on a finished job streams what it printed, then returns.
    assert main(["logs", "rb-via-ray", "--follow", "--address", cluster.dashboard_url]) == 0
    assert "run via-ray committed (6 rows x 3 metrics = 18 cells)" in capsys.readouterr().out


def _client(cluster):
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(cluster.dashboard_url)


def _jobs(cluster) -> int:
    return len(_client(cluster).list_jobs())


def test_nothing_is_submitted_for_a_broken_config(cluster, workdir, capsys, monkeypatch):
    _in_process(monkeypatch, workdir)
    before = _jobs(cluster)
    config = yaml.safe_load((workdir / "job.yaml").read_text())
    config["metrics"][1]["name"] = "exact_macth"
    (workdir / "broken.yaml").write_text(yaml.safe_dump(config))
    assert main(["submit", "broken.yaml", "--address", cluster.dashboard_url]) == 2
    assert "metrics[1].name" in capsys.readouterr().err

    assert (
        main(["submit", "job.yaml", "--output", "out/relative", "--address", cluster.dashboard_url])
        == 2
    )
    assert "relative local path" in capsys.readouterr().err

    outside = workdir.parent / "outside.yaml"
    shutil.copy(workdir / "job.yaml", outside)
    assert (
        main(["submit", str(outside), "--working-dir", ".", "--address", cluster.dashboard_url])
        == 2
    )
    assert "outside the working dir" in capsys.readouterr().err
    assert _jobs(cluster) == before


def test_working_dir_too_large_is_refused_before_submission(
    cluster, workdir, tmp_path, capsys, monkeypatch
):
    """The job server takes packages up to 100 MiB: a working dir with 101 MiB of random
    bytes (which do not compress) is refused, and nothing is submitted."""
    work = tmp_path / "big"
    (work / "jobs").mkdir(parents=True)
    shutil.copy(workdir / "jobs/run.py", work / "jobs/run.py")
    shutil.copy(workdir / "job.yaml", work / "job.yaml")
    (work / "blob.bin").write_bytes(os.urandom(101 * 2**20))
    _in_process(monkeypatch, work)
    before = _jobs(cluster)
    assert (
        main(["submit", "job.yaml", "--working-dir", ".", "--address", cluster.dashboard_url]) == 2
    )
    err = capsys.readouterr().err
    assert (
        f"working dir {work} is too large to ship: its zipped package exceeds the job "
        "server's limit of 100 MiB"
    ) in err
    assert ".rayignore" in err
    assert _jobs(cluster) == before


def test_unreachable_address_and_unknown_job(cluster, workdir, capsys, monkeypatch):
    from support.s3_fixtures import _free_port

    _in_process(monkeypatch, workdir)
    # RAY_ADDRESS names the live cluster, but --address wins.
    monkeypatch.setenv("RAY_ADDRESS", cluster.dashboard_url)
    nowhere = f"http://127.0.0.1:{_free_port()}"
    assert main(["submit", "job.yaml", "--working-dir", ".", "--address", nowhere]) == 1
    err = capsys.readouterr().err
    assert f"cannot reach a Ray job server at {nowhere}" in err and "ray start --head" in err
    assert "8265" in err

    assert main(["status", "raysubmit_nosuchjob"]) == 2  # the address from RAY_ADDRESS
    assert "no job 'raysubmit_nosuchjob'" in capsys.readouterr().err
    assert main(["logs", "raysubmit_nosuchjob"]) == 2


def test_wait_exits_with_the_jobs_own_status(cluster, workdir, tmp_path, capsys, monkeypatch):
    """An input that exists nowhere passes the local check (which never reads the
    input), and the job's driver exits with ragbatch's 2, which --wait passes on. The
    input is full of shell syntax that would create files if the entry point (which Ray
    runs through a shell) did not quote it; a run id of that kind is refused here."""
    _in_process(monkeypatch, workdir)
    markers = [tmp_path / f"injected-{i}" for i in range(4)]
    absent = f"data/absent/$(touch {markers[0]});touch {markers[1]}&&touch {markers[2]} #"
    code = main(
        [
            "submit",
            "job.yaml",
            "--working-dir",
            ".",
            "--input",
            absent,
            "--address",
            cluster.dashboard_url,
            "--wait",
            "--run-id",
            "absent-input",
        ]
    )
    out = capsys.readouterr().out
    assert code == 2, out
    with pytest.raises(SystemExit) as refused:  # argparse refuses the id: exit 2
        main(
            [
                "submit",
                "job.yaml",
                "--working-dir",
                ".",
                "--run-id",
                f"x;touch {markers[3]}",
                "--address",
                cluster.dashboard_url,
            ]
        )
    assert refused.value.code == 2
    assert "--run-id" in capsys.readouterr().err
    assert [m for m in markers if m.exists()] == []
    job_id = next(line for line in out.splitlines() if line.startswith("submitted job ")).split()[2]
    assert f"job {job_id}: FAILED" in out
    assert main(["status", job_id, "--address", cluster.dashboard_url]) == 0
    assert "driver exit code: 2" in capsys.readouterr().out
    assert main(["logs", job_id, "--address", cluster.dashboard_url]) == 0
    assert "data/absent" in capsys.readouterr().out


def test_nightly_submission_runs_jobs_nightly_for_the_night(workdir, monkeypatch):
    """``--nightly``: jobs/nightly.py, run id ``nightly-<night>``, ``{run_date}`` rendered
    in the printed paths; a run id fixed in the config is refused. Nothing is submitted."""
    from ragbatch.ops.submit import prepare_job

    monkeypatch.setattr(sys, "path", list(sys.path))
    config = yaml.safe_load((workdir / "job.yaml").read_text())
    root = config["output"]["uri"]
    config["output"]["uri"] = root + "/night={run_date:%Y%m%d}"
    (workdir / "nightly.yaml").write_text(yaml.safe_dump(config))
    request = prepare_job(
        workdir / "nightly.yaml", working_dir=workdir, nightly=True, run_date=dt.date(2026, 11, 28)
    )
    assert request.entrypoint == (
        "python jobs/nightly.py nightly.yaml --run-id nightly-2026-11-28 --run-date 2026-11-28"
    )
    assert request.output.manifest == (
        f"{root}/night=20261128/runs/run_date=2026-11-28/run_id=nightly-2026-11-28/manifest.json"
    )

    config["run"]["run_id"] = "fixed"
    (workdir / "nightly.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match="run.run_id: a nightly config cannot fix the run id"):
        prepare_job(workdir / "nightly.yaml", working_dir=workdir, nightly=True)


#: The callback of the job submitted without a checkout: an answer shorter than this passes.
SHORT_ANSWER = 1200


@pytest.mark.release
def test_submit_from_a_folder_that_is_not_a_checkout(
    cluster, workdir, tmp_path, capsys, monkeypatch
):
    """What a user who installed ragbatch with pip has: a config and a ``binary`` callback
    module in a folder of their own, submitted from another folder. The input and output
    are absolute paths every node reaches (this machine's). The cluster finds the callback
    only in what is shipped (its PYTHONPATH is the checkout), and runs ``python -m ragbatch``."""
    own = tmp_path / "my-evals"
    own.mkdir()
    (own / "answer_checks.py").write_text(
        f"def short(batch):\n    return batch['answer'].str.len_chars() < {SHORT_ANSWER}\n"
    )
    config = yaml.safe_load((workdir / "job.yaml").read_text())
    config["input"]["uri"] = str(workdir / "data")
    config["output"]["uri"] = str(tmp_path / "out")
    config["metrics"] = [
        {"name": "exact_match", "params": {"case_sensitive": False}},
        {"name": "binary", "id": "short_answer", "params": {"callback": "answer_checks:short"}},
    ]
    config.pop("engines")
    (own / "job.yaml").write_text(yaml.safe_dump(config))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _in_process(monkeypatch, elsewhere)

    code = main(
        [
            "submit",
            str(own / "job.yaml"),
            "--address",
            cluster.dashboard_url,
            "--wait",
            "--run-id",
            "from-package",
            "--run-date",
            "2026-11-28",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    job_id = next(line for line in out.splitlines() if line.startswith("submitted job ")).split()[2]
    info = _client(cluster).get_job_info(job_id)
    assert (
        info.entrypoint
        == "python -m ragbatch run job.yaml --run-id from-package --run-date 2026-11-28"
    )
    assert info.metadata["ragbatch_config"] == "job.yaml"

    scores = pl.scan_parquet(
        f"{tmp_path}/out/scores/**/*.parquet", hive_partitioning=True
    ).collect()
    assert scores["status"].unique().to_list() == ["ok"]
    got = {(r["row_id"], r["metric"]): r["score"] for r in scores.iter_rows(named=True)}
    expected = {key: value for key, value in _expected(workdir).items() if key[1] == "exact_match"}
    for path in sorted((workdir / "data").glob("system=*/part.csv")):
        with path.open(newline="", encoding="utf-8") as fh:
            for i, row in enumerate(csv.DictReader(fh)):
                expected[f"{path.parent.name}/part.csv:{i}", "short_answer"] = float(
                    len(row["llm_answer"]) < SHORT_ANSWER
                )
    assert got == expected
    assert sorted(set(expected.values())) == [0.0, 1.0]
    manifest = tmp_path / "out/runs/run_date=2026-11-28/run_id=from-package/manifest.json"
    assert json.loads(manifest.read_text())["rows"]["input"] == 2 * ROWS_PER_SYSTEM
