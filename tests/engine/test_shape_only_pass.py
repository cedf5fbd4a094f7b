"""The dry pass on a shape-only copy of the model (cam/layers.py ``inspect_layers``: parameters and buffers on the
meta device, nothing computed): every module's name, kind, output shape, layout, calls and order as a real pass on
the model itself gives them, for CNNs, a 3-D U-Net and transformers of each source (video models:
tests/pipeline/test_video_dry_pass.py); the model itself is not run and not changed (its hooks run, on shapes, as
they ran in a real dry pass); a detector, whose NMS needs values, falls back to the real pass with the same result."""

from __future__ import annotations

import pytest
import torch
import torchvision
from attention_models import tiny_vit
from monai.networks.nets import UNet
from torch import nn

from gradcam_cli.cam import layers


def runs(model: nn.Module) -> list[str]:
    """The device of each pass of ``model``'s (a hook on it, which its copies keep, as they keep any hook)."""
    devices: list[str] = []
    model.register_forward_hook(lambda _m, inputs, _o: devices.append(inputs[0].device.type))
    return devices


def real_pass(model: nn.Module, example: torch.Tensor) -> list[layers.LayerInfo]:
    return layers._inspect(model, example, None, True)


def resnet18() -> tuple[nn.Module, torch.Tensor]:
    return torchvision.models.resnet18(num_classes=5), torch.zeros(1, 3, 64, 64)


def torchvision_vit() -> tuple[nn.Module, torch.Tensor]:
    vit = torchvision.models.VisionTransformer(32, 8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32)
    return vit, torch.zeros(1, 3, 32, 32)


def timm_vit() -> tuple[nn.Module, torch.Tensor]:
    return tiny_vit(num_classes=4, reg_tokens=2), torch.zeros(1, 3, 32, 32)


def monai_unet() -> tuple[nn.Module, torch.Tensor]:
    return UNet(3, 1, 3, channels=(4, 8, 16), strides=(2, 2), num_res_units=1), torch.zeros(1, 1, 32, 32, 32)


@pytest.mark.parametrize("build", [resnet18, torchvision_vit, timm_vit, monai_unet])
def test_the_shape_only_pass_equals_the_real_one_without_running_the_model(build):
    torch.manual_seed(0)
    model, example = build()
    model.eval()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    expected = real_pass(model, example)
    calls = runs(model)
    seen = layers.inspect_layers(model, example)
    assert seen == expected
    assert calls == ["meta"]  # the model itself never ran: one pass of shapes
    assert any(info.output_shape for info in seen if info.name)
    after = model.state_dict()
    assert all(after[name].device.type == "cpu" and torch.equal(after[name], t) for name, t in before.items())
    assert all(p.device.type == "cpu" for p in model.parameters())


@pytest.mark.quick
def test_a_detector_whose_nms_needs_values_falls_back_to_the_real_pass():
    torch.manual_seed(0)
    detector = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=3
    ).eval()
    example = torch.zeros(1, 3, 96, 96)
    expected = real_pass(detector, example)
    calls = runs(detector)
    assert layers.inspect_layers(detector, example) == expected
    assert calls == ["cpu"]  # the real pass, once (the shape-only one stopped at the NMS)
