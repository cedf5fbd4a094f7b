"""EigenGradCAM, AblationCAM and FullGrad: formulas by hand, agreement with an independent computation
(``method_reference.py``: forward hooks, ``torch.autograd.grad``, unbatched loops) on random-weight torchvision
models with BatchNorm statistics calibrated, and with pytorch-grad-cam where it is right; where it is not, the test
shows what it computes instead:

* EigenGradCAM at a layer followed by an in-place op (``out += identity``): its activations are the post-in-place
  values (CPU aliasing, as ``tests/methods/test_references.py`` explains).
* AblationCAM where the activations are not all >= 0 with minimum 0 (Hardswish, BatchNorm outputs): it writes
  min(A) - 1e7 into the ablated channel, not the paper's 0.
* FullGrad: it adds 1e-7 to every channel's span before dividing; where a term's values are tiny (random
  MobileNetV3, EfficientNet) that changes the map; without it, it agrees.

The sweeps (``slow``) run at 112 x 112 on light architectures: AblationCAM costs one forward pass per channel, twice
(ours batched, the reference's loop one at a time).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import pytorch_grad_cam as pgc
import torch
from cam_reference import pearson, signed_projection
from method_reference import (
    ablation_weights,
    ablationcam,
    calibrate_batchnorm,
    eigengradcam,
    fullgrad,
    pytorch_grad_cam_ablation_value,
    pytorch_grad_cam_map,
)
from method_subjects import REQUIRED, model, ours, photo, top_class
from torch import nn

from gradcam_cli import Explainer
from gradcam_cli.cam.engine import LayerCapture
from gradcam_cli.cam.fullgrad import bias_layers, layer_bias


class SignedEigenGradCAM(pgc.EigenGradCAM):
    """pytorch-grad-cam's EigenGradCAM, the component's sign fixed as for Eigen-CAM (``cam_reference.py``)."""

    def get_cam_image(self, input_tensor, target_layer, targets, activations, grads, eigen_smooth=False):
        return signed_projection(grads * activations)


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """Many small passes: one intra-op thread (see ``tests/methods/test_references.py``); the models freed after."""
    yield
    model.cache_clear()


def tiny_cnn() -> nn.Module:
    """16 channels at 8 x 8 from a 64 x 64 input; layer ``3`` (a conv followed by another) has negative outputs,
    ``5`` (a ReLU) none."""
    torch.manual_seed(1)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1),
        nn.Conv2d(16, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )
    with torch.no_grad():
        net[4].weight[3].zero_()  # channel 3 of layers 4 and 5: zero everywhere (not run by AblationCAM)
        net[4].bias[3] = 0.0
    return calibrate_batchnorm(net, (64, 64))


# --- formulas by hand ----------------------------------------------------------------------------------------------


class Pooled(nn.Module):
    """A = ReLU(first two input channels); y = sum_k v_k sum_ij A^k_ij + b: ablating channel k lowers y by
    v_k sum A^k."""

    def __init__(self) -> None:
        super().__init__()
        self.select = nn.Conv2d(3, 2, 1, bias=False)
        self.features = nn.ReLU()
        self.head = nn.Linear(2, 3)
        with torch.no_grad():
            self.select.weight.copy_(torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]).view(2, 3, 1, 1))
            self.head.weight.copy_(torch.tensor([[1.0, -2.0], [0.5, 0.5], [0.0, 1.0]]))
            self.head.bias.copy_(torch.tensor([1.0, 0.0, 0.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(self.select(x)).sum(dim=(2, 3)))


@pytest.mark.quick
def test_ablationcam_weights_by_hand() -> None:
    # Channel 0 = [[1, 2]] (sum 3), channel 1 = [[0, 4]] (sum 4); class 0: y = 3 - 8 + 1 = -4.
    # y_0 = -4 - 3 = -7, y_1 = -4 + 8 = 4: w_0 = (y - y_0) / y = 3 / -4, w_1 = -8 / -4 = 2.
    # L = ReLU(-0.75 * [1, 2] + 2 * [0, 4]) = ReLU([-0.75, 6.5]) = [0, 6.5].
    x = torch.tensor([[1.0, 2.0], [0.0, 4.0], [0.0, 0.0]]).view(1, 3, 1, 2)
    explainer = Explainer(Pooled(), "features", "ablationcam", score_batch_size=1)
    cams = explainer.compute(x, target=0)[2]
    assert torch.allclose(cams["ablationcam"][0][0], torch.tensor([[[0.0, 6.5]]]))


@pytest.mark.quick
def test_eigengradcam_is_the_signed_first_component_of_the_gradient_weighted_activations() -> None:
    # Two channels over three positions; g ⊙ A = [[1, 2, 3], [2, 4, 6]] (rank one): the centred rows are
    # [-1, 0, 1] and [-2, 0, 2], the component is [-1, 0, 1] times a positive factor, ReLU leaves [0, 0, 1]*c.
    from gradcam_cli.cam.methods import eigengradcam as ours_eigengradcam

    activations = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]).view(1, 2, 1, 3)
    gradients = torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]).view(1, 2, 1, 3)
    cam = ours_eigengradcam(activations, gradients)[0, 0]
    assert cam[0] == 0 and cam[1] == pytest.approx(0, abs=1e-6) and cam[2] > 0
    assert torch.allclose(cam / cam[2], torch.tensor([0.0, 0.0, 1.0]), atol=1e-6)


@pytest.mark.quick
def test_batchnorm_bias_is_beta_minus_mean_times_its_scale() -> None:
    norm = nn.BatchNorm2d(2).eval()
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([2.0, 0.5]))
        norm.bias.copy_(torch.tensor([1.0, -1.0]))
        norm.running_mean.copy_(torch.tensor([3.0, 4.0]))
        norm.running_var.copy_(torch.tensor([4.0 - norm.eps, 1.0 - norm.eps]))
    # scale = (2 / 2, 0.5 / 1) = (1, 0.5); bias = (1 - 3 * 1, -1 - 4 * 0.5) = (-2, -3); z = scale * x + bias.
    assert torch.allclose(layer_bias(norm), torch.tensor([-2.0, -3.0]))
    x = torch.randn(1, 2, 3, 3)
    assert torch.allclose(norm(x), x * torch.tensor([1.0, 0.5]).view(1, 2, 1, 1) + layer_bias(norm).view(1, 2, 1, 1))
    net = tiny_cnn()
    assert list(bias_layers(net)) == ["0", "1", "3", "4"]


# --- the engine's extra passes ---------------------------------------------------------------------------------------


def test_a_replaced_output_lands_at_the_explained_call_only() -> None:
    """A module that runs twice is explained at its last call; AblationCAM replaces that call's output, not the
    first one's."""
    relu = nn.ReLU()
    net = nn.Sequential(nn.Conv2d(3, 4, 1), relu, nn.Conv2d(4, 4, 1), relu, nn.Flatten(), nn.Linear(16, 2))
    x = torch.randn(1, 3, 2, 2)
    with LayerCapture(net, {"relu": relu}) as capture:
        capture.forward(x)
        replacement = torch.full((1, 4, 2, 2), 7.0)
        replaced = capture.forward_output_replaced(x, "relu", replacement)
    with torch.no_grad():
        expected = net[5](net[4](replacement))
    assert torch.allclose(replaced, expected)  # type: ignore[arg-type]


