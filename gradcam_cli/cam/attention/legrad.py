"""LeGrad (Bousselham, Boggust, Chaybouti, Strobelt & Kuehne, "LeGrad: An Explainability Method for Vision
Transformers via Feature Formation Sensitivity", arXiv:2404.03214, 2024), as its reference code
(github.com/WalBouss/LeGrad, ``legrad/wrapper.py``, ``compute_legrad_clip``) computes it.

For each layer l of the last :data:`LEGRAD_LAYERS`: s_l, the target's score computed from layer l's tokens;
E_l = mean over heads and over all query rows of ReLU(ds_l/dA_l) (the gradient alone, not multiplied by the
attention), at the patch columns; the map is sum_l E_l (min-max normalised, as every map is). The choices the paper
leaves open, settled as the reference code settles them, and where this differs:

- which layers: the last two (the reference's default ``layer_index=-2``);
- the gradient is clamped at zero and *not* multiplied by A_l;
- which rows: the mean over every query row, the class token's, prefix tokens' and patches' alike (the reference
  averages ``grad.mean(dim=1).mean(dim=1)``); only the patch columns are kept (the reference drops column 0; here
  all P prefix columns, so registers never show);
- how an intermediate layer is scored: the reference pools layer l's tokens by their mean and applies CLIP's
  ``ln_post`` and projection; here layer l's tokens go through the rest of the model with the blocks after l
  skipped (each passes its input on), i.e. through the model's own final norm, pooling and head, and are scored by
  the same score as every method (the class logit, ``similar:``, ``text:``, ...). For the last layer this is the
  explained score itself; for a CLIP tower pooling its class token it differs from the reference's mean pooling.
"""

from __future__ import annotations

import torch

from .tokens import AttentionMaps

LEGRAD_LAYERS = 2
"""How many of the last layers LeGrad sums (the reference code's default ``layer_index=-2``)."""


def legrad(maps: AttentionMaps) -> torch.Tensor:
    """(N, h, w): sum over the layers in ``maps`` (the last :data:`LEGRAD_LAYERS`) of mean_{heads, rows}
    ReLU(ds_l/dA_l) at the patch columns, ``maps.gradients[i]`` being layer i's own score's gradient."""
    if maps.gradients is None:
        raise ValueError("LeGrad needs each layer's gradient")
    height, width = maps.grid
    total = sum(gradient.float().clamp(min=0).mean(dim=(1, 2))[:, maps.prefix :] for gradient in maps.gradients)
    if not isinstance(total, torch.Tensor):
        raise ValueError("LeGrad needs at least one layer")
    return total.reshape(total.shape[0], height, width)
