"""timm and Hugging Face models explained with the automatic layer agree with an independent computation, and token
models point at a planted object.

Every architecture family the tool knows is built tiny with random weights, explained with the default layer
(:func:`gradcam_cli.cam.layers.default_layer`) and the layout the tool infers from the model's own prefix-token
count, and compared, by Pearson correlation >= 0.999 and value by value on the coarse map, with Grad-CAM computed
here from first principles: a forward hook keeps the layer's output (handing the network a clone), then
``torch.autograd.grad`` of the target logit with respect to it, reshaped to (C, h, w) by what the test knows about
the architecture (channel-first, channel-last, or ``prefix`` tokens then a square grid), spatial-mean weights, ReLU,
bilinear upsampling (``align_corners=False``) and min-max.

Random weights say nothing about where an object is, so the planted-object test hand-sets a timm ViT's weights to
detect red patches, with a class token and 8 register tokens (9 leading tokens, more than the tool would guess).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from attention_models import HF_TINY, tiny_vit
from method_reference import stashing
from square_model import square_image
from torch import nn

from gradcam_cli.cam.explainer import Explainer
from gradcam_cli.models.hf_models import describe_hf
from gradcam_cli.models.hub import HubModel
from gradcam_cli.models.loading import LoadedModel
from gradcam_cli.models.timm_models import describe_timm

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")
PEARSON_MIN = 0.999
VIT = {"depth": 2, "embed_dim": 32, "num_heads": 2}
"""A two-block, 32-wide ViT: enough to have attention, small enough to build in milliseconds."""


@dataclass(frozen=True)
class Case:
    """A tiny model, the default layer the tool must choose, and how that layer lays out its grid."""

    name: str
    build: Callable[[], nn.Module]
    layer: str
    layout: str  # nchw, nhwc or tokens
    prefix: int = 0
    size: int = 64


def _timm(name: str, **options: object) -> Callable[[], nn.Module]:
    return lambda: timm.create_model(name, pretrained=False, num_classes=10, **options)


def _hf(config: Callable[[], object], model: str) -> Callable[[], nn.Module]:
    return lambda: getattr(transformers, model)(config())


TIMM_QUICK = [
    Case("deit-distilled", _timm("deit_tiny_distilled_patch16_224", img_size=64, **VIT), "blocks.1.norm1", "tokens", 2),
    Case(
        "swin",
        _timm(
            "swin_tiny_patch4_window7_224", img_size=64, embed_dim=16, depths=(1, 1), num_heads=(1, 2), window_size=4
        ),
        "norm",
        "nhwc",
    ),
]
TIMM_SWEEP = [
    Case("resnet", _timm("test_resnet"), "layer4", "nchw", size=128),
    Case("convnext", _timm("test_convnext"), "norm_pre", "nchw", size=128),
    Case("efficientnet", _timm("test_efficientnet"), "bn2", "nchw", size=128),
    Case("regnet", _timm("regnetx_002"), "final_conv", "nchw", size=128),
    Case("vit", _timm("vit_tiny_patch16_224", img_size=64, **VIT), "blocks.1.norm1", "tokens", 1),
    Case("vit-registers", _timm("vit_base_patch16_reg4_gap_256", img_size=64, **VIT), "blocks.1.norm1", "tokens", 4),
    Case("beit", _timm("beit_base_patch16_224", img_size=64, **VIT), "blocks.1.norm1", "tokens", 1),
    Case("eva", _timm("eva02_tiny_patch14_224", img_size=56, **VIT), "blocks.1.norm1", "tokens", 1, size=56),
    Case("vit-resnet-hybrid", _timm("vit_tiny_r_s16_p8_224", img_size=128, **VIT), "blocks.1.norm1", "tokens", 1, 128),
    Case("maxvit-hybrid", _timm("test_maxvit"), "norm", "nchw", size=160),
]
HF_QUICK = [
    Case(
        "hf-vit",
        _hf(
            lambda: transformers.ViTConfig(image_size=64, patch_size=16, num_labels=10, **HF_TINY),
            "ViTForImageClassification",
        ),
        "vit.layers.1.layernorm_before",
        "tokens",
        1,
    ),
]
HF_SWEEP = [
    Case(
        "hf-swin",
        _hf(
            lambda: transformers.SwinConfig(
                image_size=64, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=4, num_labels=10
            ),
            "SwinForImageClassification",
        ),
        "swin.layernorm",
        "tokens",
        0,
    ),
    Case(
        "hf-convnext",
        _hf(
            lambda: transformers.ConvNextConfig(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], num_labels=10),
            "ConvNextForImageClassification",
        ),
        "convnext.encoder.stages.1",
        "nchw",
    ),
    Case(
        "hf-deit-distilled",
        _hf(
            lambda: transformers.DeiTConfig(image_size=64, patch_size=16, num_labels=10, **HF_TINY),
            "DeiTForImageClassificationWithTeacher",
        ),
        "deit.layers.1.layernorm_before",
        "tokens",
        2,
    ),
]


def _params(quick: list[Case], sweep: list[Case]) -> list:
    return [pytest.param(c, id=c.name) for c in quick] + [
        pytest.param(c, id=c.name, marks=pytest.mark.slow) for c in sweep
    ]


def _loaded(case: Case) -> LoadedModel:
    torch.manual_seed(0)
    module = case.build().eval()
    _calibrate_batchnorm(module, case.size)
    built: HubModel = describe_timm(module) if hasattr(module, "pretrained_cfg") else describe_hf(module)
    return LoadedModel(module, case.name, "none", None, built.input_spec, prefix_tokens=built.prefix_tokens)


def _calibrate_batchnorm(model: nn.Module, size: int) -> None:
    """BatchNorm running statistics of the actual input (random nets' identity statistics let the signal fade)."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None
    model.train()
    with torch.no_grad():
        model(torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0)))
    model.eval()


