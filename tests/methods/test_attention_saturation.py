"""A saturated class-token attention under a final LayerNorm starves attn-grad's last layer (docs/methods.md,
"Attention methods"): the known-answer ViT (tests/attention_known.py) with its last block's queries scaled by 100,
so the class token attends to one token; measured against attention and gradients captured here with autograd."""

from __future__ import annotations

import copy

import torch
from attention_known import SIZE, make_images, train_vit  # tests/ is on sys.path (conftest)
from torch import nn

from gradcam_cli import Explainer
from gradcam_cli.io.images import InputSpec
from gradcam_cli.models.loading import LoadedModel


def _scaled(model: nn.Module, scale: float) -> nn.Module:
    """A copy whose last block's queries (weights and bias) are ``scale`` times larger: logits ``scale`` times."""
    scaled = copy.deepcopy(model)
    qkv, dim = scaled.blocks[-1].attn.qkv, scaled.embed_dim
    with torch.no_grad():
        qkv.weight[:dim] *= scale
        qkv.bias[:dim] *= scale
    return scaled


def _captured(model: nn.Module, inputs: torch.Tensor, classes: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each block's attention A (N, heads, L, L) and dS/dA for S the sum of the true classes' logits, read from a
    copy on timm's plain path (attn_drop's input)."""
    model = copy.deepcopy(model)
    seen: list[torch.Tensor] = []

    def keep(_module: nn.Module, args: tuple[torch.Tensor, ...], _output: torch.Tensor) -> None:
        args[0].retain_grad()
        seen.append(args[0])

    for block in model.blocks:
        block.attn.fused_attn = False
        block.attn.attn_drop.register_forward_hook(keep)
    with torch.enable_grad():
        model(inputs.clone().requires_grad_(True)).gather(1, classes[:, None]).sum().backward()
    return [(a.detach(), a.grad) for a in seen if a.grad is not None]


def _term(attention: torch.Tensor, gradient: torch.Tensor) -> torch.Tensor:
    """attn-grad's term of one layer, the class token's row over the patches: mean_h clamp(dS/dA ⊙ A, min=0)[0, 1:]."""
    return (gradient * attention).clamp(min=0).mean(dim=1)[:, 0, 1:]


def _pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.stack([torch.corrcoef(torch.stack([x, y]))[0, 1] for x, y in zip(a, b, strict=True)]).mean())


def test_a_saturated_class_token_attention_starves_attn_grads_last_layer() -> None:
    base = train_vit()
    inputs, classes, cells = make_images(64, seed=1)
    figures = {}
    for scale in (1.0, 100.0):
        model = _scaled(base, scale)
        with torch.no_grad():
            accuracy = float((model(inputs).argmax(dim=1) == classes).float().mean())
        (first, first_grad), (last, last_grad) = _captured(model, inputs, classes)
        saturation = float(last[:, :, 0].amax(dim=-1).mean())  # the class token's largest attention, mean of heads
        attended = last[:, :, 0].argmax(dim=-1, keepdim=True)
        gradient_there = float(last_grad[:, :, 0].gather(-1, attended).mean())
        loaded = LoadedModel(model, "known", "trained", ["red", "blue"], InputSpec(SIZE, (SIZE, SIZE)), prefix_tokens=1)
        _, _, cams = Explainer(loaded, methods=["rollout", "attn-grad"]).compute(inputs, target=None)
        maps = {method: cams[method][0][0].flatten(1).clamp(min=0) for method in ("rollout", "attn-grad")}
        mass = {m: float((v.gather(1, cells[:, None]).squeeze(1) / v.sum(dim=1)).mean()) for m, v in maps.items()}
        figures[scale] = {
            "accuracy": accuracy,
            "saturation": saturation,
            "dS/dA at the attended token": gradient_there,
            "last layer's term": float(_term(last, last_grad).sum(dim=1).mean()),
            "attn-grad ~ first layer's term": _pearson(maps["attn-grad"], _term(first, first_grad)),
            "attn-grad mass": mass["attn-grad"],
            "rollout mass": mass["rollout"],
        }
    print(figures)  # the figures of docs/methods.md
    plain, saturated = figures[1.0], figures[100.0]
    assert plain["accuracy"] >= 0.95 and saturated["accuracy"] >= 0.95  # the same decisions
    assert plain["saturation"] < 0.5 < 0.99 < saturated["saturation"]
    # the gradient at the attended token is not small but negative: the clamp drops it, and the others' A is ~0
    assert saturated["dS/dA at the attended token"] < 0 < plain["dS/dA at the attended token"]
    assert saturated["last layer's term"] < plain["last layer's term"] / 10
    # what is left is the first layer's term alone
    assert plain["attn-grad ~ first layer's term"] < 0.9 < 0.99 < saturated["attn-grad ~ first layer's term"]
    assert saturated["rollout mass"] >= 0.35  # rollout, with no gradients, is not starved
