"""Asking again what the judgment cache holds only failed replies for (``cache.rejudge``).

A cached reply that cannot be parsed would otherwise be served to every later run: a
judge server that returned malformed replies once, and was then fixed, would leave its
cells ``parse_failure`` forever, at no cost and with no new call. Re-asking works
through *generations* of a request's cache keys:

* Generation 0 is the request as it always was: one key per attempt (the first try and
  its parse retries, :func:`~ragbatch.judge.cache.cache_key` with seeds ``seed + a``).
* Generation ``g`` > 0 asks the same request again (same prompt, output, seed) under
  keys derived from those (:func:`rejudge_key`), filed under the same group, so that the
  lookup of a batch finds every generation with the others.

Every run follows the chain (:func:`first_generation`): a generation whose every attempt
is cached and fails to parse is passed over when the next generation exists, so the
first generation that holds a reply that parses is used (and one paid for by a rejudging
run is found by every run after it, rejudging or not). A run with ``rejudge`` starts the
next generation of a request whose last generation failed entirely from stored replies,
and asks it once: a generation that failed in this run is not asked again in it. The
chain holds at most :data:`MAX_REJUDGES` generations after the first, so a judge that
cannot answer a row costs at most that many more requests (times its parse retries) over
all runs; past the bound the last generation's failure stands.

Only ``parse_failure`` depends on a cached reply this way. ``judge_error``, ``timeout``
and ``context_too_long`` completions are never cached (:meth:`JudgmentCache.put
<ragbatch.judge.cache.JudgmentCache.put>` keeps ``ok`` completions only), so every run asks
them again whatever ``rejudge`` says; :data:`~ragbatch.core.status.REJUDGE_STATUSES`
accepts them for that reason. An ``error`` cell is the metric's own code failing, which a
new reply does not fix: :func:`~ragbatch.core.status.check_rejudge` refuses it.
"""

from __future__ import annotations

import hashlib
from typing import Callable, Iterable

from ragbatch.core.status import PARSE_FAILURE, REJUDGE_STATUSES, check_rejudge
from ragbatch.judge.protocol import Completion

__all__ = [
    "MAX_REJUDGES",
    "NIGHTLY_REJUDGE",
    "REJUDGE_STATUSES",
    "check_rejudge",
    "first_generation",
    "reasks_parse_failures",
    "rejudge_key",
]

#: Generations after the first that a request may be asked under: the bound on its chain.
MAX_REJUDGES = 3

#: What ``ragbatch nightly`` re-asks when the config leaves ``cache.rejudge`` unset.
NIGHTLY_REJUDGE = (PARSE_FAILURE,)

#: A cached reply of a key: (completion, stored), ``stored`` True when it was read from
#: the cache's files (an earlier run paid for it), False when this process obtained it.
Found = tuple[Completion, bool]


def rejudge_key(key: str, generation: int) -> str:
    """The cache key of generation ``generation`` of the request whose generation-0 key
    (one attempt's) is ``key``.

    Parameters
    ----------
    key : str
        Hex SHA-256 (64 characters) from :func:`~ragbatch.judge.cache.cache_key`.
    generation : int
        0 to :data:`MAX_REJUDGES`.

    Returns
    -------
    str
        ``key`` itself for generation 0, else the hex SHA-256 of ``key``, the word
        ``rejudge`` and ``generation``.

    Raises
    ------
    ValueError
        ``generation`` is outside 0 to :data:`MAX_REJUDGES`.
    """
    if not 0 <= generation <= MAX_REJUDGES:
        raise ValueError(f"rejudge generation {generation} is outside 0..{MAX_REJUDGES}")
    if generation == 0:
        return key
    return hashlib.sha256(f"{key}\x00rejudge\x00{generation}".encode("ascii")).hexdigest()


def first_generation(
    attempt_key: Callable[[int], str],
    attempts: int,
    lookup: Callable[[str], Found | None],
    parses: Callable[[Completion], bool],
    rejudge: bool,
) -> int:
    """The generation a request is answered from: the first one, in chain order, that is
    not a complete failure, or the one a rejudging run starts.

    Parameters
    ----------
    attempt_key : callable
        Attempt number (0 to ``attempts - 1``) -> its generation-0 cache key.
    attempts : int
        1 + the parse retries (at least 1).
    lookup : callable
        Cache key -> :data:`Found`, or None when the cache does not hold it.
    parses : callable
        Whether a cached completion parses (and was not cut at ``max_tokens``).
    rejudge : bool
        Whether ``parse_failure`` is re-asked (``cache.rejudge``).

    Returns
    -------
    int
        0 to :data:`MAX_REJUDGES`. Generation ``g`` is passed over when every attempt of
        it is cached and none parses, and either generation ``g + 1`` is cached (its
        first attempt) or ``rejudge`` is on and every failed reply of ``g`` was stored by
        an earlier run. The generation returned is then worked through attempt by
        attempt as usual: a cached reply is used, a missing one is asked.
    """
    for generation in range(MAX_REJUDGES):
        stored = True
        for attempt in range(attempts):
            found = lookup(rejudge_key(attempt_key(attempt), generation))
            if found is None or parses(found[0]):
                return generation  # asked from here on, or answered by this generation
            stored = stored and found[1]
        ahead = lookup(rejudge_key(attempt_key(0), generation + 1)) is not None
        if not ahead and not (rejudge and stored):
            return generation
    return MAX_REJUDGES


def reasks_parse_failures(statuses: Iterable[str] | None) -> bool:
    """Whether ``statuses`` (``cache.rejudge`` as run) re-ask ``parse_failure``."""
    return PARSE_FAILURE in (statuses or ())
