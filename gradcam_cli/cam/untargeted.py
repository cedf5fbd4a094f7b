"""Maps without a target: an embedding model (a headless backbone such as DINOv2, a CLIP model without prompts) given
no ``--target`` has no class or score to explain, yet the methods registered with ``needs_target=False`` (rollout,
the last layer's attention: they read the attention alone) still give one map per image (docs/targets.md, "Without
a target").

Each such map's target is :func:`~gradcam_cli.cam.results.no_target`, which rows show as ``"score": "none"`` and file
names as ``0-no-target``. ``--method all`` on such a model keeps the methods that need no target and names the
others (:func:`untargeted_methods`); a method asked for by name that needs a target is refused with the message of
:func:`ask_for_target`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ..errors import UsageError
from ..options import ALL_METHODS, ExplainOptions
from .methods import METHODS
from .results import ImageExplanation, no_target
from .scores import Cams, ClassName, MaskedProbability, explanations_of

if TYPE_CHECKING:
    from ..models.loading import LoadedModel


def has_no_target(model: LoadedModel, options: ExplainOptions) -> bool:
    """Whether a classifier-like run has nothing to explain a method's target by: no ``--target``, and a model
    without classes (an embedding model, a CLIP-style model without prompts; a model whose ``--embedding`` is
    chosen)."""
    prompts = model.text is not None and bool(model.categories)
    embeds = model.embeds or model.text is not None or options.embedding is not None
    return not options.targets and embeds and not prompts


def ask_for_target(model: LoadedModel) -> str:
    """What to give such a model: ``--target similar:IMAGE_OR_FOLDER`` (and, a CLIP-style one, text or prompts)."""
    what = "text:PROMPT or similar:IMAGE" if model.text is not None else "similar:IMAGE_OR_FOLDER"
    labels = " (or --labels FILE of prompts, ranked as classes)" if model.text is not None else ""
    return f"--target {what}{labels}"


def untargeted_methods(
    model: LoadedModel, options: ExplainOptions, methods: Sequence[str], takes_targets: bool = True
) -> tuple[list[str], list[str]]:
    """``methods`` kept and left out: where ``--method all`` meets a model with no target (:func:`has_no_target`;
    ``takes_targets``: the task is a classifier's, whose score that is), the methods that need one are left out
    (none, where that would leave none: the score then asks for a target)."""
    if ALL_METHODS not in options.methods or not takes_targets or not has_no_target(model, options):
        return list(methods), []
    kept = [name for name in methods if not METHODS[name].needs_target]
    return (kept, [name for name in methods if name not in kept]) if kept else (list(methods), [])


def left_out_for_target(model: LoadedModel, methods: Sequence[str]) -> str:
    """What ``--method all`` says of the methods it left out for lack of a target."""
    return f"--method all leaves out {', '.join(methods)} (they need a target: give {ask_for_target(model)})"


class NoTargetScore:
    """The :class:`~gradcam_cli.cam.scores.Score` of a run with no target: one map per image and method, none
    differentiated. ``methods``: those explained, each registered with ``needs_target=False`` (else the one-line
    UsageError asking for a target); a class chosen (``target``: ``--target-class``, ``top_k``: ``--top-k``) is
    refused."""

    def __init__(self, model: LoadedModel, methods: Sequence[str], target: int | None, top_k: int | None) -> None:
        needing = [name for name in methods if METHODS[name].needs_target]
        if needing or not methods:
            some = f" ({_listed(needing)} {_need(needing)} one)" if len(needing) < len(methods) else ""
            raise UsageError(f"{model.name} embeds images and has no classes: give {ask_for_target(model)}{some}")
        given = [option for option, value in (("--target-class", target), ("--top-k", top_k)) if value is not None]
        if given:
            raise UsageError(
                f"{given[0]} chooses a class; {model.name} has none, and {_listed(methods)} {_need(methods)} none"
            )

    def targets(
        self, output: object, inputs: torch.Tensor, target: int | None, top_k: int, chosen: torch.Tensor | None = None
    ) -> NoTargets:
        """One target-free map per sample of ``output`` (nothing here applies)."""
        return NoTargets(int(inputs.shape[0]))


def _listed(methods: Sequence[str]) -> str:
    return ", ".join(methods)


def _need(methods: Sequence[str]) -> str:
    return "needs" if len(methods) == 1 else "need"


class NoTargets:
    """The single, empty target of every sample of a pass: nothing to differentiate, no predictions."""

    def __init__(self, samples: int) -> None:
        self.samples = samples

    @property
    def count(self) -> int:
        return 1

    @property
    def region(self) -> tuple[float, float]:
        return (1.0, 1.0)

    def value(self, k: int) -> torch.Tensor | None:
        return None

    def masked(self, k: int) -> MaskedProbability:
        raise UsageError("a map without a target has no score to mask")

    def in_view(self) -> None:
        """None: another view's pass has no targets either (``--aug-smooth`` averages the views' maps)."""
        return None

    def results(self, cams: Cams, sizes: Sequence[tuple[int, ...]], class_name: ClassName) -> list[ImageExplanation]:
        return [ImageExplanation([], explanations_of(cams, i, 0, no_target(), size)) for i, size in enumerate(sizes)]
