"""Building the plugin manager and collecting what plugins register.

The manager is built by :func:`get_plugin_manager`, never at import time, so
importing ckpt has no side effects and tests can build a fresh one. Built-in
plugins (:data:`DEFAULT_PLUGINS`) are registered through the same hooks as
third-party ones found through the ``ckpt`` entry-point group.

:func:`registry` is the one registry of a process, built on first use and
shared by the command line, the engine and the workers; :func:`load_registry`
builds a separate one (tests, notebooks registering plugin objects of their own).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pluggy

from ckpt.errors import PluginError, PluginWarning
from ckpt.plugins import hookspecs
from ckpt.plugins.analyzer import Analyzer, validate_analyzer

if TYPE_CHECKING:  # pragma: no cover
    from ckpt.plugins._importers import Importer
    from ckpt.plugins.objectives import Objective
    from ckpt.plugins.tasks import LazyTask, Task

DEFAULT_PLUGINS: tuple[str, ...] = (
    "ckpt.plugins.objectives",
    "ckpt.plugins._importers",
    "ckpt.analyzers.loss",
    "ckpt.analyzers.hessian_basis",
    "ckpt.analyzers.random_basis",
    "ckpt.analyzers.polca",
    "ckpt.analyzers.fisher",
    "ckpt.analyzers.lca",
    "ckpt.analyzers.clusters",
    "ckpt.analyzers.grad_norms",
    "ckpt.analyzers.sparsity",
    "ckpt.analyzers.embedding_geometry",
    "ckpt.analyzers.curvature",
    "ckpt.analyzers.spectrum",
    "ckpt.analyzers.normalization",
    "ckpt.analyzers.boundary_distance",
    "ckpt.analyzers.attention",
    "ckpt.analyzers.llc",
    "ckpt.analyzers.essential_dynamics",
    "ckpt.sandboxes",
)
"""Modules of ckpt's own plugins, registered exactly like third-party ones."""


def analyzer_hook(*analyzers: type[Analyzer]) -> Callable[[Callable[[type[Analyzer]], None]], None]:
    """The ``ckpt_register_analyzers`` hookimpl that registers ``analyzers``, for ckpt's own modules.

    It is the hook a third-party plugin writes out (docs/plugins.md), made once here
    because each built-in analyzer module would otherwise end in the same four lines;
    a module binds it to the hook's name, which pluggy looks for:
    ``ckpt_register_analyzers = analyzer_hook(Polca)``.

    Examples
    --------
    >>> from ckpt.analyzers.loss import Loss
    >>> registered = []
    >>> analyzer_hook(Loss)(registered.append)
    >>> registered == [Loss]
    True
    """

    @hookspecs.hookimpl
    def ckpt_register_analyzers(register: Callable[[type[Analyzer]], None]) -> None:
        for analyzer in analyzers:
            register(analyzer)

    names = ", ".join(f"``{analyzer.name}``" for analyzer in analyzers)
    ckpt_register_analyzers.__doc__ = f"Register {names}."
    return ckpt_register_analyzers


KINDS = ("analyzers", "objectives", "importers", "tasks")


@dataclass(frozen=True)
class Provider:
    """Where a registered item comes from: the plugin and the distribution that ships it."""

    plugin: str
    package: str
    version: str

    def __str__(self) -> str:
        return f"plugin {self.plugin!r} from {self.package} {self.version}"


@dataclass
class Registry:
    """Everything the plugins registered, by kind, with their providers."""

    analyzers: dict[str, type[Analyzer]] = field(default_factory=dict)
    objectives: dict[str, Objective] = field(default_factory=dict)
    importers: dict[str, Importer] = field(default_factory=dict)
    tasks: dict[str, Task | LazyTask] = field(default_factory=dict)
    providers: dict[tuple[str, str], Provider] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    """One line per plugin that failed to load or register, or whose names were taken (also warned)."""

    def provider(self, kind: str, name: str) -> Provider:
        """Who registered ``name`` of ``kind``."""
        return self.providers[(kind, name)]


def _own_provider(module: str) -> Provider:
    import ckpt

    return Provider(module, ckpt.DISTRIBUTION, ckpt.__version__)


