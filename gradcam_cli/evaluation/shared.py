"""Which of ``gradcam eval``'s methods share one explanation pass, and one image's passes, each run once.

The methods that read the captured pass (the forward pass and one backward pass per target: Grad-CAM, Grad-CAM++,
LayerCAM, XGrad-CAM, HiResCAM, EigenCAM, randomcam, ...) are explained together, as ``gradcam`` explains them: one
pass on the image, one per sanity stage, one for the random methods' redraw, one batch of stability copies and one
per other box class, for all of them. A method that runs its own batches of masked inputs (Score-CAM, AblationCAM,
RISE, occlusion: its ``shows_progress``) is explained alone, so that each method's progress step holds its own
cost. Sharing changes no map: each method's map is a function of the pass alone (docs/evaluation.md, "Costs")."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from ..cam.methods import METHODS
from .report import ImageScores, MethodScores

T = TypeVar("T")


def pass_groups(methods: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Each method -> the methods explained in the same passes as it (itself alone for the masked-input ones)."""
    shared = tuple(method for method in methods if not METHODS[method].shows_progress)
    return {method: shared if method in shared else (method,) for method in methods}


def methods_to_run(
    methods: Sequence[str],
    done: ImageScores | None,
    scores: dict[str, MethodScores],
    on_method: Callable[[str], Any] | None,
) -> Iterator[str]:
    """Each of ``methods`` not yet finished on the image (``done``: those that are, their figures copied into
    ``scores`` in turn), ``on_method(name)`` called as its work begins."""
    for method in methods:
        if done is not None and method in done.methods:
            scores[method] = done.methods[method]
            continue
        if on_method is not None:
            on_method(method)
        yield method


class Once:
    """Work done at most once per key (one image's passes: cleared as the next image begins)."""

    def __init__(self) -> None:
        self._done: dict[tuple[Any, ...], Any] = {}

    def __call__(self, key: tuple[Any, ...], work: Callable[[], T]) -> T:
        if key not in self._done:
            self._done[key] = work()
        result: T = self._done[key]
        return result

    def __len__(self) -> int:
        return len(self._done)

    def clear(self) -> None:
        self._done.clear()
