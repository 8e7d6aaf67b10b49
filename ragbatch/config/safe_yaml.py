"""YAML loading with budgets, so a hostile or broken file cannot exhaust memory.

PyYAML's ``safe_load`` expands every alias into a full copy of its anchor, so ten nested
anchors of ten aliases each (a "billion laughs" file of a few hundred bytes) build 10**10
objects. :func:`load_yaml` refuses such a file before constructing anything: it checks
the size in bytes, counts alias references in the event stream, and works out how many
nodes the document would expand to from its composed node graph (where an alias is a
shared reference, so this costs time linear in the file).

It also refuses a mapping that gives one key twice (two ``judge_a:`` under ``engines:``),
which PyYAML would accept with the last value silently replacing the first. The check is
made by the loader as it builds each mapping (:class:`UniqueKeySafeLoader`), on the keys
written in that mapping; keys a merge key (``<<: *defaults``) brings in may still be
overridden by the mapping's own keys, as YAML's merge defines.
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


#: The tag PyYAML's resolver gives a merge key (``<<``).
_MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(yaml.YAMLError):
    """A mapping of the document gives one key twice (raised by
    :class:`UniqueKeySafeLoader`; :func:`load_yaml` turns it into a
    :class:`~ragbatch.core.errors.ConfigError` naming the file).

    Attributes
    ----------
    key : str
        The key as written at its second occurrence.
    first_key : str
        The key as written at its first occurrence (another spelling of the same value,
        e.g. ``on`` for ``true``, or ``key``).
    first_line, line : int
        1-based lines of the first and the second occurrence.
    """

    def __init__(self, key: str, first_key: str, first_line: int, line: int):
        self.key = key
        self.first_key = first_key
        self.first_line = first_line
        self.line = line
        super().__init__(self.describe())

    def describe(self) -> str:
        """``line 5: key 'judge_a' is given twice in the same mapping (lines 3 and 5);
        ...; remove or rename one``."""
        same = "" if self.first_key == self.key else f", the same key as {self.first_key!r}"
        where = (
            f"twice on line {self.line}"
            if self.first_line == self.line
            else f"lines {self.first_line} and {self.line}"
        )
        if self.key == "<<":
            fix = "give one merge key a list instead: `<<: [*a, *b]`"
        else:
            fix = "YAML would keep only the last value, so remove or rename one"
        return (
            f"line {self.line}: key {self.key!r} is given twice in the same mapping "
            f"({where}{same}); {fix}"
        )


class UniqueKeySafeLoader(yaml.SafeLoader):
    """:class:`yaml.SafeLoader` that raises :class:`DuplicateKeyError` for a mapping
    giving one key twice.

    Keys are compared as constructed, so two spellings of one value (``on:`` and
    ``true:``, ``1:`` and ``0x1:``) are the same key. Merge keys (``<<``) are not
    compared with the mapping's own keys: ``<<: *base`` then ``x: 2`` overrides the
    ``x`` of ``base``, as YAML's merge defines; two ``<<`` keys in one mapping are a
    repeated key (write ``<<: [*a, *b]``).
    """

    def __init__(self, stream: str):
        super().__init__(stream)
        self._keys_checked: set[int] = set()

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        """Check ``node``'s own keys once, before merging rewrites its pairs, then merge.

        PyYAML flattens a mapping when it is built and, earlier, when another mapping
        merges it (``<<: *node``); either way the first call sees the keys as written.
        """
        if id(node) not in self._keys_checked:
            self._keys_checked.add(id(node))
            self._check_unique_keys(node)
        super().flatten_mapping(node)

    def _check_unique_keys(self, node: yaml.MappingNode) -> None:
        first: dict[Any, tuple[str, int]] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue  # a list or mapping as a key: the constructor refuses it
            if key_node.tag == _MERGE_TAG:
                key: Any = _MERGE_TAG  # has no constructor of its own
            else:
                key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                continue
            line = key_node.start_mark.line + 1
            if key in first:
                first_key, first_line = first[key]
                raise DuplicateKeyError(key_node.value, first_key, first_line, line)
            first[key] = (key_node.value, line)


def load_yaml(data: bytes, where: str) -> Any:
    """Parse YAML ``data`` as :func:`yaml.safe_load` does, within the budgets above and
    refusing repeated keys (:class:`UniqueKeySafeLoader`).

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
        nodes, holds a recursive anchor, is not UTF-8, is not valid YAML, or has a
        mapping that gives one key twice (the message names the key, both lines and
        says to remove or rename one).
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
        return _load_unique_keys(text)
    except DuplicateKeyError as exc:
        raise ConfigError(f"{where}: {exc.describe()}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {exc}") from None


def _load_unique_keys(text: str) -> Any:
    """``text``'s single document built by :class:`UniqueKeySafeLoader` (None when empty)."""
    loader = UniqueKeySafeLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


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
