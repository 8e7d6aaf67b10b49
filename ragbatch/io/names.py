"""Which input column names a run can use.

Two checks, both with messages that name the column and the fix:

* :func:`refuse_internal_names` runs on every file as it is read: a column whose name
  starts with :data:`ragbatch.core.columns.INTERNAL_PREFIX` would collide with a column the
  pipeline adds for itself, so it is an error wherever it appears.
* :func:`unusable_names` runs on the columns a run would use (mapped or passed through as
  slices), at ``validate`` and at run start: an empty or whitespace-only name cannot be
  told apart in the scores table, reports or SQL, and a name given twice is ambiguous.

An unnamed *first* column of a CSV/TSV header is what ``pandas.DataFrame.to_csv()``
writes for the index; the CSV reader skips that one column (see
:func:`ragbatch.io.text_formats.read_delimited`) instead of failing.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable

from ragbatch.core.columns import INTERNAL_PREFIX, is_internal
from ragbatch.core.errors import InputError


def refuse_internal_names(names: Iterable[str], where: str) -> None:
    """Raise when a column name lies in the pipeline's namespace.

    Parameters
    ----------
    names : iterable of str
        The columns of one input file, as read.
    where : str
        The file, for the message.

    Raises
    ------
    InputError
        Some name starts with :data:`~ragbatch.core.columns.INTERNAL_PREFIX`; the message
        lists them and says to rename them in the input.
    """
    clashing = [n for n in names if is_internal(n)]
    if clashing:
        raise InputError(
            f"{where}: column name(s) {', '.join(repr(n) for n in clashing)} start with "
            f"{INTERNAL_PREFIX!r}, which ragbatch keeps for its own columns; rename them in the "
            "input"
        )


def unusable_names(names: list[str], used: Iterable[str]) -> list[str]:
    """Problems with the names of the columns a run uses.

    Parameters
    ----------
    names : list of str
        Every column of the input, in order (duplicates possible in Parquet).
    used : iterable of str
        The columns the run would read: mapped and slice columns.

    Returns
    -------
    list of str
        One ``"input: ..."`` message per problem (empty name, whitespace-only name, name
        given twice), empty when fine.
    """
    counts = Counter(names)
    problems = []
    for name in dict.fromkeys(used):
        if name not in counts:
            continue
        if not name.strip():
            position = names.index(name) + 1
            problems.append(
                f"input: column {position} has {'an empty' if not name else 'a whitespace-only'} "
                f"name ({name!r}); name it in the input, or set input.slice_columns to the "
                "columns to keep (it is then not read)"
            )
        elif counts[name] > 1:
            problems.append(
                f"input: column name {name!r} appears {counts[name]} times; give each column a "
                "distinct name in the input, or set input.slice_columns to leave it out"
            )
    return problems
