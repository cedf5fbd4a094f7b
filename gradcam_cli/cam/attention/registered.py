"""The attention methods as the method registry calls them: ``(activations, gradients, attention, *, eigen_smooth)``
with no layer (``activations`` and ``gradients`` are ``None``) and the pass's
:class:`~gradcam_cli.cam.attention.tokens.AttentionMaps`; ``eigen_smooth`` changes nothing."""

from __future__ import annotations

import torch

from .last import last_attention
from .legrad import legrad
from .relevance import attention_gradient
from .rollout import rollout
from .tokens import AttentionMaps


def attention_rollout(
    activations: None, gradients: None, attention: AttentionMaps, *, eigen_smooth: bool = False
) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema, ACL 2020): see :mod:`gradcam_cli.cam.attention.rollout`."""
    return rollout(attention)


def attn_grad(
    activations: None, gradients: None, attention: AttentionMaps, *, eigen_smooth: bool = False
) -> torch.Tensor:
    """Gradient-weighted attention relevance (Chefer et al., ICCV 2021): see
    :mod:`gradcam_cli.cam.attention.relevance`."""
    return attention_gradient(attention)


def class_attention(
    activations: None, gradients: None, attention: AttentionMaps, *, eigen_smooth: bool = False
) -> torch.Tensor:
    """The last layer's class-token attention, averaged over heads: see :mod:`gradcam_cli.cam.attention.last`."""
    return last_attention(attention)


def layer_gradients(
    activations: None, gradients: None, attention: AttentionMaps, *, eigen_smooth: bool = False
) -> torch.Tensor:
    """LeGrad (Bousselham et al., 2024): see :mod:`gradcam_cli.cam.attention.legrad`."""
    return legrad(attention)
