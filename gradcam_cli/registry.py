"""One registry per kind of thing gradcam knows by name: tasks, model families and CAM methods.

Each kind has one :class:`Registry` (in the module that defines its entry type: ``cam.methods`` for methods,
``models.families`` for model families, ``cam.tasks`` for task adapters). Entries register themselves when their
module is imported, and third-party packages add entries through Python entry points, as pytest plugins do: a
package that declares, in its ``pyproject.toml``::

    [project.entry-points."gradcam_cli.methods"]
    mymethod = "my_package.cams"

has ``my_package.cams`` imported the first time the method registry is looked up; importing it registers its
entries (an entry point may also name an entry object itself, which is then registered under the entry point's
name). The groups are :data:`PLUGIN_GROUPS`. A plugin that fails to import, that names something other than a
module or an entry of its group, whose entry object is named otherwise than its entry point, or that registers a name
the package or an earlier plugin holds already, is one line naming the plugin's distribution and entry point
(:class:`~gradcam_cli.errors.UsageError`, exit code 2), never a traceback; the command stops there, so that a name
never means something else than it did without the plugin. Nothing here imports torch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType
from typing import Generic, TypeVar, overload

from .errors import UsageError, describe, suggest

T = TypeVar("T")
D = TypeVar("D")

METHODS_GROUP = "gradcam_cli.methods"
FAMILIES_GROUP = "gradcam_cli.families"
TASKS_GROUP = "gradcam_cli.tasks"
PLUGIN_GROUPS = (FAMILIES_GROUP, METHODS_GROUP, TASKS_GROUP)
"""The entry-point groups that third-party packages add families, methods and tasks through."""


class Registry(Generic[T]):
    """Named entries of one kind, in registration order; plugins of ``group`` loaded on the first look-up.

    ``kind`` names an entry in messages (``method``, ``model family``, ``task``); ``register_plugin(name, loaded)``,
    when given, is called with each entry point's name and what it loaded (a module that registered its entries on
    import, or an entry object that the callback registers under the entry point's name).
    """

    def __init__(self, kind: str, group: str, register_plugin: Callable[[str, object], None] | None = None) -> None:
        self.kind = kind
        self.group = group
        self._entries: dict[str, T] = {}
        self._register_plugin = register_plugin
        self._plugins_loaded = False
        self._failure: str | None = None
        self._origins: dict[str, str] = {}
        self._lock = threading.RLock()

    def register(self, name: str, entry: T, *, replace: bool = False) -> T:
        """Add ``entry`` under ``name``; a second entry under one name is refused unless ``replace`` (a
        ``ValueError``; while a plugin loads, a :class:`UsageError` naming the plugin and who holds the name)."""
        with self._lock:
            if name in self._entries and not replace and self._entries[name] is not entry:
                loading = _loading()
                if loading:
                    raise UsageError(self._clash(loading[-1].point, name))
                raise ValueError(f"a {self.kind} named {name!r} is registered already")
            self._entries[name] = entry
            loading = _loading()
            if loading:
                self._origins[name] = plugin_label(loading[-1].point)
                loading[-1].registered.append(entry)
            else:
                self._origins.pop(name, None)
        return entry

    def _clash(self, point: metadata.EntryPoint, name: str) -> str:
        holder = self._origins.get(name)
        held = f"the plugin {holder} registered it first" if holder else "it is one of gradcam-cli's own"
        dist = point.dist.name if point.dist is not None else None
        remedy = f"rename it there or uninstall it (pip uninstall {dist})" if dist else "rename it there"
        return (
            f"the {self.kind} plugin {plugin_label(point)} registers a {self.kind} named {name!r}, but {held}: {remedy}"
        )

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests and notebooks that registered something temporary)."""
        with self._lock:
            self._entries.pop(name, None)
            self._origins.pop(name, None)

    def __setitem__(self, name: str, entry: T) -> None:
        """``registry[name] = entry``: :meth:`register` with ``replace`` (as ``monkeypatch.setitem`` uses it)."""
        self.register(name, entry, replace=True)

    def __delitem__(self, name: str) -> None:
        """``del registry[name]``: :meth:`unregister`."""
        self.unregister(name)

    def __getitem__(self, name: str) -> T:
        """The entry ``name``; an unknown name is a one-line :class:`UsageError` with close matches."""
        entry = self.get(name)
        if entry is None:
            raise UsageError(f"unknown {self.kind} {name!r}.{suggest(name, self.names())}")
        return entry

    @overload
    def get(self, name: str) -> T | None: ...

    @overload
    def get(self, name: str, default: D) -> T | D: ...

    def get(self, name: str, default: object = None) -> object:
        """The entry ``name``, or ``default`` (as a dict's ``get``: ``monkeypatch.setitem`` uses it)."""
        self.load_plugins()
        return self._entries.get(name, default)

    def __contains__(self, name: object) -> bool:
        self.load_plugins()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def names(self) -> tuple[str, ...]:
        """Every entry's name, in registration order (the package's own first, then plugins')."""
        self.load_plugins()
        return tuple(self._entries)

    def items(self) -> list[tuple[str, T]]:
        self.load_plugins()
        return list(self._entries.items())

    def values(self) -> list[T]:
        self.load_plugins()
        return list(self._entries.values())

    def load_plugins(self) -> None:
        """Import every entry point of :attr:`group` once (later calls do nothing, or raise the first call's
        :class:`UsageError` again: a registry a plugin could not join is not used half loaded)."""
        with self._lock:
            if self._plugins_loaded:
                if self._failure is not None:
                    raise UsageError(self._failure)
                return
            self._plugins_loaded = True  # first, so that a plugin that looks the registry up does not recurse
            self._failure = None
            for point in plugin_entry_points(self.group):
                try:
                    self._load_plugin(point)
                except UsageError as error:
                    self._failure = str(error)
                    raise

    def _load_plugin(self, point: metadata.EntryPoint) -> None:
        """Import one entry point and register what it names (its module registers its own entries on import)."""
        loading = _Loading(point)
        _loading().append(loading)
        try:
            try:
                loaded = point.load()
            except UsageError:
                raise
            except Exception as error:  # any failure inside a third-party package: one line, naming it
                raise UsageError(
                    f"the {self.kind} plugin {plugin_label(point)} failed to load: {describe(error)}"
                ) from error
            if isinstance(loaded, ModuleType):
                return
            own = getattr(loaded, "name", point.name)
            if isinstance(own, str) and own != point.name:
                raise UsageError(
                    f"the {self.kind} plugin {plugin_label(point)} names a {self.kind} called {own!r}: "
                    "an entry point is named as the entry it names"
                )
            if self._register_plugin is not None:
                self._register_plugin(point.name, loaded)
            if not any(entry is loaded for entry in loading.registered):  # in this registry or another
                raise UsageError(
                    f"the {self.kind} plugin {plugin_label(point)} names a {type(loaded).__name__}, "
                    f"neither a {self.kind} nor a module"
                )
        finally:
            _loading().pop()


