"""Plain-text rendering of a :class:`~ragbatch.analysis.compare.Comparison` for the CLI."""

from __future__ import annotations

from ragbatch.analysis.compare import Comparison
from ragbatch.analysis.corrected import estimate_text

_REASON_CHARS = 100


def _num(value: float | None, width: int = 9, sign: str = "") -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{sign}{width}.3f}"


def _p(value: float | None) -> str:
    """A p-value in 8 characters: ``0.0312``, ``<0.0001``, or ``-`` when there is none."""
    if value is None:
        return f"{'-':>8}"
    return f"{'<0.0001':>8}" if value < 1e-4 else f"{value:>8.4f}"


def _short(text: str | None, limit: int = _REASON_CHARS) -> str:
    if text is None:
        return "-"
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def pairing_line(comparison: Comparison) -> str:
    """``rows: N paired (a by row_id, b by content hash), x only in baseline, ...``."""
    c = comparison.pairing.counts()
    line = (
        f"rows: {c['row_id'] + c['content']} paired ({c['row_id']} by row_id, "
        f"{c['content']} by content hash of {', '.join(comparison.pairing.match_on)}), "
        f"{c['only_baseline']} only in baseline, {c['only_candidate']} only in candidate"
    )
    if c["ambiguous_baseline"] or c["ambiguous_candidate"]:
        line += (
            f" (of these, {c['ambiguous_baseline']} + {c['ambiguous_candidate']} have "
            "a content hash that is not unique)"
        )
    return line


def format_comparison(comparison: Comparison, *, max_ids: int = 10) -> str:
    """The comparison as the text ``ragbatch compare`` prints: runs, pairing, one line per
    metric and slice value (``*`` marks a flagged change: see
    :mod:`ragbatch.analysis.compare`), with its p-value and adjusted p-value, status
    changes, the rows that moved most with their reasons, and the regressions when a
    threshold was given."""
    out: list[str] = []
    if comparison.baseline is not None and comparison.candidate is not None:
        out.append(f"baseline:  {comparison.baseline.describe()}")
        out.append(f"candidate: {comparison.candidate.describe()}")
    out.append(pairing_line(comparison))
    pairing = comparison.pairing
    for label, ids in (
        ("only in baseline", pairing.only_baseline),
        ("only in candidate", pairing.only_candidate),
    ):
        if ids:
            more = f" (+{len(ids) - max_ids} more)" if len(ids) > max_ids else ""
            out.append(f"  {label}: {', '.join(ids[:max_ids])}{more}")
    if pairing.note:
        out.append(f"note: {pairing.note}")
    if comparison.metrics_only_baseline:
        out.append(
            f"metrics only in baseline (not compared): {', '.join(comparison.metrics_only_baseline)}"
        )
    if comparison.metrics_only_candidate:
        out.append(
            f"metrics only in candidate (not compared): {', '.join(comparison.metrics_only_candidate)}"
        )
    out.append("")
    out.extend(_metric_table(comparison))
    if comparison.corrected.height:
        out += ["", *_corrected_table(comparison)]
    if comparison.status_changes.height:
        out += ["", "status changes (paired cells whose status differs):"]
        for r in comparison.status_changes.iter_rows(named=True):
            out.append(
                f"  {r['metric']}: {r['baseline_status']} -> {r['candidate_status']}: {r['n']}"
            )
        for r in comparison.status_changed_rows.iter_rows(named=True):
            out.append(
                f"    {r['metric']}  {_row(r)}  {r['baseline_status']} -> "
                f"{r['candidate_status']}  reason: {_short(r['candidate_reason'])}"
            )
    if comparison.moved.height:
        out += ["", "rows that moved most (paired cells ok in both runs):"]
        for r in comparison.moved.iter_rows(named=True):
            out.append(
                f"  {r['metric']}  {_row(r)}  {r['baseline_score']:.3f} -> "
                f"{r['candidate_score']:.3f} ({r['change']})"
            )
            out.append(f"      baseline reason: {_short(r['baseline_reason'])}")
            out.append(f"      candidate reason: {_short(r['candidate_reason'])}")
    if comparison.threshold is not None:
        regressions = comparison.regressions()
        out.append("")
        if regressions.height:
            names = ", ".join(
                f"{r['metric']} ({r['mean_diff']:+.3f})" for r in regressions.iter_rows(named=True)
            )
            out.append(f"REGRESSION beyond {comparison.threshold:g}: {names}")
        else:
            out.append(f"no metric regresses beyond {comparison.threshold:g}")
    return "\n".join(out)


