"""The engine registry: one entry per engine ``type`` a config can name.

Each :class:`EngineType` says everything the rest of ragbatch needs to know about an
engine without importing its backend: the pydantic model of its config entry, the kind
of stage it runs in, how to load it, and, for judge engines, the judge's identity in
cache keys, its context window, its tokenizer and the check run before any actor starts.
The config validates every ``engines`` entry through this registry
(:mod:`ragbatch.config.engine_spec`), and every site that differs by engine asks the
registry instead of comparing ``spec.type`` with a string.

An engine is one module: its spec model, its adapter and one :func:`register_engine`
call run when the module is imported. The registry imports those modules the first time
it is asked anything (:func:`load_engines`), in the driver and in every Ray worker
alike: every module of the package ``ragbatch.engines`` (the built-in engines), then the
entry points of the group ``ragbatch.engines`` (:data:`ENTRY_POINT_GROUP`) that other
installed distributions declare. docs/extending.md, "An engine", walks through it.

Hooks may be given as callables or as ``"module:function"`` strings, which are imported
on first use, so that registering an engine never imports its backend.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import threading
from dataclasses import dataclass
from typing import Any, Callable

from ragbatch.core.errors import ConfigError, EngineError
from ragbatch.core.plugins import import_package_modules, load_entry_points
from ragbatch.core.pool_sizing import TORCH_POOL, PoolRule
from ragbatch.core.stages import stage_kind_names

#: The package whose modules are the built-in engines (imported by :func:`load_engines`).
BUILT_IN_PACKAGE = "ragbatch.engines"
#: The entry-point group other distributions declare their engines in.
ENTRY_POINT_GROUP = "ragbatch.engines"

Hook = Callable[..., Any] | str | None

#: ``(model id, sampling key)``: what a judge engine records in every cache key
#: (:func:`ragbatch.judge.cache.cache_key`).
Identity = tuple[str, dict[str, Any]]


@dataclass(frozen=True)
class EngineType:
    """One engine ``type``: its config model and the hooks the planner, dry run, cache
    probe and runner call.

    Attributes
    ----------
    name : str
        The ``type:`` value of a config entry; the spec model's ``type`` field must be
        ``Literal[name]`` (the config validates an entry of that ``type`` with it).
    spec : type of pydantic.BaseModel
        The validated config entry: a subclass of
        :class:`ragbatch.config.engine_spec.StageResources` (for a judge engine of
        :class:`ragbatch.config.engine_spec.JudgeSettings`).
    stage : str
        The stage kind the engine's metrics run in: a registered stage kind with actors
        (:func:`ragbatch.core.stages.stage_kind_names`), such as ``"model"``, ``"pii"``
        or ``"judge"``.
    loader : callable or str
        ``loader(spec) -> engine``: builds the engine (for a judge engine a
        :class:`ragbatch.judge.protocol.JudgeEngine`); called inside the stage's actors.
    install : str
        The pip command that installs the engine's backend, shown when its adapter
        module cannot be imported.
    packages : tuple of str
        Distributions whose versions the run manifest records.
    local_model : bool
        Whether ``spec.model`` names a local directory (the planner checks that it
        exists); False for a served model name.
    identities : callable or str, optional
        ``identities(spec) -> list[Identity]``: the (model id, sampling key) pairs the
        engine will record, without loading a model; more than one when the engine may
        run in one of several ways. Raises :class:`~ragbatch.core.errors.EngineError` when
        they cannot be worked out. Default: load the engine and ask it
        (``engine.model_id``, ``engine.sampling_key()``), then close it.
    identities_note : str
        Why there may be several identities; a dry run shows it when there are.
    context_window : callable or str, optional
        ``context_window(spec) -> (int, str) | None``: the model's window in tokens
        (prompt plus completion) when ``max_model_len`` is not set, and where it comes
        from (shown by a dry run). Default: unknown (None).
    tokenizer : callable or str, optional
        ``tokenizer(spec) -> str | None``: the tokenizer directory when ``tokenizer``
        is not set. Default: None (prompt lengths are then approximated).
    preflight : callable or str, optional
        ``preflight(spec) -> None``: a check of a few seconds run once in the driver
        before any actor starts (for example that a server answers); raises
        :class:`~ragbatch.core.errors.EngineError`. Default: nothing to check.
    pool_rule : PoolRule
        How the engine's actor pool is sized for what its spec leaves unset
        (:mod:`ragbatch.core.pool_sizing`). Default: :data:`~ragbatch.core.pool_sizing.TORCH_POOL`
        (actors x threads = the CPUs, one actor per GPU).
    order : int
        Where the engine stands in listings (:func:`engine_types`; for example the judge
        engines a judge metric names in ``ragbatch metrics``): lower first, ties in
        registration order. Default 100, after the built-in engines (10 to 50).
    provides : tuple of str
        What the engine can do for a metric, as capability names that metrics ask for
        instead of engine names (:class:`EnginesProviding`): ``embed`` (texts to
        vectors), ``score_pairs`` (a relevance score per text pair), ``detect_pii``.
        Judge engines are found by their stage instead. Default: none.
    synonyms : tuple of str
        Other names a config may give as the ``type`` (for example ``pii`` for
        ``presidio``); :func:`engine_synonyms` maps them.
    default_for : tuple of str
        Capabilities for which ``{type: <name>}`` with every setting at its default is
        the engine a metric gets when its config names none (:func:`default_engine`).
        At most one registered engine may be the default for a capability.
    """

    name: str
    spec: type
    stage: str
    loader: Hook
    install: str
    packages: tuple[str, ...] = ()
    local_model: bool = True
    identities: Hook = None
    identities_note: str = "several identities are possible: a hit under any counts"
    context_window: Hook = None
    tokenizer: Hook = None
    preflight: Hook = None
    pool_rule: PoolRule = TORCH_POOL
    order: int = 100
    provides: tuple[str, ...] = ()
    default_for: tuple[str, ...] = ()
    synonyms: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        kinds = stage_kind_names(actors=True)
        if self.stage not in kinds:
            raise ValueError(
                f"engine type {self.name!r}: stage {self.stage!r} is not one of {', '.join(kinds)}"
            )
        tag = getattr(self.spec, "model_fields", {}).get("type")
        if tag is None or getattr(tag.annotation, "__args__", None) != (self.name,):
            raise ValueError(
                f"engine type {self.name!r}: {self.spec.__name__} needs a field "
                f"`type: Literal[{self.name!r}]`"
            )
        if not set(self.default_for) <= set(self.provides):
            raise ValueError(
                f"engine type {self.name!r}: default_for {self.default_for} names a "
                f"capability it does not provide ({self.provides})"
            )

    def _hook(self, ref: Hook) -> Callable[..., Any] | None:
        if ref is None or callable(ref):
            return ref
        module, _, attr = ref.partition(":")
        try:
            loaded = importlib.import_module(module)
        except ImportError as exc:
            raise EngineError(
                f"engine type {self.name!r} needs a package that is not "
                f"installed ({exc}); install it with: {self.install}"
            ) from None
        return getattr(loaded, attr)

    def load(self, spec: Any) -> Any:
        """The engine ``spec`` describes (``loader(spec)``).

        Raises
        ------
        EngineError
            The adapter or its backend is not installed (the message gives
            :attr:`install`), or the adapter's own load fails.
        """
        loader = self._hook(self.loader)
        if loader is None:
            raise EngineError(f"engine type {self.name!r} has no loader")
        return loader(spec)

    def engine_identities(self, spec: Any) -> list[Identity]:
        """The (model id, sampling key) pairs the engine will record; see
        :attr:`identities`.

        Raises
        ------
        EngineError
            They cannot be worked out (a server cannot be reached, a backend is missing).
        """
        hook = self._hook(self.identities)
        if hook is not None:
            return list(hook(spec))
        engine = self.load(spec)
        try:
            return [(engine.model_id, engine.sampling_key())]
        finally:
            engine.close()

    def window(self, spec: Any) -> tuple[int, str] | None:
        """The model's window in tokens and its source, from :attr:`context_window`
        (None: unknown)."""
        hook = self._hook(self.context_window)
        return hook(spec) if hook is not None else None

    def tokenizer_path(self, spec: Any) -> str | None:
        """``spec.tokenizer`` when set, else :attr:`tokenizer`'s answer (None: none)."""
        if getattr(spec, "tokenizer", None):
            return spec.tokenizer
        hook = self._hook(self.tokenizer)
        return hook(spec) if hook is not None else None

    def check(self, spec: Any) -> None:
        """Run :attr:`preflight` (nothing when the engine has none).

        Raises
        ------
        EngineError
            From the hook.
        """
        hook = self._hook(self.preflight)
        if hook is not None:
            hook(spec)


