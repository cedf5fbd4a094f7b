"""Batch norms folded into convolutions (gradcam_cli.models.folding, Explainer.folded): the same maps, the model
left as it was, and no folding where it would change a method's maps or the model does not trace."""

from __future__ import annotations

import pytest
import torch
import torchvision
from method_reference import calibrate_batchnorm
from model_state import with_random_statistics
from torch import nn

from gradcam_cli import Explainer
from gradcam_cli.models.folding import fold_batch_norms


def snapshot(model: nn.Module) -> tuple[dict[str, torch.Tensor], list[object]]:
    state = {k: v.clone() for k, v in model.state_dict().items()}
    modes = [(id(m), m.training) for m in model.modules()]
    return state, modes + [(id(p), p.requires_grad, p.grad) for p in model.parameters()]


def maps(explainer: Explainer, inputs: torch.Tensor) -> list[torch.Tensor]:
    return [e.saliency for result in explainer.explain_batch(inputs) for e in result.explanations]


def assert_same_maps(explainer: Explainer, inputs: torch.Tensor, folds: bool = True) -> None:
    model = explainer.model.module
    before = snapshot(model)
    plain = maps(explainer, inputs)
    with explainer.folded() as folded:
        assert (folded is not explainer) is folds
        quick = maps(folded, inputs)
    assert len(plain) == len(quick)
    for a, b in zip(plain, quick, strict=True):
        assert a.max() == pytest.approx(1.0)  # real maps, not constants
        assert (a - b).abs().max() <= 1e-4
    after = snapshot(model)
    assert before[1] == after[1]  # modes, requires_grad, .grad: as found
    assert before[0].keys() == after[0].keys() and all(torch.equal(before[0][k], after[0][k]) for k in before[0])
    assert explainer.explain_batch(inputs) is not None and explainer.network[0] is model  # the copy is gone on exit


@pytest.fixture(scope="module")
def resnet18() -> nn.Module:
    torch.manual_seed(0)
    return with_random_statistics(torchvision.models.resnet18())


def test_resnet_maps_are_the_same_folded_and_the_model_is_left_as_found(resnet18):
    inputs = torch.randn(3, 3, 96, 128)
    assert_same_maps(Explainer(resnet18, "layer4", ["gradcam", "gradcam++", "layercam"], top_k=2), inputs)


def test_the_folded_copy_shares_what_it_does_not_fold_and_calls_kept_layers_as_modules(resnet18):
    copy = fold_batch_norms(resnet18, ["layer3.1.conv2", "layer4"])
    assert copy is not None
    assert copy.get_submodule("layer3.1.conv2") is resnet18.layer3[1].conv2  # kept: not folded with its bn2
    assert copy.get_submodule("layer3.1.bn2") is resnet18.layer3[1].bn2
    assert copy.get_submodule("layer1.0.conv1") is not resnet18.layer1[0].conv1  # folded with bn1
    assert not hasattr(copy.get_submodule("layer1.0"), "bn1")
    assert copy.get_submodule("layer4") is not resnet18.layer4  # folded inside, a copy of its own
    assert copy.get_submodule("fc") is resnet18.fc
    seen = []
    handle = copy.get_submodule("layer3.1.conv2").register_forward_hook(lambda m, i, o: seen.append(o))
    try:
        with torch.no_grad():
            out = copy(torch.randn(1, 3, 64, 64))
    finally:
        handle.remove()
    assert len(seen) == 1 and out.shape == (1, 1000)


@pytest.mark.parametrize("layers", [["layer4.1.conv2"], ["layer4", "layer4.1"], ["layer3.1.bn2", "layer2"]])
def test_kept_layers_give_the_same_maps(resnet18, layers):
    # a convolution whose batch norm would fold, layers inside other layers, a batch norm itself
    assert_same_maps(Explainer(resnet18, layers), torch.randn(2, 3, 64, 96))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "layer"),
    [
        ("mobilenet_v3_small", "features.12"),
        ("efficientnet_b0", "features.8"),
        ("vgg11_bn", "features.25"),
        ("regnet_x_400mf", "trunk_output"),
        ("googlenet", "inception5b"),
        ("densenet121", "features.denseblock4"),
        ("shufflenet_v2_x0_5", "conv5"),
    ],
)
def test_other_architectures_give_the_same_maps_folded(name, layer):
    torch.manual_seed(0)
    kwargs = {"aux_logits": False, "init_weights": False} if name == "googlenet" else {}
    model = with_random_statistics(getattr(torchvision.models, name)(**kwargs))
    assert_same_maps(Explainer(model, layer, top_k=2), torch.randn(2, 3, 96, 128))


def test_a_model_in_training_mode_folds_to_its_eval_mode_function():
    # load_model returns torchvision models as built, in training mode. Their stochastic depth passes
    # self.training on as an argument, which a torch.fx trace keeps as a constant: traced in training mode, the
    # folded copy would drop residual branches at random in every pass (issue 20: wrong classes and maps in every
    # run of 32 images or more). The explained passes are eval-mode passes, and so must the copy be.
    torch.manual_seed(0)
    model = calibrate_batchnorm(torchvision.models.efficientnet_b0(), (64, 96)).train()
    layer = "features.8.0"
    inputs = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        expected = model.eval()(inputs)
    model.train()
    copy = fold_batch_norms(model, [layer])
    assert copy is not None
    assert all(m.training for m in model.modules())  # left in the mode it was in
    with torch.no_grad():
        assert torch.allclose(copy.eval()(inputs), expected, atol=1e-4)
    model.train()
    assert_same_maps(Explainer(model, layer), inputs)


def test_guided_and_gradient_free_methods_fold_but_fullgrad_does_not(resnet18):
    inputs = torch.randn(2, 3, 64, 64)
    assert_same_maps(Explainer(resnet18, "layer4", ["guided-gradcam", "eigencam"]), inputs)
    # FullGrad reads every layer's bias: folding would change its maps, so it does not fold
    assert_same_maps(Explainer(resnet18, "layer4", ["gradcam", "fullgrad"]), inputs, folds=False)


class Branchy(nn.Module):
    """A convolution and batch norm behind control flow on a tensor's value: torch.fx cannot trace it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.norm(self.conv(x))
        if features.mean() > 100:  # never, but decided on values
            features = features * 2
        return self.head(features.mean(dim=(2, 3)))


def test_a_model_that_does_not_trace_is_explained_unfolded():
    torch.manual_seed(0)
    model = with_random_statistics(Branchy())
    assert fold_batch_norms(model, ["conv"]) is None
    assert_same_maps(Explainer(model, "conv"), torch.rand(2, 3, 16, 16), folds=False)


def test_a_convolution_read_twice_is_not_folded():
    class TwoReaders(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.norm = nn.BatchNorm2d(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.conv(x)
            return self.norm(y) + y  # the convolution's own output is needed too

    model = with_random_statistics(TwoReaders())
    assert fold_batch_norms(model) is None
