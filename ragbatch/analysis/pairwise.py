"""Statistics of pairwise judge verdicts: win rates, Bradley-Terry ratings, position
consistency, position and length bias.

A pairwise judge sees one question and two systems' answers and says which is better,
or that they tie. Every pair is judged in both orders (A shown first, then B shown
first), so that a judge's preference for a position can be told from a preference for
content. The verdict table (:data:`VERDICT_SCHEMA`) holds one row per (pair, order).

- **Win rate** of a system: its wins plus half its ties, over the verdicts it took part
  in, with a percentile bootstrap interval over questions.
- **Bradley-Terry ratings** (Bradley & Terry 1952, Biometrika 39; fitted with the MM
  algorithm of Hunter 2004, Annals of Statistics 32): each system gets a strength
  ``p_i`` such that ``P(i beats j) = p_i / (p_i + p_j)``; a tie counts as half a win
  each way, and a weak prior (half a tie between every two systems) keeps strengths
  finite when a system never wins. Ratings are on the Elo scale arena leaderboards use:
  ``1000 + 400 log10(p_i / g)``, ``g`` the geometric mean strength, with percentile
  bootstrap intervals over questions (each resampled question brings all its verdicts).
- **Position consistency**: the share of pairs judged in both orders whose outcome
  (which system won, or a tie) is the same in both: 1 for a judge that reads content
  only, 0 for one that always picks the same position.
- **Position bias**: among verdicts with a winner, the share won by the answer shown
  first (0.5 without bias), with its Wilson interval. **Length bias**: among verdicts
  with a winner between answers of different lengths, the share won by the longer one.

A judge is flagged ``position_bound`` when fewer than half its pairs survive the swap and
its position share's interval excludes 0.5: its verdicts follow position, not content.
It is flagged ``inconsistent`` when fewer than half survive the swap otherwise (a judge
near chance).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from ragbatch.analysis.intervals import CONFIDENCE, N_RESAMPLES, SEED, wilson_interval

FIRST, SECOND, TIE = "first", "second", "tie"

#: The verdict table: one row per (pair, order). ``question`` groups the verdicts the
#: bootstrap resamples together; ``pair_id`` names the unordered pair of one question
#: (the same in both orders); ``first`` and ``second`` the systems in the order shown;
#: ``verdict`` one of ``first``, ``second``, ``tie``, or null when the judge gave none
#: (a failed or unparseable reply); ``first_chars`` and ``second_chars`` the answers'
#: lengths in characters.
VERDICT_SCHEMA = {
    "question": pl.String,
    "pair_id": pl.String,
    "first": pl.String,
    "second": pl.String,
    "verdict": pl.String,
    "first_chars": pl.Int64,
    "second_chars": pl.Int64,
}

#: Prior of the Bradley-Terry fit: ties added between every two systems.
PRIOR_TIES = 0.5

#: Elo-scale constants: a rating difference of ``ELO_SCALE`` means odds of 10 to 1.
ELO_BASE, ELO_SCALE = 1000.0, 400.0


@dataclass(frozen=True)
class Share:
    """A proportion with its Wilson interval: ``value`` in [0, 1] (None when ``n`` is
    0), ``[low, high]`` at the given confidence, ``n`` the verdicts or pairs it counts."""

    value: float | None
    low: float | None
    high: float | None
    n: int


@dataclass
class PairwiseResult:
    """What :func:`pairwise_statistics` found.

    Attributes
    ----------
    ratings : polars.DataFrame
        One row per system, best first: ``system``, ``rating`` (Elo scale, mean 1000),
        ``rating_ci_low``, ``rating_ci_high``, ``win_rate`` (wins + ties / 2 over its
        verdicts, in [0, 1]), ``win_rate_ci_low``, ``win_rate_ci_high``, ``n_verdicts``.
    head_to_head : polars.DataFrame
        One row per ordered system pair (``system``, ``opponent``) that met: ``wins``,
        ``losses``, ``ties`` of ``system`` against ``opponent`` over both orders, and
        ``win_rate`` (wins + ties / 2 over their verdicts).
    consistency : Share
        Position consistency over pairs judged in both orders.
    position : Share
        Share of verdicts with a winner won by the first position.
    length : Share
        Share of verdicts with a winner (answers of different lengths) won by the longer.
    n_failed : int
        Verdicts that are null (not counted anywhere else).
    flags : list of str
        ``position_bound`` or ``inconsistent`` (see the module notes); empty otherwise.
    """

    ratings: pl.DataFrame
    head_to_head: pl.DataFrame
    consistency: Share
    position: Share
    length: Share
    n_failed: int
    flags: list[str] = field(default_factory=list)


def bradley_terry(
    wins: np.ndarray, prior_ties: float = PRIOR_TIES, tol: float = 1e-10, max_iter: int = 10_000
) -> np.ndarray:
    """Bradley-Terry strengths by Hunter's MM iteration.

    Parameters
    ----------
    wins : numpy.ndarray
        Square array, ``wins[i, j]`` = times ``i`` beat ``j`` (a tie adds 0.5 to both
        ``wins[i, j]`` and ``wins[j, i]``); the diagonal is ignored.
    prior_ties : float
        Ties added between every two systems (>= 0) before fitting.

    Returns
    -------
    numpy.ndarray
        Strengths ``p`` (float64, positive) with geometric mean 1; ``P(i beats j) =
        p_i / (p_i + p_j)``.

    Raises
    ------
    ValueError
        ``wins`` is not square or is negative, or a system has no win and no prior.
    """
    w = np.array(wins, dtype=np.float64)
    if w.ndim != 2 or w.shape[0] != w.shape[1] or (w < 0).any():
        raise ValueError("wins must be a square array of non-negative counts")
    k = w.shape[0]
    np.fill_diagonal(w, 0.0)
    w = w + prior_ties / 2 * (1 - np.eye(k))
    games = w + w.T
    total = w.sum(axis=1)
    if (total <= 0).any():
        raise ValueError("every system needs a win or a prior to have a finite strength")
    p = np.ones(k)
    for _ in range(max_iter):
        new = total / (games / (p[:, None] + p[None, :])).sum(axis=1)
        new /= math.exp(float(np.log(new).mean()))
        done = float(np.max(np.abs(new - p))) < tol
        p = new
        if done:
            break
    return p


def elo_ratings(strengths: np.ndarray) -> np.ndarray:
    """Strengths on the Elo scale: ``1000 + 400 log10(p / geometric mean of p)``."""
    logs = np.log10(strengths)
    return ELO_BASE + ELO_SCALE * (logs - logs.mean())


def _wins_matrix(frame: pl.DataFrame, systems: list[str]) -> np.ndarray:
    """``wins[i, j]``: verdicts ``i`` won against ``j`` (a tie half to each)."""
    index = {s: i for i, s in enumerate(systems)}
    w = np.zeros((len(systems), len(systems)))
    for first, second, verdict in frame.select("first", "second", "verdict").iter_rows():
        a, b = index[first], index[second]
        if verdict == FIRST:
            w[a, b] += 1
        elif verdict == SECOND:
            w[b, a] += 1
        elif verdict == TIE:
            w[a, b] += 0.5
            w[b, a] += 0.5
    return w


def _win_rates(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(win rate, verdicts) per system from a wins matrix (NaN rate without verdicts)."""
    games = (w + w.T).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(games > 0, w.sum(axis=1) / games, np.nan), games