def get_plugin_manager(
    *, entry_points: bool = True, extra: Iterable[Any] = ()
) -> tuple[pluggy.PluginManager, dict[str, Provider]]:
    """Build a plugin manager with ckpt's hookspecs, built-in plugins and installed plugins.

    Parameters
    ----------
    entry_points
        Also load third-party plugins from the ``ckpt`` entry-point group.
    extra
        Plugin objects or modules to register too (tests, notebooks).

    Returns
    -------
    manager, providers
        The pluggy manager and, per registered plugin name, where it came from.
    """
    manager = pluggy.PluginManager(hookspecs.PROJECT)
    manager.add_hookspecs(hookspecs)
    providers: dict[str, Provider] = {}
    for module_name in DEFAULT_PLUGINS:
        manager.register(importlib.import_module(module_name), name=module_name)
        providers[module_name] = _own_provider(module_name)
    if entry_points:
        for entry_point in importlib.metadata.entry_points(group=hookspecs.PROJECT):
            dist = entry_point.dist
            package = dist.name if dist is not None else "an unknown package"
            version = dist.version if dist is not None else "?"
            try:
                plugin = entry_point.load()
                if manager.is_registered(plugin):
                    continue
                manager.register(plugin, name=entry_point.name)
            except Exception as exc:  # a broken plugin must not break ckpt
                warnings.warn(
                    f"plugin {entry_point.name!r} from {package} {version} failed to load and is skipped: "
                    f"{type(exc).__name__}: {exc}",
                    PluginWarning,
                    stacklevel=2,
                )
                continue
            providers[entry_point.name] = Provider(entry_point.name, package, version)
    for plugin in extra:
        if manager.is_registered(plugin):
            continue
        name = manager.register(plugin)
        providers[str(name)] = Provider(str(name), getattr(plugin, "__name__", type(plugin).__name__), "local")
    return manager, providers


def collect(manager: pluggy.PluginManager, providers: dict[str, Provider]) -> Registry:
    """Call every ``ckpt_register_*`` hook and gather the results into a :class:`Registry`."""
    registry = Registry()
    for kind in KINDS:
        hook = getattr(manager.hook, f"ckpt_register_{kind}")
        for implementation in hook.get_hookimpls():
            plugin_name = implementation.plugin_name
            provider = providers.get(plugin_name, Provider(plugin_name, "unknown", "?"))
            target: dict[str, Any] = getattr(registry, kind)

            def register(
                *args: Any, kind: str = kind, target: dict[str, Any] = target, provider: Provider = provider
            ) -> None:
                if kind == "analyzers":
                    (item,) = args
                    try:
                        validate_analyzer(item)
                    except PluginError as exc:  # skip this one; the plugin's later registrations still count
                        who = getattr(item, "__qualname__", repr(item))
                        warnings.warn(f"analyzer {who} of {provider} is skipped: {exc}", PluginWarning, stacklevel=2)
                        return
                    name = item.name
                else:
                    name, item = args
                if name in target:
                    first = registry.providers[(kind, name)]
                    warnings.warn(
                        f"{kind[:-1]} {name!r} registered by {provider} is ignored: the name is taken by {first}",
                        PluginWarning,
                        stacklevel=2,
                    )
                    return
                target[name] = item
                registry.providers[(kind, name)] = provider

            try:
                implementation.function(register=register)
            except Exception as exc:
                warnings.warn(
                    f"{provider} failed in ckpt_register_{kind} and is skipped: {type(exc).__name__}: {exc}",
                    PluginWarning,
                    stacklevel=2,
                )
    return registry


def load_registry(*, entry_points: bool = True, extra: Iterable[Any] = ()) -> Registry:
    """Build a plugin manager and collect every registration into a new :class:`Registry`.

    Each problem (a plugin that fails to load or to register, a name that is
    taken) is a :class:`PluginWarning` and a line of ``Registry.problems``.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PluginWarning)
        manager, providers = get_plugin_manager(entry_points=entry_points, extra=extra)
        registry = collect(manager, providers)
    for warning in caught:
        if issubclass(warning.category, PluginWarning):
            registry.problems.append(" ".join(str(warning.message).split()))
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return registry


_registry: Registry | None = None
_registry_lock = threading.Lock()


def registry() -> Registry:
    """The plugin registry of this process: built once, on first use, then shared.

    The command line, the engine and the workers all read this one, so a
    process imports the installed plugins once (``ckpt analyze`` built three
    before). :func:`reset_registry` forgets it, e.g. after installing a plugin
    in a running notebook.
    """
    global _registry
    if _registry is None:
        with _registry_lock:
            if _registry is None:
                _registry = load_registry()
    return _registry


def reset_registry() -> None:
    """Forget the shared registry; the next :func:`registry` call builds it anew."""
    global _registry
    with _registry_lock:
        _registry = None


__all__ = [
    "DEFAULT_PLUGINS",
    "KINDS",
    "Provider",
    "Registry",
    "analyzer_hook",
    "collect",
    "get_plugin_manager",
    "load_registry",
    "registry",
    "reset_registry",
]
