"""Reading inputs: discovery, formats, task planning, fingerprints and read errors."""

from __future__ import annotations

import csv
import gzip
import json
import pickle
import uuid
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from ragbatch.config.job import InputSection
from ragbatch.core.errors import InputError
from ragbatch.io import (
    NONSTRING_COLUMN,
    ReadTask,
    input_fingerprint,
    is_process_local,
    normalize,
    peek_schema,
    plan_read,
    read_task,
    resolve,
    to_pyarrow,
)

DATA = Path(__file__).resolve().parents[1] / "examples" / "data"
ARES = DATA / "ares" / "datasets_v2__LLM_Judge_Test_Set_Human_Annotations.tsv"
TONIC = DATA / "tonic_validate_paul_graham"
TRULENS = DATA / "trulens" / "cortex_eval_df_with_trulens_scores.csv"


def cfg(uri, **kwargs) -> InputSection:
    return InputSection(uri=str(uri), **kwargs)


def read_all(config: InputSection, **plan_kwargs) -> tuple[list[ReadTask], pa.Table]:
    tasks = plan_read(config, **plan_kwargs)
    tables = [read_task(t, config) for t in tasks]
    return tasks, pa.concat_tables(tables, promote_options="permissive")


def write_csv(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode(encoding))
    return path


@pytest.fixture()
def memory_root():
    fs = fsspec.filesystem("memory")
    root = f"/rb-{uuid.uuid4().hex[:8]}"
    yield fs, root
    if fs.exists(root):
        fs.rm(root, recursive=True)


# --------------------------------------------------------------------------- formats


def test_parquet_single_file(tmp_path):
    table = pa.table({"q": ["a", "b", None], "n": [1, 2, 3]})
    pq.write_table(table, tmp_path / "one.parquet")
    tasks, got = read_all(cfg(tmp_path / "one.parquet"))
    assert tasks == [ReadTask(str(tmp_path / "one.parquet"), "one.parquet", "parquet")]
    assert got.equals(table)


def test_parquet_row_groups_split_into_tasks_with_row_offsets(tmp_path):
    table = pa.table({"i": list(range(35))})
    pq.write_table(table, tmp_path / "big.pq", row_group_size=10)  # groups of 10, 10, 10, 5
    config = cfg(tmp_path / "big.pq")
    tasks = plan_read(config, target_rows_per_task=25)
    assert [(t.row_groups, t.row_offset) for t in tasks] == [((0, 1), 0), ((2, 3), 20)]
    tasks = plan_read(config, target_rows_per_task=10)
    assert [(t.row_groups, t.row_offset) for t in tasks] == [
        ((0,), 0),
        ((1,), 10),
        ((2,), 20),
        ((3,), 30),
    ]
    parts = [read_task(t, config) for t in tasks]
    assert [p.num_rows for p in parts] == [10, 10, 10, 5]
    assert [p["i"][0].as_py() for p in parts] == [t.row_offset for t in tasks]
    ids = [normalize(p, config, t)["row_id"].to_pylist() for p, t in zip(parts, tasks)]
    assert sum(ids, []) == [f"big.pq:{i}" for i in range(35)]


def test_hive_partitioned_parquet_directory(tmp_path):
    root = tmp_path / "traces"
    for system, rows in (("b", ["x"]), ("a", ["y", "z"])):
        (root / f"system={system}").mkdir(parents=True)
        pq.write_table(pa.table({"q": rows}), root / f"system={system}" / "part-0.parquet")
    (root / "_SUCCESS").write_text("")
    (root / ".part-0.parquet.crc").write_text("x")
    (root / "_temporary").mkdir()
    pq.write_table(pa.table({"q": ["junk"]}), root / "_temporary" / "part-9.parquet")
    config = cfg(root)
    tasks, got = read_all(config)
    assert [t.file_key for t in tasks] == ["system=a/part-0.parquet", "system=b/part-0.parquet"]
    assert [t.partition for t in tasks] == [(("system", "a"),), (("system", "b"),)]
    assert got.to_pydict() == {"q": ["y", "z", "x"], "system": ["a", "a", "b"]}
    assert got.schema.field("system").type == pa.string()
    assert peek_schema(config) == pa.schema([("q", pa.string()), ("system", pa.string())])


