"""The hook engine: right gradients and activations (in-place traps included), and no trace left on the model.

Every gradient here is checked against an independent ``torch.autograd.grad`` computation: a forward hook that
saves the layer's true output and hands the rest of the network a clone (so a later in-place op edits the clone,
not the saved tensor), then ``autograd.grad(score, saved_output)``.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch
import torchvision
from model_state import hook_counts, mixed_model, snapshot
from square_model import build as build_square_model
from square_model import square_image
from torch import nn

from gradcam_cli.cam.engine import LayerCapture
from gradcam_cli.cam.explainer import Explainer
from gradcam_cli.io.images import InputSpec, to_input_tensor
from gradcam_cli.models.loading import LoadedModel

CLASS = 3


def reference(model: nn.Module, layer: str, inputs: torch.Tensor, cls: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(activations, gradients, calls) of ``layer``'s last call, computed independently of the engine."""
    saved: list[torch.Tensor] = []

    def keep_and_clone(_module: nn.Module, _inputs: object, output: torch.Tensor) -> torch.Tensor:
        saved.append(output)
        return output.clone()

    model.eval()
    handle = model.get_submodule(layer).register_forward_hook(keep_and_clone)
    try:
        with torch.enable_grad():
            logits = model(inputs.requires_grad_(True))
            (grad,) = torch.autograd.grad(logits[:, cls].sum(), saved[-1])
    finally:
        handle.remove()
    return saved[-1].detach().clone(), grad, len(saved)