def _share(successes: int, n: int, confidence: float) -> Share:
    value, low, high = wilson_interval(successes, n, confidence)
    return Share(value, low, high, n)


def pairwise_statistics(
    verdicts: pl.DataFrame,
    *,
    confidence: float = CONFIDENCE,
    n_resamples: int = N_RESAMPLES,
    seed: int = SEED,
) -> PairwiseResult:
    """Ratings, head-to-head counts, consistency and biases of a verdict table (see the
    module notes).

    Parameters
    ----------
    verdicts : polars.DataFrame
        Columns :data:`VERDICT_SCHEMA` (extra columns are ignored).
    confidence, n_resamples, seed
        Interval level; bootstrap resamples of the questions and their seed.

    Raises
    ------
    ValueError
        A column is missing, a verdict is not ``first``, ``second``, ``tie`` or null, or
        fewer than two systems appear.
    """
    missing = [c for c in VERDICT_SCHEMA if c not in verdicts.columns]
    if missing:
        raise ValueError(f"the verdict table lacks columns {missing}")
    frame = verdicts.select(pl.col(c).cast(t) for c, t in VERDICT_SCHEMA.items())
    bad = frame.filter(
        pl.col("verdict").is_not_null() & ~pl.col("verdict").is_in([FIRST, SECOND, TIE])
    )
    if bad.height:
        raise ValueError(f"verdict {bad['verdict'][0]!r} is not one of first, second, tie")
    systems = sorted(set(frame["first"].to_list()) | set(frame["second"].to_list()))
    if len(systems) < 2:
        raise ValueError("pairwise statistics need at least two systems")
    judged = frame.filter(pl.col("verdict").is_not_null()).with_columns(
        pl.when(pl.col("verdict") == FIRST)
        .then(pl.col("first"))
        .when(pl.col("verdict") == SECOND)
        .then(pl.col("second"))
        .otherwise(None)
        .alias("winner")
    )
    w = _wins_matrix(judged, systems)
    rates, games = _win_rates(w)
    intervals = _bootstrap(judged, systems, confidence, n_resamples, seed)
    ratings = pl.DataFrame(
        {
            "system": systems,
            "rating": elo_ratings(bradley_terry(w)),
            "rating_ci_low": intervals[0],
            "rating_ci_high": intervals[1],
            "win_rate": [None if math.isnan(r) else float(r) for r in rates],
            "win_rate_ci_low": intervals[2],
            "win_rate_ci_high": intervals[3],
            "n_verdicts": games.round().astype(np.int64),
        },
        schema_overrides={
            "rating_ci_low": pl.Float64,
            "rating_ci_high": pl.Float64,
            "win_rate": pl.Float64,
            "win_rate_ci_low": pl.Float64,
            "win_rate_ci_high": pl.Float64,
        },
    ).sort("rating", descending=True, maintain_order=True)
    decided = judged.filter(pl.col("verdict") != TIE)
    position = _share(int((decided["verdict"] == FIRST).sum()), decided.height, confidence)
    differ = decided.filter(pl.col("first_chars") != pl.col("second_chars"))
    longer_first = pl.col("first_chars") > pl.col("second_chars")
    longer_won = differ.filter((pl.col("verdict") == FIRST) == longer_first).height
    length = _share(longer_won, differ.height, confidence)
    consistency = _consistency(judged, confidence)
    flags = []
    if consistency.value is not None and consistency.value < 0.5:
        excludes_half = (position.low is not None and position.low > 0.5) or (
            position.high is not None and position.high < 0.5
        )
        flags.append("position_bound" if excludes_half else "inconsistent")
    return PairwiseResult(
        ratings,
        _head_to_head(judged, systems, w),
        consistency,
        position,
        length,
        frame.height - judged.height,
        flags,
    )


