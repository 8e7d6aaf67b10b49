"""``ragbatch cache stats | compact | prune | check``: look after a judgment cache.

The cache is named by a job config (its ``cache`` section, or ``<output.uri>/judge_cache``)
or by ``--uri``. ``prune`` keeps the entries used within the last ``--keep-runs`` runs
or ``--keep-days`` days (default: the config's ``cache.keep_runs`` / ``cache.keep_days``).
Both ``compact`` and ``prune`` first fold the journal (what runs wrote since their last
fold, a run in progress or a killed one included). ``check`` lists the bucket and
journal files that cannot be read (``--data``: every byte, not only the footers) and
with ``--repair`` sets them aside; it exits
:data:`~ragbatch.core.exit_codes.EXIT_CACHE_DAMAGED` when it leaves such files in place.
Design and costs: docs/cache.md.
"""

from __future__ import annotations

import argparse
from typing import Any

from ragbatch.cli.common import add_storage_option
from ragbatch.core.errors import ConfigError, OutputError
from ragbatch.core.exit_codes import EXIT_CACHE_DAMAGED, EXIT_OK


def _add_cache_parser(sub: Any) -> None:
    """Add ``cache`` and its three actions to the ``ragbatch`` parser."""
    p = sub.add_parser("cache", help="judgment cache: stats, compact, prune, check")
    p.add_argument("action", choices=("stats", "compact", "prune", "check"))
    p.add_argument("config", nargs="?", help="job config (YAML) whose cache to use")
    p.add_argument("--uri", help="the cache root (instead of a config's)")
    add_storage_option(p, "fsspec storage option of --uri (repeatable; as for ragbatch compare)")
    p.add_argument("--keep-runs", type=int, help="prune: keep entries used in the last N runs")
    p.add_argument("--keep-days", type=float, help="prune: keep entries used in the last D days")
    p.add_argument(
        "--data",
        action="store_true",
        help="check: read and decode every file whole (default: footers and columns only)",
    )
    p.add_argument(
        "--repair",
        action="store_true",
        help="check: move the files that cannot be read to <cache>/v2/damaged/ (their "
        "entries are asked again by the runs that need them)",
    )


def _location(args: argparse.Namespace) -> tuple[str, dict[str, Any], Any]:
    """(uri, storage options, cache section or None) named by the arguments."""
    from ragbatch.io.options import storage_options_from

    if args.uri:
        return args.uri, storage_options_from(args.storage_option, "--storage-option"), None
    if not args.config:
        raise ConfigError("ragbatch cache: give a job config or --uri")
    from ragbatch.config.job import load_config

    config = load_config(args.config)
    uri, options = config.cache_location()
    if "{" in uri:
        raise ConfigError(
            f"cache.uri {uri!r} holds a placeholder: name the rendered root with --uri"
        )
    return uri, options, config.cache


def cmd_cache(args: argparse.Namespace) -> int:
    """Run ``ragbatch cache <action>``; print what was found or done."""
    from ragbatch.judge import cache_upkeep as upkeep

    uri, options, section = _location(args)
    if args.action != "check" and (args.data or args.repair):
        raise ConfigError("--data and --repair apply to `ragbatch cache check` only")
    try:
        files = upkeep.open_files(uri, options)
        if args.action == "stats":
            _print_stats(upkeep.cache_stats(files))
            return EXIT_OK
        if args.action == "check":
            return _check(upkeep, files, args.data, args.repair)
        if args.action == "compact":
            done = upkeep.compact(files)
            _print_fold(done.fold)
            print(f"compacted {done.buckets} buckets: {done.entries} entries")
            return EXIT_OK
        keep_runs = args.keep_runs if args.keep_runs is not None else _get(section, "keep_runs")
        keep_days = args.keep_days if args.keep_days is not None else _get(section, "keep_days")
        if keep_runs is None and keep_days is None:
            raise ConfigError(
                "ragbatch cache prune: give --keep-runs, --keep-days or both "
                "(or cache.keep_runs / cache.keep_days in the config)"
            )
        try:
            result = upkeep.prune(files, keep_runs, keep_days)
        except ValueError as exc:
            raise ConfigError(f"ragbatch cache prune: {exc}") from None
        _print_fold(result.fold)
        print(
            f"pruned {result.buckets} buckets: kept {result.kept} entries, dropped {result.dropped}"
        )
        return EXIT_OK
    except (ConfigError, OutputError):
        raise
    except OSError as exc:
        raise OutputError(f"judgment cache {uri}: {type(exc).__name__}: {exc}") from exc


def _print_stats(areas: dict[str, Any]) -> None:
    """One line per area of ``ragbatch cache stats``; the ``damaged`` area (files set
    aside, not read) only when it holds files."""
    for area, s in areas.items():
        if area == "damaged":
            if s.files:
                print(f"{area:8s} files {s.files:7d}  (set aside, not read)  bytes {s.bytes:14d}")
            continue
        line = (
            f"{area:8s} files {s.files:7d}  entries {s.rows - s.touches:11d}  "
            f"touches {s.touches:9d}  bytes {s.bytes:14d}"
        )
        if s.unreadable:
            line += f"  unreadable {s.unreadable} (ragbatch cache check --repair)"
        print(line)


def _check(upkeep: Any, files: Any, data: bool, repair: bool) -> int:
    """``ragbatch cache check``: print each unreadable file with why (and where
    ``repair`` moved it); exit 0 when none is left in place, else
    :data:`~ragbatch.core.exit_codes.EXIT_CACHE_DAMAGED`."""
    result = upkeep.check_cache(files, data=data, repair=repair)
    moved = dict(result.set_aside)
    for path, why in result.damaged:
        print(f"damaged   {files.uri(path)}: {why}")
        if path in moved:
            print(f"set aside {files.uri(path)} -> {files.uri(moved[path])}")
    what = "every byte" if data else "footers and columns"
    print(
        f"checked {result.files} files ({what}): {len(result.damaged)} damaged"
        + (f", {len(result.set_aside)} set aside" if repair else "")
    )
    if result.damaged and not repair:
        print("run `ragbatch cache check --repair` to set them aside")
        return EXIT_CACHE_DAMAGED
    return EXIT_OK


def _print_fold(fold: Any) -> None:
    """Say what the journal fold that starts ``compact`` and ``prune`` did."""
    print(
        f"folded {fold.journal_files} journal files ({fold.rows} rows) "
        f"into {fold.files_written} bucket files"
    )


def _get(section: Any, name: str) -> Any:
    return getattr(section, name, None) if section is not None else None
