"""CAM methods: small pure functions from a layer's activations and gradients to a coarse saliency map, each
registered once as a :class:`CamMethod` in :data:`METHODS`.

Every method takes ``activations`` A and ``gradients`` g = dS^c/dA (S^c: the target's score) of shape
(N, C, h, w) and returns an (N, h, w) map, not yet upsampled or normalised (see
:func:`gradcam_cli.cam.maps.to_image_maps`). Most methods weight the channels, W_k = w_k * A^k, and end with
:func:`~gradcam_cli.cam.smoothing.combine`: ReLU(sum_k W_k), or with ``eigen_smooth=True`` ReLU of the first
principal component of the W_k (see :mod:`gradcam_cli.cam.smoothing`). Methods that need more than the layer
(the model run again, a pass through the whole network, a second backward pass, a seed) say so by their
:class:`~gradcam_cli.cam.methods.needs.Need`. The modules hold the methods by kind: :mod:`.gradient` (the Grad-CAM
family), :mod:`.activation` (no gradients), :mod:`.scorecam`, :mod:`.ablation`, :mod:`.fullgrad`, :mod:`.guided`,
:mod:`.finer`, :mod:`.shapley`, :mod:`.random`, :mod:`.perturbation` (RISE, D-RISE, occlusion) and :mod:`.attention`
(rollout, attn-grad, attention, LeGrad: a transformer's attention). The table of methods,
their papers and where they differ from pytorch-grad-cam is in docs/methods.md (its table made by
:func:`.table.methods_table`).
"""

from __future__ import annotations

from typing import Any

from .ablation import ABLATIONCAM, ablationcam
from .activation import EIGENCAM, FEM, KPCACAM, eigencam, fem, kernel_first_component, kpcacam
from .attention import (
    ATTENTION,
    ATTN_GRAD,
    LEGRAD,
    ROLLOUT,
    attention_rollout,
    attn_grad,
    class_attention,
    layer_gradients,
)
from .finer import FINERCAM, finercam
from .fullgrad import FULLGRAD, fullgrad
from .gradient import (
    EIGENGRADCAM,
    GRADCAM,
    GRADCAM_ELEMENTWISE,
    GRADCAM_PLUS_PLUS,
    HIRESCAM,
    LAYERCAM,
    REFINECAM,
    SEGEIGENCAM,
    XGRADCAM,
    eigengradcam,
    gradcam,
    gradcam_elementwise,
    gradcam_plus_plus,
    hirescam,
    layercam,
    refinecam,
    segeigencam,
    xgradcam,
)
from .guided import GUIDED_BACKPROP, GUIDED_GRADCAM, guided_backprop, guided_gradcam
from .needs import Need
from .perturbation import DRISE, OCCLUSION, RISE, drise, occlusion, rise
from .random import RANDOMCAM, randomcam
from .registry import CLASSIFY, METHODS, CamMethod, register_method, resolve_methods
from .scorecam import SCORECAM, scorecam
from .shapley import SHAPLEYCAM, shapleycam

BUILTIN_METHODS: tuple[CamMethod[Any], ...] = (
    GRADCAM,
    GRADCAM_PLUS_PLUS,
    XGRADCAM,
    HIRESCAM,
    LAYERCAM,
    SCORECAM,
    EIGENCAM,
    EIGENGRADCAM,
    ABLATIONCAM,
    FULLGRAD,
    GUIDED_BACKPROP,
    GUIDED_GRADCAM,
    FINERCAM,
    GRADCAM_ELEMENTWISE,
    KPCACAM,
    SHAPLEYCAM,
    FEM,
    REFINECAM,
    SEGEIGENCAM,
    RANDOMCAM,
    RISE,
    DRISE,
    OCCLUSION,
    ROLLOUT,
    ATTN_GRAD,
    ATTENTION,
    LEGRAD,
)
"""The package's own methods, in the order ``--method all`` runs them and docs/methods.md lists them
(:data:`gradcam_cli.options.METHOD_NAMES` names them without importing torch)."""
for _method in BUILTIN_METHODS:
    register_method(_method)

__all__ = [
    "BUILTIN_METHODS",
    "CLASSIFY",
    "METHODS",
    "CamMethod",
    "Need",
    "ablationcam",
    "attention_rollout",
    "attn_grad",
    "class_attention",
    "drise",
    "eigencam",
    "eigengradcam",
    "fem",
    "finercam",
    "fullgrad",
    "gradcam",
    "gradcam_elementwise",
    "gradcam_plus_plus",
    "guided_backprop",
    "guided_gradcam",
    "hirescam",
    "kernel_first_component",
    "kpcacam",
    "layer_gradients",
    "layercam",
    "occlusion",
    "randomcam",
    "refinecam",
    "register_method",
    "resolve_methods",
    "rise",
    "scorecam",
    "segeigencam",
    "shapleycam",
    "xgradcam",
]
