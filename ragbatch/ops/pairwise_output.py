"""What ``ragbatch pairwise`` writes under ``<output.uri>/pairwise/run_date=<date>/run_id=<id>/``:

- ``verdicts/``: the verdict table (:data:`ragbatch.ops.pairwise.VERDICT_COLUMNS`) as
  Parquet, partitioned by ``order`` (``order=1/``, ``order=2/``: each pair's two orders);
- ``ratings.parquet``: Bradley-Terry ratings (Elo scale) and win rates with their
  bootstrap intervals, one row per system, best first;
- ``head_to_head.parquet``: wins, losses and ties of every system against every other;
- ``summary.json``: position consistency, position and length bias (with Wilson
  intervals), the judge's flags and what they mean, counts, the judge model, judge calls,
  cache hits and tokens;
- ``report.html``: one self-contained HTML section of all of it, with the ratings chart.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import TYPE_CHECKING, Any

import polars as pl

from ragbatch import __version__
from ragbatch.analysis.pairwise import PairwiseResult, Share
from ragbatch.core.errors import OutputError
from ragbatch.core.ids import check_id
from ragbatch.core.redact import redact

if TYPE_CHECKING:
    from ragbatch.ops.pairwise import Pairs
    from ragbatch.ops.pairwise_config import PairwiseConfig

#: What each flag of :func:`ragbatch.analysis.pairwise.pairwise_statistics` means.
FLAG_NOTES = {
    "position_bound": "fewer than half of the pairs keep their verdict when the answers "
    "swap places, and the share won by the first position is not 0.5 within its interval: "
    "the judge's verdicts follow position, not content; its ratings are not evidence",
    "inconsistent": "fewer than half of the pairs keep their verdict when the answers swap "
    "places: the judge is near chance; its ratings are not evidence",
}


def run_path(cfg: PairwiseConfig, run_date: dt.date, run_id: str) -> str:
    """``<output root>/pairwise/run_date=<date>/run_id=<id>`` (the root's own path, no
    protocol), ``run_id`` checked as a path segment (:func:`ragbatch.core.ids.check_id`).

    Raises
    ------
    ConfigError
        ``run_id`` is not a valid id.
    OutputError
        The directory already exists (a run id is written once).
    """
    from ragbatch.io.fs import resolve

    fs, base = resolve(cfg.output.uri, cfg.output.storage_options)
    run_id = check_id(run_id, "pairwise run id")
    path = f"{base.rstrip('/')}/pairwise/run_date={run_date.isoformat()}/run_id={run_id}"
    if fs.exists(path):
        raise OutputError(f"pairwise run {run_id} already exists at {path}; choose another id")
    return path


def _share(share: Share) -> dict[str, Any]:
    return {"value": share.value, "ci_low": share.low, "ci_high": share.high, "n": share.n}


def summary_of(
    cfg: PairwiseConfig,
    run_id: str,
    run_date: dt.date,
    started: dt.datetime,
    pairs: Pairs,
    verdicts: pl.DataFrame,
    result: PairwiseResult,
) -> dict[str, Any]:
    """The run's ``summary.json`` document (JSON-serialisable; credentials redacted)."""
    models = [m for m in verdicts["model"].unique().to_list() if m is not None]
    statuses = verdicts["status"].fill_null("none").value_counts(sort=True)
    return {
        "run_id": run_id,
        "run_date": run_date.isoformat(),
        "name": cfg.name,
        "started_at": started.isoformat(),
        "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(),
        "ragbatch_version": __version__,
        "judge": {"engine": cfg.pairwise.engine, "models": sorted(models)},
        "prompt": "builtin" if cfg.criteria is None else "rubric",
        "systems": pairs.systems,
        "counts": {**pairs.counts, "verdicts": verdicts.height, "failed": result.n_failed},
        "statuses": dict(zip(statuses["status"].to_list(), statuses["count"].to_list())),
        "judge_calls": int(verdicts["judge_calls"].fill_null(0).sum()),
        "cache_hits": int(verdicts["cache_hits"].fill_null(0).sum()),
        "prompt_tokens": int(verdicts["prompt_tokens"].fill_null(0).sum()),
        "completion_tokens": int(verdicts["completion_tokens"].fill_null(0).sum()),
        "confidence": cfg.bootstrap.confidence,
        "position_consistency": _share(result.consistency),
        "position_bias": _share(result.position),
        "length_bias": _share(result.length),
        "flags": list(result.flags),
        "flag_notes": {f: FLAG_NOTES[f] for f in result.flags},
        "config": redact(cfg.model_dump(mode="json")),
    }