# --- against the references, quick ------------------------------------------------------------------------------------


def test_quick_ablationcam_matches_the_unbatched_loop_with_progress() -> None:
    net, x = tiny_cnn(), torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    target = top_class(net, x)
    calls: list[tuple[int, int]] = []
    explainer = Explainer(net, "5", "ablationcam", score_batch_size=4, progress=lambda d, t: calls.append((d, t)))
    mine = explainer.explain_batch(x, target=target)[0].explanations[0].saliency
    assert pearson(mine, ablationcam(net, net[5], x, target)) >= REQUIRED
    assert calls[0] == (0, 15) and calls[-1] == (15, 15) and len(calls) == 1 + math.ceil(15 / 4)  # channel 3 skipped
    peer = pytorch_grad_cam_map(pgc.AblationCAM, net, [net[5]], x, target)  # ReLU output, minimum 0: the paper's rule
    assert pearson(mine, peer) >= REQUIRED


def test_quick_ablationcam_departure_of_pytorch_grad_cam_on_negative_activations() -> None:
    net, x = tiny_cnn(), torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    target = top_class(net, x)
    mine = ours(net, "3", "ablationcam", x, target)
    assert pearson(mine, ablationcam(net, net[3], x, target)) >= REQUIRED
    peer = pytorch_grad_cam_map(pgc.AblationCAM, net, [net[3]], x, target)
    reconstruction = ablationcam(net, net[3], x, target, value=pytorch_grad_cam_ablation_value)
    assert pearson(peer, reconstruction) >= REQUIRED
    assert not torch.allclose(
        ablation_weights(net, net[3], x, target),
        ablation_weights(net, net[3], x, target, value=pytorch_grad_cam_ablation_value),
    )


