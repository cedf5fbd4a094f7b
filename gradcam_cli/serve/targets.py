"""Targets typed on the page, in the ``--target`` grammar (:mod:`gradcam_cli.targets`, docs/targets.md).

A text with a ``KIND:`` prefix is a :class:`~gradcam_cli.targets.TargetSpec`; one without is a class, matched as
``--target-class`` matches it (the faster path: it keeps the explainer of the image's top classes). A ``similar:``
target typed on the page names a served input or an upload by its id (``i3``, ``u…``) or name, never a path: its
reference is that image's file, so nothing outside the served set is read. The command's own targets (``--target``,
or the run record's), which the page starts with, are taken as given.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..targets import TargetSpec
from .http import HttpError
from .images import ImageStore


def page_target(text: str | None, images: ImageStore, defaults: Sequence[TargetSpec]) -> str | TargetSpec | None:
    """``text`` as the page sent it: ``None`` (the default target), a class's name or index, or a target spec whose
    ``similar:`` references are the served images' files; a mistake is a 400 with its one-line message."""
    text = (text or "").strip()
    if not text:
        return None
    if ":" not in text:
        return text
    for default in defaults:
        if text == str(default):
            return default
    try:
        spec = TargetSpec.parse(text)
    except ValueError as error:
        raise HttpError(400, f"target {error}") from None
    return served_references(spec, images)


def served_references(spec: TargetSpec, images: ImageStore) -> TargetSpec:
    """``spec`` with each ``similar:`` reference (a contrast's parts too) replaced by the file of the served image it
    names; one that names none is a 400 with the close matches."""
    if spec.parts:
        return TargetSpec(
            spec.kind, spec.value, spec.index, spec.sign, tuple(served_references(p, images) for p in spec.parts)
        )
    if spec.kind != "similar":
        return spec
    return TargetSpec("similar", str(images.named(spec.value).path))
