"""Sliding-window maps of volumes (cam/windows.py): the windows and weights against nnU-Net's own functions, the
stitched Grad-CAM against a reference written here with a forward hook and ``torch.autograd.grad`` per window (none of
gradcam_cli's code), one window covering the volume against the whole-volume pass, and MONAI's ``GradCAM`` on the
same network and layer."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F
from cam_reference import pearson
from volume_models import classifier, grad_cam_of_window, loaded, reference_stitched, segmenter, volume

from gradcam_cli import Explainer
from gradcam_cli.cam.windows import (
    Windows,
    explain_volume,
    gaussian_weights,
    padding,
    predicted_classes,
    window_slices,
    window_steps,
)
from gradcam_cli.errors import UsageError

PATCH = (12, 12, 12)
SHAPE = (20, 26, 30)

nnunet_windows = pytest.importorskip("nnunetv2.inference.sliding_window_prediction")


@pytest.mark.quick
@pytest.mark.parametrize(
    ("shape", "patch", "step"),
    [((20, 26, 30), (12, 12, 12), 0.5), ((128, 300, 97), (64, 128, 96), 0.5), ((40, 40, 40), (40, 16, 7), 0.3)],
)
def test_windows_and_weights_are_nnunets(shape, patch, step):
    assert window_steps(shape, patch, step) == nnunet_windows.compute_steps_for_sliding_window(shape, patch, step)
    slices = window_slices(shape, patch, step)
    starts = {tuple(side.start for side in s) for s in slices}
    assert len(slices) == len(starts) == torch.tensor([len(s) for s in window_steps(shape, patch, step)]).prod()
    assert all(side.stop - side.start == tile for s in slices for side, tile in zip(s, patch, strict=True))
    theirs = nnunet_windows.compute_gaussian(patch, 1 / 8, 1, dtype=torch.float64, device=torch.device("cpu"))
    ours = gaussian_weights(patch)
    assert ours.shape == patch and float(ours.max()) == 1.0 and float(ours.min()) > 0
    torch.testing.assert_close(ours.double(), theirs / theirs.max(), rtol=1e-5, atol=1e-7)


@pytest.mark.quick
@pytest.mark.parametrize("classes", [1, 2, 3, 5])
def test_the_predicted_classes_are_torchs_argmax_ties_and_nans_included(classes):
    generator = torch.Generator().manual_seed(classes)
    logits = torch.randint(-2, 3, (2, classes, 6, 7, 8), generator=generator).float()  # many equal maxima
    for values in (logits, logits.bfloat16(), logits[:, :, ::2].transpose(2, 4)):  # and strided
        assert torch.equal(predicted_classes(values), values.argmax(dim=1))
    assert (logits.argmax(dim=1) != 0).any() or classes == 1
    logits[0, -1, 0, 0, :4] = float("nan")
    logits[1, 0, 1, 1, :3] = float("nan")
    logits[1, -1, 1, 1, 1:] = float("nan")  # a NaN after an earlier one: the first is the argmax
    assert torch.equal(predicted_classes(logits), logits.argmax(dim=1))


@pytest.mark.quick
def test_a_volume_smaller_than_the_patch_is_padded_as_nnunet_pads_it():
    assert padding((5, 12, 20), (8, 12, 16)) == [(1, 2), (0, 0), (0, 0)]
    with pytest.raises(UsageError, match="step between windows"):
        Windows(PATCH, step=0)


def test_the_stitched_map_matches_an_autograd_reference_per_window():
    model, x = segmenter(), volume(SHAPE)
    explainer = Explainer(loaded(model, PATCH), "bottleneck", ["gradcam"])
    seen = []
    result = explain_volume(
        explainer, x, Windows(PATCH, batch_size=3), classes=[1, 2], progress=lambda *a: seen.append(a)
    )
    assert result.windows == 3 * 4 * 4 and seen[-1] == (48, 48) and len(seen) == 16
    assert result.maps["gradcam"].shape == (2, *SHAPE)
    for k, c in enumerate([1, 2]):
        reference = reference_stitched(model, model.bottleneck, x, c)
        assert pearson(result.maps["gradcam"][k], reference) >= 0.999, c
    # the shares: every voxel votes once in all, so the classes' shares sum to 1
    assert result.shares.shape == (3,) and float(result.shares.sum()) == pytest.approx(1.0, abs=1e-5)


def test_window_batches_do_not_change_the_maps_and_classes_default_to_those_predicted():
    model, x = segmenter(), volume(SHAPE)
    explainer = Explainer(loaded(model, PATCH), "bottleneck", ["gradcam", "layercam"])
    one = explain_volume(explainer, x, Windows(PATCH, batch_size=1), top_k=2)
    four = explain_volume(explainer, x, Windows(PATCH, batch_size=4), top_k=2)
    assert one.classes == four.classes and len(one.classes) == 2 and 0 not in one.classes
    order = one.shares.argsort(descending=True).tolist()
    assert one.classes == [c for c in order if c != 0][:2]
    for method in ("gradcam", "layercam"):
        torch.testing.assert_close(one.maps[method], four.maps[method], rtol=1e-4, atol=1e-5)


@pytest.mark.quick
def test_one_window_over_the_volume_is_the_whole_volume_pass():
    model, x = segmenter(), volume((12, 16, 14))
    explainer = Explainer(loaded(model, (12, 16, 14)), "bottleneck", ["gradcam", "hirescam"])
    windowed = explain_volume(explainer, x, Windows((12, 16, 14)), classes=[1])
    whole = explain_volume(explainer, x, None, classes=[1])
    plain = explainer.explain_batch(x[None], target=1)[0]  # the segmenter's own score, whole volume
    for i, method in enumerate(("gradcam", "hirescam")):
        torch.testing.assert_close(windowed.maps[method][0], whole.maps[method][0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(whole.maps[method][0], plain.explanations[i].saliency, rtol=1e-5, atol=1e-6)


def test_a_region_mask_scores_the_class_over_the_region():
    model, x = segmenter(), volume(SHAPE)
    region = torch.zeros(SHAPE, dtype=torch.bool)
    region[4:10, 5:15, 10:22] = True
    explainer = Explainer(loaded(model, PATCH), "bottleneck", ["gradcam"])
    result = explain_volume(explainer, x, Windows(PATCH), classes=[2], region=region)
    steps = window_steps(SHAPE, PATCH)
    g = gaussian_weights(PATCH).double()
    summed, total = torch.zeros(SHAPE, dtype=torch.float64), torch.zeros(SHAPE, dtype=torch.float64)
    for z in steps[0]:
        for y in steps[1]:
            for w in steps[2]:
                s = (slice(z, z + 12), slice(y, y + 12), slice(w, w + 12))
                cam = grad_cam_of_window(model, model.bottleneck, x[(slice(None), *s)][None], 2, region[s])
                summed[s] += F.interpolate(cam[None, None], size=PATCH, mode="trilinear")[0, 0] * g
                total[s] += g
    assert pearson(result.maps["gradcam"][0], summed / total) >= 0.999


def test_monai_grad_cam_agrees_on_a_3d_classifier_and_on_a_segmenter_scored_over_every_voxel():
    """MONAI's GradCAM differentiates ``logits[:, c].sum()``: a classifier's logit, and for a segmenter the class's
    logits over every voxel (not only those predicted as it: there MONAI's is another score, so the comparison
    uses a region mask of the whole volume). Its default postprocessing maps (min, max) to (1, 0), flipping the
    map; the comparison uses its raw map, min-max scaled here."""
    visualize = pytest.importorskip("monai.visualize")

    def scaled(m: torch.Tensor) -> torch.Tensor:
        m = m.detach()
        return (m - m.min()) / (m.max() - m.min())

    net, x = classifier(), volume((16, 16, 16))
    ours = Explainer(net, "2", ["gradcam"], top_k=1).explain_batch(x[None])[0]
    c = ours.predictions[0].index
    theirs = visualize.GradCAM(net, target_layers="2", postprocessing=lambda m: m)(x[None], class_idx=c)
    assert pearson(ours.explanations[0].saliency, scaled(theirs[0, 0])) >= 0.999

    model = segmenter()
    explainer = Explainer(loaded(model, (16, 16, 16)), "bottleneck", ["gradcam"])
    whole = explain_volume(explainer, x, None, classes=[1], region=torch.ones(16, 16, 16, dtype=torch.bool))
    theirs = visualize.GradCAM(model, target_layers="bottleneck", postprocessing=lambda m: m)(x[None], class_idx=1)
    assert pearson(whole.maps["gradcam"][0], scaled(theirs[0, 0])) >= 0.999


@pytest.mark.quick
def test_a_bare_volume_segmenter_is_taken_for_a_segmenter():
    explainer = Explainer(segmenter(), "bottleneck", ["gradcam"])
    assert explainer.model.task == "segment"
    with pytest.raises(UsageError, match="cannot cut"):
        explain_volume(explainer, volume(SHAPE), Windows((8, 8)))


def test_a_volume_smaller_than_the_patch_is_explained_padded_and_cut_back():
    model, x = segmenter(), volume((9, 16, 11))
    explainer = Explainer(loaded(model, PATCH), "bottleneck", ["gradcam"])
    result = explain_volume(explainer, x, Windows(PATCH), classes=[1])
    assert result.maps["gradcam"].shape == (1, 9, 16, 11)
    assert float(result.shares.sum()) == pytest.approx(1.0, abs=1e-5)  # the padding's voxels are not counted
    padded = F.pad(x, (0, 1, 0, 0, 1, 2))  # (before, after) per axis, last axis first: 11 -> 12, 16, 9 -> 12
    reference = reference_stitched(model, model.bottleneck, padded, 1)[1:10, :, 0:11]
    assert pearson(result.maps["gradcam"][0], reference) >= 0.999


def test_score_cam_runs_through_the_windows_as_through_the_whole_volume_pass():
    model, x = segmenter(), volume((12, 16, 14))
    explainer = Explainer(loaded(model, (12, 16, 14)), "bottleneck", ["scorecam"], score_batch_size=4)
    windowed = explain_volume(explainer, x, Windows((12, 16, 14)), classes=[2])
    plain = explainer.explain_batch(x[None], target=2)[0]  # the segmenter's masked probability, whole volume
    torch.testing.assert_close(windowed.maps["scorecam"][0], plain.explanations[0].saliency, rtol=1e-4, atol=1e-5)


def test_classes_predicted_inside_a_region_are_counted_inside_it():
    model, x = segmenter(), volume(SHAPE)
    explainer = Explainer(loaded(model, PATCH), "bottleneck", ["gradcam"])
    everywhere = explain_volume(explainer, x, Windows(PATCH), top_k=3)
    region = torch.zeros(SHAPE, dtype=torch.bool)
    region[:, :, :3] = True
    inside = explain_volume(explainer, x, Windows(PATCH), top_k=3, region=region)
    assert float(inside.shares.sum()) == pytest.approx(float(region.float().mean()), abs=1e-5)
    assert inside.shares.le(everywhere.shares + 1e-6).all()
    assert inside.classes and inside.classes == [
        c for c in inside.shares.argsort(descending=True).tolist() if c and inside.shares[c] > 0
    ]


@pytest.mark.quick
@pytest.mark.parametrize("methods", [["gradcam"], ["gradcam", "scorecam"]])
def test_a_window_batch_leaves_no_reference_cycle_behind(methods):
    """Each window batch's inputs, targets and logits are freed when the batch is done, not at the next run of
    Python's cycle collector (which, on a CT, let some ten batches' logits pile up: 0.6 GB)."""
    model, x = segmenter(), volume(SHAPE)
    explainer = Explainer(loaded(model, PATCH), "bottleneck", methods)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        explain_volume(explainer, x, Windows(PATCH, batch_size=2), classes=[1])
        gc.collect()
        left = [type(thing).__name__ for thing in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert "Tensor" not in left and "MethodInputs" not in left, sorted(set(left))