def write_pairwise(
    cfg: PairwiseConfig,
    path: str,
    verdicts: pl.DataFrame,
    result: PairwiseResult,
    summary: dict[str, Any],
) -> None:
    """Write the run's files (module notes) under ``path`` (from :func:`run_path`).

    Raises
    ------
    OutputError
        A file cannot be written (the message names it).
    """
    import pyarrow.parquet as pq

    from ragbatch.io.fs import resolve

    fs, _ = resolve(cfg.output.uri, cfg.output.storage_options)
    try:
        fs.makedirs(path, exist_ok=True)
        pq.write_to_dataset(
            verdicts.to_arrow(),
            f"{path}/verdicts",
            partition_cols=["order"],
            filesystem=fs,
            basename_template="part-{i}.parquet",
        )
        for name, frame in (("ratings", result.ratings), ("head_to_head", result.head_to_head)):
            with fs.open(f"{path}/{name}.parquet", "wb") as out:
                frame.write_parquet(out)
        with fs.open(f"{path}/summary.json", "w", encoding="utf-8") as out:
            json.dump(summary, out, ensure_ascii=False, indent=2)
        with fs.open(f"{path}/report.html", "w", encoding="utf-8") as out:
            out.write(report_html(result, summary))
    except OSError as exc:
        raise OutputError(f"cannot write the pairwise run under {path}: {exc}") from exc


_TEMPLATE = """\
<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Pairwise judging {{ s.run_id }}</title>
<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .5em;text-align:right}
td:first-child,th:first-child{text-align:left}.flag{background:#fde2e1;border:2px solid #d0605e;padding:.5em}</style>
</head><body><section id="pairwise">
<h2>Pairwise judging: {{ s.name }}</h2>
<p>Run {{ s.run_id }} ({{ s.run_date }}); judge {{ s.judge.engine }} ({{ s.judge.models|join(", ") }});
{{ s.counts.questions }} questions, {{ s.counts.pairs }} pairs, each judged in both orders
({{ s.counts.verdicts }} verdicts, {{ s.counts.failed }} without a verdict);
{{ s.judge_calls }} judge calls, {{ s.cache_hits }} cache hits.
{% if s.counts.null_answers %}{{ s.counts.null_answers }} row(s) with a null answer were
left out of the pairs.{% endif %}</p>
{% for f, note in s.flag_notes.items() %}
<p class="flag"><strong>Judge flagged {{ f }}</strong>: {{ note }}.</p>
{% endfor %}
<h3>Ratings</h3>
<table><tr><th>system</th><th>rating</th><th>{{ pct }}% interval</th>
<th>win rate</th><th>{{ pct }}% interval</th><th>verdicts</th></tr>
{% for r in ratings %}<tr><td>{{ r.system }}</td><td>{{ num(r.rating, 0) }}</td>
<td>{{ num(r.rating_ci_low, 0) }} to {{ num(r.rating_ci_high, 0) }}</td>
<td>{{ num(r.win_rate, 3) }}</td>
<td>{{ num(r.win_rate_ci_low, 3) }} to {{ num(r.win_rate_ci_high, 3) }}</td>
<td>{{ r.n_verdicts }}</td></tr>
{% endfor %}</table>
{% if chart %}<p><img alt="ratings with intervals" src="{{ chart }}"></p>{% endif %}
<h3>Judge behaviour</h3>
<table><tr><th>measure</th><th>value</th><th>{{ pct }}% interval</th><th>n</th></tr>
{% for label, v in shares %}<tr><td>{{ label }}</td><td>{{ num(v.value, 3) }}</td>
<td>{{ num(v.ci_low, 3) }} to {{ num(v.ci_high, 3) }}</td><td>{{ v.n }}</td></tr>
{% endfor %}</table>
<p>Position consistency: the share of pairs whose verdict survives the swap (1 for a judge that reads content only).
Position bias: among verdicts with a winner, the share won by the answer shown first (0.5 without bias).
Length bias: among verdicts with a winner between answers of different lengths, the share won by the longer one.</p>
</section></body></html>
"""


def _num(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def report_html(result: PairwiseResult, summary: dict[str, Any]) -> str:
    """The run's report: one self-contained HTML page (jinja2 with autoescape, so any
    system name or text is escaped), with the ratings chart as an inline SVG."""
    import jinja2

    from ragbatch.analysis.plots import data_uri, interval_dots

    ratings = result.ratings.to_dicts()
    chart = data_uri(
        interval_dots(
            [r["system"] for r in ratings],
            [r["rating"] for r in ratings],
            [r["rating_ci_low"] for r in ratings],
            [r["rating_ci_high"] for r in ratings],
            title="Bradley-Terry ratings (Elo scale)",
            xlabel="rating",
        )
    )
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    shares = [
        ("position consistency", summary["position_consistency"]),
        ("position bias (first position wins)", summary["position_bias"]),
        ("length bias (longer answer wins)", summary["length_bias"]),
    ]
    return env.from_string(_TEMPLATE).render(
        s=summary,
        ratings=ratings,
        shares=shares,
        chart=chart,
        num=_num,
        pct=round(100 * summary["confidence"]),
    )
