"""Finding layers by name, listing them with their output shapes, and choosing a sensible default."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..errors import GradcamError, ModelLoadError, UsageError, describe, suggest
from ..io.images import InputSpec, load_image, to_input_tensor
from ..models.modes import model_state_preserved
from ..models.tasks import NAMED_LAYERS
from .attention.discovery import attention_sites
from .reshape import Layout, infer_layout

if TYPE_CHECKING:
    from ..models.loading import LoadedModel

_HEAD_POOLING = (
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveMaxPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool2d,
    nn.AdaptiveAvgPool3d,
    nn.AdaptiveMaxPool3d,
)
_LAYOUT_ONLY = ("Permute",)
"""Modules that only reorder their input's axes (torchvision's ``Permute``): never chosen as the default."""


@dataclass
class LayerInfo:
    """One module as seen during a dry forward pass."""

    name: str
    kind: str
    output_shape: tuple[int, ...] | None
    calls: int
    finished_at: int
    layout: Layout | None = None
    started_at: int = -1
    output_type: str = "Tensor"
    """The type of the module's output: a layer whose output is not a tensor (a tuple) has no map."""
    attention: bool = False
    """Whether the attention methods read this module (:func:`layer_table` says)."""

    @property
    def is_candidate(self) -> bool:
        """A layer CAMs can explain: a spatial output (N, C, H, W), channel-last (N, H, W, C) or a token sequence
        (N, L, C) with an H x W grid of patches (see :mod:`gradcam_cli.cam.reshape`), with more than one position."""
        return bool(self.name) and self.layout is not None and self.layout.positions > 1


def resolve_layer(model: nn.Module, name: str) -> nn.Module:
    """The submodule at dotted path ``name`` (``layer4``, ``layer4.1.conv2``, ``features.28``)."""
    try:
        return model.get_submodule(name)
    except AttributeError:
        names = [n for n, _ in model.named_modules() if n]
        hint = suggest(name, names) or " Run with --list-layers to see every layer."
        raise UsageError(f"unknown layer {name!r}.{hint}") from None


def reads_tokens(model: LoadedModel, possible: bool = True) -> bool:
    """Whether ``model``'s 3-D (N, L, C) outputs may be token sequences on a patch grid: only where its task's
    adapter says they may be (``possible``: a classifier's, :attr:`~gradcam_cli.cam.tasks.TaskAdapter.tokens`), of a
    family whose profile says it makes tokens (timm, Hugging Face), or one with an attention module or a patch
    embedding (a convolution whose stride is its kernel: torchvision's ViT, your own transformer or mixer). Elsewhere
    a 3-D output has no grid: a detector head's (N, anchors, classes)."""
    if not possible:
        return False
    if model.prefix_tokens is not None or model.profile.tokens:
        return True
    return any(_makes_tokens(module) for module in model.module.modules())


def _makes_tokens(module: nn.Module) -> bool:
    """An attention module, or a patch embedding: a convolution cutting its input into patches (stride = kernel)."""
    if "attention" in type(module).__name__.lower():
        return True
    return isinstance(module, nn.Conv2d) and module.stride == module.kernel_size and module.stride[0] > 1


def inspect_layers(
    model: nn.Module,
    example: torch.Tensor,
    prefix_tokens: int | None = None,
    tokens: bool = True,
    meta: bool = False,
) -> list[LayerInfo]:
    """Every module with its output shape, from one dry forward pass with a forward hook on each module.

    Modules that run several times per forward report the shape of their last call and the number of calls.
    ``prefix_tokens``: the model's own count of non-spatial leading tokens; ``tokens``: whether 3-D outputs may be
    token sequences (see :mod:`gradcam_cli.cam.reshape`). ``meta``: the pass on PyTorch's ``meta`` device (the
    example's and the model's parameters and buffers as shapes without data, through ``torch.func.functional_call``:
    nothing computed, the model left as it is); a model that cannot run there raises.
    """
    infos = {name: LayerInfo(name, type(m).__name__, None, 0, -1) for name, m in model.named_modules()}
    counter = iter(range(1 << 62))
    handles = []
    input_size = tuple(example.shape[2:])

    def starter(name: str) -> Callable[[nn.Module, object], None]:
        def pre_hook(_module: nn.Module, _inputs: object) -> None:
            infos[name].started_at = next(counter)

        return pre_hook

    def recorder(name: str) -> Callable[[nn.Module, object, object], None]:
        def hook(_module: nn.Module, _inputs: object, output: object) -> None:
            info = infos[name]
            info.calls += 1
            info.finished_at = next(counter)
            info.output_shape = tuple(output.shape) if isinstance(output, torch.Tensor) else None
            info.output_type = type(output).__name__
            shape = info.output_shape
            info.layout = infer_layout(shape, input_size, prefix_tokens, tokens) if shape else None

        return hook

    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(starter(name)))
        handles.append(module.register_forward_hook(recorder(name)))
    try:
        with model_state_preserved(model), torch.no_grad():
            if meta:
                named = [*model.named_parameters(), *model.named_buffers()]
                shapes = {name: torch.empty_like(tensor, device="meta") for name, tensor in named}
                torch.func.functional_call(model, shapes, (example.to("meta"),))
            else:
                model(example)
    finally:
        for handle in handles:
            handle.remove()
    return list(infos.values())


