"""The map arithmetic: Grad-CAM weights, per-image [0, 1] normalisation, bilinear upsampling (align_corners=False)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradcam_cli.cam.maps import normalise, to_image_maps, upsample
from gradcam_cli.cam.methods import gradcam

pytestmark = pytest.mark.quick


def test_gradcam_weights_are_spatial_means_of_gradients_and_result_is_relu():
    activations = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]], [[1.0, 0.0], [0.0, 1.0]]]])  # (1, 2, 2, 2)
    gradients = torch.tensor([[[[1.0, 1.0], [1.0, 1.0]], [[-4.0, 0.0], [0.0, -4.0]]]])  # means: 1 and -2
    expected = torch.relu(1.0 * activations[0, 0] - 2.0 * activations[0, 1])  # [[-1, 2], [3, 2]] -> ReLU
    assert torch.equal(gradcam(activations, gradients), expected.unsqueeze(0))
    assert torch.equal(expected, torch.tensor([[0.0, 2.0], [3.0, 2.0]]))


def test_gradcam_is_per_sample():
    torch.manual_seed(0)
    acts, grads = torch.randn(3, 5, 4, 4), torch.randn(3, 5, 4, 4)
    together = gradcam(acts, grads)
    for i in range(3):
        torch.testing.assert_close(together[i : i + 1], gradcam(acts[i : i + 1], grads[i : i + 1]))


def test_normalise_spans_zero_to_one_per_map():
    torch.manual_seed(0)
    maps = torch.stack([torch.rand(6, 7) * 50 + 10, torch.rand(6, 7) * 1e-3, -torch.rand(6, 7)])
    out = normalise(maps)
    assert out.shape == maps.shape
    for i in range(3):
        assert out[i].min().item() == 0.0
        assert out[i].max().item() == pytest.approx(1.0, abs=1e-6)
        # min-max scaling keeps the order of values and their relative spacing
        expected = (maps[i] - maps[i].min()) / (maps[i].max() - maps[i].min())
        torch.testing.assert_close(out[i], expected)


@pytest.mark.parametrize("value", [0.0, 3.5, 1e-30])
def test_constant_and_all_zero_maps_stay_finite_and_become_zeros(value):
    maps = torch.full((2, 5, 5), value)
    out = normalise(maps)
    assert torch.isfinite(out).all()
    assert torch.equal(out, torch.zeros_like(maps))
    fused = to_image_maps([maps[:, :2, :2], maps], (9, 11))
    assert torch.isfinite(fused).all() and torch.equal(fused, torch.zeros(2, 9, 11))


def test_upsampling_is_bilinear_with_align_corners_false():
    # a 1 x 2 ramp [0, 1] doubled: half-pixel centres give [0, .25, .75, 1]; align_corners=True would give thirds
    ramp = torch.tensor([[[0.0, 1.0]]])
    out = upsample(ramp, (1, 4))
    torch.testing.assert_close(out, torch.tensor([[[0.0, 0.25, 0.75, 1.0]]]))


def test_upsampling_matches_opencv_linear_resize_and_keeps_shape():
    cv2 = pytest.importorskip("cv2")
    torch.manual_seed(0)
    coarse = torch.rand(1, 7, 7)
    out = upsample(coarse, (300, 451))
    assert out.shape == (1, 300, 451)
    reference = cv2.resize(coarse[0].numpy(), (451, 300), interpolation=cv2.INTER_LINEAR)
    np.testing.assert_allclose(out[0].numpy(), reference, atol=1e-4)


def test_to_image_maps_upsamples_then_normalises_each_image():
    coarse = torch.tensor([[[0.0, 2.0], [4.0, 8.0]], [[5.0, 5.0], [5.0, 5.0]]])
    out = to_image_maps([coarse], (20, 30))
    assert out.shape == (2, 20, 30)
    assert out[0].min() == 0 and out[0].max() == pytest.approx(1.0)
    assert out[0][-1, -1] == pytest.approx(1.0) and out[0][0, 0] == 0  # corners keep the extremes
    assert torch.equal(out[1], torch.zeros(20, 30))


def test_fusing_layers_is_the_normalised_mean_of_normalised_maps():
    a = torch.tensor([[[0.0, 1.0], [2.0, 3.0]]])
    b = torch.tensor([[[30.0, 0.0], [10.0, 20.0]]])
    fused = to_image_maps([a, b], (2, 2))
    torch.testing.assert_close(fused, normalise((normalise(a) + normalise(b)) / 2))
    torch.testing.assert_close(fused, torch.tensor([[[0.5, 0.0], [0.5, 1.0]]]))
