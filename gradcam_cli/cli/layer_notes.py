"""What ``gradcam``, ``gradcam eval`` and ``gradcam serve`` say of the layers they explain: the default layer and
why, or the model's last stages that RefineCAM reads."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..cam.explainer import Explainer
    from ..cam.tasks import TaskAdapter


def default_layer_reason(adapter: TaskAdapter, declared: bool = False) -> str:
    """Why the default layer was chosen, as the 'using layer' message says it (``declared``: the model's own, a YOLO
    detector's head inputs, a DETR's backbone stage: :attr:`~gradcam_cli.cam.tasks.TaskAdapter.declared_layer`)."""
    kind = adapter.declared_layer if declared else adapter.default_layer
    return f"{kind}; choose with --layer"


def layers_notes(explainer: Explainer, layers_given: bool) -> list[str]:
    """What ``gradcam`` and ``gradcam eval`` say of the layers chosen: the model's last stages, where RefineCAM read
    them from one layer given or none (:meth:`~gradcam_cli.cam.explainer.Explainer`); else, ``layers_given`` false,
    the default layer and why (nothing where no method reads a layer: RISE, occlusion alone); and where RefineCAM
    reads one layer, shared with the other methods, that it does."""
    from ..cam.methods import METHODS

    chosen, label = explainer.chosen.layers, explainer.layer_label
    staged = ", ".join(name for name in explainer.chosen.methods if METHODS[name].stages > 1)
    if staged and len(chosen) > max(1, len(explainer.options.layers)) and not explainer.model.default_layers:
        return [f"using layers {label} (the model's last stages, as {staged} reads them; give --layer more than once)"]
    notes = []
    if chosen and not layers_given:
        notes.append(
            f"using layer {label} ({default_layer_reason(explainer.adapter, bool(explainer.model.default_layers))})"
        )
    if staged and len(chosen) == 1:
        notes.append(
            f"{staged} reads layer {label} alone, as the other methods do: its map is that layer's Grad-CAM++ "
            "(run it alone for the model's last stages, or give --layer more than once)"
        )
    return notes
