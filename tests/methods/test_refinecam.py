"""RefineCAM (Domeniconi et al., ICPR 2026): each layer's Grad-CAM++ map, upsampled to the input's pixels and
normalised to [0, 1], multiplied across the layers and normalised again; by default (one layer given, or none) the
model's last stages.

The reference is written from that definition with nothing but forward hooks and ``torch.autograd.grad``, in
float64 after the gradient (Grad-CAM++ as Eq. 19 of Chattopadhay et al. states it); it is held to the command's maps
on a tiny CNN and on a random-weight ResNet-18 (batch norms calibrated so that its gradients are O(1), as a trained
model's), and to pytorch-grad-cam's ``RefineCAM`` (1.5.7). torchcam's ``RefineCAM`` fuses at the largest layer's
grid instead of the input's; it is not installed here (docs/methods.md, RefineCAM, says where it differs).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision
from cam_reference import PaperGradCAMPlusPlus, pearson
from method_reference import calibrate_batchnorm, stashing
from PIL import Image
from torch import nn
from typer.testing import CliRunner

from gradcam_cli import Explainer
from gradcam_cli.cam.methods import METHODS
from gradcam_cli.cli import app
from gradcam_cli.cli.layer_notes import layers_notes
from gradcam_cli.io.images import IMAGENET_MEAN, IMAGENET_STD

REQUIRED = 0.999
SIZE = 64
RESNET_STAGES = ("layer1", "layer2", "layer3", "layer4")


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """Small passes: one intra-op thread (see ``tests/methods/test_references.py``)."""
    yield


def three_stage_cnn() -> nn.Module:
    """32x32, 16x16 and 8x8 grids from a 64x64 input, each ending in a ReLU (``2``, ``4``, ``6``)."""
    torch.manual_seed(3)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )
    return calibrate_batchnorm(net, (SIZE, SIZE)).eval()


def resnet18() -> nn.Module:
    torch.manual_seed(0)
    return calibrate_batchnorm(torchvision.models.resnet18(weights=None), (SIZE, SIZE)).eval()


def smooth_input(seed: int = 0) -> torch.Tensor:
    """A (1, 3, 64, 64) input with structure at every scale (bicubic upsampled noise), not white noise."""
    coarse = torch.rand(1, 3, 4, 4, generator=torch.Generator().manual_seed(seed))
    return F.interpolate(coarse, size=(SIZE, SIZE), mode="bicubic", align_corners=False) * 4 - 2


def minmax(maps: torch.Tensor) -> torch.Tensor:
    span = maps.max() - maps.min()
    return (maps - maps.min()) / span if span > 0 else torch.zeros_like(maps)


def reference_refinecam(model: nn.Module, layers: list[nn.Module], x: torch.Tensor, target: int) -> torch.Tensor:
    """The (H, W) RefineCAM map: per layer alpha = g^2 / (2 g^2 + sum_ab A_ab g^3) (0 where that is 0),
    w_k = sum_ij alpha ReLU(g), M = ReLU(sum_k w_k A^k), upsampled bilinearly to the input and min-max normalised;
    the product over the layers, min-max normalised."""
    with stashing(layers) as stash, torch.enable_grad():
        logits = model(x.clone().requires_grad_(True))
        gradients = torch.autograd.grad(logits[0, target], [kept[-1] for kept in stash])
    per_layer = []
    for kept, gradient in zip(stash, gradients, strict=True):
        a, g = kept[-1].detach().double(), gradient.double()
        denominator = 2 * g**2 + a.sum(dim=(2, 3), keepdim=True) * g**3
        alpha = torch.where(denominator != 0, g**2 / torch.where(denominator != 0, denominator, 1.0), 0.0)
        weights = (alpha * g.clamp(min=0)).sum(dim=(2, 3), keepdim=True)
        cam = (weights * a).sum(dim=1, keepdim=True).clamp(min=0)
        upsampled = F.interpolate(cam, size=tuple(x.shape[-2:]), mode="bilinear", align_corners=False)[0, 0]
        per_layer.append(minmax(upsampled))
    return minmax(torch.stack(per_layer).prod(dim=0))


def explained(model: nn.Module, layers: str | list[str] | None, x: torch.Tensor, target: int) -> tuple:
    explainer = Explainer(model, layers, ["refinecam"], target=target)
    result = explainer.explain_batch(x)[0]
    return explainer.chosen.layers, result.explanations[0].saliency.double()


@pytest.mark.quick
def test_registration_fuses_by_the_product_over_the_last_stages() -> None:
    method = METHODS["refinecam"]
    assert (method.fusion, method.stages, method.tasks, method.uses_gradients) == ("product", 4, ("classify",), True)
    assert all(other.fusion == "mean" and other.stages == 1 for name, other in METHODS.items() if name != "refinecam")


@pytest.mark.quick
def test_tiny_cnn_matches_the_reference_at_its_stages() -> None:
    net, x = three_stage_cnn(), smooth_input()
    target = int(net(x).argmax())
    layers, saliency = explained(net, None, x, target)
    assert layers == ("2", "4", "6")  # the last layer at each grid, the coarsest the default layer
    reference = reference_refinecam(net, [net[2], net[4], net[6]], x, target)
    assert pearson(saliency, reference) >= REQUIRED
    # the product is not the mean: every method but refinecam fuses several layers by the mean
    mean = Explainer(net, list(layers), ["gradcam++"], target=target).explain_batch(x)[0].explanations[0].saliency
    assert pearson(saliency, mean.double()) < 0.99


def test_resnet18_matches_the_reference_and_pytorch_grad_cam() -> None:
    from pytorch_grad_cam import GradCAMPlusPlus, RefineCAM
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    net, x = resnet18(), smooth_input(1)
    target = int(net(x).argmax())
    layers, saliency = explained(net, None, x, target)
    assert layers == RESNET_STAGES  # no --layer: the four stages, as the authors' example takes them
    modules = [net.get_submodule(name) for name in RESNET_STAGES]
    reference = reference_refinecam(net, modules, x, target)
    assert pearson(saliency, reference) >= REQUIRED
    assert explained(net, "layer4", x, target)[0] == RESNET_STAGES  # one --layer: the stages ending at it
    assert explained(net, ["layer3", "layer4"], x, target)[0] == ("layer3", "layer4")  # several: those

    # pytorch-grad-cam's RefineCAM fuses as the paper does (normalised maps at the input's size, their product,
    # normalised); with its own Grad-CAM++ it adds 1e-6 to alpha's denominator, so the paper's weights are also given
    targets = [ClassifierOutputTarget(target)]
    for base in (PaperGradCAMPlusPlus, GradCAMPlusPlus):
        peer = RefineCAM(model=net, target_layers=modules, base_method=base)
        try:
            peer_map = torch.from_numpy(np.asarray(peer(input_tensor=x, targets=targets)[0]))
        finally:
            for cam in peer.base_cam_per_layer:
                cam.activations_and_grads.release()
        assert pearson(saliency, peer_map) >= REQUIRED, base.__name__


def test_other_methods_keep_their_layer_beside_refinecam() -> None:
    net, x = three_stage_cnn(), smooth_input()
    explainer = Explainer(net, None, ["gradcam", "refinecam"], target=0)
    assert explainer.chosen.layers == ("6",)  # shared with gradcam: the default layer, refinecam's map of it alone
    maps = {e.method: e.saliency for e in explainer.explain_batch(x)[0].explanations}
    alone = Explainer(net, "6", ["gradcam++"], target=0).explain_batch(x)[0].explanations[0].saliency
    assert torch.allclose(maps["refinecam"], alone)
    part = explainer.with_options(methods=("refinecam",))  # as gradcam eval explains a pass group: the run's layer
    assert part.chosen.layers == ("6",) and torch.allclose(part.explain_batch(x)[0].explanations[0].saliency, alone)
    assert layers_notes(explainer, layers_given=False) == [
        "using layer 6 (last spatial layer; choose with --layer)",
        "refinecam reads layer 6 alone, as the other methods do: its map is that layer's Grad-CAM++ (run it alone for "
        "the model's last stages, or give --layer more than once)",
    ]
    assert layers_notes(Explainer(net, None, ["refinecam"]), layers_given=False) == [
        "using layers 2+4+6 (the model's last stages, as refinecam reads them; give --layer more than once)"
    ]


def _weights_and_image(tmp_path: Path) -> tuple[nn.Module, Path, Path, torch.Tensor]:
    net = resnet18()
    for parameter in net.parameters():
        parameter.requires_grad_(False)
    weights = tmp_path / "resnet18.pth"
    torch.save(net.state_dict(), weights)
    coarse = torch.rand(1, 3, 4, 4, generator=torch.Generator().manual_seed(2))
    pixels = F.interpolate(coarse, size=(SIZE, SIZE), mode="bicubic", align_corners=False)[0].clamp(0, 1)
    image = tmp_path / "smooth.png"
    Image.fromarray((pixels * 255).round().byte().permute(1, 2, 0).numpy()).save(image)
    stored = torch.from_numpy(np.asarray(Image.open(image).convert("RGB")).copy()).permute(2, 0, 1).float() / 255
    mean, std = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return net, weights, image, ((stored - mean) / std)[None]


def test_the_command_explains_with_refinecam_end_to_end(tmp_path: Path) -> None:
    net, weights, image, x = _weights_and_image(tmp_path)
    arguments = [str(image), "--model", "resnet18", "--weights", str(weights), "--input-size", str(SIZE),
                 "--method", "refinecam", "--save-raw", "--json", "-o", str(tmp_path / "out")]  # fmt: skip
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 0, result.output
    assert "using layers layer1+layer2+layer3+layer4 (the model's last stages, as refinecam reads them" in result.stderr
    (row,) = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert row["method"] == "refinecam" and row["layer"] == "+".join(RESNET_STAGES)
    saliency = np.load(next(path for path in row["outputs"] if path.endswith(".npy")))
    assert saliency.shape == (SIZE, SIZE)
    modules = [net.get_submodule(name) for name in RESNET_STAGES]
    assert pearson(saliency, reference_refinecam(net, modules, x, row["target"]["index"])) >= REQUIRED