def default_layer(model: nn.Module, infos: list[LayerInfo], scopes: Sequence[str] = ()) -> str:
    """The last layer to finish whose output is still spatial: ``layer4`` for ResNets, ``features`` for VGG,
    ``norm`` for Swin. ``scopes``: dotted module names tried first, in turn (a detector's backbone, see
    :data:`gradcam_cli.models.tasks.LAYER_SCOPES`): the first with a spatial layer inside it gives the default.

    Global pooling heads (adaptive pools) and pure axis permutations are skipped, so VGG's 7x7 ``avgpool`` and
    Swin's ``permute`` are not chosen. Token sequences with a class token (ViT) are special: the head reads only
    the class token, so after the last attention layer the patch tokens no longer affect the score and their
    gradients are zero. There the default is the last spatial layer that finishes before the last attention
    module starts: the input of the last block's attention (``encoder.layers.encoder_layer_11.ln_1`` in
    torchvision's ``vit_b_16``).
    """
    for scope in scopes:
        inside = [i for i in infos if i.name == scope or i.name.startswith(f"{scope}.")]
        if any(i.is_candidate for i in inside):
            return default_layer(model, inside)
    modules = dict(model.named_modules())
    candidates = [
        i
        for i in infos
        if i.is_candidate
        and not isinstance(modules[i.name], _HEAD_POOLING)
        and type(modules[i.name]).__name__ not in _LAYOUT_ONLY
    ]
    if not candidates:
        raise UsageError("the model has no layer with a spatial output; pass --layer explicitly")
    chosen = max(candidates, key=lambda info: info.finished_at)
    if chosen.layout is not None and chosen.layout.prefix:
        attention = [i.started_at for i in infos if i.calls and "attention" in i.kind.lower()]
        before = [i for i in candidates if attention and i.finished_at < max(attention)]
        if before:
            chosen = max(before, key=lambda info: info.finished_at)
    return chosen.name


def stage_layers(model: nn.Module, infos: list[LayerInfo], chosen: Sequence[str], count: int) -> tuple[str, ...]:
    """The ``chosen`` layers; where that is one layer, ``last``, and ``count`` more than 1 (RefineCAM's:
    :func:`~gradcam_cli.cam.methods.registry.stages_of`), up to ``count`` layers ending at it, the output of each of
    the model's last stages, earliest first.
    Walking back from ``last``, a stage ends where the grid is next finer: the layer with the shortest dotted name
    (the outermost: ``layer3``, not ``layer4.0.bn1`` inside the next stage's first block) among those at the finer
    grid that finish before any layer at the coarser grid does, the last of them where names are as short
    (``features.29`` of a VGG). ResNets give ``layer1`` to ``layer4``; a model whose grid never changes (a ViT's
    tokens) gives ``last`` alone. Pooling heads and axis permutations never count, as for :func:`default_layer`, nor
    modules called more than once in a pass (a ReLU shared by a block's convolutions)."""
    if len(chosen) != 1 or count < 2:
        return tuple(chosen)
    last = chosen[0]
    modules = dict(model.named_modules())
    pool = [
        i
        for i in infos
        if i.is_candidate
        and i.calls == 1
        and not isinstance(modules[i.name], _HEAD_POOLING)
        and type(modules[i.name]).__name__ not in _LAYOUT_ONLY
    ]
    stage = next((i for i in pool if i.name == last), None)
    stages = [last]
    while stage is not None and len(stages) < count:
        positions = _positions(stage)
        first = min(i.finished_at for i in pool if _positions(i) <= positions)
        finer = [i for i in pool if i.finished_at < first and _positions(i) > positions]
        if not finer:
            break
        grid = _grid(max(finer, key=lambda info: info.finished_at))
        stage = min((i for i in finer if _grid(i) == grid), key=lambda info: (info.name.count("."), -info.finished_at))
        stages.insert(0, stage.name)
    return tuple(stages)


