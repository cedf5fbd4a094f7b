"""Resuming (``--skip-existing``): which images a previous run already finished, found from the files on disk."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch

from ..cam.results import Explanation, Prediction
from ..io.discovery import InputImage
from ..io.naming import TARGET_TAIL
from ..options import OutputOptions
from .outputs import OutputKind

_PROBE_TARGET = Prediction(0, "x", 0.0)
_PROBE_MARK = "_0-x"


class OutputIndex:
    """The names in each output folder, listed once: ``--skip-existing`` over N images costs one listing per
    folder, not a directory scan per image.

    Per-explanation outputs are named ``<prefix>_<class index>-<class slug><ending>``; :meth:`matches` finds every
    name with a given prefix and ending, whatever the class.
    """

    def __init__(self) -> None:
        self._names: dict[Path, set[str]] = {}
        self._by_prefix: dict[tuple[Path, str], dict[str, list[str]]] = {}

    def names(self, folder: Path) -> set[str]:
        if folder not in self._names:
            try:
                self._names[folder] = {entry.name for entry in os.scandir(folder) if entry.is_file()}
            except OSError:
                self._names[folder] = set()
        return self._names[folder]

    def matches(self, folder: Path, prefix: str, ending: str) -> list[str]:
        key = (folder, ending)
        if key not in self._by_prefix:
            index: dict[str, list[str]] = {}
            for name in self.names(folder):
                if not name.endswith(ending):
                    continue
                head, _, tail = name[: len(name) - len(ending)].rpartition("_")
                if head and TARGET_TAIL.fullmatch(tail):
                    index.setdefault(head, []).append(name)
            self._by_prefix[key] = index
        return sorted(self._by_prefix[key].get(prefix, []))


class ExistingOutputs:
    """Finds the outputs a previous run wrote for an image, if all of them exist.

    Without a fixed ``target``, each method's listed per-explanation kinds must exist for ``top_k`` classes
    (whichever they were); with one, exactly that class's files; per-image kinds must exist as named.
    """

    def __init__(
        self,
        options: OutputOptions,
        kinds: Sequence[OutputKind],
        methods: Sequence[str],
        target: Prediction | None,
        top_k: int,
    ) -> None:
        self.options, self.kinds, self.methods, self.target, self.top_k = options, kinds, methods, target, top_k
        self.index = OutputIndex()

    def find(self, image: InputImage) -> list[str] | None:
        """The existing outputs of ``image``, in record order, or ``None`` if any is missing."""
        found: list[str] = []
        for method in self.methods:
            for kind in self.kinds:
                if not kind.listed or not kind.per_explanation:
                    continue
                if self.target is not None:
                    path = kind.path(self.options, image, Explanation(method, self.target, torch.empty(0)))
                    if path.name not in self.index.names(path.parent):
                        return None
                    found.append(str(path))
                    continue
                probe = kind.path(self.options, image, Explanation(method, _PROBE_TARGET, torch.empty(0)))
                cut = probe.name.rfind(_PROBE_MARK)
                if cut < 0:
                    continue  # a kind not named by class: cannot be matched without knowing the class
                folder = probe.parent
                names = self.index.matches(folder, probe.name[:cut], probe.name[cut + len(_PROBE_MARK) :])
                if len(names) < self.top_k:
                    return None
                found.extend(str(folder / name) for name in names)
        for kind in self.kinds:
            if kind.listed and not kind.per_explanation:
                path = kind.path(self.options, image, None)
                if path.name not in self.index.names(path.parent):
                    return None
                found.append(str(path))
        return found