def test_hive_partition_values_are_unquoted_and_hive_null_is_null(tmp_path):
    write_csv(tmp_path / "app=a%2Fb" / "x.csv", "q\n1\n")
    write_csv(tmp_path / "app=__HIVE_DEFAULT_PARTITION__" / "y.csv", "q\n2\n")
    _, got = read_all(cfg(tmp_path))
    # "_" sorts before "a": the null partition comes first
    assert got.to_pydict() == {"q": ["2", "1"], "app": [None, "a/b"]}


def test_inconsistent_partition_levels_are_an_error(tmp_path):
    write_csv(tmp_path / "app=a" / "x.csv", "q\n1\n")
    write_csv(tmp_path / "y.csv", "q\n2\n")
    with pytest.raises(
        InputError,
        match=r"hive partition directories differ.*"
        r"app=a/x.csv has \['app'\] but y.csv has \[\]",
    ):
        plan_read(cfg(tmp_path))


def test_jsonl_keeps_values_and_marks_mixed_columns(tmp_path):
    lines = [
        {"q": "héllo 世界 👋", "answer": "42", "n": 1, "ctx": ["a", "b"]},
        {"q": "second", "answer": 42, "n": 2.5, "ctx": ["c"]},
        {"q": None, "answer": {"text": "x"}, "extra": True},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text(
        "\n".join(json.dumps(x, ensure_ascii=False) for x in lines) + "\n\n", encoding="utf-8"
    )
    _, got = read_all(cfg(path))
    assert got.column_names == ["q", "answer", "n", "ctx", "extra", NONSTRING_COLUMN]
    assert got["q"].to_pylist() == ["héllo 世界 👋", "second", None]
    assert got["n"].type == pa.float64() and got["n"].to_pylist() == [1.0, 2.5, None]
    assert got["ctx"].type == pa.list_(pa.string())
    # "answer" mixes a string, a number and an object: strings verbatim, the rest JSON text
    assert got["answer"].type == pa.string()
    assert got["answer"].to_pylist() == ["42", "42", '{"text": "x"}']
    assert got[NONSTRING_COLUMN].to_pylist() == [None, ["answer"], ["answer"]]
    assert got["extra"].to_pylist() == [None, None, True]


def test_json_array_and_json_lines_with_json_extension(tmp_path):
    records = [{"q": "a", "k": 1}, {"q": "b", "k": 2}]
    (tmp_path / "arr.json").write_text("  \n" + json.dumps(records, indent=2))
    (tmp_path / "lines.json").write_text("\n".join(json.dumps(r) for r in records))
    for name in ("arr.json", "lines.json"):
        tasks, got = read_all(cfg(tmp_path / name))
        assert tasks[0].format == "json"
        assert got.to_pylist() == records
    assert peek_schema(cfg(tmp_path / "arr.json")) == pa.schema(
        [("q", pa.string()), ("k", pa.int64())]
    )


def test_csv_reads_every_column_as_string_and_only_empty_as_null(tmp_path):
    path = write_csv(
        tmp_path / "t.csv",
        'id,q,latency\n007,"multi\nline, with comma",1.5\n008,,NA\n009,"",null\n',
    )
    _, got = read_all(cfg(path))
    assert got.schema == pa.schema(
        [("id", pa.string()), ("q", pa.string()), ("latency", pa.string())]
    )
    assert got.to_pydict() == {
        "id": ["007", "008", "009"],
        "q": ["multi\nline, with comma", None, None],
        "latency": ["1.5", "NA", "null"],
    }


def test_tsv_and_tab_extension(tmp_path):
    text = 'q\tanswer\n"say ""hi"""\t 2 \n'
    for name in ("t.tsv", "t.tab"):
        path = write_csv(tmp_path / name, text)
        tasks, got = read_all(cfg(path))
        assert tasks[0].format == "tsv"
        assert got.to_pydict() == {"q": ['say "hi"'], "answer": [" 2 "]}


def test_gzipped_csv(tmp_path):
    path = tmp_path / "t.csv.gz"
    path.write_bytes(gzip.compress("q,a\nx,007\n".encode()))
    tasks, got = read_all(cfg(path))
    assert tasks[0].format == "csv"
    assert got.to_pydict() == {"q": ["x"], "a": ["007"]}


def test_encoding_option_decodes_latin1(tmp_path):
    path = write_csv(tmp_path / "t.csv", "q\ncafé\n", encoding="latin-1")
    _, got = read_all(cfg(path, encoding="latin-1"))
    assert got["q"].to_pylist() == ["café"]


def test_utf8_byte_order_mark_is_not_part_of_the_first_column(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b"\xef\xbb\xbfq,a\nx,y\n")
    _, got = read_all(cfg(path))
    assert got.column_names == ["q", "a"]


def test_empty_csv_and_header_only_csv(tmp_path):
    write_csv(tmp_path / "a.csv", "q,a\n")
    write_csv(tmp_path / "b.csv", "")
    config = cfg(tmp_path)
    tables = [read_task(t, config) for t in plan_read(config)]
    assert [t.num_rows for t in tables] == [0, 0]
    assert tables[0].column_names == ["q", "a"]
    assert peek_schema(config).names == ["q", "a"]


# --------------------------------------------------------------------------- locations


def test_directory_glob_file_url_and_relative_path_agree(tmp_path, monkeypatch):
    write_csv(tmp_path / "d" / "b.csv", "q\n2\n")
    write_csv(tmp_path / "d" / "a.csv", "q\n1\n")
    write_csv(tmp_path / "d" / "sub" / "c.csv", "q\n3\n")
    expected_keys = ["a.csv", "b.csv", "sub/c.csv"]
    monkeypatch.chdir(tmp_path)
    for uri in (tmp_path / "d", f"file://{tmp_path}/d", "d", "d/", "./d"):
        tasks, got = read_all(cfg(uri))
        assert [t.file_key for t in tasks] == expected_keys, uri
        assert got["q"].to_pylist() == ["1", "2", "3"]
    tasks, _ = read_all(cfg(tmp_path / "d" / "*.csv"))
    assert [t.file_key for t in tasks] == ["a.csv", "b.csv"]
    tasks, _ = read_all(cfg(f"{tmp_path}/d/**/*.csv"))
    assert [t.file_key for t in tasks] == expected_keys
    tasks, _ = read_all(cfg(tmp_path / "d" / "sub" / "c.csv"))
    assert [t.file_key for t in tasks] == ["c.csv"]


def test_ordering_is_deterministic(tmp_path):
    for name in ("z.jsonl", "m.jsonl", "a.jsonl", "k/b.jsonl"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text('{"q": "%s"}\n' % name)
    first = plan_read(cfg(tmp_path))
    assert first == plan_read(cfg(tmp_path))
    assert [t.file_key for t in first] == ["a.jsonl", "k/b.jsonl", "m.jsonl", "z.jsonl"]


def test_memory_filesystem(memory_root):
    fs, root = memory_root
    fs.pipe(f"{root}/part=1/x.csv", b"q\nhello\n")
    fs.pipe(f"{root}/part=2/y.csv", b"q\nworld\n")
    config = cfg(f"memory://{root}")
    tasks, got = read_all(config)
    assert [t.file_key for t in tasks] == ["part=1/x.csv", "part=2/y.csv"]
    assert got.to_pydict() == {"q": ["hello", "world"], "part": ["1", "2"]}
    memory_fs, _ = resolve(config.uri, {})
    assert is_process_local(memory_fs)
    fingerprint = input_fingerprint(config, tasks)
    assert [f["path"] for f in fingerprint["files"]] == [
        f"memory://{root}/part=1/x.csv",
        f"memory://{root}/part=2/y.csv",
    ]


def test_resolve_and_pyarrow_bridge(tmp_path):
    local, path = resolve(str(tmp_path), {})
    assert not is_process_local(local) and path == str(tmp_path)
    assert isinstance(to_pyarrow(local), pafs.LocalFileSystem)
    memory, _ = resolve("memory://x", {})
    bridged = to_pyarrow(memory)
    assert isinstance(bridged, pafs.PyFileSystem)


def test_read_task_is_picklable():
    task = ReadTask("b/k.parquet", "k.parquet", "parquet", 10, (2, 3), (("a", "1"),))
    assert pickle.loads(pickle.dumps(task)) == task


def test_fingerprint_uses_metadata_only(tmp_path):
    (tmp_path / "a.parquet").write_bytes(b"not parquet at all")
    write_csv(tmp_path / "b.csv", "q\n1\n")
    config = cfg(tmp_path, format="csv")
    tasks = plan_read(config)
    fp = input_fingerprint(config, tasks)
    assert fp["files"] == [
        {
            "path": str(tmp_path / "b.csv"),
            "size": 4,
            "etag_or_mtime": fp["files"][0]["etag_or_mtime"],
        }
    ]
    assert fp["files"][0]["etag_or_mtime"] is not None
    assert len(fp["sha256"]) == 64 and input_fingerprint(config, tasks) == fp
    write_csv(tmp_path / "b.csv", "q\n12\n")
    assert input_fingerprint(config, tasks)["sha256"] != fp["sha256"]


def test_format_option_reads_unrecognised_names(tmp_path):
    write_csv(tmp_path / "part-0000", "q\nx\n")
    write_csv(tmp_path / "part-0001", "q\ny\n")
    _, got = read_all(cfg(tmp_path, format="csv"))
    assert got["q"].to_pylist() == ["x", "y"]


def test_non_data_files_next_to_data_are_ignored(tmp_path):
    write_csv(tmp_path / "a.csv", "q\nx\n")
    (tmp_path / "LICENSE").write_text("MIT")
    (tmp_path / "SOURCE.md").write_text("# source")
    tasks, _ = read_all(cfg(tmp_path))
    assert [t.file_key for t in tasks] == ["a.csv"]


# --------------------------------------------------------------------------- shipped data


def test_ares_tsv_has_200_rows_and_8_columns():
    config = cfg(ARES)
    _, got = read_all(config)
    assert got.shape == (200, 8)
    assert got.column_names == [
        "Reaction",
        "Sources",
        "Question",
        "Document",
        "Answer",
        "Context_Relevance_Label",
        "Answer_Faithfulness_Label",
        "Answer_Relevance_Label",
    ]
    assert all(t == pa.string() for t in got.schema.types)
    with ARES.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle, delimiter="\t"))
    assert rows[0] == got.column_names
    assert [r[3] or None for r in rows[1:]] == got["Document"].to_pylist()