_REGISTRY: dict[str, EngineType] = {}
_listeners: list[Callable[[], None]] = []
_loaded: list[str] = []
_LOADING = "<loading>"
_LOCK = threading.RLock()


def load_engines() -> tuple[str, ...]:
    """Import the modules that register engines, once per process: every module of
    :data:`BUILT_IN_PACKAGE`, then every entry point of :data:`ENTRY_POINT_GROUP` (a
    module, imported, or an :class:`EngineType`, registered). Every lookup of this
    module calls it first, so a Ray worker that validates a config knows the same
    engines as the driver.

    Returns
    -------
    tuple of str
        The built-in modules and entry points loaded (empty after the first call).

    Raises
    ------
    ImportError
        A built-in engine module cannot be imported. A third-party entry point that
        fails is logged and skipped (:func:`ragbatch.core.plugins.load_entry_points`).
    """
    if _loaded and _loaded[0] != _LOADING:
        return ()
    with _LOCK:  # another thread's lookup waits until the modules are loaded
        if _loaded:  # loaded, or being loaded by this thread: a lookup made meanwhile
            return ()
        _loaded.append(_LOADING)
        try:
            names = import_package_modules(BUILT_IN_PACKAGE)
            names += load_entry_points(ENTRY_POINT_GROUP, _register_loaded)
        except BaseException:
            _loaded.clear()  # the next lookup tries again, and fails the same way
            raise
        _loaded[:] = names or ["none"]
        return tuple(names)