def capture(model: nn.Module, layer: str, inputs: torch.Tensor, cls: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(activations, gradients, calls) of ``layer`` as the engine sees them, with every warning an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with LayerCapture(model, {layer: model.get_submodule(layer)}) as cap:
            logits = cap.forward(inputs)
            grads = cap.gradients(logits[:, cls].sum())
            acts = cap.activations()[layer].clone()
            calls = cap.calls()[layer]
    return acts, grads[layer], calls


def tiny_densenet() -> nn.Module:
    """torchvision's DenseNet class (its forward does ``F.relu(features, inplace=True)``), small."""
    return torchvision.models.DenseNet(
        growth_rate=8, block_config=(2, 2), num_init_features=16, bn_size=2, num_classes=10
    )


@pytest.fixture(scope="module")
def resnet18() -> nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18().eval()


@pytest.fixture(scope="module")
def vgg11() -> nn.Module:
    torch.manual_seed(1)
    return torchvision.models.vgg11().eval()


def images(n: int = 2, size: int = 64, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


# --- gradients and activations match an independent computation, in-place traps included ------------------------


@pytest.mark.parametrize(
    ("model_fixture", "layer", "what"),
    [
        ("vgg11", "features.18", "VGG conv followed by ReLU(inplace=True)"),
        ("densenet", "features", "DenseNet features followed by F.relu(inplace=True)"),
        ("resnet18", "layer4.1.bn2", "BatchNorm in a residual block followed by out += identity"),
        ("resnet18", "layer4", "a plain layer (no in-place op after it)"),
    ],
)
def test_gradients_and_activations_equal_autograd_reference(request, model_fixture, layer, what):
    model = tiny_densenet().eval() if model_fixture == "densenet" else request.getfixturevalue(model_fixture)
    x = images()
    acts, grads, calls = capture(model, layer, x, CLASS)
    ref_acts, ref_grads, ref_calls = reference(model, layer, x.clone(), CLASS)
    assert calls == ref_calls == 1
    assert grads.shape == ref_grads.shape == acts.shape
    assert grads.abs().max() > 0, what
    torch.testing.assert_close(grads, ref_grads, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(acts, ref_acts, rtol=1e-5, atol=1e-6)
    assert hook_counts(model) == {}


@pytest.mark.parametrize(("model_fixture", "layer"), [("vgg11", "features.18"), ("densenet", "features")])
def test_activations_are_taken_before_the_following_inplace_relu(request, model_fixture, layer):
    """A conv or BatchNorm output has negative values; after the in-place ReLU it would have none."""
    model = tiny_densenet().eval() if model_fixture == "densenet" else request.getfixturevalue(model_fixture)
    acts, _, _ = capture(model, layer, images(), CLASS)
    assert (acts < 0).any()


@pytest.mark.quick
def test_activations_of_batchnorm_before_residual_add_are_its_own_output(resnet18):
    block = resnet18.layer4[1]
    x = images()
    acts, _, _ = capture(resnet18, "layer4.1.bn2", x, CLASS)
    seen = {}
    handles = [
        block.conv2.register_forward_hook(lambda _m, _i, out: seen.__setitem__("conv2", out.detach().clone())),
        block.register_forward_hook(lambda _m, _i, out: seen.__setitem__("block", out.detach().clone())),
    ]
    try:
        with torch.no_grad():
            resnet18(x)
    finally:
        for handle in handles:
            handle.remove()
    torch.testing.assert_close(acts, block.bn2(seen["conv2"]))
    assert not torch.allclose(acts, seen["block"])  # not the value after += identity and the ReLU


@pytest.mark.quick
def test_module_called_twice_is_explained_at_its_last_call(resnet18):
    """ResNet's BasicBlock runs its one ReLU(inplace=True) twice: the engine explains the last call (documented)."""
    x = images()
    acts, grads, calls = capture(resnet18, "layer4.1.relu", x, CLASS)
    ref_acts, ref_grads, ref_calls = reference(resnet18, "layer4.1.relu", x.clone(), CLASS)
    assert calls == ref_calls == 2
    torch.testing.assert_close(acts, ref_acts)
    torch.testing.assert_close(grads, ref_grads, rtol=1e-4, atol=1e-7)
    # the last call's output is the block's output
    with torch.no_grad():
        block_out = {}
        handle = resnet18.layer4[1].register_forward_hook(lambda _m, _i, o: block_out.__setitem__("o", o.clone()))
        try:
            resnet18(x)
        finally:
            handle.remove()
    torch.testing.assert_close(acts, block_out["o"])


def test_the_same_capture_twice_gives_the_same_answer(vgg11):
    """The in-place fallback is remembered; a second run (tensor-hook mode from the start) agrees with the first."""
    x = images()
    first = capture(vgg11, "features.18", x, CLASS)
    second = capture(vgg11, "features.18", x, CLASS)
    torch.testing.assert_close(first[1], second[1])
    torch.testing.assert_close(first[0], second[0])


# --- no trace left on the model ---------------------------------------------------------------------------------


@pytest.mark.quick
def test_hooks_modes_and_flags_restored_after_success():
    model = mixed_model()
    before = snapshot(model)
    during = {}

    def spy(module: nn.Module, _inputs: object) -> None:
        during["training"] = any(m.training for m in module.modules())
        during["requires_grad"] = any(p.requires_grad for p in module.parameters())

    spy_handle = model.register_forward_pre_hook(spy)
    explainer = Explainer(model, layers="features")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = explainer.explain_batch(images(1, 16))[0]
    spy_handle.remove()
    assert during == {"training": False, "requires_grad": False}  # eval mode, frozen parameters during the pass
    assert snapshot(model) == before
    assert hook_counts(model) == {}
    assert all(p.grad is None for p in model.parameters())
    assert result.explanations[0].saliency.shape == (16, 16)


@pytest.mark.quick
def test_hooks_modes_and_flags_restored_after_an_exception_mid_forward():
    model = mixed_model()
    before = snapshot(model)
    explainer = Explainer(model, layers="features")  # its dry pass must succeed: the model explodes afterwards
    model.explode = True
    with pytest.raises(ValueError, match="boom mid-forward"):
        explainer.explain_batch(images(1, 16))
    assert snapshot(model) == before
    assert hook_counts(model) == {}
    assert all(p.grad is None for p in model.parameters())


def test_hooks_removed_when_the_caller_fails_inside_the_capture(vgg11):
    with pytest.raises(KeyError), LayerCapture(vgg11, {"features.18": vgg11.features[18]}) as cap:
        cap.forward(images(1))
        assert hook_counts(vgg11) != {}  # hooks are there while capturing
        raise KeyError("caller error")
    assert hook_counts(vgg11) == {}
    assert all(p.requires_grad for p in vgg11.parameters())


def test_eval_mode_is_used_for_the_pass():
    """Dropout in train mode would make the logits random; the engine's logits equal the eval-mode ones."""
    model = mixed_model()
    x = images(2, 16)
    with LayerCapture(model, {"features": model.features}) as cap:
        logits = cap.forward(x).detach()
    model.eval()
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(logits, expected)


@pytest.mark.quick
@pytest.mark.parametrize("frozen", ["none", "some", "all"])
def test_requires_grad_flags_restored_and_no_parameter_grad(frozen):
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    if frozen == "all":
        model.requires_grad_(False)
    elif frozen == "some":
        model.layer1.requires_grad_(False)
        model.fc.bias.requires_grad_(False)
    before = snapshot(model)
    explainer = Explainer(model, layers="layer3")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = explainer.explain_batch(images(1, 64), top_k=2)[0]
    assert snapshot(model) == before
    assert all(p.grad is None for p in model.parameters())
    for explanation in result.explanations:  # a model with every parameter frozen still gets real maps
        assert explanation.saliency.max() == pytest.approx(1.0)


class CountBackward(torch.autograd.Function):
    calls = 0

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        CountBackward.calls += 1
        return grad


class Counted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.features = nn.Conv2d(4, 4, 3, padding=1)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = CountBackward.apply(self.stem(x))
        return self.head(torch.relu(self.features(x)).mean(dim=(2, 3)))


def test_backward_stops_at_the_target_layer():
    """Nothing before the target layer is differentiated, even when the input itself requires grad."""
    CountBackward.calls = 0
    model = Counted()
    x = images(1, 16).requires_grad_(True)
    with LayerCapture(model, {"features": model.features}) as cap:
        logits = cap.forward(x)
        grads = cap.gradients(logits[:, 0].sum())
    assert grads["features"].abs().max() > 0
    assert CountBackward.calls == 0
    assert x.grad is None


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("layer", ["1", "2", "3"])
def test_channels_last_batches_get_the_gradients_of_a_convolution_followed_by_batch_norm(batch, layer):
    """Issue 20: a channels-last batch of one through a full backward hook on a convolution followed by a batch
    norm got wrong gradients on the CPU (PyTorch's batch-norm backward misread the hook's re-viewed output)."""
    torch.manual_seed(0)
    norm = nn.BatchNorm2d(64)
    norm.running_mean.uniform_(-1, 1)
    norm.running_var.uniform_(0.5, 2)
    head = (nn.SiLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 5))
    model = nn.Sequential(nn.Conv2d(3, 32, 3), nn.Conv2d(32, 64, 1, bias=False), norm, *head).eval()
    inputs = torch.randn(batch, 3, 9, 11)
    activations, expected, _ = reference(model, layer, inputs.clone(), 2)
    with LayerCapture(model, {layer: model.get_submodule(layer)}) as cap:
        logits = cap.forward(inputs.contiguous(memory_format=torch.channels_last))
        gradients = cap.gradients(logits[:, 2].sum())[layer]
        assert torch.allclose(cap.activations()[layer], activations, atol=1e-5)
    assert torch.allclose(gradients, expected, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize(("name", "layer"), [("vgg11", "features.18"), ("resnet18", "layer4.1.bn2")])
def test_no_warning_reaches_the_user_on_inplace_patterns(name, layer):
    """Fresh models (so the in-place fallback happens again), every warning recorded."""
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(num_classes=10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Explainer(model, layers=layer).explain_batch(images(1, 32), top_k=2)
    assert [str(w.message) for w in caught] == []


# --- batches: every sample its own target and its own map ---------------------------------------------------------


@pytest.mark.quick
def test_batch_of_two_images_with_different_targets_equals_each_alone():
    spec = InputSpec(mean=(0, 0, 0), std=(1, 1, 1))
    loaded = LoadedModel(build_square_model(), "squares", "none", ["red", "green", "blue"], spec)
    explainer = Explainer(loaded, layers="features")
    red = to_input_tensor(square_image(box=(30, 20, 70, 60), colour="red"), loaded.input_spec)
    blue = to_input_tensor(square_image(box=(300, 200, 360, 260), colour="blue"), loaded.input_spec)
    together = explainer.explain_batch(torch.stack([red, blue]), [(320, 480)] * 2)
    alone = [explainer.explain_batch(x.unsqueeze(0), [(320, 480)])[0] for x in (red, blue)]
    assert [r.explanations[0].target.name for r in together] == ["red", "blue"]
    for both, single in zip(together, alone, strict=True):
        assert both.explanations[0].target == single.explanations[0].target
        torch.testing.assert_close(both.explanations[0].saliency, single.explanations[0].saliency)
    assert not torch.allclose(together[0].explanations[0].saliency, together[1].explanations[0].saliency)


def test_batched_top_k_maps_equal_unbatched_on_resnet18(resnet18):
    x = images(2, 64, seed=5)
    explainer = Explainer(resnet18, layers="layer3")
    together = explainer.explain_batch(x, top_k=2)
    alone = [explainer.explain_batch(x[i : i + 1], top_k=2)[0] for i in range(2)]
    for both, single in zip(together, alone, strict=True):
        assert [e.target.index for e in both.explanations] == [e.target.index for e in single.explanations]
        for a, b in zip(both.explanations, single.explanations, strict=True):
            torch.testing.assert_close(a.saliency, b.saliency, rtol=0, atol=1e-4)


# --- layers that cannot give a map, and input sizes the model cannot run, are refused when the explainer is built --


class Tally:
    """A count shared with every copy of what holds it (the dry pass runs on a shape-only copy of the model)."""

    def __init__(self) -> None:
        self.count = 0

    def __deepcopy__(self, memo: dict[int, object]) -> Tally:
        return self


class Counting(nn.Module):
    """Wraps a model and counts its forward passes, its copies' included."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.tally = Tally()

    @property
    def passes(self) -> int:
        return self.tally.count

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.tally.count += 1
        return self.inner(x)


@pytest.mark.quick
@pytest.mark.parametrize(
    ("layer", "expected"),
    [
        ("avgpool", "layer 'avgpool' outputs 1x512x1x1: a single position, so its map is flat; choose a spatial layer "
         "such as layer4 (see --list-layers)"),
        ("fc", "layer 'fc' outputs 1x1000: no spatial grid, so it has no map; choose a spatial layer such as layer4 "
         "(see --list-layers)"),
    ],
)  # fmt: skip
def test_a_layer_without_a_map_is_refused_naming_the_nearest_spatial_layer(resnet18, layer, expected):
    from gradcam_cli.errors import UsageError

    with pytest.raises(UsageError) as caught:
        Explainer(resnet18, layers=["layer3", layer])
    assert str(caught.value) == expected


def test_one_dry_pass_serves_the_default_layer_and_the_check(resnet18):
    counted = Counting(resnet18)
    assert list(Explainer(counted).chosen.layers) == ["inner.layer4"]
    assert counted.passes == 1
    Explainer(counted, layers="inner.layer4")
    assert counted.passes == 2


def test_a_1x1_layer_of_efficientnet_lite0_is_refused_before_any_image(tmp_path):
    from typer.testing import CliRunner

    from gradcam_cli.cli import app
    from gradcam_cli.errors import EXIT_USAGE

    square_image().save(tmp_path / "square.png")
    out = tmp_path / "out"
    args = [str(tmp_path / "square.png"), "-m", "efficientnet_lite0", "--weights", "none", "--layer", "_avg_pooling"]
    result = CliRunner().invoke(app, [*args, "-o", str(out), "--workers", "0"])
    assert result.exit_code == EXIT_USAGE, result.output
    assert result.stderr.splitlines() == [
        "error: layer '_avg_pooling' outputs 1x1280x1x1: a single position, so its map is flat; choose a spatial "
        "layer such as _swish (see --list-layers)"
    ]
    assert not list(out.rglob("*.png"))  # no image was processed


def test_input_size_too_small_for_a_layer_names_the_layer_still_spatial():
    from gradcam_cli.errors import UsageError
    from gradcam_cli.models.loading import load_model

    with pytest.raises(
        UsageError, match=r"^layer 'layer4' outputs 1x512x1x1: .* such as layer3 \(see --list-layers\)$"
    ):
        Explainer(load_model("resnet18", "none", input_size=32), layers="layer4")


@pytest.mark.parametrize("command", [["IMAGE"], ["eval", "IMAGE"], ["--list-layers"], ["IMAGE", "--list-layers"]])
@pytest.mark.parametrize(("model", "size", "fails_at"), [("efficientnet_lite0", 16, "16x16"), ("alexnet", 32, "32x32")])
def test_an_input_size_too_small_for_the_model_is_one_line_with_exit_2(
    tmp_path, monkeypatch, capsys, command, model, size, fails_at
):
    import sys

    from gradcam_cli.cli import main
    from gradcam_cli.errors import EXIT_USAGE

    square_image(size=(48, 32), box=(5, 5, 15, 15)).save(tmp_path / "wide.png")  # its input: size x 1.5 size
    args = [str(tmp_path / "wide.png") if a == "IMAGE" else a for a in command]
    args += ["-m", model, "--weights", "none", "--input-size", str(size), "--device", "cpu"]
    if command[0] != "eval":
        args += ["-o", str(tmp_path / "out"), "--workers", "0"]
    monkeypatch.setattr(sys, "argv", ["gradcam", *args])
    with pytest.raises(SystemExit) as exited:
        main()
    if command == ["IMAGE", "--list-layers"]:  # the table's dry pass runs on the image: 16x24 or 32x48
        fails_at = f"{size}x{size * 3 // 2}"
    assert exited.value.code == EXIT_USAGE
    assert capsys.readouterr().err.splitlines() == [
        f"error: --input-size {size} is too small for {model} (its forward pass fails at {fails_at}); use a larger "
        "size such as 224"
    ]


class AlwaysFails(nn.Module):
    """A classifier whose forward pass fails at every size (its linear layer expects other features)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(10, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).flatten(1))


def test_a_model_failing_at_its_usual_size_is_a_model_error_not_an_input_size_one():
    from gradcam_cli.errors import EXIT_MODEL, GradcamError

    loaded = LoadedModel(AlwaysFails(), "always-fails", "none", None, InputSpec(size=64))
    with pytest.raises(GradcamError) as caught:
        Explainer(loaded, layers="features")
    message = str(caught.value)
    assert caught.value.exit_code == EXIT_MODEL and "\n" not in message
    assert re.fullmatch(r"always-fails fails on a 64x64 input: .*mat1 and mat2 shapes cannot be multiplied.*", message)


def test_keywords_build_the_options_an_explainer_takes_whole(square_model):
    from gradcam_cli import Explainer
    from gradcam_cli.options import ExplainOptions

    whole = ExplainOptions(layers=("features",), methods=("gradcam", "layercam"), target_class="green")
    by_options = Explainer(square_model, whole)
    by_keywords = Explainer(square_model, "features", ["gradcam", "layercam"], target="green")
    assert by_keywords.options == by_options.options == whole
    assert by_options.chosen.target == 1 and list(by_options.chosen.layers) == ["features"]
    inputs = torch.rand(2, 3, 32, 32)
    _, _, cams = by_options.compute(inputs)
    _, _, again = by_keywords.compute(inputs)
    for method in ("gradcam", "layercam"):
        torch.testing.assert_close(cams[method][0][0], again[method][0][0])
    other = by_options.with_options(methods=("hirescam",))
    assert list(other.chosen.methods) == ["hirescam"] and other.options.target_class == "green"
    with pytest.raises(TypeError, match="not both"):
        Explainer(square_model, whole, top_k=2)


def test_an_explainer_with_other_options_keeps_its_precision(square_model):
    """``with_options`` (gradcam eval's per-method explainers) runs at the precision of the explainer it copies."""
    from gradcam_cli import Explainer

    bf16 = Explainer(square_model, "features", ["gradcam"], precision="bf16")
    assert bf16.with_options(methods=("layercam",)).chosen.precision == "bf16"
    assert bf16.with_options(module=square_model.module).chosen.precision == "bf16"


@pytest.mark.quick
def test_a_call_context_belongs_to_its_call_and_the_explainer_stays_as_built(square_model):
    from gradcam_cli.cam.explainer_input import CallContext

    explainer = Explainer(square_model, "features", ["gradcam", "scorecam"], score_batch_size=2)
    built = dict(vars(explainer))
    captures: list[LayerCapture] = []
    progress: list[tuple[int, int]] = []

    class Counted(LayerCapture):
        def __init__(self, model, layers):
            super().__init__(model, layers)
            captures.append(self)

    inputs = torch.rand(1, 3, 32, 32)
    context = CallContext(Counted, lambda done, total: progress.append((done, total)))
    _, _, cams = explainer.compute(inputs, context=context)
    assert len(captures) == 1 and progress and progress[-1][0] == progress[-1][1]  # this call's, every masked pass
    seen = len(progress)
    _, _, plain = explainer.compute(inputs)  # no context: plain captures, the explainer's own (no) progress
    assert len(captures) == 1 and len(progress) == seen
    assert vars(explainer).keys() == built.keys() and all(vars(explainer)[k] is v for k, v in built.items())
    for method in ("gradcam", "scorecam"):
        torch.testing.assert_close(cams[method][0][0], plain[method][0][0])
