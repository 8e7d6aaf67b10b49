"""Verdict probabilities read from the token logprobs of a judge reply.

A judge request whose reply holds verdicts (an :class:`~ragbatch.judge.protocol.Ask`
with :class:`~ragbatch.judge.protocol.VerdictSlots`) asks the engine for the top
logprobs of every generated token. For each verdict of the reply:

1. The verdict is located in the reply: the value of every JSON member named
   ``slots.key`` (``"verdict": true``), each item of the array under it with
   ``slots.items`` (``"verdicts": [1, 0]``), or the whole reply for a choice (also when
   an OpenAI-style server wrapped it as ``{"verdict": "3"}``).
2. The token where the verdict starts is found by laying the generated tokens' texts
   end to end. That token may begin with text before the verdict (``":true``); call it
   the prefix.
3. Each alternative at that position (the engine's top-k plus the generated token)
   that starts with the prefix and continues with the start of exactly one valid
   verdict counts for that verdict, with probability ``exp(logprob)``.
4. p(verdict v) = the mass counted for v divided by the mass counted for all valid
   verdicts: the distribution normalized over the valid alternatives present in the
   top-k. Alternatives that continue with no valid verdict (whitespace, other text)
   are left out.

The confidence of a cell is the mean, over its verdicts, of p(the verdict the judge
generated). The probability-weighted score (``score: probability``, G-Eval's scheme) uses
each verdict's expected value, the sum over v of p(v) times v's value.

No guesses: when the engine returned no logprobs, the token texts do not spell the
reply, or the verdict's token cannot be told apart between verdicts, the probabilities
are missing and :class:`NoConfidence` says why.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

from ragbatch.judge.protocol import Completion, TokenLogprob, VerdictSlots

#: The member that wraps a choice sent as a JSON schema (OpenAI ``response_format``).
_WRAPPER_KEY = "verdict"


class NoConfidence(ValueError):
    """Verdict probabilities cannot be read from a reply; the message says why."""


@dataclass(frozen=True)
class VerdictProbability:
    """One verdict of a reply and its distribution.

    Attributes
    ----------
    literal : str
        The verdict the judge generated, as written in the reply.
    p : dict of str to float
        Probability of each valid verdict (normalized over the valid alternatives found
        in the top-k; sums to 1; verdicts not found are absent, i.e. 0).
    expected : float
        Sum over verdicts of ``p[v]`` times v's value (:class:`VerdictSlots.values`).
    """

    literal: str
    p: dict[str, float]
    expected: float

    @property
    def generated(self) -> float:
        """p(the verdict the judge generated), in (0, 1]."""
        return self.p[self.literal]


def locate(text: str, slots: VerdictSlots) -> list[tuple[int, str]]:
    """Where ``text`` holds its verdicts.

    Parameters
    ----------
    text : str
        A reply (or the generated tokens' texts joined).
    slots : VerdictSlots

    Returns
    -------
    list of (int, str)
        The character offset where each verdict starts and the verdict as written, in
        reply order; empty when none is found.
    """
    literals = sorted(slots.literals, key=len, reverse=True)
    one = "|".join(re.escape(v) for v in literals)
    if slots.key is None:
        # the reply starts with the choice; the generated tokens may go on with an
        # end-of-sequence token that the reply's text leaves out
        start = re.match(rf"\s*(?P<v>{one})", text)
        if start is not None:
            return [(start.start("v"), start.group("v"))]
        key = _WRAPPER_KEY
        pattern = re.compile(rf'"{re.escape(key)}"\s*:\s*"(?P<v>{one})"')
        return [(m.start("v"), m.group("v")) for m in pattern.finditer(text)]
    member = rf'"{re.escape(slots.key)}"\s*:\s*'
    if not slots.items:
        pattern = re.compile(rf"{member}(?P<v>{one})(?![\w.])")
        return [(m.start("v"), m.group("v")) for m in pattern.finditer(text)]
    found: list[tuple[int, str]] = []
    for array in re.finditer(rf"{member}\[", text):
        item = re.compile(rf"\s*(?P<v>{one})\s*(?P<end>[,\]])")
        at = array.end()
        while (m := item.match(text, at)) is not None:
            found.append((m.start("v"), m.group("v")))
            at = m.end()
            if m.group("end") == "]":
                break
    return found


def verdict_probabilities(completion: Completion, slots: VerdictSlots) -> list[VerdictProbability]:
    """The distribution of every verdict in ``completion``'s reply.

    Parameters
    ----------
    completion : Completion
        An ``ok`` completion whose reply parsed.
    slots : VerdictSlots

    Returns
    -------
    list of VerdictProbability
        One per verdict located in the reply, in order; every probability in [0, 1].

    Raises
    ------
    NoConfidence
        The engine returned no logprobs, the tokens do not spell the reply's verdicts,
        or a verdict's probabilities cannot be read (see the module notes).
    """
    tokens = completion.logprobs
    if not tokens:
        return _no("the engine returned no token logprobs")
    joined = "".join(t.token for t in tokens)
    spots = locate(joined, slots)
    if [v for _, v in spots] != [v for _, v in locate(completion.text or "", slots)]:
        return _no("the token texts the engine returned do not spell the reply's verdicts")
    if not spots:
        return _no("no verdict found in the reply")
    starts = _token_starts(tokens)
    return [_at(tokens, starts, offset, literal, slots) for offset, literal in spots]


def _no(reason: str) -> list[VerdictProbability]:
    raise NoConfidence(reason)


def _token_starts(tokens: Sequence[TokenLogprob]) -> list[int]:
    starts, at = [], 0
    for t in tokens:
        starts.append(at)
        at += len(t.token)
    return starts


def _at(
    tokens: Sequence[TokenLogprob],
    starts: list[int],
    offset: int,
    literal: str,
    slots: VerdictSlots,
) -> VerdictProbability:
    """The distribution of the verdict ``literal`` starting at character ``offset``."""
    import bisect

    i = bisect.bisect_right(starts, offset) - 1
    while not tokens[i].token:  # an empty token (an unfinished byte) holds no text
        i += 1
    token = tokens[i]
    prefix = token.token[: offset - starts[i]]
    alternatives = dict(token.top)
    alternatives.setdefault(token.token, token.logprob)
    mass = dict.fromkeys(slots.literals, 0.0)
    for text, logprob in alternatives.items():
        verdict = _verdict_of(text, prefix, slots.literals)
        if verdict is not None and math.isfinite(logprob):
            mass[verdict] += math.exp(logprob)
    if _verdict_of(token.token, prefix, slots.literals) != literal:
        raise NoConfidence(
            f"the token {token.token!r} of verdict {literal!r} does not tell "
            f"the verdicts {list(slots.literals)} apart"
        )
    total = sum(mass.values())
    if mass[literal] <= 0.0 or total <= 0.0:
        raise NoConfidence(f"the engine gave verdict {literal!r} no probability")
    p = {v: m / total for v, m in mass.items() if m > 0.0}
    values = dict(slots.values)
    return VerdictProbability(literal, p, sum(q * values[v] for v, q in p.items()))


def _verdict_of(text: str, prefix: str, literals: Sequence[str]) -> str | None:
    """The one verdict that token ``text`` starts, after ``prefix``; None if it starts
    none or several."""
    if not text.startswith(prefix) or len(text) == len(prefix):
        return None
    rest = text[len(prefix) :]
    matches = [v for v in literals if v.startswith(rest) or rest.startswith(v)]
    return matches[0] if len(matches) == 1 else None


def mean(values: Sequence[float]) -> float:
    """The arithmetic mean of a non-empty sequence."""
    return math.fsum(values) / len(values)


@dataclass
class CellConfidence:
    """What the judge stage gathers about one cell's verdicts.

    Attributes
    ----------
    asked : int
        Replies of the cell that held verdicts.
    verdicts : list of VerdictProbability
        Their verdicts' distributions, in order.
    note : str or None
        Why the distributions of some reply are missing (the first such reason).
    """

    asked: int = 0
    verdicts: list[VerdictProbability] | None = None
    note: str | None = None

    def read(self, completion: Completion, slots: VerdictSlots) -> None:
        """Add the verdicts of one parsed reply."""
        self.asked += 1
        if self.verdicts is None:
            self.verdicts = []
        try:
            self.verdicts.extend(verdict_probabilities(completion, slots))
        except NoConfidence as exc:
            self.note = self.note or str(exc)

    @property
    def value(self) -> float | None:
        """The cell's confidence: mean p(generated verdict) over its verdicts; None when
        the cell has no verdicts or some reply's distributions are missing."""
        if self.note is not None or not self.verdicts:
            return None
        return mean([v.generated for v in self.verdicts])
