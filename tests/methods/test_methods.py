"""The CAM methods: formulas checked by hand, against pytorch-grad-cam, and against the papers where it departs.

Which reference each method is held to (see ``cam_reference.py`` for the exact differences):

* gradcam, hirescam, layercam: pytorch-grad-cam as is.
* gradcam++: Eq. 19 of the paper, computed in the test (pytorch-grad-cam's pipeline, its weights without the 1e-6
  it adds to the alpha denominator; that eps dominates for the small gradients of random weights).
* xgradcam: the paper's formula, computed in the test (pytorch-grad-cam without the 1e-7 it adds to the channel
  sums; that eps dominates for the ~1e-13 activations of random-weight EfficientNet/MobileNetV3). Unmodified
  pytorch-grad-cam is also matched where its eps is negligible.
* eigencam: pytorch-grad-cam's own projection, with the SVD sign fixed by gradcam-cli's convention (pytorch-grad-cam
  keeps whatever sign LAPACK returns, so its map is sometimes the other half of the component).
* scorecam: the authors' per-channel loop (softmax probability of the target class), re-implemented in the test;
  pytorch-grad-cam uses a softmax across channels instead.

Maps are compared at 224x224 after min-max normalisation of both (pytorch-grad-cam normalises and cv2-resizes).
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from torch import nn

pytest.importorskip("pytorch_grad_cam")

from cam_reference import (
    PYTORCH_GRAD_CAM,
    TRUSTED,
    paper_scorecam,
    paper_scorecam_weights,
    pearson,
    reference_map,
)
from conftest import ROOT, SAMPLE_DIR

from gradcam_cli.cam.engine import LayerCapture
from gradcam_cli.cam.explainer import Explainer
from gradcam_cli.cam.maps import normalise, to_image_maps, upsample
from gradcam_cli.cam.masked_scores import MaskedScores
from gradcam_cli.cam.methods import BUILTIN_METHODS, METHODS, gradcam_plus_plus, hirescam, layercam, xgradcam
from gradcam_cli.cam.methods.needs import ATTENTION_NEEDS
from gradcam_cli.io.images import InputSpec, load_image, to_input_tensor
from gradcam_cli.io.naming import RUN_RECORD_NAME
from gradcam_cli.options import METHOD_NAMES

GRADIENT_METHODS = ["gradcam", "gradcam++", "xgradcam", "hirescam", "layercam"]
ARCHITECTURES = [
    ("resnet18", "layer4"),
    ("resnet50", "layer4"),
    ("convnext_tiny", "features"),
    ("efficientnet_b0", "features"),
    ("regnet_y_400mf", "trunk_output"),
    ("mobilenet_v3_large", "features"),
]
"""No in-place op after the target layer in any of these (pytorch-grad-cam's tensor hooks need that)."""
SCORECAM_ARCHITECTURES = [
    ("regnet_y_400mf", "trunk_output"),
    ("squeezenet1_0", "features"),
    ("alexnet", "features"),
    ("mnasnet0_5", "layers"),
]
"""Score-CAM costs one forward pass per channel, twice (ours, then the reference's loop): light networks
(ResNet-18 alone takes minutes on two CPU cores), whose layers' channel sums are positive (on random-weight
MobileNetV3-Small they are all negative, so with near-uniform weights every Score-CAM map is ReLU(negative) = 0).
One network per family: SqueezeNet 1.1 (the same Fire modules and 512-channel 13 x 13 layer as 1.0) was the
slowest test of the suite (its reference loop alone over a minute) for a code path that 1.0 already runs."""
XGRADCAM_EPS_NEGLIGIBLE = [("resnet18", "layer4"), ("resnet50", "layer4"), ("convnext_tiny", "features")]
REQUIRED = 0.999


@functools.cache
def photo() -> torch.Tensor:
    """chelsea.jpg as a 1x3x224x224 ImageNet-normalised batch."""
    image = load_image(SAMPLE_DIR / "chelsea.jpg")
    return to_input_tensor(image, InputSpec(fixed_size=(224, 224))).unsqueeze(0)


@functools.cache
def random_model(name: str) -> tuple[nn.Module, int]:
    """A torchvision model with seeded random weights, in eval mode, and its top class on :func:`photo`."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None).eval()
    with torch.no_grad():
        target = int(model(photo()).argmax())
    return model, target


def ours(model: nn.Module, layers: str | list[str], method: str, target: int, **options) -> torch.Tensor:
    explainer = Explainer(model, layers, method, **options)
    return explainer.explain_batch(photo(), target=target)[0].explanations[0].saliency


def tiny_cnn() -> nn.Module:
    """A small random CNN (16 channels at 8x8 from a 64x64 input) for the cheap Score-CAM checks."""
    torch.manual_seed(1)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    ).eval()
    with torch.no_grad():
        model[-1].weight.mul_(20)  # spread the probabilities so that the weights differ visibly between channels
        model[4].weight[3].zero_()  # channel 3 of the target layer: constant (zero) map, skipped
        model[4].bias[3] = 0.0
    return model


# --- the registry ----------------------------------------------------------------------------------------------


@pytest.mark.quick
def test_every_method_is_registered_with_formula_and_paper() -> None:
    newer = ("gradcam-elementwise", "kpcacam", "shapleycam", "fem", "randomcam", "rise", "occlusion")
    newer += ("rollout", "attn-grad", "attention", "legrad")  # tests/methods/test_attention_methods.py
    newer += ("drise",)  # tests/methods/test_drise.py
    newer += ("segeigencam",)  # tests/methods/test_segeigencam.py
    newer += ("refinecam",)  # tests/methods/test_refinecam.py
    own = {method.name: method for method in BUILTIN_METHODS}  # plugins' (tests/plugins) come after them in METHODS
    methods = {
        name: method for name, method in own.items() if name not in newer
    }  # tests/methods/test_method_references.py
    assert list(methods) == [
        *("gradcam", "gradcam++", "xgradcam", "hirescam", "layercam", "scorecam", "eigencam"),
        *("eigengradcam", "ablationcam", "fullgrad", "guided-backprop", "guided-gradcam", "finercam"),
    ]
    assert tuple(METHODS)[: len(own)] == tuple(own) == METHOD_NAMES  # the names the parser accepts without torch
    uses_gradients = {name for name, method in methods.items() if method.uses_gradients}
    assert set(GRADIENT_METHODS) | {"eigengradcam", "guided-gradcam"} == uses_gradients
    assert {"scorecam", "ablationcam"} == {name for name, method in methods.items() if method.uses_model}
    assert {"eigencam"} == {name for name, method in methods.items() if method.class_agnostic}
    classifiers_only = {name for name, method in methods.items() if method.tasks == ("classify",)}
    assert classifiers_only == {"ablationcam", "fullgrad", "guided-backprop", "guided-gradcam", "finercam"}
    for name, method in methods.items():
        assert method.name == name
        doc = method.compute.__doc__ or ""
        assert "L = " in doc, name
        assert any(str(year) in doc for year in range(2017, 2026)), name


# --- formulas by hand --------------------------------------------------------------------------------------------


@pytest.mark.quick
def test_gradcam_plus_plus_follows_eq_19_by_hand() -> None:
    # One channel, two positions: A = [1, 3] (sum 4), g = [0.5, -0.25].
    # alpha_1 = 0.5^2 / (2 * 0.5^2 + 4 * 0.5^3) = 0.25;  alpha_2 = 0.0625 / (0.125 - 0.0625) = 1.
    # w = 0.25 * ReLU(0.5) + 1 * ReLU(-0.25) = 0.125;  L = 0.125 * A = [0.125, 0.375].
    activations = torch.tensor([1.0, 3.0]).view(1, 1, 1, 2)
    gradients = torch.tensor([0.5, -0.25]).view(1, 1, 1, 2)
    assert torch.allclose(gradcam_plus_plus(activations, gradients), torch.tensor([[[0.125, 0.375]]]))
    # The popular wrong denominator, 2 g_ij^2 + sum_ab A_ab g_ab^3 = 2 g^2 + 0.078125, gives another map:
    wrong_alpha = 0.25 / (0.5 + (1 * 0.5**3 + 3 * (-0.25) ** 3))
    assert not math.isclose(wrong_alpha * 0.5, 0.125)


def test_gradcam_plus_plus_survives_tiny_gradients() -> None:
    # alpha is scale-free in the activations' sum only through g * sum A; g^2 and g^3 would underflow in float32.
    activations = torch.rand(1, 4, 3, 3) + 0.1
    gradients = torch.randn(1, 4, 3, 3) * 1e-20
    cam = gradcam_plus_plus(activations, gradients)
    assert torch.isfinite(cam).all() and cam.max() > 0


@pytest.mark.quick
def test_xgradcam_hirescam_layercam_by_hand() -> None:
    activations = torch.tensor([[1.0, 3.0], [2.0, 0.0]]).view(1, 2, 1, 2)  # channel 0: [1, 3]; channel 1: [2, 0]
    gradients = torch.tensor([[0.5, -0.5], [1.0, 2.0]]).view(1, 2, 1, 2)
    # xgradcam: w_0 = (1*0.5 + 3*-0.5) / 4 = -0.25; w_1 = (2*1 + 0*2) / 2 = 1; L = ReLU(-0.25*[1,3] + [2,0]).
    assert torch.allclose(xgradcam(activations, gradients), torch.tensor([[[1.75, 0.0]]]))
    # hirescam: L = ReLU([0.5 + 2, -1.5 + 0]) = [2.5, 0].
    assert torch.allclose(hirescam(activations, gradients), torch.tensor([[[2.5, 0.0]]]))
    # layercam: L = ReLU([0.5 + 2, 0 + 0]) = [2.5, 0].
    assert torch.allclose(layercam(activations, gradients), torch.tensor([[[2.5, 0.0]]]))
    # A channel whose activations sum to zero gets weight 0 in xgradcam, not a division by zero.
    assert torch.isfinite(xgradcam(torch.zeros(1, 1, 2, 2), torch.ones(1, 1, 2, 2))).all()


def test_hirescam_equals_gradcam_under_a_global_average_pooling_head(square_model) -> None:
    # With GAP + linear after the layer, every position gets the same gradient: HiResCAM = Grad-CAM (the paper).
    from square_model import square_image

    explainer = Explainer(square_model, "features", ["gradcam", "hirescam"])
    result = explainer.explain(square_image(), target=0)
    assert torch.allclose(result.explanations[0].saliency, result.explanations[1].saliency, atol=1e-6)


# --- against the references, one quick case per method -----------------------------------------------------------


@pytest.mark.parametrize("method", ["gradcam", "gradcam++", "xgradcam", "hirescam", "layercam", "eigencam"])
def test_quick_agreement_on_resnet18(method: str) -> None:
    model, target = random_model("resnet18")
    mine = ours(model, "layer4", method, target)
    reference = reference_map(TRUSTED[method], model, [model.layer4], photo(), target)
    assert pearson(mine, reference) >= REQUIRED


def test_quick_xgradcam_agreement_with_unmodified_pytorch_grad_cam() -> None:
    # (gradcam, hirescam and layercam are held to unmodified pytorch-grad-cam above: without eigen-smooth the
    # TRUSTED classes are pytorch-grad-cam's own.)
    model, target = random_model("resnet18")
    mine = ours(model, "layer4", "xgradcam", target)
    reference = reference_map(PYTORCH_GRAD_CAM["xgradcam"], model, [model.layer4], photo(), target)
    assert pearson(mine, reference) >= REQUIRED


@pytest.mark.quick
def test_scorecam_matches_the_authors_loop_on_a_small_cnn() -> None:
    model = tiny_cnn()
    inputs = torch.randn(2, 3, 64, 64)
    targets = torch.tensor([4, 7])
    layer = model[5]
    with LayerCapture(model, {"layer": layer}) as capture:
        capture.forward(inputs)
        activations = capture.activations()["layer"]
        scores = MaskedScores(capture.forward_unhooked, inputs, targets, batch_size=5)(activations)  # 5 ∤ 15
    for i in range(2):
        expected = paper_scorecam_weights(model, layer, inputs[i : i + 1], int(targets[i]))
        assert torch.allclose(scores[i], expected, rtol=1e-4, atol=1e-7)
        assert scores[i, 3] == 0  # the constant channel: skipped, weight 0
    assert scores.std() > 0.01  # the weights really differ between channels
    explainer = Explainer(model, "5", "scorecam", score_batch_size=5)
    for i in range(2):
        mine = explainer.explain_batch(inputs[i : i + 1], target=int(targets[i]))[0].explanations[0].saliency
        assert pearson(mine, paper_scorecam(model, layer, inputs[i : i + 1], int(targets[i]))) >= REQUIRED


def test_scorecam_reports_progress_and_is_silent_by_default(capsys) -> None:
    model = tiny_cnn()
    calls = []
    explainer = Explainer(model, "5", "scorecam", score_batch_size=4, progress=lambda d, t: calls.append((d, t)))
    explainer.compute(torch.randn(1, 3, 64, 64), target=0)
    assert calls[0] == (0, 15) and calls[-1] == (15, 15)  # 16 channels, one constant
    assert [d for d, _ in calls] == sorted(d for d, _ in calls) and len(calls) == 1 + math.ceil(15 / 4)
    Explainer(model, "5", "scorecam").compute(torch.randn(1, 3, 64, 64), target=0)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


# --- sharing passes --------------------------------------------------------------------------------------------


@pytest.mark.quick
def test_methods_share_the_forward_and_backward_passes(square_model, monkeypatch) -> None:
    forwards = []
    square_model.module.register_forward_pre_hook(lambda *_: forwards.append(1))
    backwards = []
    original = LayerCapture.gradients

    def counting(self, score, retain_graph=False):
        backwards.append(1)
        return original(self, score, retain_graph)

    monkeypatch.setattr(LayerCapture, "gradients", counting)
    inputs = torch.rand(2, 3, 32, 48)
    explainer = Explainer(square_model, "features", [*GRADIENT_METHODS, "eigencam"])
    forwards.clear()  # the dry pass made when the explainer is built is not part of computing the maps
    cams = explainer.compute(inputs, top_k=2)[2]
    assert len(forwards) == 1 and len(backwards) == 2  # one forward; one backward per target, for five methods
    assert all(len(cams[m]) == 2 and cams[m][0][0].shape == (2, 32, 48) for m in cams)
    assert cams["eigencam"][0][0] is cams["eigencam"][1][0]  # class-agnostic: computed once
    explainer = Explainer(square_model, "features", "eigencam")
    forwards.clear()
    backwards.clear()
    explainer.compute(inputs, top_k=2)
    assert len(forwards) == 1 and not backwards  # eigencam needs no backward pass
    explainer = Explainer(square_model, "features", "scorecam", score_batch_size=2)
    forwards.clear()
    explainer.compute(inputs[:1], target=0)
    assert len(forwards) == 1 + 2  # the shared pass, then 3 masked inputs 2 at a time


def test_scorecam_between_gradient_methods_and_several_targets() -> None:
    model = tiny_cnn()
    inputs = torch.randn(1, 3, 64, 64)
    both = Explainer(model, "5", ["gradcam", "scorecam", "layercam"]).compute(inputs, top_k=2)[2]
    for method in ("gradcam", "layercam"):
        alone = Explainer(model, "5", method).compute(inputs, top_k=2)[2]
        for k in range(2):
            assert torch.allclose(both[method][k][0], alone[method][k][0])


# --- several layers --------------------------------------------------------------------------------------------


def test_several_layers_fuse_as_the_mean_of_normalised_maps() -> None:
    model, target = random_model("resnet18")
    size = (300, 200)
    fused = Explainer(model, ["layer3", "layer4"], "gradcam").explain_batch(photo(), [size], target)
    fused = fused[0].explanations[0].saliency
    cams = [Explainer(model, n, "gradcam").compute(photo(), target)[2]["gradcam"][0][0] for n in ("layer3", "layer4")]
    expected = normalise(torch.stack([normalise(upsample(cam, size)) for cam in cams]).mean(dim=0))[0]
    assert torch.allclose(fused, expected, atol=1e-6)
    assert torch.allclose(to_image_maps(cams, size)[0], expected, atol=1e-6)
    assert fused.min() == 0 and fused.max() == 1


def test_several_layers_agree_with_pytorch_grad_cam() -> None:
    # pytorch-grad-cam fuses the same way: ReLU, normalise and resize each layer's map, average, normalise.
    model, target = random_model("resnet18")
    mine = ours(model, ["layer3", "layer4"], "layercam", target)
    reference = reference_map(TRUSTED["layercam"], model, [model.layer3, model.layer4], photo(), target)
    assert pearson(mine, reference) >= REQUIRED


# --- the CLI ---------------------------------------------------------------------------------------------------


def test_cli_writes_one_output_per_method(tmp_path) -> None:
    from square_model import square_image
    from typer.testing import CliRunner

    from gradcam_cli.cli import app

    image = tmp_path / "square.png"
    square_image().save(image)
    out = tmp_path / "out"
    cnn_methods = [  # a classifier's; drise explains detectors (tests/methods/test_drise.py)
        name for name, method in METHODS.items() if method.needs not in ATTENTION_NEEDS and "classify" in method.tasks
    ]
    methods = ",".join(cnn_methods)  # the attention methods: tests/methods/test_attention_methods.py
    model = f"{ROOT}/tests/square_model.py:build"
    args = [str(image), "--model", model, "-t", "0", "--method", methods, "-o", str(out), "--workers", "0", "-q"]
    args += ["--rise-masks", "50", "--occlusion-window", "160", "--occlusion-stride", "160"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    written = sorted(p.name for p in out.iterdir() if p.name != RUN_RECORD_NAME)
    assert len(written) == len(cnn_methods)
    for method in cnn_methods:
        assert f"square_{method}_0-0.png" in written


def test_help_states_methods_costs_and_smoothing() -> None:
    from typer.testing import CliRunner

    from gradcam_cli.cli import app

    text = " ".join(CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}).output.split())
    for method in METHOD_NAMES:  # the package's own; a plugin's are "or a plugin's"
        assert method in text
    assert "one extra forward pass per channel" in text
    assert "--aug-smooth" in text and "--eigen-smooth" in text


# --- the sweep: five and more architectures at 224x224, random weights -----------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("method", ["gradcam", "gradcam++", "xgradcam", "hirescam", "layercam", "eigencam"])
@pytest.mark.parametrize(("name", "layer"), ARCHITECTURES)
def test_sweep_against_trusted_reference(name: str, layer: str, method: str) -> None:
    model, target = random_model(name)
    mine = ours(model, layer, method, target)
    reference = reference_map(TRUSTED[method], model, [model.get_submodule(layer)], photo(), target)
    assert pearson(mine, reference) >= REQUIRED


@pytest.mark.slow
@pytest.mark.parametrize(("name", "layer"), XGRADCAM_EPS_NEGLIGIBLE)
def test_sweep_xgradcam_against_unmodified_pytorch_grad_cam(name: str, layer: str) -> None:
    model, target = random_model(name)
    mine = ours(model, layer, "xgradcam", target)
    reference = reference_map(PYTORCH_GRAD_CAM["xgradcam"], model, [model.get_submodule(layer)], photo(), target)
    assert pearson(mine, reference) >= REQUIRED


@pytest.mark.slow
@pytest.mark.parametrize(("name", "layer"), SCORECAM_ARCHITECTURES)
def test_sweep_scorecam_against_the_authors_loop(name: str, layer: str) -> None:
    model, target = random_model(name)
    mine = ours(model, layer, "scorecam", target, score_batch_size=64)
    assert pearson(mine, paper_scorecam(model, model.get_submodule(layer), photo(), target)) >= REQUIRED


def test_cli_scorecam_progress_rows_open_and_close(monkeypatch) -> None:
    from gradcam_cli.cli import reporting as cli

    monkeypatch.setattr(cli.sys.stderr, "isatty", lambda: True, raising=False)
    reporter = cli.Reporter(quiet=False, verbose=False, as_json=False)
    passes = cli.PassProgress(reporter)
    for done in (0, 32, 64, 70):  # alone: a bar of its own, closed at the end
        passes(done, 70)
    assert passes.task is None and passes.own is None and cli.ProgressBar.active is None
    with cli.ProgressBar(reporter, 3, "explaining") as images:  # under the image bar: a second row, removed at the end
        assert cli.ProgressBar.active is images
        passes(0, 10)
        assert len(images.bar.tasks) == 2
        passes(10, 10)
        assert len(images.bar.tasks) == 1 and passes.own is None
    assert cli.ProgressBar.active is None
    quiet = cli.PassProgress(cli.Reporter(quiet=True, verbose=False, as_json=False))
    quiet(0, 5)
    assert quiet.task is None