def _grid(info: LayerInfo) -> tuple[int, ...]:
    return info.layout.grid if info.layout is not None else ()


def _positions(info: LayerInfo) -> int:
    return info.layout.positions if info.layout is not None else 0


def model_default_layer(model: LoadedModel, infos: list[LayerInfo], scopes: Sequence[str] = ()) -> str:
    """:func:`default_layer` for a loaded model, looking in ``scopes`` first (its task adapter's
    :attr:`~gradcam_cli.cam.tasks.TaskAdapter.layer_scopes`: a detector's or segmenter's backbone), and some of
    torchvision's detectors have their own (:data:`gradcam_cli.models.tasks.NAMED_LAYERS`). A model that declares
    its default layers (a YOLO detector's head inputs: ``LoadedModel.default_layers``) gets them, joined with ``+``."""
    if model.default_layers:
        return "+".join(model.default_layers)
    named = NAMED_LAYERS.get(model.name)
    if named is not None and any(info.name == named and info.is_candidate for info in infos):
        return named
    return default_layer(model.module, infos, scopes)


def blank_input(spec: InputSpec, device: torch.device | None = None) -> torch.Tensor:
    """A zero (1, 3, H, W) input at the model's size: ``size`` x ``size`` (its sides rounded to the spec's
    ``multiple``), or its fixed size; a model that takes no images, a zero input of its ``shape``."""
    if spec.shape is not None:
        return torch.zeros(1, *spec.shape, device=device)
    height, width = spec.resized_shape(spec.size, spec.size)
    return torch.zeros(1, 3, height, width, device=device)


def dry_pass(
    model: LoadedModel, device: torch.device, example: torch.Tensor | None = None, tokens: bool = True
) -> list[LayerInfo]:
    """:func:`inspect_layers` on ``example`` (default: :func:`blank_input`), a failing forward pass turned into one
    line: UsageError when ``--input-size`` is too small for the model (the usual size works), ModelLoadError
    when the model fails at its usual size too. ``tokens``: its 3-D outputs may be tokens (:func:`reads_tokens`).
    A video model's pass on a blank clip (its profile's ``clips``) is made on the ``meta`` device
    (:func:`inspect_layers`): the same shapes without computing a clip's forward pass, a few hundredths of a second
    instead of one clip's; a model that cannot run there makes the pass on ``device``."""
    if example is None:
        example = blank_input(model.input_spec, device)
        if model.profile.clips is not None:
            try:
                return inspect_layers(model.module, example, model.prefix_tokens, reads_tokens(model, tokens), True)
            except Exception:  # an operation without a meta kernel, a value read: the pass below, as for any model
                pass
    try:
        return inspect_layers(model.module, example, model.prefix_tokens, reads_tokens(model, tokens))
    except (GradcamError, torch.cuda.OutOfMemoryError):
        raise
    except Exception as error:
        raise _forward_failure(model, device, example, error) from error


class DryPasses:
    """Each model's dry pass (:func:`dry_pass`), made once and kept: per :class:`LoadedModel` object (its module,
    input size and task) and device. ``gradcam serve`` keeps one for its model, so that an explainer for another
    layer, method or target, or a faithfulness request, makes no new pass; an explainer without one makes its own."""

    def __init__(self) -> None:
        self._kept: dict[tuple[int, str], tuple[LoadedModel, list[LayerInfo]]] = {}

    def get(self, model: LoadedModel, device: torch.device, tokens: bool = True) -> list[LayerInfo]:
        """``model``'s layers from its dry pass on ``device``, made now if not yet (``tokens``: :func:`dry_pass`)."""
        key = (id(model), str(device))
        kept = self._kept.get(key)
        if kept is None or kept[0] is not model:
            kept = (model, dry_pass(model, device, tokens=tokens))
            self._kept[key] = kept
        return list(kept[1])

    def keep(self, model: LoadedModel, device: torch.device, infos: list[LayerInfo]) -> None:
        """Keep ``infos`` as ``model``'s dry pass on ``device`` (a copy of a model whose pass was made, its task
        found from it)."""
        self._kept[(id(model), str(device))] = (model, list(infos))