def test_tonic_directory_reads_six_runs_with_system_column():
    config = cfg(TONIC)
    tasks, got = read_all(config)
    assert len(tasks) == 6
    assert got.num_rows == 330
    assert got.column_names == [
        "reference_question",
        "reference_answer",
        "llm_answer",
        "llm_context",
        "answer_similarity",
        "system",
    ]
    counts = got.group_by("system").aggregate([("system", "count")]).to_pydict()
    assert dict(zip(counts["system"], counts["system_count"])) == {
        s: 55 for s in ("chatbees", "cohere", "customgpt", "openai", "titan", "vertex")
    }
    assert "system" in peek_schema(config).names


def test_trulens_csv_contexts_are_excerpts():
    config = cfg(
        TRULENS,
        columns={
            "question": "query",
            "contexts": "rag_context",
            "answer": "llm_answer",
            "reference": "expected_response",
        },
    )
    tasks, raw = read_all(config)
    assert raw.shape == (60, 37)
    out = normalize(raw, config, tasks[0])
    first = json.loads(raw["rag_context"][0].as_py())
    assert out["contexts"][0].as_py() == [item["excerpt"] for item in first]
    assert out["_issues"].combine_chunks().field("contexts").null_count == 60
    assert out["contexts"].null_count == raw["rag_context"].null_count