def _register_loaded(obj: Any) -> None:
    if isinstance(obj, EngineType):
        register_engine(obj)


def register_engine(entry: EngineType) -> EngineType:
    """Add ``entry`` under ``entry.name`` and rebuild the config models that hold engines.

    Registering the same entry again is a no-op.

    Raises
    ------
    ValueError
        Another entry already has the name.
    TypeError
        The loader is a class that still lacks a method its base requires (an abstract
        class, such as a judge engine without ``complete``): it could never be built.
    """
    if inspect.isclass(entry.loader) and inspect.isabstract(entry.loader):
        missing = ", ".join(sorted(getattr(entry.loader, "__abstractmethods__", ())))
        raise TypeError(
            f"engine type {entry.name!r}: its loader {entry.loader.__name__} lacks "
            f"{missing}, which its base class requires"
        )
    existing = _REGISTRY.get(entry.name)
    if existing is not None:
        if existing == entry:
            return entry
        raise ValueError(
            f"engine type {entry.name!r} registered twice ({existing.spec.__name__} "
            f"and {entry.spec.__name__})"
        )
    _REGISTRY[entry.name] = entry
    _changed()
    return entry


def unregister_engine(name: str) -> None:
    """Remove the entry ``name`` (for tests that register a temporary engine); a name
    that is not registered is ignored."""
    if _REGISTRY.pop(name, None) is not None:
        _changed()


