"""The run date in a config's URIs: ``{run_date}`` and ``{run_date:<strftime format>}``.

Three fields may name the run date, so that one config serves every night
(:data:`TEMPLATED_FIELDS`)::

    input:
      uri: s3://traces/run_date={run_date}/      # -> s3://traces/run_date=2026-11-28/
      # uri: s3://traces/{run_date:%Y/%m/%d}/    # -> s3://traces/2026/11/28/

``{run_date}`` becomes the ISO date ``YYYY-MM-DD``; after a colon comes a strftime format
made of date directives only (:data:`DATE_DIRECTIVES`). ``{{`` and ``}}`` are literal
braces. Any other placeholder, a conversion (``!r``) or an unbalanced brace is a
:class:`~ragbatch.core.errors.ConfigError` naming the field and the fix.

A config is rendered once, when its run's date is known (``ragbatch run``, ``validate``
and ``nightly``; see :func:`ragbatch.pipeline.runner.run_job`); the rendered URIs are what the run
reads, writes and records in its manifest.
"""

from __future__ import annotations

import datetime as dt
import string
from typing import TYPE_CHECKING

from ragbatch.core.errors import ConfigError

if TYPE_CHECKING:
    from ragbatch.config.job import JobConfig

#: Config fields whose text may hold placeholders (dotted paths into the config).
TEMPLATED_FIELDS = ("input.uri", "output.uri", "cache.uri")

#: The one placeholder name.
RUN_DATE = "run_date"

#: strftime directives a format may use: the date ones of C89 and ISO 8601 (no time of
#: day: a run date has none) and ``%%``.
DATE_DIRECTIVES = frozenset("aAwdbBmyYjUWGuV%")

_HELP = (
    "the only placeholder is {run_date} (ISO date) or {run_date:FORMAT} with a strftime "
    "FORMAT such as %Y/%m/%d; write {{ and }} for literal braces"
)


def _parse(text: str, field: str) -> list[tuple[str, str | None]]:
    """``text`` as (literal, format) pieces; format is None after the last placeholder,
    ``""`` for a plain ``{run_date}``. Raises ConfigError for anything else."""
    try:
        pieces = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise ConfigError(f"{field}: malformed braces in {text!r} ({exc}); {_HELP}") from None
    out: list[tuple[str, str | None]] = []
    for literal, name, spec, conversion in pieces:
        if name is None:
            out.append((literal, None))
            continue
        shown = (
            "{"
            + name
            + (f"!{conversion}" if conversion else "")
            + (f":{spec}" if spec else "")
            + "}"
        )
        if name != RUN_DATE:
            raise ConfigError(f"{field}: unknown placeholder {shown} in {text!r}; {_HELP}")
        if conversion:
            raise ConfigError(
                f"{field}: {shown} in {text!r} has a conversion (!{conversion}); drop it: {_HELP}"
            )
        _check_format(spec or "", shown, text, field)
        out.append((literal, spec or ""))
    return out


def _check_format(spec: str, shown: str, text: str, field: str) -> None:
    if not spec:
        return
    if "{" in spec or "}" in spec:
        raise ConfigError(
            f"{field}: {shown} in {text!r} nests a placeholder in its format; {_HELP}"
        )
    directives = []
    i = 0
    while i < len(spec):
        if spec[i] == "%":
            code = spec[i + 1] if i + 1 < len(spec) else ""
            if not code:
                raise ConfigError(
                    f"{field}: the format of {shown} in {text!r} ends with a lone "
                    "%; write %% for a percent sign"
                )
            if code not in DATE_DIRECTIVES:
                raise ConfigError(
                    f"{field}: {shown} in {text!r} uses %{code}, which is not a date directive; "
                    f"use %Y, %m, %d, %j, %V, %G, %u, %a, %A, %b, %B, %y, %U, %W, %w or %%"
                )
            directives.append(code)
            i += 2
        else:
            i += 1
    if not [d for d in directives if d != "%"]:
        raise ConfigError(
            f"{field}: the format of {shown} in {text!r} holds no strftime directive; {_HELP}"
        )


def placeholders(text: str, field: str = "uri") -> list[str]:
    """The run-date placeholders of ``text``: one format per placeholder (``""`` for a
    plain ``{run_date}``), in order; empty when there is none.

    Raises
    ------
    ConfigError
        An unknown placeholder, a conversion, a format with a non-date directive or no
        directive, or an unbalanced brace; the message names ``field``.
    """
    return [spec for _, spec in _parse(text, field) if spec is not None]


def render(text: str, run_date: dt.date, field: str = "uri") -> str:
    """``text`` with every placeholder replaced by ``run_date`` and ``{{``/``}}`` by braces.

    Parameters
    ----------
    text : str
        A URI template, e.g. ``"s3://traces/{run_date:%Y/%m/%d}/"``.
    run_date : datetime.date
    field : str
        Config field ``text`` came from, for error messages.

    Returns
    -------
    str

    Raises
    ------
    ConfigError
        As :func:`placeholders`.

    Examples
    --------
    >>> render("out/run_date={run_date}/", dt.date(2026, 11, 28))
    'out/run_date=2026-11-28/'
    >>> render("s3://t/{run_date:%Y/%m/%d}/x.{{json}}", dt.date(2026, 1, 2))
    's3://t/2026/01/02/x.{json}'
    """
    return "".join(
        literal
        + ("" if spec is None else run_date.isoformat() if spec == "" else run_date.strftime(spec))
        for literal, spec in _parse(text, field)
    )


def fixed_prefix(text: str, field: str = "uri") -> str | None:
    """The part of ``text`` that no run date changes, cut back to its last ``/`` (the
    deepest folder common to every night), or None when ``text`` has no placeholder.
    For ``"s3://b/traces/run_date={run_date}/"`` it is ``"s3://b/traces"``.

    Raises
    ------
    ConfigError
        As :func:`placeholders`.
    """
    pieces = _parse(text, field)
    if all(spec is None for _, spec in pieces):
        return None
    head = ""
    for literal, spec in pieces:
        head += literal
        if spec is not None:
            break
    return head[: head.rfind("/")] if "/" in head else ""


def _get(config: "JobConfig", path: str) -> str | None:
    section, name = path.split(".")
    return getattr(getattr(config, section), name)


def uri_templates(config: "JobConfig") -> dict[str, str]:
    """The fields of :data:`TEMPLATED_FIELDS` that need rendering (a placeholder or an
    escaped brace), with their text as written.

    Raises
    ------
    ConfigError
        One problem per field whose text is not a valid template.
    """
    problems: list[str] = []
    found: dict[str, str] = {}
    for path in TEMPLATED_FIELDS:
        text = _get(config, path)
        if text is None or ("{" not in text and "}" not in text):
            continue
        try:
            _parse(text, path)
        except ConfigError as exc:
            problems.extend(exc.problems)
            continue
        found[path] = text
    if problems:
        raise ConfigError(problems)
    return found


def render_config(config: "JobConfig", run_date: dt.date) -> "JobConfig":
    """A copy of ``config`` whose :data:`TEMPLATED_FIELDS` are rendered for ``run_date``
    and whose ``run.run_date`` is ``run_date``. Render a config once: rendering turns
    ``{{`` into ``{``.

    Raises
    ------
    ConfigError
        As :func:`uri_templates`.
    """
    templates = uri_templates(config)
    rendered = config.model_copy(deep=True)
    rendered.run.run_date = run_date
    for path, text in templates.items():
        section, name = path.split(".")
        setattr(getattr(rendered, section), name, render(text, run_date, path))
    return rendered
