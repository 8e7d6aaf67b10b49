"""The argument types and helpers the commands share (run ids, storage options, the config)."""

from __future__ import annotations

import argparse

from ragbatch.config.job import JobConfig, load_config
from ragbatch.core.errors import ConfigError
from ragbatch.core.exit_codes import EXIT_DEGENERATE
from ragbatch.core.ids import id_argument


#: argparse ``type=`` of every run id argument: a bad id exits 2 before anything runs.
_RUN_ID = id_argument("run id")


def _add_degenerate_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--fail-on-degenerate",
        action="store_true",
        default=None,
        help=f"exit {EXIT_DEGENERATE} when the run commits but a judge metric's result "
        "is degenerate (a constant judge, empty extractions, junk reasons...; "
        "thresholds: the config's diagnostics section; default: "
        "diagnostics.fail_on_degenerate)",
    )


def _rejudge_statuses(text: str) -> list[str]:
    """``--rejudge``'s value: statuses separated by commas, or ``none`` for none."""
    from ragbatch.core.status import check_rejudge

    names = [t.strip() for t in text.split(",") if t.strip()]
    if names == ["none"]:
        return []
    try:
        return check_rejudge(names, "--rejudge")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_rejudge_flag(p: argparse.ArgumentParser, default: str) -> None:
    """``--rejudge STATUS[,STATUS]``: overrides ``cache.rejudge`` (:func:`_load`)."""
    p.add_argument(
        "--rejudge",
        type=_rejudge_statuses,
        default=None,
        metavar="STATUS[,STATUS]",
        help="ask the judge again for the cached requests behind cells of these "
        "statuses, under new cache keys (parse_failure; judge_error, timeout and "
        "context_too_long are never cached, so always asked again), or none; "
        f"default: cache.rejudge, else {default} (docs/cache.md)",
    )


def _add_storage_option_args(p: argparse.ArgumentParser, root_flag: str, other_flag: str) -> None:
    """``--storage-option`` for ``root_flag``'s root and ``--<other>-storage-option`` for
    ``other_flag``'s (:func:`_storage_options` reads them; docs/storage.md)."""
    form = (
        "repeatable; VALUE is read as YAML (anon=false is a bool), a dotted KEY nests "
        "(client_kwargs.region_name=eu-west-1); the AWS_*/GOOGLE_* environment applies "
        "to what is not given"
    )
    add_storage_option(p, f"fsspec storage option of the {root_flag} root ({form})")
    other = other_flag.removesuffix("-output").lstrip("-")
    add_storage_option(
        p,
        f"storage option of the {other_flag} root, as --storage-option; only "
        f"these apply there (default: none; without {other_flag} the "
        f"{root_flag} root and its options are used)",
        prefix=other,
    )


def add_storage_option(p: argparse.ArgumentParser, help_text: str, prefix: str = "") -> None:
    """Add the repeatable flag ``--storage-option KEY=VALUE`` (``--<prefix>-storage-option``
    with a ``prefix``) to ``p``: each value parsed into ``args.storage_option``
    (``args.<prefix>_storage_option``), a list of ``(key path, value)`` pairs
    (:func:`ragbatch.io.options.parse_storage_option`; a bad one is a usage error)."""
    p.add_argument(
        f"--{prefix}-storage-option" if prefix else "--storage-option",
        dest=f"{prefix}_storage_option" if prefix else "storage_option",
        action="append",
        default=[],
        type=_storage_option,
        metavar="KEY=VALUE",
        help=help_text,
    )


def _storage_option(text: str) -> tuple[tuple[str, ...], object]:
    from ragbatch.io.options import parse_storage_option

    try:
        return parse_storage_option(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _storage_options(args: argparse.Namespace, other: str | None = None) -> dict:
    """The storage options the flags give: of the main root (``--storage-option``), or of
    the ``other`` root (``--<other>-storage-option``, e.g. ``candidate``).

    Raises
    ------
    ConfigError
        A key is given twice or both as a value and as a parent of nested keys; or
        ``--<other>-storage-option`` is given without ``--<other>-output``.
    """
    from ragbatch.io.options import storage_options_from

    if other is None:
        return storage_options_from(args.storage_option, "--storage-option")
    pairs = getattr(args, f"{other}_storage_option")
    if pairs and not getattr(args, f"{other}_output"):
        raise ConfigError(
            f"--{other}-storage-option applies to the --{other}-output root; "
            f"add --{other}-output, or give the options with --storage-option"
        )
    return storage_options_from(pairs, f"--{other}-storage-option")


def _other_root(args: argparse.Namespace, other: str) -> tuple[str, dict]:
    """The root and options of ``--<other>-output``, defaulting to ``--output``'s."""
    options = _storage_options(args, other)
    if getattr(args, f"{other}_output"):
        return getattr(args, f"{other}_output"), options
    return args.output_uri, _storage_options(args)


def _column_list(text: str) -> tuple[str, ...]:
    return tuple(c.strip() for c in text.split(",") if c.strip())


def _confidence(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be strictly between 0 and 1, got {text}")
    return value


def _fdr(text: str) -> float | None:
    """``--fdr``: a false discovery rate in (0, 1), or ``off`` (no control)."""
    if text.strip().lower() in ("off", "none"):
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(
            f"must be a false discovery rate strictly between 0 and 1 (e.g. 0.05), or "
            f"'off', got {text!r}"
        )
    return value


def _add_fdr_arg(p: argparse.ArgumentParser) -> None:
    """``--fdr Q``: the false discovery rate across a comparison's lines."""
    p.add_argument(
        "--fdr",
        type=_fdr,
        default=0.05,
        metavar="Q",
        help="false discovery rate across all lines of the comparison (metrics x "
        "slices; Benjamini-Hochberg over paired-test p-values): a line is flagged when "
        "its adjusted p-value is at most Q and its interval excludes zero; 'off' flags "
        "by the interval alone (default %(default)s)",
    )


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0.0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (in the metric's units), got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {text}")
    return value


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="path to the job config (YAML)")
    p.add_argument("--input", dest="input_uri", help="override input.uri")
    p.add_argument("--output", dest="output_uri", help="override output.uri")


def _load(args: argparse.Namespace) -> JobConfig:
    config = load_config(args.config)
    if args.input_uri:
        config.input.uri = args.input_uri
    if args.output_uri:
        config.output.uri = args.output_uri
    if getattr(args, "run_date", None):
        config.run.run_date = args.run_date
    if getattr(args, "rejudge", None) is not None:
        config.cache.rejudge = args.rejudge
    return config