def on_change(listener: Callable[[], None]) -> None:
    """Call ``listener()`` after every registration change (for a cache of anything
    derived from the registered engines)."""
    _listeners.append(listener)


def _changed() -> None:
    for listener in list(_listeners):
        listener()


def engine_type(name: str, where: str = "engine") -> EngineType:
    """The entry registered as ``name``.

    Raises
    ------
    ConfigError
        No engine type has that name; the message names ``where`` and the nearest names
        (:func:`unknown_type`).
    """
    load_engines()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"{where}: {unknown_type(name)}") from None


def unknown_type(name: Any) -> str:
    """What is wrong with the engine type ``name`` that is not registered:
    ``"unknown engine type 'x' (did you mean 'y'?); the engine types are ..."``."""
    names = engine_names()
    close = difflib.get_close_matches(str(name), list(names), n=3, cutoff=0.5)
    hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
    return (
        f"unknown engine type {name!r}{hint}; the engine types are {', '.join(names)} (an "
        f"engine from another package is found once that package is installed in this "
        f"environment, through the entry-point group {ENTRY_POINT_GROUP})"
    )


def engine_of(spec: Any) -> EngineType:
    """The entry of a validated engine spec (by its ``type``).

    Raises
    ------
    ConfigError
        ``spec.type`` is not a registered engine type.
    """
    return engine_type(str(getattr(spec, "type", None)), "engine spec")


def engine_types(stage: str | None = None) -> list[EngineType]:
    """Every registered entry by :attr:`EngineType.order`, then in registration order;
    only those of ``stage`` when given."""
    load_engines()
    ranked = sorted(_REGISTRY.values(), key=lambda e: e.order)  # a stable sort
    return [e for e in ranked if stage is None or e.stage == stage]


def engine_names(stage: str | None = None) -> tuple[str, ...]:
    """The ``type`` names of :func:`engine_types`."""
    return tuple(e.name for e in engine_types(stage))


def engine_synonyms() -> dict[str, str]:
    """Other name -> engine ``type`` over every registered engine
    (:attr:`EngineType.synonyms`); a registered type name is never a synonym."""
    entries = engine_types()
    names = {e.name for e in entries}
    return {alias: e.name for e in entries for alias in e.synonyms if alias not in names}


def engines_providing(*capabilities: str) -> tuple[str, ...]:
    """The ``type`` names of the registered engines that provide any of
    ``capabilities`` (:attr:`EngineType.provides`), in :func:`engine_types` order."""
    wanted = set(capabilities)
    return tuple(e.name for e in engine_types() if wanted & set(e.provides))


def default_engine(capability: str) -> dict[str, Any] | None:
    """``{"type": name}`` of the registered engine that is the default for
    ``capability`` (:attr:`EngineType.default_for`), or None when none is.

    Raises
    ------
    ConfigError
        Two registered engines claim to be the default for ``capability``.
    """
    claims = [e.name for e in engine_types() if capability in e.default_for]
    if len(claims) > 1:
        raise ConfigError(
            f"engine types {', '.join(claims)} all claim to be the default for "
            f"{capability!r}; uninstall or fix one of them"
        )
    return {"type": claims[0]} if claims else None


class EnginesProviding:
    """A metric's ``engine_types`` (or ``second_engine_types``) given by capability: the
    names of every registered engine that provides one of ``capabilities``, read when
    asked, so an engine registered later (by a plugin) serves the metric too."""

    def __init__(self, *capabilities: str) -> None:
        self.capabilities = capabilities

    def __get__(self, instance: Any, owner: Any) -> tuple[str, ...]:
        return engines_providing(*self.capabilities)


class DefaultEngineFor:
    """A metric's ``default_engine`` given by capability (:func:`default_engine`)."""

    def __init__(self, capability: str) -> None:
        self.capability = capability

    def __get__(self, instance: Any, owner: Any) -> dict[str, Any] | None:
        return default_engine(self.capability)
