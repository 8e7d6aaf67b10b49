"""YAML loading with budgets, so a hostile or broken file cannot exhaust memory.

PyYAML's ``safe_load`` expands every alias into a full copy of its anchor, so ten nested
anchors of ten aliases each (a "billion laughs" file of a few hundred bytes) build 10**10
objects. :func:`load_yaml` refuses such a file before constructing anything: it checks
the size in bytes, counts alias references in the event stream, and works out how many
nodes the document would expand to from its composed node graph (where an alias is a
shared reference, so this costs time linear in the file).
"""

from __future__ import annotations

from typing import Any

import yaml

from ragbatch.core.errors import ConfigError

#: Largest YAML file read as a config, in bytes (1 MiB).
MAX_YAML_BYTES = 1 << 20
#: Most alias references (``*name``) a YAML file may hold.
MAX_YAML_ALIASES = 1_000
#: Most nodes (scalars, lists, mappings) a YAML file may expand to once aliases are copied.
MAX_YAML_NODES = 100_000


def load_yaml(data: bytes, where: str) -> Any:
    """Parse YAML ``data`` with :func:`yaml.safe_load` within the budgets above.

    Parameters
    ----------
    data : bytes
        The file's bytes (UTF-8).
    where : str
        The file, for messages.

    Returns
    -------
    Any
        The parsed document (None for an empty file).

    Raises
    ------
    ConfigError
        The data is over :data:`MAX_YAML_BYTES`, holds more than
        :data:`MAX_YAML_ALIASES` aliases, expands to more than :data:`MAX_YAML_NODES`
        nodes, holds a recursive anchor, is not UTF-8, or is not valid YAML.
    """
    if len(data) > MAX_YAML_BYTES:
        raise ConfigError(
            f"{where}: {len(data):,} bytes is over the {MAX_YAML_BYTES:,}-byte limit "
            "for a YAML config; keep large data (schemas, labels) in files it names"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{where}: not UTF-8 text (byte offset {exc.start}); save it as UTF-8"
        ) from None
    try:
        _check_aliases(text, where)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is not None:
            _check_expansion(node, where)
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {exc}") from None


def _check_aliases(text: str, where: str) -> None:
    aliases = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_YAML_ALIASES:
                raise ConfigError(
                    f"{where}: more than {MAX_YAML_ALIASES:,} YAML aliases (*name); a config "
                    "needs few, write the values out or split the file"
                )


def _check_expansion(root: yaml.Node, where: str) -> None:
    """Raise when the document under ``root`` expands to more than MAX_YAML_NODES nodes.

    The size of a node is 1 plus the sizes of its children; an alias is the same node
    object as its anchor, so sizes are memoized per node and the walk visits each node of
    the composed graph once.
    """
    sizes: dict[int, int] = {}
    on_path: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in on_path:
            raise ConfigError(
                f"{where}: a YAML anchor refers to itself (line "
                f"{node.start_mark.line + 1}); configs cannot be recursive"
            )
        on_path.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            children = []
        for child in children:
            total += size(child)
            if total > MAX_YAML_NODES:
                raise ConfigError(
                    f"{where}: the YAML expands to more than {MAX_YAML_NODES:,} values once its "
                    "aliases (*name) are copied (nested anchors); write the values out instead"
                )
        on_path.discard(key)
        sizes[key] = total
        return total

    size(root)