@dataclass
class _Loading:
    """An entry point being loaded, and what has been registered while it loads (in any registry)."""

    point: metadata.EntryPoint
    registered: list[object] = field(default_factory=list)


_THREAD = threading.local()


def _loading() -> list[_Loading]:
    """This thread's entry points being loaded (innermost last), whichever registry loads them: a plugin module that
    registers into another kind's registry on import is named in a clash too."""
    stack: list[_Loading] | None = getattr(_THREAD, "loading", None)
    if stack is None:
        stack = _THREAD.loading = []
    return stack


def plugin_label(point: metadata.EntryPoint) -> str:
    """``'toy' (gradcam-example-plugin 0.1.0: gradcam_example_plugin.family:TOY)``: the entry point's name, its
    distribution and version where known, and what it names."""
    dist = point.dist
    made = f"{dist.name} {dist.version}: " if dist is not None else ""
    return f"{point.name!r} ({made}{point.value})"


def plugin_versions() -> dict[str, str]:
    """Each installed distribution that declares entry points of :data:`PLUGIN_GROUPS`, with its version, by name
    (what the run record names; read from the metadata, nothing is imported)."""
    found = {
        point.dist.name: point.dist.version
        for group in PLUGIN_GROUPS
        for point in plugin_entry_points(group)
        if point.dist is not None
    }
    return dict(sorted(found.items()))


def plugin_entry_points(group: str) -> list[metadata.EntryPoint]:
    """The installed packages' entry points of ``group``, sorted by name (a stable order whatever the install)."""
    return sorted(metadata.entry_points(group=group), key=lambda point: point.name)