def _row(r: dict) -> str:
    if r["baseline_row_id"] == r["candidate_row_id"]:
        return r["baseline_row_id"]
    return f"{r['baseline_row_id']} / {r['candidate_row_id']}"


def _metric_table(comparison: Comparison) -> list[str]:
    table = comparison.metrics
    if not table.height:
        return ["no metric computed by both runs"]
    labels = [
        "(all rows)" if r["slice"] is None else f"{r['slice']}={r['slice_value']}"
        for r in table.iter_rows(named=True)
    ]
    mwidth = max(12, *(len(m) for m in table["metric"].to_list()))
    swidth = min(40, max(12, *(len(s) for s in labels)))
    level = f"{comparison.confidence:.0%} interval"
    header = (
        f"{'metric':<{mwidth}}  {'slice':<{swidth}} {'pairs':>6} {'baseline':>9} "
        f"{'candidate':>9} {'diff':>9}  {level:<20} {'p':>8} {'p adj':>8} change"
    )
    lines = [header, "-" * len(header)]
    previous = None
    for label, r in zip(labels, table.iter_rows(named=True)):
        name = r["metric"] if r["metric"] != previous else ""
        previous = r["metric"]
        interval = "-" if r["ci_low"] is None else f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]"
        change = f"{r['change']} *" if r["change"] else ""
        if _too_few(r, comparison.min_pairs):
            change = f"(fewer than {comparison.min_pairs} pairs: not flagged)"
        lines.append(
            f"{name:<{mwidth}}  {_short(label, swidth):<{swidth}} {r['n_pairs']:>6} "
            f"{_num(r['baseline_mean'])} {_num(r['candidate_mean'])} "
            f"{_num(r['mean_diff'], sign='+')}  {interval:<20} {_p(r['p_value'])} "
            f"{_p(r['p_adjusted'])} {change}".rstrip()
        )
    if comparison.fdr is None:
        lines.append(
            f"* the change's {level} excludes zero (paired bootstrap over rows ok in both "
            "runs); no control for testing many lines at once (--fdr off)"
        )
    else:
        n = table["p_value"].drop_nulls().len()
        lines.append(
            f"* flagged: the change's {level} excludes zero (paired bootstrap over rows ok "
            f"in both runs) and its p-value adjusted over the {n} lines (Benjamini-Hochberg; "
            f"p: McNemar's exact test for 0/1 scores, else a paired t-test) is at most "
            f"{comparison.fdr:g}, the false discovery rate (--fdr)"
        )
    if comparison.by:
        lines.append(
            f"  a slice needs at least {comparison.min_pairs} pairs to be flagged (--min-pairs)"
        )
    return lines


def _too_few(r: dict, min_pairs: int) -> bool:
    """A slice line whose interval excludes zero but that has too few pairs to flag."""
    return (
        r["slice"] is not None
        and r["n_pairs"] < min_pairs
        and r["ci_low"] is not None
        and (r["ci_low"] > 0 or r["ci_high"] < 0)
    )


def _corrected_table(comparison: Comparison) -> list[str]:
    """Each run's label-corrected means (not paired: each over its own labels)."""
    level = f"{comparison.confidence:.0%}"
    table = comparison.corrected
    mwidth = max(12, *(len(m) for m in table["metric"].to_list()))
    header = (
        f"{'metric':<{mwidth}}  {'run':<9} {'labels':>6} {'mean':>7}  {'labels mean [' + level + ']':<26}"
        f"  {'corrected mean [' + level + ']':<26}  lambda"
    )
    lines = [
        "label-corrected means (prediction-powered inference, docs/ppi.md):",
        header,
        "-" * len(header),
    ]
    for r in table.iter_rows(named=True):
        labels = estimate_text(r["labels_mean"], r["labels_ci_low"], r["labels_ci_high"])
        ppi = estimate_text(r["ppi_mean"], r["ppi_ci_low"], r["ppi_ci_high"])
        lam = "-" if r["ppi_lambda"] is None else f"{r['ppi_lambda']:.2f}"
        line = (
            f"{r['metric']:<{mwidth}}  {r['run']:<9} {r['n_labelled']:>6} {_num(r['mean'], 7)}  "
            f"{labels:<26}  {ppi:<26}  {lam}"
        )
        if r["ppi_reason"]:
            line += f"  ({_short(r['ppi_reason'], 80)})"
        lines.append(line)
    return lines
