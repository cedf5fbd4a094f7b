"""What a CAM method takes besides a layer's activations and gradients: one :class:`Need` per kind of extra input,
typed by the value the method is given (:attr:`gradcam_cli.cam.methods.registry.CamMethod.needs`). The passes that
build each value are in :mod:`gradcam_cli.cam.passes`; what a need costs (running the model again, reading every
layer, keeping the graph) is said here once, and the methods' flags follow from it.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import torch

from ..ablation import AblatedScores
from ..attention.tokens import AttentionMaps
from ..drise import WeightedMasks
from ..fullgrad import FullGradients
from ..masked_scores import MaskedScores
from ..perturbation import MaskedPasses

E_co = TypeVar("E_co", covariant=True)


class Need(Generic[E_co]):
    """One kind of extra input, of type ``E_co``: ``name`` as messages say it; ``uses_model``: building it runs the
    model again on altered inputs or activations; ``reads_every_layer``: it reads layers besides the explained ones
    (so folding batch norms would change it); ``keeps_graph``: it differentiates the explained pass's graph again
    (so the first backward pass must keep it); ``shows_progress``: the command line shows a progress bar for its
    passes."""

    def __init__(
        self,
        name: str,
        *,
        uses_model: bool = False,
        reads_every_layer: bool = False,
        keeps_graph: bool = False,
        shows_progress: bool = False,
    ) -> None:
        self.name = name
        self.shows_progress = shows_progress
        self.uses_model = uses_model
        self.reads_every_layer = reads_every_layer
        self.keeps_graph = keeps_graph

    def __repr__(self) -> str:
        return f"Need({self.name!r})"


MASKED_SCORES: Need[MaskedScores] = Need("masked scores", uses_model=True, shows_progress=True)
"""Score-CAM: the target's probability for the input masked by each channel (:class:`MaskedScores`)."""
ABLATED_SCORES: Need[AblatedScores] = Need("ablated scores", uses_model=True, shows_progress=True)
"""AblationCAM: the target's score with each channel of the layer set to zero (:class:`AblatedScores`)."""
GUIDED_GRADIENT: Need[torch.Tensor] = Need("guided gradient")
"""Guided backpropagation and Guided Grad-CAM: the target's guided (N, 3, H, W) input gradient
(:class:`~gradcam_cli.cam.guided.GuidedPass`)."""
FULL_GRADIENTS: Need[FullGradients] = Need("full gradients", reads_every_layer=True)
"""FullGrad: the input gradient and every bias layer's (:class:`FullGradients`)."""
FINER_GRADIENT: Need[torch.Tensor] = Need("finer gradient", keeps_graph=True)
"""Finer-CAM: the layer's gradient of the target's Finer-CAM score (:mod:`gradcam_cli.cam.finer`)."""
HESSIAN_PRODUCT: Need[torch.Tensor] = Need("Hessian-vector product", keeps_graph=True)
"""ShapleyCAM: the layer's Hessian-vector product H A
(:meth:`~gradcam_cli.cam.engine.LayerCapture.hessian_vector_products`)."""
SEED: Need[list[int]] = Need("seed")
"""randomcam: the seeds of its noise, one per image (:func:`~gradcam_cli.cam.methods.random.image_seeds`)."""
MASKED_PASSES: Need[MaskedPasses] = Need("masked passes", uses_model=True, shows_progress=True)
"""RISE and occlusion: the black-box passes on masked inputs (:class:`MaskedPasses`)."""
DETECTION_PASSES: Need[WeightedMasks] = Need("detection passes", uses_model=True, shows_progress=True)
"""D-RISE: a target's masks weighted by how similar each masked input's detections are to it (:class:`WeightedMasks`;
one set of passes for every detection of the batch, :class:`~gradcam_cli.cam.drise.DetectionPasses`)."""
QUERY_ATTENTION: Need[torch.Tensor] = Need("query attention")
"""A DETR-family detector's ``attention``: each target's (N, h, w) cross-attention over the image, recorded in the
explained pass (:class:`~gradcam_cli.cam.detr.Attended`)."""

ATTENTION_MAPS: Need[AttentionMaps] = Need("attention maps", reads_every_layer=True)
"""rollout and attention: the explained pass's attention probabilities, every layer's
(:class:`~gradcam_cli.cam.attention.tokens.AttentionMaps`; they read every attention layer, so nothing is folded)."""
ATTENTION_GRADIENTS: Need[AttentionMaps] = Need("attention gradients", reads_every_layer=True, keeps_graph=True)
"""attn-grad: the attention probabilities with the target's gradients with respect to them (a backward pass through
the explained pass's graph)."""
LAYER_SCORES: Need[AttentionMaps] = Need("layer scores", reads_every_layer=True, keeps_graph=True)
"""LeGrad: the last layers' attention, each with the gradient of the target's score computed from that layer's tokens
(a pass with the later blocks skipped per layer: :mod:`gradcam_cli.cam.attention.legrad`)."""
ATTENTION_NEEDS: tuple[Need[AttentionMaps], ...] = (ATTENTION_MAPS, ATTENTION_GRADIENTS, LAYER_SCORES)
"""What the attention methods need: a transformer's attention (a model without it leaves them out of ``all``)."""

NEEDS: tuple[Need[object], ...] = (
    MASKED_SCORES,
    ABLATED_SCORES,
    GUIDED_GRADIENT,
    FULL_GRADIENTS,
    FINER_GRADIENT,
    HESSIAN_PRODUCT,
    SEED,
    MASKED_PASSES,
    DETECTION_PASSES,
    QUERY_ATTENTION,
    *ATTENTION_NEEDS,
)
"""Every kind of extra input, each built by :mod:`gradcam_cli.cam.passes`."""
