"""``ragbatch pairwise``: judge the answers of several systems to the same questions in
pairs, both orders, and rate the systems.

Steps, all in this process (no Ray):

1. :func:`read_answers` reads ``input`` with the job's readers and normalization (or
   the inputs behind committed runs, ``runs``) and keeps the system column, the
   canonical question and answer, and a content key per row
   (:func:`ragbatch.analysis.pairing.content_keys` over ``pairwise.match_on``).
2. :func:`build_pairs` matches questions across systems by that key and makes every
   unordered pair of systems that answered a question; each pair is judged in both
   orders. Rows with a null answer are left out of the pairs and counted.
3. :func:`judge_pairs` asks the pairwise preference judge
   (:class:`~ragbatch.judge.pairwise_preference.PairwisePreference`) through a
   :class:`~ragbatch.judge.run.JudgeRunner` with the judgment cache, so that a rerun
   makes no judge call; a failed or unparseable reply becomes a null verdict with its
   status and reason kept.
4. :func:`ragbatch.analysis.pairwise.pairwise_statistics` gives ratings, head-to-head
   counts, position consistency, position and length bias and the judge's flags;
   :func:`write_pairwise` writes them under
   ``<output.uri>/pairwise/run_date=<date>/run_id=<id>/``.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import logging
from dataclasses import dataclass, field
from typing import Any

import polars as pl
import pyarrow as pa

from ragbatch.analysis.pairwise import FIRST, SECOND, TIE, PairwiseResult, pairwise_statistics
from ragbatch.analysis.pairing import content_keys
from ragbatch.core.errors import InputError
from ragbatch.ops.pairwise_config import PairwiseConfig

log = logging.getLogger("ragbatch")

#: (pair, order) rows judged in one batch (one engine round, then a judgment-cache flush).
BATCH_ROWS = 512

#: Verdict of the judge's reply -> verdict of the verdict table.
_VERDICTS = {"A": FIRST, "B": SECOND, "tie": TIE}

#: The verdict table's columns and types, in order (the statistics read the first seven
#: of :data:`ragbatch.analysis.pairwise.VERDICT_SCHEMA` from it, ``question`` being the
#: content key there).
VERDICT_COLUMNS: dict[str, Any] = {
    "question": pl.String,
    "question_key": pl.String,
    "pair_id": pl.String,
    "order": pl.Int64,
    "first": pl.String,
    "second": pl.String,
    "verdict": pl.String,
    "first_chars": pl.Int64,
    "second_chars": pl.Int64,
    "reason": pl.String,
    "status": pl.String,
    "prompt_tokens": pl.Int64,
    "completion_tokens": pl.Int64,
    "judge_calls": pl.Int64,
    "cache_hits": pl.Int64,
    "judge_reply": pl.String,
    "model": pl.String,
}


@dataclass
class Pairs:
    """The pairs to judge.

    Attributes
    ----------
    frame : polars.DataFrame
        Two rows per pair (``order`` 1, then 2 with the answers swapped): ``question``
        (text), ``question_key`` (64 hex digits), ``pair_id`` (``<key>:<a>|<b>``, the
        same in both orders), ``order``, ``first``, ``second`` (system names),
        ``first_answer``, ``second_answer`` (str), ``first_chars``, ``second_chars``
        (Int64, answer lengths in Unicode code points).
    systems : list of str
        The systems compared, sorted.
    counts : dict
        ``rows`` read, ``null_answers`` (rows left out of the pairs), ``null_keys``
        (rows with an answer left out for a null ``match_on`` value), ``duplicates``
        (rows of a system repeating a question key it already answered; the first is
        kept), ``questions`` (questions judged), ``unmatched_questions`` (keys fewer than
        two systems answered), ``pairs``.
    """

    frame: pl.DataFrame
    systems: list[str]
    counts: dict[str, int] = field(default_factory=dict)


def read_answers(cfg: PairwiseConfig) -> pl.DataFrame:
    """The answers to compare as ``system``, ``question``, ``answer`` (str),
    ``question_key`` (the content key, 64 hex digits) and ``null_key`` (bool: a
    ``match_on`` value is null): the rows of ``input``, or those behind each committed
    run of ``runs`` (read again from the run's input, :mod:`ragbatch.analysis.inputs`).

    Raises
    ------
    InputError
        The input is unreadable or empty, or lacks the system column or a ``match_on``
        column (the message lists the columns it has); a run is not committed under its
        output root, or its input cannot be read again unchanged.
    """
    section = cfg.pairwise
    if cfg.runs is not None:
        frame = _run_rows(cfg)
        system_column = "system"
    else:
        frame = _input_rows(cfg)
        system_column = section.system_column
    available = sorted(c for c in frame.columns if not c.startswith("_"))
    if system_column not in frame.columns:
        raise InputError(
            f"pairwise.system_column: {system_column!r} is not a column of the "
            f"input; its columns: {available}"
        )
    missing = [c for c in section.match_on if c not in frame.columns]
    if missing:
        raise InputError(
            f"pairwise.match_on: column(s) {missing} are not in the input; its columns: {available}"
        )
    keys = content_keys(
        frame.select(pl.int_range(pl.len()).cast(pl.String).alias("row_id"), *section.match_on),
        section.match_on,
    )
    return pl.DataFrame(
        {
            "system": frame[system_column].cast(pl.String),
            "question": frame["question"].cast(pl.String)
            if "question" in frame.columns
            else pl.Series([None] * frame.height, dtype=pl.String),
            "answer": frame["answer"].cast(pl.String)
            if "answer" in frame.columns
            else pl.Series([None] * frame.height, dtype=pl.String),
            "question_key": keys["key"],
            "null_key": frame.select(
                pl.any_horizontal(pl.col(c).is_null() for c in section.match_on)
            ).to_series(),
        }
    )


def _input_rows(cfg: PairwiseConfig) -> pl.DataFrame:
    """``input``'s rows, normalized as a job reads them (canonical and slice columns)."""
    from ragbatch.io.read import plan_read, read_task
    from ragbatch.io.schema import normalize

    assert cfg.input is not None
    tables = [
        normalize(read_task(task, cfg.input), cfg.input, task) for task in plan_read(cfg.input)
    ]
    if not tables or sum(t.num_rows for t in tables) == 0:
        raise InputError(f"input {cfg.input.uri} holds no rows; nothing to compare")
    frame = pl.from_arrow(pa.concat_tables(tables, promote_options="permissive"))
    assert isinstance(frame, pl.DataFrame)
    return frame


def _run_rows(cfg: PairwiseConfig) -> pl.DataFrame:
    """The canonical input rows behind each run of ``runs``, with a ``system`` column
    (the run's ``system``, default its run id)."""
    from ragbatch.analysis.inputs import load_inputs
    from ragbatch.analysis.runs import find_run

    assert cfg.runs is not None
    parts = []
    for i, source in enumerate(cfg.runs):
        run = find_run(source.output, source.run_id, source.storage_options)
        inputs = load_inputs(run)
        if inputs.rows is None:
            raise InputError(f"runs[{i}]: the input of run {source.run_id}: {inputs.note}")
        parts.append(inputs.rows.with_columns(pl.lit(source.name).alias("system")))
    return pl.concat(parts, how="diagonal_relaxed")


def build_pairs(
    answers: pl.DataFrame, systems: list[str] | None = None, max_questions: int | None = None
) -> Pairs:
    """Every unordered pair of systems that answered a question, in both orders.

    Parameters
    ----------
    answers : polars.DataFrame
        As :func:`read_answers` returns. Rows with a null answer, and rows with a null
        value in a ``match_on`` column (no question to match them on), are left out and
        counted.
    systems : list of str, optional
        The systems to compare (default: every non-null system of ``answers``).
    max_questions : int, optional
        Keep the first N questions (in input order) that two systems or more answered.

    Raises
    ------
    InputError
        A system of ``systems`` is not in the input, fewer than two systems remain, or
        no question was answered by two of them.
    """
    present = sorted(s for s in answers["system"].unique().to_list() if s is not None)
    if systems is not None:
        unknown = [s for s in systems if s not in present]
        if unknown:
            raise InputError(
                f"pairwise.systems: {unknown} are not systems of the input; its systems: {present}"
            )
        chosen = sorted(systems)
    else:
        chosen = present
    if len(chosen) < 2:
        raise InputError(
            f"pairwise judging needs at least two systems; the input has {len(chosen)}: "
            f"{chosen} (check pairwise.system_column)"
        )
    rows = answers.filter(pl.col("system").is_in(chosen))
    counts = {
        "rows": rows.height,
        "null_answers": int(rows["answer"].is_null().sum()),
        "null_keys": int((rows["null_key"] & rows["answer"].is_not_null()).sum()),
    }
    rows = rows.filter(pl.col("answer").is_not_null() & ~pl.col("null_key"))
    firsts = rows.unique(["question_key", "system"], keep="first", maintain_order=True)
    counts["duplicates"] = rows.height - firsts.height
    order = firsts.group_by("question_key", maintain_order=True).agg(
        pl.col("system"), pl.col("answer"), pl.col("question").first()
    )
    matched = order.filter(pl.col("system").list.len() >= 2)
    counts["unmatched_questions"] = order.height - matched.height
    if max_questions is not None:
        matched = matched.head(max_questions)
    if matched.height == 0:
        raise InputError(
            "no question was answered by two of the systems compared; check "
            "pairwise.match_on and the system column"
        )
    out = []
    for key, names, texts, question in matched.iter_rows():
        by_system = dict(zip(names, texts))
        for a, b in itertools.combinations(sorted(by_system), 2):
            pair_id = f"{key}:{a}|{b}"
            for n, (x, y) in enumerate(((a, b), (b, a)), start=1):
                out.append(
                    {
                        "question": question,
                        "question_key": key,
                        "pair_id": pair_id,
                        "order": n,
                        "first": x,
                        "second": y,
                        "first_answer": by_system[x],
                        "second_answer": by_system[y],
                    }
                )
    frame = pl.DataFrame(
        out,
        schema={
            "question": pl.String,
            "question_key": pl.String,
            "pair_id": pl.String,
            "order": pl.Int64,
            "first": pl.String,
            "second": pl.String,
            "first_answer": pl.String,
            "second_answer": pl.String,
        },
    ).with_columns(
        pl.col("first_answer").str.len_chars().cast(pl.Int64).alias("first_chars"),
        pl.col("second_answer").str.len_chars().cast(pl.Int64).alias("second_chars"),
    )
    counts["questions"] = matched.height
    counts["pairs"] = frame.height // 2
    return Pairs(frame, chosen, counts)


def judge_pairs(cfg: PairwiseConfig, pairs: Pairs, run_id: str | None = None) -> pl.DataFrame:
    """The verdict table (:data:`VERDICT_COLUMNS`, one row per row of ``pairs.frame``).

    The judge engine is ``engines[pairwise.engine]``, loaded through the engine
    registry; with ``cache.enabled`` the judgment cache (default
    ``<output.uri>/judge_cache``) answers requests already judged and keeps new replies,
    flushed after every :data:`BATCH_ROWS` rows.

    Raises
    ------
    EngineError
        The judge cannot be loaded or reached.
    OutputError
        The judgment cache cannot be read or written.
    """
    from ragbatch.engines import load_judge_engine
    from ragbatch.judge.batch import judge_frame
    from ragbatch.judge.cache import JudgmentCache
    from ragbatch.judge.pairwise_preference import PairwisePreference
    from ragbatch.judge.protocol import run_sync
    from ragbatch.judge.rejudge import reasks_parse_failures
    from ragbatch.judge.run import JudgeRunner

    spec: Any = cfg.engines[cfg.pairwise.engine]  # a judge engine (checked by the config)
    params: dict[str, Any] = {} if cfg.criteria is None else {"criteria": cfg.criteria}
    metric = PairwisePreference.from_params(params, metric_id="pairwise_preference")
    assert isinstance(metric, PairwisePreference)
    cache = None
    if cfg.cache.enabled:
        uri = cfg.cache.uri or f"{cfg.output.uri.rstrip('/')}/judge_cache"
        _fold(uri, cfg.cache.storage_options, run_id)  # what an interrupted run paid for
        cache = JudgmentCache(uri, cfg.cache.storage_options, [metric.name], run_id=run_id)
    engine = load_judge_engine(spec)
    runner = JudgeRunner(
        engine,
        [metric],
        cache=cache,
        parse_retries=spec.parse_retries,
        seed=spec.seed,
        max_tokens=spec.max_tokens,
        rejudge=reasks_parse_failures(cfg.cache.rejudge),
    )
    frame = pairs.frame.select(
        pl.col("pair_id").alias("row_id"),
        "question",
        pl.col("first_answer").alias("answer"),
        pl.col("second_answer").alias("reference"),
    )
    cells: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    try:
        for start in range(0, frame.height, BATCH_ROWS):
            part = run_sync(judge_frame(runner, frame.slice(start, BATCH_ROWS)))[metric.id]
            cells += part[0]
            records += part[1]
            if cache is not None:  # what a batch paid for is kept if a later one fails
                cache.flush()
    finally:
        engine.close()
    if cache is not None:
        _fold(cache.uri, cfg.cache.storage_options, run_id)
    verdicts = []
    for cell in cells:
        details = json.loads(cell["details"]) if cell["details"] else {}
        ok = cell["status"] == "ok"
        verdicts.append(_VERDICTS.get(details.get("verdict", "")) if ok else None)
    judged = pl.DataFrame(
        {
            "verdict": verdicts,
            "status": [c["status"] for c in cells],
            "model": [c["model"] for c in cells],
            **{k: [r[k] for r in records] for k in _RECORD_KEYS},
        },
        schema={
            "verdict": pl.String,
            "status": pl.String,
            "model": pl.String,
            **{k: VERDICT_COLUMNS[k] for k in _RECORD_KEYS},
        },
    )
    # an ok cell's reason is the judge's (in details); a failed cell's says what failed
    reasons = [
        json.loads(c["details"]).get("reason") if c["details"] else c["reason"] for c in cells
    ]
    judged = judged.with_columns(pl.Series("reason", reasons, dtype=pl.String))
    return pl.concat([pairs.frame, judged], how="horizontal").select(list(VERDICT_COLUMNS))


def _fold(uri: str, options: dict[str, Any], run_id: str | None) -> None:
    """Fold the judgment cache's journal into its buckets, where lookups find it, as a
    run does before it starts and after it commits; a failure is logged, never raised
    (the journal stays for the next fold)."""
    from ragbatch.judge.cache_upkeep import fold_journal, open_files

    try:
        fold_journal(open_files(uri, options), run_id)
    except Exception as exc:
        log.warning("judgment cache %s: journal not folded: %s: %s", uri, type(exc).__name__, exc)


_RECORD_KEYS = ("prompt_tokens", "completion_tokens", "judge_calls", "cache_hits", "judge_reply")


@dataclass
class PairwiseRun:
    """A written pairwise run: where it is, its verdicts, statistics and summary."""

    run_id: str
    run_date: dt.date
    path: str
    verdicts: pl.DataFrame
    result: PairwiseResult
    summary: dict[str, Any]


def statistics(verdicts: pl.DataFrame, cfg: PairwiseConfig) -> PairwiseResult:
    """:func:`~ragbatch.analysis.pairwise.pairwise_statistics` of a verdict table, the
    bootstrap resampling questions by their content key."""
    boot = cfg.bootstrap
    return pairwise_statistics(
        verdicts.with_columns(pl.col("question_key").alias("question")),
        confidence=boot.confidence,
        n_resamples=boot.resamples,
        seed=boot.seed,
    )


def run_pairwise(
    cfg: PairwiseConfig, *, run_id: str | None = None, run_date: dt.date | None = None
) -> PairwiseRun:
    """Read, pair, judge, rate and write (see the module notes).

    Every check of the config and the input (system column, systems, match_on, the
    run id) happens before the judge is loaded or asked anything.

    Raises
    ------
    ConfigError, InputError
        The run id is not a valid id, or the input cannot be paired (see
        :func:`read_answers`, :func:`build_pairs`).
    OutputError
        The run's directory already exists.
    EngineError
        The judge cannot be loaded or reached.
    """
    from ragbatch.core.ids import check_id
    from ragbatch.core.run_date import choose_run_date
    from ragbatch.ops.pairwise_output import run_path, summary_of, write_pairwise
    from ragbatch.pipeline.runner import new_run_id

    started = dt.datetime.now(dt.timezone.utc)
    run_id = check_id(new_run_id(started) if run_id is None else run_id, "pairwise run id")
    run_date = choose_run_date(run_date, now=started)
    path = run_path(cfg, run_date, run_id)
    pairs = build_pairs(read_answers(cfg), cfg.pairwise.systems, cfg.pairwise.max_questions)
    log.info(
        "pairwise %s: %d systems, %d questions, %d pairs, %d judge requests",
        run_id,
        len(pairs.systems),
        pairs.counts["questions"],
        pairs.counts["pairs"],
        pairs.frame.height,
    )
    verdicts = judge_pairs(cfg, pairs, run_id)
    result = statistics(verdicts, cfg)
    summary = summary_of(cfg, run_id, run_date, started, pairs, verdicts, result)
    write_pairwise(cfg, path, verdicts, result, summary)
    return PairwiseRun(run_id, run_date, path, verdicts, result, summary)
