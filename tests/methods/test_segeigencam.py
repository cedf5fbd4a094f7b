"""Seg-Eigen-CAM (``--method segeigencam``) held to its formula written out here with nothing but a forward hook,
``torch.autograd.grad`` and numpy's SVD (Chung & Ying 2025: |g| ⊙ A, its first principal component, the sign of
Eq. 13), and to pytorch-grad-cam's ``SegEigenCAM`` on the same segmenter and layer; a classifier and a detector
refuse it in one line.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cam_reference import pearson
from method_reference import minmax, stashing, up
from torch import nn

from gradcam_cli import Explainer
from gradcam_cli.cam.methods import METHODS, resolve_methods, segeigencam
from gradcam_cli.errors import UsageError

REQUIRED = 0.999
CLASSES = 4


class TinySegmenter(nn.Module):
    """A random-weight encoder (stride 2), a head (a ReLU in it, so a channel's gradient changes sign from place to
    place and |g| ⊙ A is not g ⊙ A up to each channel's sign) upsampled: {"out": (N, 4, H, W) logits}, as
    torchvision's segmenters return."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.Tanh()
        )
        self.classifier = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, CLASSES, 1))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.classifier(self.features(x))
        return {"out": nn.functional.interpolate(logits, size=x.shape[-2:], mode="bilinear", align_corners=False)}


def _inputs(seed: int = 3) -> torch.Tensor:
    return torch.randn(1, 3, 48, 48, generator=torch.Generator().manual_seed(seed))


def _largest_class(net: nn.Module, x: torch.Tensor) -> int:
    with torch.no_grad():
        counts = torch.bincount(net(x)["out"].argmax(dim=1).flatten(), minlength=CLASSES)
    return int(counts.argmax())


def reference(net: nn.Module, layer: nn.Module, x: torch.Tensor, target: int) -> torch.Tensor:
    """The paper's map: the region score (the class's logits summed where it wins, as pytorch-grad-cam's
    ``SemanticSegmentationTarget``), W = |g| ⊙ A, centred positions x channels, the first right singular vector
    (numpy, float64), negated where |min| > |max|, ReLU, upsampled and min-max: (H, W)."""
    with stashing([layer]) as stash, torch.enable_grad():
        logits = net(x)["out"]
        score = (logits[0, target] * (logits.argmax(dim=1)[0] == target)).sum()
        (gradients,) = torch.autograd.grad(score, stash[0][-1])
    weighted = (gradients.abs() * stash[0][-1].detach())[0].double().numpy()
    samples = weighted.reshape(weighted.shape[0], -1).T
    samples = samples - samples.mean(axis=0)
    _, _, vt = np.linalg.svd(samples, full_matrices=False)
    projection = samples @ vt[0]
    if abs(projection.min()) > abs(projection.max()):
        projection = -projection
    cam = np.maximum(projection.reshape(weighted.shape[1:]), 0)
    return minmax(up(torch.from_numpy(cam), tuple(x.shape[-2:])))


def _mine(net: nn.Module, x: torch.Tensor, target: int, methods: list[str] | None = None) -> dict[str, torch.Tensor]:
    result = Explainer(net, "features", methods or ["segeigencam"]).explain_batch(x, target=target)[0]
    return {e.method: e.saliency for e in result.explanations}


@pytest.mark.quick
def test_quick_segeigencam_is_registered_for_segmenters_with_its_formula_and_paper() -> None:
    method = METHODS["segeigencam"]
    assert method.tasks == ("segment",)
    assert method.uses_gradients and not method.class_agnostic and method.needs is None
    doc = method.compute.__doc__ or ""
    assert "|g| ⊙ A" in doc and "Eq. 13" in doc and "2025" in doc


@pytest.mark.quick
def test_quick_segeigencams_sign_is_eq_13_whatever_the_svd_returns() -> None:
    activations = torch.rand(2, 5, 6, 7, generator=torch.Generator().manual_seed(1))
    gradients = torch.randn(2, 5, 6, 7, generator=torch.Generator().manual_seed(2))
    cam = segeigencam(activations, gradients)
    assert cam.shape == (2, 6, 7) and bool((cam >= 0).all())
    flipped = segeigencam(activations, -gradients)  # |g| alike: the same map
    torch.testing.assert_close(cam, flipped)
    for sample in range(2):  # the kept half holds the component's largest deviation
        weighted = (gradients.abs() * activations)[sample].flatten(1).T.double()
        centred = weighted - weighted.mean(dim=0)
        projection = centred @ torch.linalg.svd(centred, full_matrices=False)[2][0]
        peak = float(projection.abs().max())
        assert float(cam[sample].max()) == pytest.approx(peak, rel=1e-4)


