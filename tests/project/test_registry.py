"""The generic registry: order, close matches, refusing a second entry, plugins through entry points."""

from __future__ import annotations

from importlib import metadata

import pytest

from gradcam_cli import registry as registry_module
from gradcam_cli.errors import UsageError
from gradcam_cli.registry import Registry

pytestmark = pytest.mark.quick


def test_entries_keep_their_order_and_unknown_names_suggest_close_ones() -> None:
    things: Registry[int] = Registry("thing", "gradcam_cli.test-things")
    things.register("alpha", 1)
    things.register("beta", 2)
    assert things.names() == ("alpha", "beta")
    assert things["beta"] == 2 and "alpha" in things and "gamma" not in things
    with pytest.raises(UsageError, match=r"unknown thing 'alpah'\. Did you mean: alpha\?"):
        things["alpah"]
    with pytest.raises(ValueError, match="registered already"):
        things.register("alpha", 3)
    things.register("alpha", 3, replace=True)
    assert things["alpha"] == 3


def test_plugins_load_once_and_a_broken_one_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list[tuple[str, object]] = []
    good = metadata.EntryPoint("good", "json:dumps", "gradcam_cli.test-things")
    monkeypatch.setattr(registry_module, "plugin_entry_points", lambda group: [good])

    def register(name: str, obj: object) -> None:  # a callback registers the entry object (or refuses it)
        loaded.append((name, obj))
        things.register(name, obj)

    things: Registry[object] = Registry("thing", "gradcam_cli.test-things", register)
    things.names()
    things.names()
    assert [name for name, _ in loaded] == ["good"]

    broken = metadata.EntryPoint("broken", "no_such_module_anywhere:thing", "gradcam_cli.test-things")
    monkeypatch.setattr(registry_module, "plugin_entry_points", lambda group: [broken])
    others: Registry[object] = Registry("thing", "gradcam_cli.test-things")
    with pytest.raises(
        UsageError, match=r"^the thing plugin 'broken' \(no_such_module_anywhere:thing\) failed to load"
    ):
        others.names()


def test_a_plugins_clash_is_one_line_naming_it_and_the_registry_stays_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin's entry under a name the registry holds is a UsageError naming the plugin, raised again on every later
    look-up (the registry is not used half loaded); a notebook's second entry is still a ValueError."""
    point = metadata.EntryPoint("alpha", "json:dumps", "gradcam_cli.test-things")
    monkeypatch.setattr(registry_module, "plugin_entry_points", lambda group: [point])
    things: Registry[object] = Registry(
        "thing", "gradcam_cli.test-things", lambda name, obj: things.register(name, obj)
    )
    things.register("alpha", 1)
    expected = (
        r"^the thing plugin 'alpha' \(json:dumps\) registers a thing named 'alpha', but it is one of gradcam-cli's"
    )
    for _ in range(2):
        with pytest.raises(UsageError, match=expected):
            things.names()
    with pytest.raises(ValueError, match="registered already"):
        things.register("alpha", 2)