# --------------------------------------------------------------------------- errors


def test_missing_path(tmp_path):
    missing = tmp_path / "nope" / "x.csv"
    with pytest.raises(InputError, match=r"x\.csv: not found") as info:
        plan_read(cfg(missing))
    assert str(missing) in str(info.value)


def test_empty_directory(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match=r"empty: no input files \(the directory holds nothing\)"):
        plan_read(cfg(tmp_path / "empty"))


def test_directory_without_data_files_lists_what_it_found(tmp_path):
    (tmp_path / "LICENSE").write_text("MIT")
    with pytest.raises(
        InputError,
        match=r"no data files: the directory holds 1 file\(s\) \(0 hidden, e\.g\. LICENSE\)",
    ):
        plan_read(cfg(tmp_path))


def test_glob_matching_nothing(tmp_path):
    with pytest.raises(InputError, match=r"\*\.parquet: the glob matched no files"):
        plan_read(cfg(tmp_path / "*.parquet"))


def test_mixed_formats_are_listed(tmp_path):
    write_csv(tmp_path / "a.csv", "q\n1\n")
    (tmp_path / "b.jsonl").write_text('{"q": 1}\n')
    (tmp_path / "c.jsonl").write_text('{"q": 1}\n')
    with pytest.raises(InputError) as info:
        plan_read(cfg(tmp_path))
    message = str(info.value)
    assert (
        "mixes file formats (csv: 1 file(s), e.g. a.csv; jsonl: 2 file(s), e.g. b.jsonl)" in message
    )
    assert "input.format" in message
    assert [t.file_key for t in plan_read(cfg(tmp_path, format="jsonl"))] == ["b.jsonl", "c.jsonl"]