def _head_to_head(judged: pl.DataFrame, systems: list[str], w: np.ndarray) -> pl.DataFrame:
    rows = []
    for i, a in enumerate(systems):
        for j, b in enumerate(systems):
            if i == j:
                continue
            met = judged.filter(
                ((pl.col("first") == a) & (pl.col("second") == b))
                | ((pl.col("first") == b) & (pl.col("second") == a))
            )
            if not met.height:
                continue
            rows.append(
                {
                    "system": a,
                    "opponent": b,
                    "wins": int((met["winner"] == a).sum()),
                    "losses": int((met["winner"] == b).sum()),
                    "ties": int((met["verdict"] == TIE).sum()),
                    "win_rate": float(w[i, j] / met.height),
                }
            )
    schema = {
        "system": pl.String,
        "opponent": pl.String,
        "wins": pl.Int64,
        "losses": pl.Int64,
        "ties": pl.Int64,
        "win_rate": pl.Float64,
    }
    return pl.DataFrame(rows, schema=schema)


def _consistency(judged: pl.DataFrame, confidence: float) -> Share:
    """Pairs with a verdict in both orders whose outcome (the winner, or a tie) agrees."""
    both = (
        judged.with_columns(pl.col("winner").fill_null("\x00tie").alias("outcome"))
        .group_by("pair_id")
        .agg(pl.len().alias("n"), pl.col("outcome").n_unique().alias("distinct"))
        .filter(pl.col("n") == 2)
    )
    return _share(int((both["distinct"] == 1).sum()), both.height, confidence)


def _bootstrap(
    judged: pl.DataFrame, systems: list[str], confidence: float, n_resamples: int, seed: int
) -> tuple[list[float | None], ...]:
    """Percentile intervals (rating low, rating high, win rate low, win rate high) per
    system over resampled questions; all None without verdicts."""
    questions = judged["question"].unique(maintain_order=True).to_list()
    if not questions or n_resamples < 1:
        return tuple([None] * len(systems) for _ in range(4))
    per_question = {
        key[0]: _wins_matrix(group, systems)
        for key, group in judged.group_by(["question"], maintain_order=True)
    }
    stacked = np.stack([per_question[q] for q in questions])
    rng = np.random.default_rng(seed)
    elo, rates = [], []
    for _ in range(n_resamples):
        counts = np.bincount(
            rng.integers(0, len(questions), len(questions)), minlength=len(questions)
        )
        w = np.tensordot(counts.astype(np.float64), stacked, axes=1)
        elo.append(elo_ratings(bradley_terry(w)))
        rates.append(_win_rates(w)[0])
    alpha = (1 - confidence) / 2
    elo_a, rate_a = np.array(elo), np.array(rates)

    def col(values: np.ndarray) -> list[float | None]:
        return [None if math.isnan(v) else float(v) for v in values]

    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns: no verdicts
            return (
                col(np.quantile(elo_a, alpha, axis=0)),
                col(np.quantile(elo_a, 1 - alpha, axis=0)),
                col(np.nanquantile(rate_a, alpha, axis=0)),
                col(np.nanquantile(rate_a, 1 - alpha, axis=0)),
            )
