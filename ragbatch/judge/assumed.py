"""What a dry run assumes about judge replies it cannot see.

A two-step judge metric (extract statements, then verify them) puts the judge's first
reply into its second prompt, so that prompt exists only once the first reply does. To
estimate it before running, ``ragbatch run --dry-run`` assumes that the judge restates
the text it is asked to split (the answer, or the reference answer) as one statement per
sentence, in the text's own words. The follow-up prompt is then built by the metric's own
code from those sentences.

The assumption ignores what a judge really does with a text: it leaves out filler,
replaces pronouns with names (slightly longer statements) and may return no statements at
all (a refusal), in which case no follow-up call is made. The estimate of the follow-up
step is therefore an assumption, not a count; the first step is counted exactly.
"""

from __future__ import annotations

import re

from ragbatch.judge.parse import MAX_STATEMENTS, STATEMENT_MAX_CHARS

#: End of a sentence: ``.``, ``!`` or ``?`` (and closing quotes or brackets) followed by
#: whitespace, a CJK full stop, exclamation or question mark (``。！？``, which need no
#: space after them), or a line break.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"')\]])\s+|(?<=[。！？])\s*|\s*\n\s*")


def assumed_statements(text: str | None) -> list[str]:
    """The statements a dry run assumes the judge extracts from ``text``: its sentences.

    Parameters
    ----------
    text : str or None
        The text the judge is asked to split (an answer or a reference answer).

    Returns
    -------
    list of str
        The non-blank sentences of ``text`` in order (split after ``.``, ``!`` or ``?``
        followed by whitespace, after ``。``, ``！`` or ``？``, and at line breaks), at most
        :data:`~ragbatch.judge.parse.MAX_STATEMENTS` of them, each cut to
        :data:`~ragbatch.judge.parse.STATEMENT_MAX_CHARS` characters, as the statements
        schema allows. Empty for a null or blank text.

    Examples
    --------
    >>> assumed_statements("Paris is in France. It is the capital!\\nSee the map.")
    ['Paris is in France.', 'It is the capital!', 'See the map.']
    >>> assumed_statements("東京は大きい。人が多い！ Yes.")
    ['東京は大きい。', '人が多い！', 'Yes.']
    >>> assumed_statements("   ")
    []
    """
    if text is None:
        return []
    parts = (p.strip() for p in _SENTENCE_END.split(text))
    return [p[:STATEMENT_MAX_CHARS] for p in parts if p][:MAX_STATEMENTS]