def _forward_failure(model: LoadedModel, device: torch.device, example: torch.Tensor, error: Exception) -> GradcamError:
    sides = "x".join(map(str, example.shape[2:]))
    spec, usual = model.input_spec, InputSpec.size
    if spec.fixed_size is None and spec.shape is None and spec.size < usual:
        try:
            inspect_layers(model.module, torch.zeros(1, 3, usual, usual, device=device), model.prefix_tokens)
        except Exception:  # the model fails at its usual size too: reported below
            pass
        else:
            return UsageError(
                f"--input-size {spec.size} is too small for {model.name} (its forward pass fails at "
                f"{sides}); use a larger size such as {usual}"
            )
    return ModelLoadError(f"{model.name} fails on a {sides} input: {describe(error)}")


def forget_tokens(infos: list[LayerInfo]) -> None:
    """Drop the token layouts of ``infos`` (made before the model's task was known to be one without tokens)."""
    for info in infos:
        if info.layout is not None and info.layout.kind == "tokens":
            info.layout = None


def check_layers(
    model: nn.Module, infos: list[LayerInfo], names: Sequence[str], tokens: bool = True, suggestion: str | None = None
) -> None:
    """UsageError for the first of ``names`` whose output cannot give a map: a single position (global pooling,
    ``avgpool``: its map is flat), no spatial grid at all (``fc``; a sequence in a model without tokens, such as a
    detector head's (N, anchors, classes)) or no tensor (a Hugging Face attention module's tuple). The message names
    the nearest spatial layer before it, or ``suggestion`` (a detector's default layer: the spatial layers just
    before its head are the head's own). ``tokens``: whether the model's 3-D outputs may be tokens
    (:func:`reads_tokens`). Layers that did not run are left to the engine to report."""
    by_name = {info.name: info for info in infos}
    for name in names:
        info = by_name.get(name)
        if info is None or not info.calls or (info.layout is not None and info.layout.positions > 1):
            continue
        if info.output_shape is None:
            what = f"{info.output_type}, not a tensor, so it has no map"
        else:
            shape = "x".join(map(str, info.output_shape))
            why = "a single position, so its map is flat" if info.layout else "no spatial grid, so it has no map"
            if not tokens and len(info.output_shape) == 3:
                why = "a sequence with no spatial grid (only transformer classifiers' sequences are patch tokens)"
            what = f"{shape}: {why}"
        nearest = suggestion or _nearest_spatial_layer(model, infos, info)
        advice = f"a spatial layer such as {nearest}" if nearest else "another layer"
        raise UsageError(f"layer {name!r} outputs {what}; choose {advice} (see --list-layers)")


def _nearest_spatial_layer(model: nn.Module, infos: list[LayerInfo], info: LayerInfo) -> str | None:
    """The layer :func:`default_layer` would choose among those finishing before ``info`` (else overall)."""
    for pool in ([i for i in infos if i.finished_at < info.finished_at], infos):
        try:
            return default_layer(model, pool)
        except UsageError:
            continue
    return None


def layer_table(
    model: LoadedModel, device: torch.device, image: Path | None = None, tokens: bool = True, scopes: Sequence[str] = ()
) -> tuple[list[LayerInfo], str]:
    """Every named module with its output shape for one dry pass (a blank input of the model's size, or
    ``image``), the attention modules marked, and the default layer's name (``tokens`` and ``scopes``: its task
    adapter's, :func:`dry_pass` and :func:`model_default_layer`): what ``--list-layers`` prints."""
    example = None
    if image is not None:
        example = to_input_tensor(load_image(image), model.input_spec).unsqueeze(0).to(device)
    infos = dry_pass(model, device, example, tokens)
    attention = {site.name for site in attention_sites(model.module)}
    for info in infos:
        info.attention = info.name in attention
    return [info for info in infos if info.name], model_default_layer(model, infos, scopes)


def chosen_layers(
    model: LoadedModel,
    infos: list[LayerInfo],
    names: list[str],
    tokens: bool,
    scopes: Sequence[str] = (),
    suggest: bool = False,
) -> list[str]:
    """``names`` once :func:`check_layers` accepts them, or the model's default layer (``scopes``:
    :func:`model_default_layer`). With ``suggest`` (a detector's task: the spatial layers just before its head are
    its own), a refused layer gets the default layer suggested."""
    default = None
    if not names or suggest:
        try:
            default = model_default_layer(model, infos, scopes)
        except UsageError:
            if not names:
                raise
    check_layers(model.module, infos, names, tokens, default if suggest else None)
    return names or str(default).split("+")