def _numpy_segeigencam(activations: np.ndarray, gradients: np.ndarray) -> np.ndarray:
    """One sample's (C, *grid) -> grid, the paper's steps in numpy float64."""
    weighted = np.abs(gradients) * activations
    samples = weighted.reshape(weighted.shape[0], -1).T
    samples = samples - samples.mean(axis=0)
    projection = samples @ np.linalg.svd(samples, full_matrices=False)[2][0]
    projection = -projection if abs(projection.min()) > abs(projection.max()) else projection
    return np.maximum(projection, 0).reshape(weighted.shape[1:])


@pytest.mark.quick
@pytest.mark.parametrize("grid", [(9,), (6, 7), (3, 5, 4)])
def test_quick_segeigencam_is_its_formula_on_grids_of_every_rank(grid: tuple[int, ...]) -> None:
    generator = torch.Generator().manual_seed(len(grid))
    activations = torch.randn(2, 6, *grid, generator=generator, dtype=torch.float64)
    gradients = torch.randn(2, 6, *grid, generator=generator, dtype=torch.float64)
    cam = segeigencam(activations, gradients)
    assert cam.shape == (2, *grid)
    for n in range(2):
        expected = _numpy_segeigencam(activations[n].numpy(), gradients[n].numpy())
        np.testing.assert_allclose(cam[n].numpy(), expected, rtol=1e-4, atol=1e-4)  # the SVD runs in float32


@pytest.mark.quick
def test_quick_segeigencam_matches_its_formula_on_a_tiny_segmenter() -> None:
    net = TinySegmenter().eval()
    for seed in (3, 4):
        x = _inputs(seed)
        target = _largest_class(net, x)
        expected = reference(net, net.features, x, target)
        mine = _mine(net, x, target, ["segeigencam", "eigengradcam"])
        assert pearson(mine["segeigencam"], expected) >= REQUIRED
        assert pearson(mine["eigengradcam"], expected) < 0.9  # g ⊙ A, not |g| ⊙ A: the model tells them apart


def test_segeigencam_agrees_with_pytorch_grad_cam_on_the_same_segmenter_and_layer() -> None:
    pgc = pytest.importorskip("pytorch_grad_cam")
    if not hasattr(pgc, "SegEigenCAM"):
        pytest.skip("pytorch-grad-cam before 1.5.7 has no SegEigenCAM")
    from pytorch_grad_cam.utils.model_targets import SemanticSegmentationTarget

    net = TinySegmenter().eval()
    x = _inputs()
    target = _largest_class(net, x)

    class Logits(nn.Module):  # pytorch-grad-cam's own recipe for a segmenter returning a dict
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, inputs: torch.Tensor) -> torch.Tensor:
            return self.inner(inputs)["out"]

    with torch.no_grad():
        mask = (net(x)["out"].argmax(dim=1)[0] == target).float().numpy()
    with pgc.SegEigenCAM(Logits(net), [net.features]) as cam:
        peer = cam(input_tensor=x, targets=[SemanticSegmentationTarget(target, mask)])[0]
    assert pearson(_mine(net, x, target)["segeigencam"], torch.from_numpy(np.asarray(peer))) >= REQUIRED


@pytest.mark.quick
def test_quick_a_classifier_refuses_segeigencam_in_one_line() -> None:
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
    with pytest.raises(UsageError) as refused:
        Explainer(net, "0", ["segeigencam"])
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("--method segeigencam is for segmenters; a classifier takes gradcam")
    assert "segeigencam" not in message.split("takes", 1)[1]
    assert "segeigencam" not in resolve_methods(["all"], "classify")
    assert "segeigencam" not in resolve_methods(["all"], "detect")
    assert "segeigencam" in resolve_methods(["all"], "segment")
