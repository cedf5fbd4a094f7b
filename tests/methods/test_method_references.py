"""Methods held to method_reference.py: gradcam-elementwise, kpcacam, shapleycam, fem, randomcam and the black-box
rise and occlusion, each held to a computation written from its paper's formula (``method_reference.py``: forward hooks,
``torch.autograd.grad`` twice for ShapleyCAM's Hessian-vector product, scikit-learn's KernelPCA, numpy, unbatched
loops of masked inputs), on five random-weight torchvision architectures (the sweep, ``slow``) and a tiny CNN; the
random ones (randomcam, RISE's masks) are equal under the same seed and differ under another.
"""

from __future__ import annotations

import method_reference as ref
import pytest
import pytorch_grad_cam as pgc
import torch
from cam_reference import pearson
from method_reference import first_and_second_order, pytorch_grad_cam_map
from test_more_methods import model, photo, tiny_cnn, top_class

from gradcam_cli import Explainer
from gradcam_cli.cam.methods import METHODS
from gradcam_cli.options import PerturbationOptions

REQUIRED = 0.999
LAYER_METHODS = ["gradcam-elementwise", "kpcacam", "shapleycam", "fem"]
SMALL = PerturbationOptions(occlusion_window=28, occlusion_stride=21)


def maps(net, layer, methods, x, target, **options):
    result = Explainer(net, layer, methods, **options).explain_batch(x, target=target)[0]
    return {e.method: e.saliency for e in result.explanations}


def references(net, layer: str, x, target: int, score: str = "logit") -> dict[str, torch.Tensor]:
    module = net.get_submodule(layer)
    return {
        "gradcam-elementwise": ref.gradcam_elementwise(net, module, x, target, score),
        "kpcacam": ref.kpcacam(net, module, x, target),
        "shapleycam": ref.shapleycam(net, module, x, target, score),
        "fem": ref.fem(net, module, x, target),
    }


def test_the_new_methods_are_registered_with_formula_and_paper() -> None:
    new = [*LAYER_METHODS, "randomcam", "rise", "occlusion"]
    assert [name for name in METHODS if name in new] == new
    assert {name for name in new if METHODS[name].class_agnostic} == {"kpcacam", "fem", "randomcam"}
    assert {name for name in new if not METHODS[name].uses_layer} == {"rise", "occlusion"}
    assert METHODS["shapleycam"].tasks == ("classify", "segment")
    for name in new:
        doc = METHODS[name].compute.__doc__ or ""
        assert "L" in doc and "=" in doc, name
        assert any(str(year) in doc for year in range(2014, 2026)) or name == "randomcam", name


def test_quick_layer_methods_match_their_formulas_on_a_tiny_cnn() -> None:
    net = tiny_cnn()
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    target = top_class(net, x)
    for layer in ("3", "5"):  # negative activations at 3, none at 5
        mine = maps(net, layer, LAYER_METHODS, x, target, score="softmax")
        for name, expected in references(net, layer, x, target, "softmax").items():
            assert pearson(mine[name], expected) >= REQUIRED, (layer, name)


def test_quick_shapleycam_second_order_term_is_real_under_softmax_and_vanishes_for_a_relu_logit() -> None:
    net = tiny_cnn()
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    target = top_class(net, x)
    _, _, product = first_and_second_order(net, net[5], x, target, "softmax")
    assert float(product.abs().max()) > 1e-6  # softmax after the layer: H A != 0
    _, _, product = first_and_second_order(net, net[5], x, target, "logit")
    assert float(product.abs().max()) == 0.0  # only ReLU, pooling and a linear head: H A = 0
    mine = maps(net, "5", ["shapleycam", "gradcam"], x, target)
    torch.testing.assert_close(mine["shapleycam"], mine["gradcam"])


