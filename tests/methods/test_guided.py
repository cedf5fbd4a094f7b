"""Guided backpropagation and Guided Grad-CAM: the ReLU rule by hand and in every form a model can call it, the
model left exactly as found, and agreement with an independent computation and with pytorch-grad-cam and captum
where they are right (``method_reference.py`` says where they are not: functional ReLUs).

Maps are compared after the documented display normalisation (sum over colour channels of |G|, clipped at the 99th
percentile, min-max), applied to every reference alike; the raw gradients are compared value by value.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from cam_reference import pearson
from method_reference import (
    gradcam,
    guided_display,
    guided_gradient,
    pytorch_grad_cam_guided,
)
from method_subjects import REQUIRED, SIZE, model, ours, photo, top_class
from model_state import hook_counts, mixed_model, snapshot
from torch import nn

from gradcam_cli import Explainer
from gradcam_cli.cam.guided import GuidedPass, guided_relus
from gradcam_cli.errors import UsageError


class Relus(nn.Module):
    """x -> Linear(2, 3) -> ReLU in the given form -> Linear(3, 1): small enough to differentiate by hand."""

    def __init__(self, form: str) -> None:
        super().__init__()
        self.form = form
        self.first = nn.Linear(2, 3, bias=False)
        self.second = nn.Linear(3, 1, bias=False)
        self.relu = nn.ReLU(inplace=form == "nn.ReLU(inplace=True)")
        with torch.no_grad():
            self.first.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
            self.second.weight.copy_(torch.tensor([[2.0, -3.0, 0.5]]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        forms = {
            "nn.ReLU()": lambda: self.relu(h),
            "nn.ReLU(inplace=True)": lambda: self.relu(h),
            "F.relu": lambda: F.relu(h),
            "F.relu(inplace=True)": lambda: F.relu(h, inplace=True),
            "F.relu_": lambda: F.relu_(h),
            "torch.relu": lambda: torch.relu(h),
            "torch.relu_": lambda: torch.relu_(h),
            "Tensor.relu": lambda: h.relu(),
            "Tensor.relu_": lambda: h.relu_(),
        }
        return self.second(forms[self.form]())


FORMS = [
    "nn.ReLU()",
    "nn.ReLU(inplace=True)",
    "F.relu",
    "F.relu(inplace=True)",
    "F.relu_",
    "torch.relu",
    "torch.relu_",
    "Tensor.relu",
    "Tensor.relu_",
]


@pytest.mark.quick
@pytest.mark.parametrize("form", FORMS)
def test_every_relu_form_follows_the_guided_rule_by_hand(form: str) -> None:
    # x = (1, -2): h = W1 x = (1, -2, -1), only unit 0 active. dS/dh = w2 = (2, -3, 0.5).
    # Plain gradient: W1^T ([h > 0] * w2) = W1^T (2, 0, 0) = (2, 0).
    # Guided: W1^T ([h > 0] * max(w2, 0)) = (2, 0) as well here; with x = (1, 2): h = (1, 2, 3), all active,
    # plain: W1^T (2, -3, 0.5) = (2.5, -2.5); guided: W1^T (2, 0, 0.5) = (2.5, 0.5).
    model = Relus(form)
    x = torch.tensor([[1.0, 2.0]])
    pass_ = GuidedPass(model, x)
    guided = pass_.gradients(pass_.output.sum())  # type: ignore[union-attr]
    assert torch.allclose(guided, torch.tensor([[2.5, 0.5]]))
    plain_input = x.clone().requires_grad_(True)
    (plain,) = torch.autograd.grad(model(plain_input).sum(), plain_input)
    assert torch.allclose(plain, torch.tensor([[2.5, -2.5]]))  # and outside the pass, the ordinary rule again
    x = torch.tensor([[1.0, -2.0]])
    pass_ = GuidedPass(model, x)
    assert torch.allclose(pass_.gradients(pass_.output.sum()), torch.tensor([[2.0, 0.0]]))  # type: ignore[union-attr]


@pytest.mark.parametrize("form", FORMS)
def test_the_forward_pass_is_unchanged_in_place_forms_included(form: str) -> None:
    model = Relus(form)
    x = torch.randn(4, 2, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(x)
    with torch.enable_grad(), guided_relus():
        assert torch.equal(model(x.clone().requires_grad_(True)), expected)
    in_place = torch.tensor([-1.0, 2.0], requires_grad=True) * 1
    with guided_relus():
        returned = F.relu(in_place, inplace=True)
    assert returned is in_place and torch.equal(in_place, torch.tensor([0.0, 2.0]))


# --- the model is left exactly as found --------------------------------------------------------------------------


def _plain_output(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(x)


NEW_METHODS = ["guided-backprop", "guided-gradcam", "fullgrad", "ablationcam", "eigengradcam"]


@pytest.mark.quick
@pytest.mark.parametrize("method", NEW_METHODS)
def test_model_left_exactly_as_found(method: str) -> None:
    model = mixed_model()
    user_hook = model.features.register_forward_hook(lambda *_: None)  # the user's own hook stays
    before = snapshot(model)
    hooks = hook_counts(model)
    x = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    expected = _plain_output(mixed_model(), x)
    explainer = Explainer(model, "features", method)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        explainer.explain_batch(x)
    assert snapshot(model) == before
    assert hook_counts(model) == hooks
    assert all(p.grad is None for p in model.parameters())
    user_hook.remove()
    assert torch.equal(_plain_output(model, x), expected)


@pytest.mark.parametrize(
    ("method", "failing_pass"), [(m, 1) for m in NEW_METHODS] + [(m, 2) for m in NEW_METHODS if m != "eigengradcam"]
)
def test_model_restored_and_guided_rule_removed_after_an_error_mid_forward(method: str, failing_pass: int) -> None:
    """The model raises half-way through the explained pass (1) or through the method's own extra pass (2: the
    guided, full-gradient or first ablated pass), after its ReLUs ran."""
    model = mixed_model()
    before = snapshot(model)
    explainer = Explainer(model, "features", method)
    calls = []

    def explode(*_: object) -> None:
        calls.append(1)
        if len(calls) == failing_pass:
            raise ValueError("boom mid-forward")

    handle = model.after.register_forward_hook(explode)
    with pytest.raises(ValueError, match="boom mid-forward"):
        explainer.explain_batch(torch.randn(1, 3, 16, 16))
    handle.remove()
    assert len(calls) == failing_pass
    assert snapshot(model) == before
    assert hook_counts(model) == {}
    assert all(p.grad is None for p in model.parameters())
    x = torch.tensor([-1.0, 2.0], requires_grad=True)
    (gradient,) = torch.autograd.grad((torch.relu(x) * torch.tensor([1.0, -1.0])).sum(), x)
    assert torch.equal(gradient, torch.tensor([0.0, -1.0]))  # the ordinary rule: the negative gradient passes


# --- tasks --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["guided-backprop", "guided-gradcam", "fullgrad", "ablationcam"])
def test_detectors_and_segmenters_are_refused_in_one_line(method: str) -> None:
    from task_models import build_detector, build_segmenter

    for build, noun in ((build_detector, "detector"), (build_segmenter, "segmenter")):
        with pytest.raises(UsageError) as raised:
            Explainer(build(), methods=["gradcam", method])
        message = str(raised.value)
        assert "\n" not in message and f"--method {method}" in message and noun in message


# --- against the references --------------------------------------------------------------------------------------


def check_guided(name: str, layer: str, size: tuple[int, int] = SIZE) -> None:
    """Our guided gradient equals the reference's value by value, and both maps agree; pytorch-grad-cam and
    captum agree too where the network's ReLUs are all modules, and differ where some are functional."""
    net, x = model(name), photo(size)
    target = top_class(net, x)
    pass_ = GuidedPass(net, x)
    mine = pass_.gradients(pass_.output[0, target])  # type: ignore[index]
    reference = guided_gradient(net, x, target)
    torch.testing.assert_close(mine, reference, rtol=1e-4, atol=1e-6 * float(reference.abs().max()))
    assert pearson(ours(net, layer, "guided-backprop", x, target), guided_display(reference)) >= REQUIRED
    expected = guided_display(reference * gradcam(net, net.get_submodule(layer), x, target).float())
    assert pearson(ours(net, layer, "guided-gradcam", x, target), expected) >= REQUIRED
    functional = not torch.allclose(reference, guided_gradient(net, x, target, functional=False))
    peer = pytorch_grad_cam_guided(net, x, target)
    from captum.attr import GuidedBackprop

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Setting backward hooks on ReLU activations"
        captum = GuidedBackprop(net).attribute(x.clone().requires_grad_(True), target=target).detach()
    modules_only = guided_gradient(net, x, target, functional=False)
    for other in (peer, captum):
        torch.testing.assert_close(other, modules_only, rtol=1e-4, atol=1e-6 * float(modules_only.abs().max()))
        assert torch.allclose(other, mine, rtol=1e-4, atol=1e-6 * float(mine.abs().max())) != functional


