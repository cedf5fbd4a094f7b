"""The attention methods: a transformer's attention probabilities instead of a layer's features, for classifiers
(docs/methods.md, "Attention methods"). Their formulas are in :mod:`gradcam_cli.cam.attention`; here each is
registered, taking no layer (``activations`` and ``gradients`` are ``None``) and the pass's
:class:`~gradcam_cli.cam.attention.tokens.AttentionMaps`; ``eigen_smooth`` changes nothing."""

from __future__ import annotations

import torch

from ..attention.last import last_attention
from ..attention.legrad import legrad
from ..attention.relevance import attention_gradient
from ..attention.rollout import rollout
from ..attention.tokens import AttentionMaps
from .needs import ATTENTION_GRADIENTS, ATTENTION_MAPS, LAYER_SCORES
from .registry import CLASSIFY, CamMethod

IMAGES_AND_CLIPS: tuple[int, ...] = (2, 3)
"""The ranks of rollout and attn-grad: an image ViT's (h, w) patches and a video transformer's joint space-time
(t, h, w) tubelets (docs/video.md); their formulas never look at the grid, only at the token sequence."""


def attention_rollout(
    activations: torch.Tensor | None,
    gradients: torch.Tensor | None,
    attention: AttentionMaps,
    *,
    eigen_smooth: bool = False,
) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema, "Quantifying Attention Flow in Transformers", ACL 2020): see
    :mod:`gradcam_cli.cam.attention.rollout`. L = R[0, P:], R = Ã_L ... Ã_1."""
    return rollout(attention)


def attn_grad(
    activations: torch.Tensor | None,
    gradients: torch.Tensor | None,
    attention: AttentionMaps,
    *,
    eigen_smooth: bool = False,
) -> torch.Tensor:
    """Gradient-weighted attention relevance (Chefer, Gur & Wolf, ICCV 2021): see
    :mod:`gradcam_cli.cam.attention.relevance`. L = R[0, P:], R <- R + mean_h ReLU(dS/dA_l ⊙ A_l) R."""
    return attention_gradient(attention)


def class_attention(
    activations: torch.Tensor | None,
    gradients: torch.Tensor | None,
    attention: AttentionMaps,
    *,
    eigen_smooth: bool = False,
) -> torch.Tensor:
    """The last layer's class-token attention (the DINO map, Caron et al., ICCV 2021): see
    :mod:`gradcam_cli.cam.attention.last`. L = mean_h A_L[0, P:]."""
    return last_attention(attention)


def layer_gradients(
    activations: torch.Tensor | None,
    gradients: torch.Tensor | None,
    attention: AttentionMaps,
    *,
    eigen_smooth: bool = False,
) -> torch.Tensor:
    """LeGrad (Bousselham et al., arXiv:2404.03214, 2024): see :mod:`gradcam_cli.cam.attention.legrad`.
    L = sum_l mean_{h, rows} ReLU(ds_l/dA_l)[:, P:] over the last two layers."""
    return legrad(attention)


ROLLOUT = CamMethod(
    "rollout",
    attention_rollout,
    uses_gradients=False,
    needs=ATTENTION_MAPS,
    class_agnostic=True,
    needs_target=False,
    tasks=CLASSIFY,
    uses_layer=False,
    formula="R[0, P:], R = Ã_L ... Ã_1, Ã_l = 0.5 mean_heads(A_l) + 0.5 I ([Attention methods](#attention-methods))",
    paper="Abnar & Zuidema, ACL 2020",
    cost="none (class-agnostic), transformers only",
    ranks=IMAGES_AND_CLIPS,
)
ATTN_GRAD = CamMethod(
    "attn-grad",
    attn_grad,
    uses_gradients=False,
    needs=ATTENTION_GRADIENTS,
    tasks=CLASSIFY,
    uses_layer=False,
    formula="R[0, P:], R <- R + mean_heads(ReLU(∂S/∂A_l ⊙ A_l)) R from R = I",
    paper="Chefer, Gur & Wolf, ICCV 2021",
    cost="one backward pass to the first attention layer, transformers only",
    ranks=IMAGES_AND_CLIPS,
)
ATTENTION = CamMethod(
    "attention",
    class_attention,
    uses_gradients=False,
    needs=ATTENTION_MAPS,
    class_agnostic=True,
    needs_target=False,
    tasks=CLASSIFY,
    uses_layer=False,
    formula="A_L[0, P:], the last layer's class-token attention, mean over heads",
    paper="the DINO map (Caron et al., ICCV 2021)",
    cost="none (class-agnostic), transformers only",
)
LEGRAD = CamMethod(
    "legrad",
    layer_gradients,
    uses_gradients=False,
    needs=LAYER_SCORES,
    tasks=CLASSIFY,
    uses_layer=False,
    formula="sum over the last 2 layers of mean_{heads, rows} ReLU(∂s_l/∂A_l)[:, P:]",
    paper="Bousselham et al., arXiv:2404.03214, 2024",
    cost="a backward pass, and a forward and backward pass for the second-last layer",
)