def _reference(module: nn.Module, layer: nn.Module, inputs: torch.Tensor, target: int, case: Case) -> torch.Tensor:
    """The coarse (h, w) Grad-CAM of ``layer`` from a forward hook and ``torch.autograd.grad`` alone."""
    with stashing([layer]) as stash, torch.enable_grad():
        output = module(inputs)
        logits = output if isinstance(output, torch.Tensor) else output.logits
        (gradients,) = torch.autograd.grad(logits[0, target], stash[0][-1])
    activations = stash[0][-1].detach()[0]
    gradients = gradients[0]
    if case.layout == "nhwc":
        activations, gradients = activations.permute(2, 0, 1), gradients.permute(2, 0, 1)
    elif case.layout == "tokens":
        side = math.isqrt(activations.shape[0] - case.prefix)
        assert side * side == activations.shape[0] - case.prefix
        activations, gradients = (t[case.prefix :].T.reshape(-1, side, side) for t in (activations, gradients))
    weights = gradients.mean(dim=(1, 2), keepdim=True)
    return torch.relu((weights * activations).sum(dim=0))


def _pearson(first: torch.Tensor, second: torch.Tensor) -> float:
    first, second = first.double().flatten(), second.double().flatten()
    for values in (first, second):  # Pearson needs a map that varies
        assert torch.isfinite(values).all() and float(values.std()) > 1e-3 * float(values.max() - values.min()) > 0
    first, second = first - first.mean(), second - second.mean()
    return float(first @ second / (first.norm() * second.norm()))


@pytest.mark.parametrize("case", _params(TIMM_QUICK + HF_QUICK, TIMM_SWEEP + HF_SWEEP))
def test_the_automatic_layer_agrees_with_autograd(case: Case) -> None:
    loaded = _loaded(case)
    assert loaded.prefix_tokens == (case.prefix if case.layout == "tokens" else loaded.prefix_tokens)
    explainer = Explainer(loaded)
    assert list(explainer.chosen.layers) == [case.layer]
    inputs = torch.randn(1, 3, case.size, case.size, generator=torch.Generator().manual_seed(1))
    result = explainer.explain_batch(inputs)[0]
    target = result.explanations[0].target.index
    ours = result.explanations[0].saliency
    coarse = explainer.compute(inputs, target=target)[2]["gradcam"][0][0][0]
    reference = _reference(loaded.module, loaded.module.get_submodule(case.layer), inputs, target, case)
    torch.testing.assert_close(coarse, reference, rtol=1e-4, atol=1e-4 * float(reference.abs().max()))
    upsampled = F.interpolate(reference[None, None], size=(case.size,) * 2, mode="bilinear", align_corners=False)[0, 0]
    assert _pearson(ours, upsampled) >= PEARSON_MIN


# --- a planted object ---------------------------------------------------------------------------------------------


def planted_vit() -> nn.Module:
    """A timm ViT (32 x 32 input, 8 x 8 patches, a class token and 8 registers) whose class scores are the red,
    green and blue excess of its patches: patch embedding = colour detectors, attention uniform over all tokens
    (q = k = 0) so the class token reads the mean token, no norms, no MLP, head = 10 x identity."""
    planted = {"embed_dim": 3, "depth": 1, "num_heads": 1, "mlp_ratio": 1.0, "reg_tokens": 8, "num_classes": 3}
    model = tiny_vit(**planted, norm_layer=nn.Identity).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        excess = torch.full((3, 3), -0.5) + 1.5 * torch.eye(3)  # out colour c: c - (others) / 2
        model.patch_embed.proj.weight.copy_(excess[:, :, None, None].expand(-1, -1, 8, 8) / 64)
        block = model.blocks[0]
        block.attn.qkv.weight[6:9].copy_(torch.eye(3))  # v = x
        block.attn.proj.weight.copy_(torch.eye(3))
        model.head.weight.copy_(torch.eye(3) * 10)
    return model


def test_a_token_model_with_registers_points_at_the_planted_object() -> None:
    """The default layer and the model's own 9 prefix tokens put the map on the red square; the guessed layout
    (25 tokens read as a 5 x 5 grid) would not."""
    module = planted_vit()
    built = describe_timm(module)
    assert built.prefix_tokens == 9
    loaded = LoadedModel(
        module, "planted", "none", ["red", "green", "blue"], built.input_spec, prefix_tokens=built.prefix_tokens
    )
    box = (360, 80, 480, 160)  # x1, y1, x2, y2 in the 480 x 320 image: exactly patch (row 1, column 3) at 32 x 32
    explainer = Explainer(loaded, None, ["gradcam", "gradcam++", "xgradcam", "hirescam", "layercam"])
    assert list(explainer.chosen.layers) == [
        "blocks.0.norm1"
    ]  # the input of the last attention: the class token reads it
    result = explainer.explain(square_image(box=box), target=0)
    assert result.predictions[0].name == "red"
    x1, y1, x2, y2 = box
    for explanation in result.explanations:
        saliency = explanation.saliency
        row, col = divmod(int(saliency.argmax()), saliency.shape[1])
        assert x1 <= col < x2 and y1 <= row < y2, explanation.method
        assert saliency[y1:y2, x1:x2].mean() > 4 * saliency.mean(), explanation.method
    guessing = loaded.with_profile(prefix_tokens=None)  # guessing instead: the map misses the square
    guessed = Explainer(guessing).explain(square_image(box=box), target=0).explanations[0].saliency
    assert not guessed[y1:y2, x1:x2].mean() > 4 * guessed.mean()