def test_quick_agreement_on_resnet18() -> None:
    check_guided("resnet18", "layer4", (64, 64))


def test_quick_functional_relu_is_guided_where_the_peers_miss_it() -> None:
    # DenseNet's forward ends with F.relu(features, inplace=True): pytorch-grad-cam and captum replace or hook the
    # nn.ReLU modules only, so their result is guided everywhere but there.
    check_guided("tiny_densenet", "features", (64, 64))


SWEEP = [
    ("resnet18", "layer4"),
    ("vgg11", "features.18"),  # followed by ReLU(inplace=True)
    ("densenet121", "features"),  # followed by F.relu(..., inplace=True)
    ("googlenet", "inception5b"),  # F.relu(x, inplace=True) in every BasicConv2d: the peers miss almost every ReLU
    ("squeezenet1_1", "features.12"),
    ("alexnet", "features.10"),  # followed by ReLU(inplace=True)
    ("mnasnet0_5", "layers.15"),  # followed by ReLU(inplace=True)
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "layer"), SWEEP)
def test_sweep_against_the_reference_and_the_peers(name: str, layer: str) -> None:
    check_guided(name, layer)


@pytest.mark.quick
def test_cli_writes_readable_maps_and_raw_arrays(tmp_path) -> None:
    from conftest import ROOT
    from square_model import square_image
    from typer.testing import CliRunner

    from gradcam_cli.cli import app

    image = tmp_path / "square.png"
    square_image().save(image)
    out = tmp_path / "out"
    args = [str(image), "--model", f"{ROOT}/tests/square_model.py:build", "-t", "0", "-o", str(out)]
    args += ["--method", "guided-backprop,guided-gradcam", "--save-raw", "--workers", "0", "-q"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    for method in ("guided-backprop", "guided-gradcam"):
        raw = np.load(out / f"square_{method}_0-0.npy")
        assert raw.shape == (square_image().height, square_image().width)
        assert raw.min() == 0 and raw.max() == pytest.approx(1.0) and raw.std() > 0.01
        assert (out / f"square_{method}_0-0.png").stat().st_size > 0
