"""One registry per kind of thing gradcam knows by name: tasks, model families and CAM methods.

Each kind has one :class:`Registry` (in the module that defines its entry type: ``cam.methods`` for methods,
``models.families`` for model families, ``cam.tasks`` for task adapters). Entries register themselves when their
module is imported, and third-party packages add entries through Python entry points, as pytest plugins do: a
package that declares, in its ``pyproject.toml``::

    [project.entry-points."gradcam_cli.methods"]
    mymethod = "my_package.cams"

has ``my_package.cams`` imported the first time the method registry is looked up; importing it registers its
entries (an entry point may also name an entry object itself, which is then registered under the entry point's
name). The groups are :data:`PLUGIN_GROUPS`. A plugin that fails to import is one line, naming the plugin
(:class:`~gradcam_cli.errors.UsageError`), never a traceback. Nothing here imports torch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from importlib import metadata
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
        self._lock = threading.RLock()

    def register(self, name: str, entry: T, *, replace: bool = False) -> T:
        """Add ``entry`` under ``name``; a second entry under one name is refused unless ``replace``."""
        with self._lock:
            if name in self._entries and not replace and self._entries[name] is not entry:
                raise ValueError(f"a {self.kind} named {name!r} is registered already")
            self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests and notebooks that registered something temporary)."""
        with self._lock:
            self._entries.pop(name, None)

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
        """Import every entry point of :attr:`group` once (later calls do nothing)."""
        with self._lock:
            if self._plugins_loaded:
                return
            self._plugins_loaded = True  # first, so that a plugin that looks the registry up does not recurse
            for point in plugin_entry_points(self.group):
                try:
                    loaded = point.load()
                except Exception as error:  # any failure inside a third-party package: one line, naming it
                    raise UsageError(
                        f"the {self.kind} plugin {point.name!r} ({point.value}) failed to load: {describe(error)}"
                    ) from error
                if self._register_plugin is not None:
                    self._register_plugin(point.name, loaded)


def plugin_entry_points(group: str) -> list[metadata.EntryPoint]:
    """The installed packages' entry points of ``group``, sorted by name (a stable order whatever the install)."""
    return sorted(metadata.entry_points(group=group), key=lambda point: point.name)
