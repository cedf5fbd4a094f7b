"""Maps of any rank: a tiny seeded 3-D CNN (clips and volumes, (N, C, T, H, W)) and a 1-D CNN (sequences, (N, C, L))
explained through the library, against references written here from the papers' formulas, with the layer's
activations and gradients taken by a forward hook and ``torch.autograd.grad`` (none of gradcam_cli's code); the
refusal of the methods defined for 2-D maps only; layouts, upsampling, normalisation, fingerprints and raw maps of
1-D and 3-D maps."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from cam_reference import pearson
from torch import nn

from gradcam_cli import Explainer
from gradcam_cli.cam.maps import normalise, normalise_, upsample
from gradcam_cli.cam.methods import METHODS
from gradcam_cli.cam.reshape import Layout, infer_layout, to_spatial
from gradcam_cli.drift.fingerprint import GRID, decode_fingerprint, map_fingerprint
from gradcam_cli.errors import UsageError
from gradcam_cli.render.encode import save_array

CLIP = (6, 16, 16)  # T, H, W of the clips explained
CLASSES = 4


def clip_net() -> nn.Module:
    """A seeded 3-D CNN: (N, 2, T, H, W) -> (N, 4); its layer ``2`` gives (N, 8, T, H/2, W/2) maps."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv3d(2, 6, 3, padding=1),
        nn.ReLU(),
        nn.Conv3d(6, 8, 3, stride=(1, 2, 2), padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool3d(1),
        nn.Flatten(),
        nn.Linear(8, CLASSES),
    ).eval()