def test_quick_eigengradcam_and_fullgrad_on_resnet18() -> None:
    net, x = model("resnet18"), photo((64, 64))
    target = top_class(net, x)
    mine = ours(net, "layer4", "eigengradcam", x, target)
    assert pearson(mine, eigengradcam(net, net.layer4, x, target)) >= REQUIRED
    assert pearson(mine, pytorch_grad_cam_map(SignedEigenGradCAM, net, [net.layer4], x, target)) >= REQUIRED
    mine = ours(net, "layer4", "fullgrad", x, target)
    assert mine.shape == (64, 64)
    assert pearson(mine, fullgrad(net, x, target)) >= REQUIRED
    assert pearson(mine, pytorch_grad_cam_map(pgc.FullGrad, net, [], x, target)) >= REQUIRED


def test_quick_eigengradcam_after_an_inplace_add_where_pytorch_grad_cam_reads_rewritten_activations() -> None:
    net, x = model("resnet18"), photo((64, 64))
    target = top_class(net, x)
    layer = net.get_submodule("layer4.1.bn2")  # out = bn2(...); out += identity
    mine = ours(net, "layer4.1.bn2", "eigengradcam", x, target)
    assert pearson(mine, eigengradcam(net, layer, x, target)) >= REQUIRED
    assert pearson(mine, pytorch_grad_cam_map(SignedEigenGradCAM, net, [layer], x, target)) < 0.9


# --- the sweeps ------------------------------------------------------------------------------------------------------

EIGENGRADCAM_SWEEP = [
    ("resnet18", "layer4"),
    ("resnet18", "layer4.1.bn2"),  # followed by out += identity
    ("vgg11", "features.18"),  # followed by ReLU(inplace=True)
    ("densenet121", "features"),  # followed by F.relu(..., inplace=True)
    ("efficientnet_b0", "features"),
    ("mobilenet_v3_small", "features"),
    ("convnext_tiny", "features"),
    ("googlenet", "inception5b"),
]
ABLATION_SWEEP = [
    ("squeezenet1_1", "features.12"),
    ("alexnet", "features.10"),  # followed by ReLU(inplace=True)
    ("mobilenet_v3_small", "features"),  # Hardswish: negative activations
    ("regnet_y_400mf", "trunk_output"),
    ("shufflenet_v2_x0_5", "conv5"),
    ("mnasnet0_5", "layers.15"),  # BatchNorm followed by ReLU(inplace=True)
]
FULLGRAD_SWEEP = [
    "resnet18",  # every BatchNorm followed by an in-place ReLU or += identity
    "vgg11",  # convolutions with biases, no BatchNorm
    "densenet121",
    "squeezenet1_1",
    "mobilenet_v3_small",
    "efficientnet_b0",
    "regnet_y_400mf",
]
PLAIN = {"resnet18-layer4", "densenet121-features", "efficientnet_b0-features", "mobilenet_v3_small-features"}
"""Layers whose activations pytorch-grad-cam reads right (nothing changes them in place afterwards)."""