def test_single_file_without_known_extension_needs_format(tmp_path):
    write_csv(tmp_path / "data.txt", "q\n1\n")
    with pytest.raises(InputError, match="cannot tell the file format.*set input.format"):
        plan_read(cfg(tmp_path / "data.txt"))
    _, got = read_all(cfg(tmp_path / "data.txt", format="csv"))
    assert got["q"].to_pylist() == ["1"]


def test_bad_json_line_names_file_and_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"q": "a"}\n\n{"q": "b",}\n{"q": "c"}\n')
    config = cfg(path)
    with pytest.raises(InputError) as info:
        read_task(plan_read(config)[0], config)
    assert str(info.value).startswith(f"{path}, line 3: not valid JSON (")
    assert "fix or remove that line" in str(info.value)


def test_json_line_that_is_not_an_object(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"q": "a"}\n[1, 2]\n')
    config = cfg(path)
    with pytest.raises(
        InputError, match=r"line 2: expected a JSON object \(one record per line\), got list"
    ):
        read_task(plan_read(config)[0], config)


def test_bad_json_array_gives_line_and_column(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('[\n  {"q": "a"},\n  {"q": }\n]')
    config = cfg(path)
    with pytest.raises(InputError, match=r"t\.json: not valid JSON at line 3, column 9"):
        read_task(plan_read(config)[0], config)


def test_misencoded_file_names_offset_line_and_option(tmp_path):
    path = write_csv(tmp_path / "t.csv", "q\nok\ncafé\n", encoding="latin-1")
    config = cfg(path)
    with pytest.raises(InputError) as info:
        read_task(plan_read(config)[0], config)
    message = str(info.value)
    assert message.startswith(f"{path}: byte 0xe9 at byte offset 8 (line 3) is not valid utf-8")
    assert "set input.encoding" in message
    with pytest.raises(InputError, match=r"line 3\) is not valid utf-8"):
        peek_schema(cfg(path))


def test_misencoded_jsonl(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"q": "a"}\n{"q": "caf\xe9"}\n')
    config = cfg(path)
    with pytest.raises(
        InputError, match=r"byte 0xe9 at byte offset 21 \(line 2\).*input\.encoding"
    ):
        read_task(plan_read(config)[0], config)


def test_unknown_encoding(tmp_path):
    path = write_csv(tmp_path / "t.csv", "q\n1\n")
    config = cfg(path, encoding="klingon")
    with pytest.raises(InputError, match="input.encoding: unknown encoding 'klingon'"):
        read_task(plan_read(config)[0], config)


def test_corrupt_parquet(tmp_path):
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"PAR1 this is not really parquet")
    with pytest.raises(InputError) as info:
        plan_read(cfg(path))
    assert str(info.value).startswith(f"{path}: not a readable Parquet file (")
    assert "corrupt" in str(info.value)
    task = ReadTask(str(path), "bad.parquet", "parquet")
    with pytest.raises(InputError, match="not a readable Parquet file"):
        read_task(task, cfg(path))