def sequence_net() -> nn.Module:
    """A seeded 1-D CNN: (N, 3, L) -> (N, 4); its layer ``2`` gives (N, 8, L/2) maps."""
    torch.manual_seed(1)
    return nn.Sequential(
        nn.Conv1d(3, 6, 3, padding=1),
        nn.ReLU(),
        nn.Conv1d(6, 8, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool1d(1),
        nn.Flatten(),
        nn.Linear(8, CLASSES),
    ).eval()


def clips() -> torch.Tensor:
    return torch.randn(2, 2, *CLIP, generator=torch.Generator().manual_seed(2))


def sequences() -> torch.Tensor:
    return torch.randn(2, 3, 40, generator=torch.Generator().manual_seed(3))


# --- the references: the papers' formulas on activations and gradients taken here ---------------------------------


def captured(model: nn.Module, layer: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the layer's output A, dS/dA with S the sum of each sample's top logit, the top classes): a forward hook and
    ``torch.autograd.grad``."""
    kept: list[torch.Tensor] = []

    def keep(_module: nn.Module, _inputs: object, output: torch.Tensor) -> torch.Tensor:
        leaf = output.detach().requires_grad_(True)
        kept.append(leaf)
        return leaf

    handle = layer.register_forward_hook(keep)
    try:
        with torch.enable_grad():
            logits = model(x)
            top = logits.argmax(dim=1)
            (gradient,) = torch.autograd.grad(logits.gather(1, top[:, None]).sum(), kept[-1])
    finally:
        handle.remove()
    return kept[-1].detach().double(), gradient.double(), top


def grid_dims(a: torch.Tensor) -> tuple[int, ...]:
    return tuple(range(2, a.dim()))


def weighted_sum(weights: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    return torch.relu((weights * a).sum(dim=1))


def ref_gradcam(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:  # Selvaraju et al.: w_k = mean over positions
    return weighted_sum(g.mean(dim=grid_dims(a), keepdim=True), a)


def ref_gradcam_plus_plus(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:  # Chattopadhay et al., Eq. 19
    totals = a.sum(dim=grid_dims(a), keepdim=True)
    denominator = 2 * g**2 + totals * g**3
    alpha = torch.where(denominator != 0, g**2 / torch.where(denominator != 0, denominator, 1.0), 0.0)
    return weighted_sum((alpha * torch.relu(g)).sum(dim=grid_dims(a), keepdim=True), a)


def ref_xgradcam(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:  # Fu et al.
    totals = a.sum(dim=grid_dims(a), keepdim=True)
    weights = (a * g).sum(dim=grid_dims(a), keepdim=True) / torch.where(totals != 0, totals, 1.0)
    return weighted_sum(torch.where(totals != 0, weights, 0.0), a)


def ref_hirescam(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:  # Draelos & Carin
    return torch.relu((g * a).sum(dim=1))


def ref_layercam(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:  # Jiang et al.
    return torch.relu((torch.relu(g) * a).sum(dim=1))


def ref_elementwise(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return torch.relu(g * a).sum(dim=1)


def principal(weighted: torch.Tensor) -> torch.Tensor:
    """Each sample's positions (rows) x channels, centred, projected on the first right singular vector, signed so
    that the projection correlates positively with the channel sum."""
    maps = []
    for sample in weighted:
        matrix = sample.flatten(1).T.double()
        centred = matrix - matrix.mean(dim=0)
        _, _, vh = torch.linalg.svd(centred, full_matrices=False)
        projection = centred @ vh[0]
        if float(projection @ (centred.sum(dim=1))) < 0:
            projection = -projection
        maps.append(projection.view(sample.shape[1:]))
    return torch.stack(maps)


def ref_eigencam(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:  # Muhammad & Yeasin
    return torch.relu(principal(a))


def ref_eigengradcam(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return torch.relu(principal(g * a))


def ref_fem(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:  # Fuad et al.: share of positions above mean + 2 std
    flat = a.flatten(2)
    threshold = flat.mean(dim=2) + 2 * flat.std(dim=2, correction=0)
    share = (flat > threshold[:, :, None]).double().mean(dim=2)
    return weighted_sum(share.view(*share.shape, *(1,) * (a.dim() - 2)), a)


REFERENCES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "gradcam": ref_gradcam,
    "gradcam++": ref_gradcam_plus_plus,
    "xgradcam": ref_xgradcam,
    "hirescam": ref_hirescam,
    "layercam": ref_layercam,
    "gradcam-elementwise": ref_elementwise,
    "eigencam": ref_eigencam,
    "eigengradcam": ref_eigengradcam,
    "fem": ref_fem,
    "shapleycam": ref_gradcam,  # a piecewise-linear network and a logit: H A = 0, Grad-CAM's map
}


def resized(maps: torch.Tensor, size: tuple[int, ...]) -> torch.Tensor:
    """Each coarse map stretched over ``size`` (linear, bilinear or trilinear, align_corners=False) and min-max
    scaled to [0, 1]."""
    mode = {1: "linear", 2: "bilinear", 3: "trilinear"}[len(size)]
    up = F.interpolate(maps[:, None].double(), size=size, mode=mode, align_corners=False)[:, 0]
    low = up.flatten(1).min(dim=1).values.view(-1, *(1,) * len(size))
    high = up.flatten(1).max(dim=1).values.view(-1, *(1,) * len(size))
    return (up - low) / (high - low)


def ref_scorecam(model: nn.Module, a: torch.Tensor, x: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """Wang et al.: w_k = softmax(f(x ⊙ H^k))_c, H^k = A^k stretched over the input and scaled to [0, 1] (constant
    channels: weight 0)."""
    weights = torch.zeros(a.shape[:2], dtype=torch.float64)
    for n in range(a.shape[0]):
        for k in range(a.shape[1]):
            channel = a[n, k]
            if channel.max() == channel.min():
                continue
            mask = resized(channel[None], tuple(x.shape[2:]))[0].float()
            with torch.no_grad():
                weights[n, k] = model(x[n : n + 1] * mask).softmax(dim=1)[0, top[n]].double()
    return weighted_sum(weights.view(*weights.shape, *(1,) * (a.dim() - 2)), a)


def ref_ablationcam(model: nn.Module, layer: nn.Module, a: torch.Tensor, x: torch.Tensor, top: torch.Tensor):
    """Desai & Ramaswamy: w_k = (y^c - y^c_k) / y^c, y^c_k the logit with channel k of the layer set to zero."""
    with torch.no_grad():
        original = model(x).gather(1, top[:, None])[:, 0].double()
    weights = torch.zeros(a.shape[:2], dtype=torch.float64)
    for k in range(a.shape[1]):

        def ablate(_module: nn.Module, _inputs: object, output: torch.Tensor, k: int = k) -> torch.Tensor:
            output = output.clone()
            output[:, k] = 0
            return output

        handle = layer.register_forward_hook(ablate)
        try:
            with torch.no_grad():
                ablated = model(x).gather(1, top[:, None])[:, 0].double()
        finally:
            handle.remove()
        weights[:, k] = (original - ablated) / original
    return weighted_sum(weights.view(*weights.shape, *(1,) * (a.dim() - 2)), a)


def ref_finercam(model: nn.Module, layer: nn.Module, x: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """Zhang et al.: Grad-CAM of S = y_c - sum_d softmax(y_D)_d y_d, D the 3 classes nearest c (here all others),
    the weights held constant."""
    kept: list[torch.Tensor] = []

    def keep(_module: nn.Module, _inputs: object, output: torch.Tensor) -> torch.Tensor:
        kept.append(output.detach().requires_grad_(True))
        return kept[-1]

    handle = layer.register_forward_hook(keep)
    try:
        with torch.enable_grad():
            logits = model(x)
            scores = []
            for n in range(x.shape[0]):
                others = [d for d in range(CLASSES) if d != int(top[n])]
                weights = logits[n, others].detach().softmax(dim=0)
                scores.append(logits[n, top[n]] - (weights * logits[n, others]).sum())
            (gradient,) = torch.autograd.grad(torch.stack(scores).sum(), kept[-1])
    finally:
        handle.remove()
    return ref_gradcam(kept[-1].detach().double(), gradient.double())


def explained(model: nn.Module, x: torch.Tensor, methods: list[str], layer: str = "2") -> dict[str, torch.Tensor]:
    """Each method's (N, ...) maps of each sample's top class, at the input's size, through the library."""
    results = Explainer(model, layer, methods, top_k=1).explain_batch(x)
    return {m: torch.stack([r.explanations[i].saliency for r in results]) for i, m in enumerate(methods)}


# --- the tests ------------------------------------------------------------------------------------------------------


@pytest.mark.quick
def test_a_3d_cnn_gets_trilinear_maps_of_the_clip_matching_the_papers_formulas():
    model, x = clip_net(), clips()
    a, g, _ = captured(model, model[2], x)
    assert a.shape == (2, 8, 6, 8, 8)
    maps = explained(model, x, list(REFERENCES))
    for name, reference in REFERENCES.items():
        got, expected = maps[name], resized(reference(a, g), CLIP)
        assert got.shape == (2, *CLIP), name
        assert float(got.min()) == 0.0 and float(got.max()) == 1.0, name
        for n in range(2):
            assert pearson(got[n], expected[n]) >= 0.999, (name, n)


def test_a_3d_cnn_coarse_maps_are_the_layers_grid_and_grad_cam_averages_over_time_too():
    model, x = clip_net(), clips()
    a, g, top = captured(model, model[2], x)
    _, chosen, cams = Explainer(model, "2", ["gradcam"], top_k=1).compute(x)
    assert torch.equal(chosen[:, 0], top)
    coarse = cams["gradcam"][0][0]
    assert coarse.shape == (2, 6, 8, 8)
    torch.testing.assert_close(coarse.double(), ref_gradcam(a, g), rtol=1e-4, atol=1e-6)
    # weights from the frames' means alone (over H and W only) make another map: time is averaged over too
    per_frame = weighted_sum(g.mean(dim=(3, 4), keepdim=True), a)
    assert not torch.allclose(coarse.double(), per_frame, rtol=1e-3, atol=1e-6)


def test_score_ablation_and_finer_cam_on_a_3d_cnn_match_their_formulas():
    model, x = clip_net(), clips()
    a, _, top = captured(model, model[2], x)
    maps = explained(model, x, ["scorecam", "ablationcam", "finercam"])
    expected = {
        "scorecam": ref_scorecam(model, a, x, top),
        "ablationcam": ref_ablationcam(model, model[2], a, x, top),
        "finercam": ref_finercam(model, model[2], x, top),
    }
    for name, coarse in expected.items():
        reference = resized(coarse, CLIP)
        for n in range(2):
            assert pearson(maps[name][n], reference[n]) >= 0.999, (name, n)


@pytest.mark.quick
def test_a_1d_cnn_gets_linear_maps_of_the_sequence_matching_the_papers_formulas():
    model, x = sequence_net(), sequences()
    a, g, _ = captured(model, model[2], x)
    assert a.shape == (2, 8, 20)
    names = ["gradcam", "gradcam++", "xgradcam", "hirescam", "layercam", "eigencam"]
    maps = explained(model, x, names)
    for name in names:
        got, expected = maps[name], resized(REFERENCES[name](a, g), (40,))
        assert got.shape == (2, 40), name
        assert float(got.min()) == 0.0 and float(got.max()) == 1.0, name
        for n in range(2):
            assert pearson(got[n], expected[n]) >= 0.999, (name, n)


def test_a_bare_3d_module_is_explained_at_its_default_layer_and_at_the_sizes_asked():
    model = clip_net()
    explainer = Explainer(model, methods=["gradcam", "randomcam"])
    assert explainer.chosen.layers == ("3",)  # the last layer with a grid: the second ReLU
    results = explainer.explain_batch(clips(), sizes=[(12, 32, 32), (6, 20, 24)])
    assert [tuple(e.saliency.shape) for e in results[0].explanations] == [(12, 32, 32)] * 2
    assert [tuple(e.saliency.shape) for e in results[1].explanations] == [(6, 20, 24)] * 2
    again = explainer.explain_batch(clips(), sizes=[(12, 32, 32), (6, 20, 24)])
    assert torch.equal(again[0].explanations[1].saliency, results[0].explanations[1].saliency)  # seeded noise


@pytest.mark.quick
@pytest.mark.parametrize("method", ["occlusion", "rise", "kpcacam", "fullgrad", "guided-backprop", "guided-gradcam"])
def test_methods_defined_for_2d_maps_only_are_refused_in_one_line_before_any_work(method):
    calls = []
    model = clip_net()
    Explainer(model, "2", ["gradcam"])  # the dry pass
    model.register_forward_hook(lambda *_: calls.append(1))
    with pytest.raises(UsageError) as refused:
        Explainer(model, "2", [method])
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{method} is defined for 2-D maps only; ")
    assert len(calls) == 1  # the new explainer's dry pass, and nothing after it
    if METHODS[method].uses_layer:
        assert message.endswith("the maps of layer '2' are 3-D (8 x 16 x 56 x 56)")
    else:
        assert message.endswith("its maps, at the input's resolution, are 3-D (2 x 16 x 112 x 112)")


def test_aug_smooth_is_refused_for_clips():
    with pytest.raises(UsageError, match="--aug-smooth flips and rescales images; these inputs are 3-D"):
        Explainer(clip_net(), "2", ["gradcam"], aug_smooth=True)


@pytest.mark.quick
def test_each_method_says_the_ranks_of_the_grids_it_takes():
    any_rank = {
        "gradcam",
        "gradcam++",
        "xgradcam",
        "hirescam",
        "layercam",
        "scorecam",
        "eigencam",
        "eigengradcam",
        "ablationcam",
        "finercam",
        "gradcam-elementwise",
        "shapleycam",
        "fem",
        "segeigencam",
        "randomcam",
    }
    images_and_clips = {"rollout", "attn-grad"}  # joint space-time attention's tubelets (test_video_attention.py)
    for name, method in METHODS.items():
        expected = (1, 2, 3) if name in any_rank else (2, 3) if name in images_and_clips else (2,)
        assert method.ranks == expected, name


@pytest.mark.quick
def test_layouts_of_other_ranks():
    assert infer_layout((1, 8, 4, 7, 7), (16, 112, 112)) == Layout("nchw", 7, 7, leading=(4,))
    assert infer_layout((1, 4, 7, 7, 8), (16, 112, 112)) == Layout("nhwc", 7, 7, leading=(4,))
    assert infer_layout((1, 8, 20), (40,)) == Layout("ncl", 1, 20)
    assert infer_layout((1, 20, 300), (40,)) == Layout("nlc", 1, 20)
    assert infer_layout((1, 8), (40,)) is None and infer_layout((1, 8, 7, 7), (16, 112, 112)) is None
    assert Layout("nchw", 7, 7, leading=(4,)).grid == (4, 7, 7) and Layout("ncl", 1, 20).grid == (20,)
    assert Layout("nchw", 7, 7, leading=(4,)).describe() == "nchw 4x7x7"
    channel_last = torch.arange(2 * 4 * 3 * 5 * 6.0).view(2, 4, 3, 5, 6)
    assert torch.equal(
        to_spatial(channel_last, Layout("nhwc", 3, 5, leading=(4,))), channel_last.permute(0, 4, 1, 2, 3)
    )


@pytest.mark.quick
def test_upsampling_and_normalisation_by_rank():
    line = torch.tensor([[0.0, 1.0]])
    torch.testing.assert_close(upsample(line, (4,)), torch.tensor([[0.0, 0.25, 0.75, 1.0]]))  # linear, half-pixel
    cube = torch.zeros(1, 2, 2, 2)
    cube[0, 1] = 1.0  # the second frame lit
    up = upsample(cube, (4, 4, 4))
    torch.testing.assert_close(up[0, :, 0, 0], torch.tensor([0.0, 0.25, 0.75, 1.0]))  # trilinear along time
    maps = torch.stack([torch.full((2, 3, 3), 5.0), torch.arange(18.0).view(2, 3, 3)])
    normalised = normalise(maps)  # per sample, over all its positions
    assert torch.equal(normalised[0], torch.zeros(2, 3, 3))
    torch.testing.assert_close(normalised[1], torch.arange(18.0).view(2, 3, 3) / 17)
    with pytest.raises(ValueError, match="ranks differ"):
        upsample(cube, (4, 4))


@pytest.mark.quick
def test_fingerprints_of_3d_and_1d_maps(tmp_path):
    clip = torch.zeros(8, 32, 32)
    clip[:2, :8, :8] = 1.0  # the first quarter of the frames, the top-left corner
    fingerprint = map_fingerprint(clip)
    assert fingerprint["size"] == [8, 32, 32] and len(fingerprint["grid"]) == GRID
    depth = bytes.fromhex(fingerprint["depth"])
    assert len(depth) == GRID and depth[0] == round(255 / 16) and depth[-1] == 0
    grid, size = decode_fingerprint(fingerprint)
    assert size == (32, 32) and grid[0, 0] == pytest.approx(64 / 255) and grid[-1, -1] == 0  # the frames' mean
    line = map_fingerprint(torch.linspace(0, 1, 40))
    assert line["size"] == [1, 40] and "depth" not in line and len(set(line["grid"])) == 1
    assert decode_fingerprint(line)[1] == (1, 40)
    image = map_fingerprint(torch.rand(20, 30, generator=torch.Generator().manual_seed(0)))
    assert image["size"] == [20, 30] and set(image) == {"size", "grid"}  # 2-D fingerprints as before
    with pytest.raises(ValueError, match="depth"):
        decode_fingerprint({**fingerprint, "depth": "zz"})
    save_array(clip, tmp_path / "clip.npy")  # --save-raw
    raw = np.load(tmp_path / "clip.npy")
    assert raw.shape == (8, 32, 32) and raw.dtype == np.float32 and np.array_equal(raw, clip.numpy())


@pytest.mark.quick
def test_a_bare_module_takes_inputs_of_its_convolutions_rank():
    from gradcam_cli.io.images import InputSpec
    from gradcam_cli.models.profile import bare_input

    assert bare_input(clip_net()) == InputSpec(size=112, shape=(2, 16, 112, 112))
    assert bare_input(sequence_net()) == InputSpec(shape=(3, 224))
    assert bare_input(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Conv1d(4, 4, 3))) == InputSpec()  # an image model
    assert bare_input(nn.Sequential(nn.Conv1d(3, 4, 3), nn.Conv2d(3, 4, 3))) == InputSpec()  # ECA-style: images
    assert bare_input(nn.Linear(3, 4)) == InputSpec()


@pytest.mark.quick
def test_normalising_in_place_gives_normalise_s_values_on_views_without_copying():
    """A volume's stitched maps are normalised in place, cut out of their padded sums (a view): the values are
    :func:`normalise`'s exactly, a constant map included, and the result is the view itself."""
    sums = torch.randn(3, 10, 12, 14, generator=torch.Generator().manual_seed(0), dtype=torch.float32)
    sums[1] = 2.5  # constant: all zeros
    for view in (sums[:, 1:9, 2:11, 3:13], sums.permute(0, 3, 2, 1), sums.clone()):
        expected = normalise(view)
        done = normalise_(view)
        assert done.data_ptr() == view.data_ptr()
        assert torch.equal(done, expected)
    assert torch.equal(normalise_(torch.zeros(2, 4, 4, 4)), torch.zeros(2, 4, 4, 4))