@pytest.mark.slow
@pytest.mark.parametrize(("name", "layer"), EIGENGRADCAM_SWEEP)
def test_sweep_eigengradcam(name: str, layer: str) -> None:
    net, x = model(name), photo()
    target = top_class(net, x)
    mine = ours(net, layer, "eigengradcam", x, target)
    assert pearson(mine, eigengradcam(net, net.get_submodule(layer), x, target)) >= REQUIRED
    if f"{name}-{layer}" in PLAIN:
        peer = pytorch_grad_cam_map(SignedEigenGradCAM, net, [net.get_submodule(layer)], x, target)
        assert pearson(mine, peer) >= REQUIRED


@pytest.mark.slow
@pytest.mark.parametrize(("name", "layer"), ABLATION_SWEEP)
def test_sweep_ablationcam(name: str, layer: str) -> None:
    net, x = model(name), photo()
    target = top_class(net, x)
    mine = ours(net, layer, "ablationcam", x, target, score_batch_size=64)
    assert pearson(mine, ablationcam(net, net.get_submodule(layer), x, target)) >= REQUIRED


@pytest.mark.slow
def test_sweep_ablationcam_departure_of_pytorch_grad_cam() -> None:
    net, x = model("mobilenet_v3_small"), photo()
    target = top_class(net, x)
    layer = net.features
    peer = pytorch_grad_cam_map(pgc.AblationCAM, net, [layer], x, target)
    assert pearson(peer, ablationcam(net, layer, x, target, value=pytorch_grad_cam_ablation_value)) >= REQUIRED
    assert pearson(ours(net, "features", "ablationcam", x, target, score_batch_size=64), peer) < 0.95


@pytest.mark.slow
@pytest.mark.parametrize("name", FULLGRAD_SWEEP)
def test_sweep_fullgrad(name: str, monkeypatch) -> None:
    net, x = model(name), photo()
    target = top_class(net, x)
    mine = ours(net, None, "fullgrad", x, target)
    assert pearson(mine, fullgrad(net, x, target)) >= REQUIRED
    peer = pytorch_grad_cam_map(pgc.FullGrad, net, [], x, target)
    if name == "mobilenet_v3_small":  # its 1e-7 on each channel's span dominates the tiny terms
        assert pearson(mine, peer) < 0.995
    import pytorch_grad_cam.utils.image as pgc_image

    def scale_without_eps(cam, target_size=None):
        import cv2

        out = []
        for image in cam:
            image = image - np.min(image)
            image = image / np.max(image) if np.max(image) > 0 else image
            out.append(cv2.resize(np.float32(image), target_size) if target_size is not None else image)
        return np.float32(out)

    monkeypatch.setattr(pgc_image, "scale_cam_image", scale_without_eps)
    monkeypatch.setattr(pgc.fullgrad_cam, "scale_cam_image", scale_without_eps)
    assert pearson(mine, pytorch_grad_cam_map(pgc.FullGrad, net, [], x, target)) >= REQUIRED


@pytest.mark.quick
@pytest.mark.parametrize("method", ["eigengradcam", "ablationcam", "fullgrad", "guided-backprop", "guided-gradcam"])
def test_a_batch_with_two_targets_each_equals_each_image_alone(method: str) -> None:
    """Every sample its own targets and its own maps, however the extra passes batch them (3 ablated copies per
    pass do not divide 15 channels x 2 samples)."""
    net = tiny_cnn()
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(4))
    explainer = Explainer(net, "5", method, score_batch_size=3)
    _, targets, batched = explainer.compute(x, top_k=2)
    for i in range(2):
        for k in range(2):
            alone = explainer.compute(x[i : i + 1], target=int(targets[i, k]))[2][method][0][0]
            torch.testing.assert_close(batched[method][k][0][i : i + 1], alone, rtol=1e-4, atol=1e-5)


def test_aug_smooth_and_several_layers_take_the_new_methods() -> None:
    net = tiny_cnn()
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    methods = ["eigengradcam", "ablationcam", "fullgrad", "guided-backprop", "guided-gradcam"]
    for options in ({"aug_smooth": True}, {"layers": ["3", "5"]}):
        layers = options.pop("layers", "5")
        result = Explainer(net, layers, methods, **options).explain_batch(x)[0]
        assert [e.method for e in result.explanations] == methods
        for explanation in result.explanations:
            assert explanation.saliency.shape == (64, 64) and float(explanation.saliency.max()) == pytest.approx(1.0)
