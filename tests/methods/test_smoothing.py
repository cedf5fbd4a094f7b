"""--eigen-smooth (first principal component) and --aug-smooth (flips and scales mapped back, then averaged)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("pytorch_grad_cam")

from cam_reference import TRUSTED, pearson, reference_map
from pytorch_grad_cam.utils.svd_on_activations import get_2d_projection
from square_model import square_image
from test_methods import photo, random_model, tiny_cnn

from gradcam_cli.cam.explainer import Explainer
from gradcam_cli.cam.methods import METHODS
from gradcam_cli.cam.methods.needs import FULL_GRADIENTS, GUIDED_GRADIENT
from gradcam_cli.cam.smoothing import IDENTITY, Augmentation, augmentations, first_component
from gradcam_cli.io.images import InputSpec

SQUARE_BOX = (330, 40, 390, 100)  # x1, y1, x2, y2 of square_image()'s red square in its 480x320 image


# --- eigen-smooth ------------------------------------------------------------------------------------------------


def test_first_component_is_pytorch_grad_cams_projection_up_to_its_sign() -> None:
    torch.manual_seed(0)
    weighted = torch.randn(3, 16, 5, 7) + torch.linspace(0, 2, 16).view(1, 16, 1, 1)
    mine = first_component(weighted)
    theirs = torch.from_numpy(get_2d_projection(weighted.numpy()))
    for i in range(3):
        assert abs(pearson(mine[i], theirs[i])) >= 0.9999
        # The sign convention: the component correlates positively with the plain channel sum.
        assert pearson(mine[i], weighted[i].sum(dim=0)) > 0


@pytest.mark.quick
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_first_component_of_a_rank_one_map(sign: float) -> None:
    torch.manual_seed(1)
    spatial = torch.rand(6, 8)
    loadings = sign * torch.tensor([1.0, 2.0, -0.5])  # loadings summing to +-2.5
    weighted = (loadings.view(3, 1, 1) * spatial).unsqueeze(0)
    centred = spatial - spatial.mean()
    # The component is the centred map times |loadings|, signed to agree with the channel sum 2.5 * sign * map.
    expected = sign * centred * loadings.norm()
    assert torch.allclose(first_component(weighted)[0], expected, atol=1e-5)


@pytest.mark.parametrize("method", ["gradcam", "layercam"])
def test_eigen_smooth_agrees_with_pytorch_grad_cam(method: str) -> None:
    model, target = random_model("resnet18")
    explainer = Explainer(model, "layer4", method, eigen_smooth=True)
    mine = explainer.explain_batch(photo(), target=target)[0].explanations[0].saliency
    reference = reference_map(TRUSTED[method], model, [model.layer4], photo(), target, eigen_smooth=True)
    assert pearson(mine, reference) >= 0.999


@pytest.mark.slow
@pytest.mark.parametrize("method", ["gradcam++", "xgradcam", "hirescam"])
@pytest.mark.parametrize(("name", "layer"), [("resnet50", "layer4"), ("convnext_tiny", "features")])
def test_eigen_smooth_sweep(name: str, layer: str, method: str) -> None:
    model, target = random_model(name)
    explainer = Explainer(model, layer, method, eigen_smooth=True)
    mine = explainer.explain_batch(photo(), target=target)[0].explanations[0].saliency
    reference = reference_map(TRUSTED[method], model, [model.get_submodule(layer)], photo(), target, eigen_smooth=True)
    assert pearson(mine, reference) >= 0.999


def test_eigen_smooth_keeps_the_square(square_model) -> None:
    skipped = {"scorecam", "randomcam", "rise", "occlusion"}  # noise; no layer (test_method_references.py)
    skipped |= {"rollout", "attn-grad", "attention", "legrad"}  # for transformers (test_attention_methods.py)
    served = [m for m in METHODS if "classify" in METHODS[m].tasks]  # drise: detectors; segeigencam: segmenters
    explainer = Explainer(square_model, "features", [m for m in served if m not in skipped], eigen_smooth=True)
    for explanation in explainer.explain(square_image(), target=0).explanations:
        row, col = divmod(int(explanation.saliency.argmax()), explanation.saliency.shape[1])
        x1, y1, x2, y2 = SQUARE_BOX
        assert x1 - 8 <= col < x2 + 8 and y1 - 8 <= row < y2 + 8, explanation.method


# --- aug-smooth --------------------------------------------------------------------------------------------------


def test_the_views() -> None:
    views = augmentations()
    assert views[0] == IDENTITY and len(views) == 6 == len(set(views))
    assert {v.scale for v in views} == {0.75, 1.0, 1.25} and {v.flip for v in views} == {False, True}
    assert augmentations(fixed_size=True) == [IDENTITY, Augmentation(flip=True)]


@pytest.mark.quick
@pytest.mark.parametrize("view", augmentations())
def test_each_view_maps_back_to_the_original_geometry(view: Augmentation) -> None:
    # A stand-in for a CNN: the "map" is the input's first channel pooled 8x8, so it moves with the image.
    image = torch.zeros(1, 3, 96, 128)
    image[:, :, 16:32, 24:40] = 1.0  # a blob in the top-left quarter
    augmented = view.apply(image)
    coarse = torch.nn.functional.avg_pool2d(augmented[:, :1], 8)[:, 0]
    restored = view.invert(coarse, (96, 128))
    assert restored.shape == (1, 96, 128)
    row, col = divmod(int(restored[0].argmax()), 128)
    assert 12 <= row < 36 and 20 <= col < 44


def test_aug_smooth_keeps_the_maximum_inside_the_square_and_undoes_the_flip(square_model) -> None:
    newer = list(METHODS)[list(METHODS).index("guided-gradcam") + 1 :]
    skipped = set(newer)  # noise, 6 views x 4,000 masked inputs, ... (tests/methods/test_method_references.py)
    explainer = Explainer(square_model, "features", [m for m in METHODS if m not in skipped], aug_smooth=True)
    x1, y1, x2, y2 = SQUARE_BOX
    for explanation in explainer.explain(square_image(), target=0).explanations:
        saliency = explanation.saliency
        row, col = divmod(int(saliency.argmax()), saliency.shape[1])
        # Pixel-level maps (input gradients) peak on the square's edges, which the rescaled views blur by a pixel.
        margin = 2 if METHODS[explanation.method].needs in (FULL_GRADIENTS, GUIDED_GRADIENT) else 0
        assert x1 - margin <= col < x2 + margin and y1 - margin <= row < y2 + margin, explanation.method
        # Had the flipped view's map not been flipped back, the mirror image of the square (x from 90 to 150)
        # would light up as much as the square itself.
        mirror = saliency[y1:y2, 480 - x2 : 480 - x1]
        assert mirror.max() < 0.1 * saliency[y1:y2, x1:x2].max(), explanation.method


@pytest.mark.quick
def test_aug_smooth_is_flip_equivariant() -> None:
    # smoothed(flip(x)) = flip(smoothed(x)) exactly, because every view of x is a view of flip(x) mapped back.
    model = tiny_cnn()
    torch.manual_seed(0)
    inputs = torch.randn(1, 3, 96, 128)
    explainer = Explainer(model, "5", ["gradcam", "layercam"], aug_smooth=True)
    plain = explainer.compute(inputs, target=3)[2]
    mirrored = explainer.compute(inputs.flip(-1), target=3)[2]
    for method in ("gradcam", "layercam"):
        assert plain[method][0][0].shape == (1, 96, 128)  # averaged at the input's size
        assert torch.allclose(mirrored[method][0][0], plain[method][0][0].flip(-1), atol=1e-5)
    symmetric = explainer.compute((inputs + inputs.flip(-1)) / 2, target=3)[2]["gradcam"][0][0]
    assert torch.allclose(symmetric, symmetric.flip(-1), atol=1e-5)


def test_aug_smooth_uses_flips_only_for_fixed_size_models(square_model) -> None:
    fixed = square_model.with_profile(input_spec=dataclasses.replace(square_model.input_spec, fixed_size=(64, 64)))
    calls = []
    square_model.module.register_forward_pre_hook(lambda _m, args: calls.append(tuple(args[0].shape[-2:])))
    explainer = Explainer(fixed, "features", "gradcam", aug_smooth=True)
    calls.clear()  # the dry pass made when the explainer is built is not part of the smoothing
    explainer.compute(torch.rand(2, 3, 64, 64), top_k=2)
    assert calls == [(64, 64), (64, 64)]
    free = square_model.with_profile(input_spec=InputSpec(mean=(0, 0, 0), std=(1, 1, 1)))
    explainer = Explainer(free, "features", "gradcam", aug_smooth=True)
    calls.clear()
    explainer.compute(torch.rand(1, 3, 64, 64))
    assert sorted(set(calls)) == [(48, 48), (64, 64), (80, 80)] and len(calls) == 6