def test_quick_shapleycam_under_the_rest_score_its_paper_recommends() -> None:
    """--score rest (ReST, Cai 2025): ShapleyCAM of y_c - CE(y, c); the log-softmax term makes H A real, so it
    differs from Grad-CAM even on a ReLU head, where the default logit score makes the two equal."""
    net = tiny_cnn()
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    target = top_class(net, x)
    mine = maps(net, "5", ["shapleycam", "gradcam"], x, target, score="rest")
    assert pearson(mine["shapleycam"], ref.shapleycam(net, net[5], x, target, "rest")) >= REQUIRED
    _, _, product = first_and_second_order(net, net[5], x, target, "rest")
    assert float(product.abs().max()) > 1e-6


def test_quick_black_box_methods_match_their_formulas_and_need_no_layer() -> None:
    net = tiny_cnn()
    x = torch.randn(1, 3, 40, 40, generator=torch.Generator().manual_seed(2))
    target = top_class(net, x)
    options = PerturbationOptions(
        rise_masks=120, rise_grid=5, rise_probability=0.4, occlusion_window=9, occlusion_stride=6, seed=5
    )
    explainer = Explainer(net, None, ["rise", "occlusion"], perturbation=options, score_batch_size=7)
    assert list(explainer.chosen.layers) == []
    mine = {e.method: e.saliency for e in explainer.explain_batch(x, target=target)[0].explanations}
    assert pearson(mine["occlusion"], ref.occlusion(net, x, target, 9, 6)) >= REQUIRED  # a last window flush
    expected = ref.rise(net, x, target, 120, 5, 0.4, 5)
    assert pearson(mine["rise"], expected) >= REQUIRED


def test_quick_random_methods_are_seeded() -> None:
    net = tiny_cnn()
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(2))

    def run(seed: int) -> dict[str, torch.Tensor]:
        options = PerturbationOptions(rise_masks=40, rise_grid=4, seed=seed)
        return maps(net, "5", ["randomcam", "rise"], x, 0, perturbation=options, score_batch_size=16)

    first, again, other = run(1), run(1), run(2)
    for name in ("randomcam", "rise"):
        torch.testing.assert_close(first[name], again[name], rtol=0, atol=0)
        assert not torch.allclose(first[name], other[name]), name
    # the noise ignores the model: the same map at another layer with the same grid, for another class
    assert torch.equal(maps(net, "4", ["randomcam"], x, 1)["randomcam"], run(0)["randomcam"])


def test_quick_kpcacam_and_fem_agree_with_pytorch_grad_cam_where_it_is_right() -> None:
    net = tiny_cnn()
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    target = top_class(net, x)
    mine = maps(net, "5", ["fem", "gradcam-elementwise"], x, target)
    assert pearson(mine["fem"], pytorch_grad_cam_map(pgc.FEM, net, [net[5]], x, target)) >= REQUIRED
    peer = pytorch_grad_cam_map(pgc.GradCAMElementWise, net, [net[5]], x, target)
    assert pearson(mine["gradcam-elementwise"], peer) >= REQUIRED


# --- the sweep -------------------------------------------------------------------------------------------------------

SWEEP = [
    ("resnet18", "layer4"),
    ("mobilenet_v3_small", "features"),  # Hardswish, negative activations
    ("squeezenet1_1", "features.12"),  # followed by ReLU(inplace=True)
    ("shufflenet_v2_x0_5", "conv5"),
    ("mnasnet0_5", "layers.15"),  # BatchNorm followed by ReLU(inplace=True)
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "layer"), SWEEP)
def test_sweep_newer_methods(name: str, layer: str) -> None:
    net, x = model(name), photo()
    target = top_class(net, x)
    mine = maps(net, layer, [*LAYER_METHODS, "occlusion"], x, target, score="softmax", perturbation=SMALL)
    for method, expected in references(net, layer, x, target, "softmax").items():
        assert pearson(mine[method], expected) >= REQUIRED, method
    assert pearson(mine["occlusion"], ref.occlusion(net, x, target, 28, 21)) >= REQUIRED