def test_file_deleted_after_planning(tmp_path):
    path = write_csv(tmp_path / "t.csv", "q\n1\n")
    config = cfg(path)
    task = plan_read(config)[0]
    path.unlink()
    with pytest.raises(InputError, match=r"t\.csv: not found"):
        read_task(task, config)


def test_malformed_csv_row(tmp_path):
    path = write_csv(tmp_path / "t.csv", "a,b\n1,2\n3,4,5\n")
    config = cfg(path)
    with pytest.raises(InputError, match=r"t\.csv: malformed CSV: .*Expected 2 columns, got 3"):
        read_task(plan_read(config)[0], config)


def test_duplicate_header_names(tmp_path):
    path = write_csv(tmp_path / "t.csv", "a,b,a\n1,2,3\n")
    config = cfg(path)
    with pytest.raises(InputError, match=r"repeats column name\(s\) \['a'\]"):
        read_task(plan_read(config)[0], config)


def test_truncated_gzip(tmp_path):
    path = tmp_path / "t.csv.gz"
    data = gzip.compress(("q\n" + "".join(f"{i * 7919}\n" for i in range(2000))).encode())
    path.write_bytes(data[: len(data) // 2])
    config = cfg(path)
    with pytest.raises(InputError, match=r"t\.csv\.gz: cannot decompress as gzip"):
        read_task(plan_read(config)[0], config)


def test_missing_backend_names_the_extra():
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("gcsfs is installed")
    with pytest.raises(InputError, match=r"gs://bucket/x\.csv: .*pip install 'ragbatch\[gcs\]'"):
        resolve("gs://bucket/x.csv", {})


def test_a_plan_lists_its_input_once_and_fingerprints_what_it_planned(tmp_path, monkeypatch):
    """Planning a run lists the input directory once: the read tasks, the schema and the
    fingerprint the manifest and resume records use all come from that listing, and
    they equal what separate listings give."""
    import ragbatch.io.listing as listing
    from ragbatch.config.job import JobConfig
    from ragbatch.pipeline.plan import build_plan

    for day, answers in (("2024-01-01", ["a", "b"]), ("2024-01-02", ["c"])):
        (tmp_path / "in" / f"day={day}").mkdir(parents=True)
        pq.write_table(
            pa.table({"q": ["?"] * len(answers), "ans": answers}),
            tmp_path / "in" / f"day={day}" / "part-0.parquet",
        )
    listings: list[str] = []
    real = listing._list_tree
    monkeypatch.setattr(
        listing, "_list_tree", lambda fs, uri, path: listings.append(path) or real(fs, uri, path)
    )
    config = JobConfig.model_validate(
        {
            "input": {
                "uri": str(tmp_path / "in"),
                "columns": {"question": "q", "answer": "ans"},
            },
            "output": {"uri": str(tmp_path / "out")},
            "metrics": [{"name": "response_length", "params": {"max_chars": 5}}],
        }
    )
    plan = build_plan(config)
    assert len(listings) == 1
    assert plan.input_fingerprint == input_fingerprint(config.input, plan.read_tasks)
    assert [f["path"] for f in plan.input_fingerprint["files"]] == [
        str(tmp_path / "in" / f"day={d}" / "part-0.parquet") for d in ("2024-01-01", "2024-01-02")
    ]
    assert plan.read_tasks == plan_read(config.input)
    assert plan.input_schema == peek_schema(config.input)
    assert len(listings) == 4  # the three separate calls list again
