"""The console table of a calibration."""

from __future__ import annotations

from typing import Any


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def agreement_text(rows: list[dict[str, Any]], confidence: float) -> str:
    """One line per (judge, metric, measure): n, value and interval, or the reason it is
    undefined.

    Parameters
    ----------
    rows : list of dict
        Rows of the ``agreement`` table.
    confidence : float
        The intervals' coverage, for the header.
    """
    ci = f"{confidence:.0%} CI"
    jw = max([5, *(len(r["judge"]) for r in rows)])
    mw = max([6, *(len(r["metric"]) for r in rows)])
    header = (
        f"{'judge':<{jw}}  {'metric':<{mw}}  {'measure':<18} {'n':>6} {'value':>7}  {ci:<17} note"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        interval = f"[{_num(r['ci_low'])}, {_num(r['ci_high'])}]" if r["ci_low"] is not None else ""
        lines.append(
            f"{r['judge']:<{jw}}  {r['metric']:<{mw}}  {r['measure']:<18} {r['n']:>6} "
            f"{_num(r['value']):>7}  {interval:<17} {r['reason'] or ''}".rstrip()
        )
    return "\n".join(lines)
