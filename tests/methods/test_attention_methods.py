"""The attention methods (rollout, attn-grad, attention) against their papers' formulas, on attention captured
independently of the engine, across transformer families.

The reference capture replaces ``F.scaled_dot_product_attention`` (which timm, Hugging Face's ``sdpa`` and
``nn.MultiheadAttention`` with ``need_weights=False`` all call on their fused path) with a plain softmax attention
that keeps its probabilities, runs the model as it comes (fused), and differentiates the score with
``torch.autograd.grad``. The engine instead switches each module to its plain path and reads it there; the two
agree only if both read the same probabilities and the formulas below match the methods'.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from copy import deepcopy
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from attention_models import HF_TINY, PATCH, SIZE, tiny_vit
from PIL import Image
from torch import nn

from gradcam_cli.cam.attention.discovery import AttentionModel, attention_model, attention_sites
from gradcam_cli.cam.engine import LayerCapture
from gradcam_cli.cam.explainer import Explainer
from gradcam_cli.cam.maps import upsample
from gradcam_cli.errors import UsageError
from gradcam_cli.io.images import InputSpec, load_image, to_input_tensor
from gradcam_cli.models.loading import LoadedModel, load_model
from gradcam_cli.options import ModelOptions

METHODS = ("rollout", "attn-grad", "attention", "legrad")
TINY_HF = {**HF_TINY, "num_hidden_layers": 3, "num_attention_heads": 4, "image_size": SIZE, "patch_size": PATCH}
"""Three blocks of four heads over 4 x 4 patches: every Hugging Face family's tiny configuration here."""


def _timm(name: str, **kwargs: object) -> Callable[[], tuple[nn.Module, int]]:
    def build() -> tuple[nn.Module, int]:
        torch.manual_seed(0)
        model = tiny_vit(name, num_classes=5, **kwargs)
        return model.eval(), int(model.num_prefix_tokens)

    return build


class HFScores(nn.Module):
    """A Hugging Face model built from its tiny configuration, returning one field of its output as the scores: a
    classifier's ``logits`` (as the tool's loader wraps it), or a vision tower's ``pooler_output`` (the tool's
    embedder, without the projection)."""

    def __init__(self, family: str, head: str, field: str, **options: object) -> None:
        super().__init__()
        import transformers

        config = getattr(transformers, f"{family}Config")(**TINY_HF, **options)
        self.model = getattr(transformers, f"{family}{head}")(config)
        self.field = field

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(pixel_values=x), self.field)


def _hf(family: str, head: str, field: str, prefix: int, **options: object) -> Callable[[], tuple[nn.Module, int]]:
    """``transformers``' ``{family}{head}`` of a ``{family}Config`` as :class:`HFScores`, and its prefix count."""

    def build() -> tuple[nn.Module, int]:
        torch.manual_seed(0)
        return HFScores(family, head, field, **options).eval(), prefix

    return build


_hf_vit = _hf("ViT", "ForImageClassification", "logits", 1, num_labels=5)
_hf_dinov2_registers = _hf(
    "Dinov2WithRegisters", "ForImageClassification", "logits", 5, num_labels=5, num_register_tokens=4
)
_hf_clip = _hf("CLIPVision", "Model", "pooler_output", 1)
_hf_siglip = _hf("SiglipVision", "Model", "pooler_output", 0)
"""A Hugging Face SigLIP vision tower's pooled embedding: no class token, an attention-pooling head."""


def _open_clip_vit() -> tuple[nn.Module, int]:
    from open_clip.transformer import VisionTransformer

    torch.manual_seed(0)
    tower = VisionTransformer(image_size=SIZE, patch_size=8, width=32, layers=3, heads=4, mlp_ratio=2.0, output_dim=5)
    return tower.eval(), 1


def _torchvision_vit() -> tuple[nn.Module, int]:
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(SIZE, 8, num_layers=3, num_heads=4, hidden_dim=32, mlp_dim=64, num_classes=5)
    nn.init.normal_(model.heads.head.weight)  # zeros as torchvision initialises it: no gradient at all
    return model.eval(), 1


FAMILIES = {
    "timm-vit": _timm("vit_tiny_patch16_224"),
    "timm-deit-distilled": _timm("deit_tiny_distilled_patch16_224"),
    "timm-dinov2-registers": _timm("vit_small_patch14_reg4_dinov2"),
    "timm-eva02": _timm("eva02_tiny_patch14_224"),
    "hf-vit": _hf_vit,
    "hf-dinov2-registers": _hf_dinov2_registers,
    "hf-clip-tower": _hf_clip,
    "torchvision-vit": _torchvision_vit,
    "open-clip-vit": _open_clip_vit,
}


def _reference_attention(model: nn.Module, inputs: torch.Tensor, target: torch.Tensor, monkeypatch: pytest.MonkeyPatch):
    """Each layer's probabilities (N, heads, L, L) and dS/dA for S = sum_n logit[n, target[n]], from a plain
    softmax attention put in place of the fused kernel."""
    probabilities: list[torch.Tensor] = []

    def plain(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **_kwargs):
        assert attn_mask is None and not is_causal
        scores = q @ k.transpose(-2, -1) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
        weights = scores.softmax(dim=-1)
        probabilities.append(weights)
        return weights @ v

    monkeypatch.setattr(F, "scaled_dot_product_attention", plain)
    inputs = inputs.clone().requires_grad_(True)
    with torch.enable_grad():
        logits = model(inputs)
        score = logits.gather(1, target[:, None]).sum()
        gradients = torch.autograd.grad(score, probabilities)
    monkeypatch.undo()
    shaped = [p.reshape(inputs.shape[0], -1, *p.shape[-2:]).detach() for p in probabilities]
    return shaped, [g.reshape(s.shape) for g, s in zip(gradients, shaped, strict=True)], logits.detach()


def _rollout_matrix(attentions):
    rollout = None
    for a in attentions:
        ã = 0.5 * a.mean(dim=1) + 0.5 * torch.eye(a.shape[-1])
        ã = ã / ã.sum(dim=-1, keepdim=True)
        rollout = ã if rollout is None else torch.bmm(ã, rollout)
    return rollout


def _attn_grad(attentions, gradients, prefix):
    n, _, length, _ = attentions[0].shape
    relevance = torch.eye(length).repeat(n, 1, 1)
    for a, g in zip(attentions, gradients, strict=True):
        cam = (g * a).clamp(min=0).mean(dim=1)
        relevance = relevance + torch.bmm(cam, relevance)
    return relevance[:, 0, prefix:]


def _pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.flatten().double(), b.flatten().double()
    a, b = a - a.mean(), b - b.mean()
    return float((a * b).sum() / (a.norm() * b.norm()))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_attention_methods_agree_with_their_formulas(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module, prefix = FAMILIES[family]()
    torch.manual_seed(1)
    inputs = torch.randn(2, 3, SIZE, SIZE)
    loaded = LoadedModel(module, family, "none", None, InputSpec(SIZE, (SIZE, SIZE)), prefix_tokens=prefix)
    explainer = Explainer(loaded, methods=list(METHODS))
    assert explainer.attention is not None and explainer.attention.prefix == prefix
    assert list(explainer.chosen.layers) == []  # the attention methods read no layer
    _, targets, cams = explainer.compute(inputs)
    target = targets[:, 0]
    attentions, gradients, _ = _reference_attention(module, inputs, target, monkeypatch)
    assert len(attentions) == 3
    grid = SIZE // PATCH
    expected = {
        "rollout": _rollout_matrix(attentions)[:, 0, prefix:],
        "attn-grad": _attn_grad(attentions, gradients, prefix),
        "attention": attentions[-1].mean(dim=1)[:, 0, prefix:],
    }
    for method in METHODS[:3]:  # LeGrad: below
        got = cams[method][0][0]
        assert got.shape == (2, grid, grid)
        for n in range(2):
            assert _pearson(got[n], expected[method][n].reshape(grid, grid)) >= 0.999, (method, n)


def _truncated(model: nn.Module, block: str, keep: int) -> nn.Module:
    """A copy of ``model`` whose blocks (the container holding ``block``) end after the first ``keep``."""
    copy = deepcopy(model)
    container = block.rpartition(".")[0]
    parent_name, _, attribute = container.rpartition(".")
    parent = copy.get_submodule(parent_name) if parent_name else copy
    kept = list(getattr(parent, attribute))[:keep]
    sequential = isinstance(getattr(parent, attribute), nn.Sequential)
    setattr(parent, attribute, nn.Sequential(*kept) if sequential else nn.ModuleList(kept))
    return copy


@pytest.mark.parametrize("family", [*FAMILIES, "hf-siglip-tower"])
def test_legrad_agrees_with_its_reference_code(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """LeGrad as its reference code computes it: for each of the last two layers l, the model cut after block l
    scores the target, and ReLU(ds_l/dA_l) averaged over heads and rows, at the patch columns, is summed (SigLIP:
    its attention-pooling head still pools the cut model's tokens)."""
    module, prefix = {**FAMILIES, "hf-siglip-tower": _hf_siglip}[family]()
    torch.manual_seed(2)
    inputs = torch.randn(2, 3, SIZE, SIZE)
    loaded = LoadedModel(module, family, "none", None, InputSpec(SIZE, (SIZE, SIZE)), prefix_tokens=prefix)
    explainer = Explainer(loaded, methods=["legrad"])
    _, targets, cams = explainer.compute(inputs)
    blocks = [site.name.rpartition(".")[0] for site in attention_sites(module)]
    expected = torch.zeros(2, 16)
    for layer in (1, 2):
        cut = _truncated(module, blocks[0], layer + 1)
        _, gradients, _ = _reference_attention(cut, inputs, targets[:, 0], monkeypatch)
        expected += gradients[layer].clamp(min=0).mean(dim=(1, 2))[:, prefix:]
    for n in range(2):
        assert _pearson(cams["legrad"][0][0][n], expected[n]) >= 0.999


@pytest.mark.parametrize("family", ["timm-vit", "hf-vit", "torchvision-vit"])
def test_the_plain_path_gives_the_fused_paths_outputs_and_is_put_back(family: str) -> None:
    """The engine's explained pass (plain path, probabilities recorded) gives the fused path's logits to float
    rounding, and leaves every switch as it found it."""
    module, prefix = FAMILIES[family]()
    inputs = torch.randn(2, 3, SIZE, SIZE)
    with torch.no_grad():
        fused = module(inputs)
    switches = [getattr(m, "fused_attn", None) for m in module.modules()]
    implementations = [getattr(getattr(m, "config", None), "_attn_implementation", None) for m in module.modules()]
    sites = attention_sites(module)
    with LayerCapture(module, {}) as capture:
        capture.watch_attention(AttentionModel(sites, prefix, True))
        plain = capture.forward(inputs)
        maps = capture.attention_maps()
    assert torch.allclose(plain, fused, atol=1e-5, rtol=1e-5)
    assert len(maps) == 3 and maps[0].shape == (2, 4, prefix + 16, prefix + 16)
    assert torch.allclose(maps[0].sum(dim=-1), torch.ones(()), atol=1e-5)
    assert [getattr(m, "fused_attn", None) for m in module.modules()] == switches
    assert [getattr(getattr(m, "config", None), "_attn_implementation", None) for m in module.modules()] == (
        implementations
    )
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in module.modules())


@pytest.mark.quick
def test_register_tokens_never_show_even_when_they_draw_the_attention() -> None:
    """A DINOv2-with-registers model whose class token attends almost only to its registers: the maps cover the
    patches alone (the registers are prefix tokens, dropped), so no patch lights up for them."""
    module, prefix = FAMILIES["timm-dinov2-registers"]()
    assert prefix == 5
    with torch.no_grad():  # class and register tokens alike, and queries and keys along them: q_cls . k_reg is large
        direction = torch.randn(32)
        module.cls_token.copy_(4 * direction)
        module.reg_token.copy_(4 * direction.expand_as(module.reg_token))
        module.pos_embed.zero_()
        unit = F.layer_norm(direction, (32,))
        unit = unit / unit.norm()
        for block in module.blocks:
            block.attn.qkv.weight[:64] = 4.0 * torch.outer(unit, unit).repeat(2, 1)
            block.attn.qkv.bias.zero_()
    loaded = LoadedModel(module, "dinov2-reg", "none", None, InputSpec(SIZE, (SIZE, SIZE)), prefix_tokens=prefix)
    explainer = Explainer(loaded, methods=list(METHODS))
    inputs = torch.randn(1, 3, SIZE, SIZE)
    with LayerCapture(module, {}) as capture:
        capture.watch_attention(explainer.attention)
        capture.forward(inputs)
        last = capture.attention_maps()[-1].mean(dim=1)[0, 0]
    assert last[1:prefix].sum() > 0.5  # the registers draw most of the class token's attention
    _, _, cams = explainer.compute(inputs)
    for method in METHODS:
        assert cams[method][0][0].shape == (1, 4, 4)  # 16 patches, not 21 tokens
    assert torch.allclose(cams["attention"][0][0].flatten(), last[prefix:])


def test_a_cnn_is_refused_with_one_line_and_all_leaves_the_attention_methods_out() -> None:
    import torchvision

    cnn = torchvision.models.resnet18(num_classes=3).eval()
    with pytest.raises(UsageError, match="--method rollout is for transformers"):
        Explainer(cnn, methods=["rollout"])
    explainer = Explainer(cnn, methods=["all"])
    assert list(explainer.chosen.left_out) == ["rollout", "attn-grad", "attention", "legrad"]
    assert not set(explainer.chosen.methods) & set(METHODS)


def test_swin_is_refused_with_one_line() -> None:
    import torchvision

    swin = torchvision.models.swin_t(num_classes=3).eval()
    with pytest.raises(UsageError, match="attends within windows"):
        attention_model(swin, "swin_t", None, "rollout")


def test_each_attention_method_is_registered_with_its_formula_and_paper() -> None:
    from gradcam_cli.cam.attention import last, legrad, relevance, rollout
    from gradcam_cli.cam.methods import METHODS as REGISTERED

    for name in METHODS:
        method = REGISTERED[name]
        assert method.tasks == ("classify",) and not method.uses_layer and not method.uses_gradients
    assert {name for name in METHODS if REGISTERED[name].class_agnostic} == {"rollout", "attention"}
    papers = [(rollout, "Abnar & Zuidema"), (relevance, "Chefer, Gur & Wolf"), (last, "Caron"), (legrad, "Bousselham")]
    for module, paper in papers:
        assert paper in (module.__doc__ or "")
    assert "R = Ã_L ... Ã_1" in (rollout.rollout_relevance.__doc__ or "")
    assert "R <- R + Ā_l R" in (relevance.gradient_relevance.__doc__ or "")


VIT = f"{Path(__file__).parents[1].joinpath('attention_models.py')}:build_vit"


def _run(*args: object):
    from typer.testing import CliRunner

    from gradcam_cli.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


UNIT_ROUNDOFF = 2.0**-24
"""float32's unit roundoff u: one rounding of a product or sum errs by at most u, relatively."""
LAMBDA = 8.0
"""The probabilistic bound's confidence: it fails with probability at most about 2 K exp(-LAMBDA^2 / 2) ~ 1e-10."""
FORWARD_ONLY = ("rollout", "attention")
"""The attention methods that read the forward pass alone (no backward pass, no target)."""


def float32_terms(model: nn.Module, tokens: int, backward: bool) -> int:
    """K, the number of float32 terms accumulated along the longest chain of reductions of a timm ViT's forward
    pass over ``tokens`` tokens (and, with ``backward``, its backward pass, whose reductions have the same lengths),
    plus an attention method's own products. Per block: two layer norms (mean and variance: 2 x 2D terms), q, k
    and v (D), a head's scores (D / heads), the softmax and the weighted sum of values (L each), the projection
    (D), the MLP (D, then its hidden width); then the patch embedding (3 x patch x patch), the final norm (2D), the
    head (D); the methods' L x L products (rollout's, attn-grad's), one a block."""
    width, depth = int(model.embed_dim), len(model.blocks)
    heads, hidden = int(model.blocks[0].attn.num_heads), int(model.blocks[0].mlp.fc1.out_features)
    patch = int(model.patch_embed.proj.kernel_size[0])
    block = 2 * 2 * width + width + width // heads + 2 * tokens + width + width + hidden
    forward = 3 * patch * patch + depth * block + 2 * width + width
    return forward * (2 if backward else 1) + depth * tokens


@pytest.mark.quick
def test_the_command_line_explains_a_wide_image_with_every_attention_method(tmp_path: Path) -> None:
    """A 96 x 48 image at --input-size 32: a 64 x 32 input, a 4 x 8 patch grid after a class token and two
    registers; each map comes at the image's size, in [0, 1], and equals the library's for the same input.

    Equal up to float32 rounding, with a tolerance that follows from the arithmetic, not from a machine: the
    command line and the library compute the same map, but may accumulate in other orders (their threads split the
    reductions differently; a batch of one runs channels-last). An error e of a raw map value s becomes, through
    the bilinear resize (a convex combination: no growth) and the min-max normalisation m = (s - min s) /
    (max s - min s), at most 4 e / (max s - min s) in m (2e through the numerator, 2e through the denominator). The
    rounding error of a chain of float32 reductions of K terms in all is, to first order, at most K u of the terms'
    magnitudes in the worst case (gamma_K, Higham, Accuracy and Stability of Numerical Algorithms, eq. 3.4), and at
    most LAMBDA sqrt(K) u but with probability ~1e-10 when roundings are independent and of mean zero (Higham &
    Mary, SIAM J. Sci. Comput. 41(5), 2019, theorem 2.4). The worst case allows rollout's near-uniform map
    (max|s| / range ~ 160) a difference of 0.2, which checks nothing; the probabilistic bound is used:
    |dm| <= 4 LAMBDA sqrt(K) u max|s| / range per path, twice that between two paths, K = :func:`float32_terms`
    (~1,500 for the forward-only methods, ~3,000 with the backward pass), max|s| and the range from the library's
    own raw map. Observed: 0 to 1.4e-5 (rollout on a 2-core machine), against bounds of 2.6e-4 (attn-grad) to 2.3e-2
    (rollout); a wrong map (another target, a misplaced token) differs by far more."""
    image = tmp_path / "wide.png"
    Image.fromarray((np.random.default_rng(0).random((48, 96, 3)) * 255).astype(np.uint8)).save(image)
    out = tmp_path / "out"
    methods = ",".join(METHODS)
    result = _run(image, "--model", VIT, "--input-size", 32, "--method", methods, "-t", 1, "--save-raw", "-o", out)
    assert result.exit_code == 0, result.output
    assert "using layer" not in result.stderr  # no layer read
    loaded = load_model(ModelOptions(VIT, input_size=32))
    explainer = Explainer(loaded, methods=methods.split(","))
    library = explainer.explain(image, target=1)
    pixels = to_input_tensor(load_image(image), loaded.input_spec)[None]
    _, _, cams = explainer.compute(pixels, target=1)  # the raw (unnormalised) maps of the same input
    tokens = 3 + (pixels.shape[-2] // PATCH) * (pixels.shape[-1] // PATCH)
    for explanation in library.explanations:
        raw = np.load(out / f"wide_{explanation.method}_1-1.npy")
        assert raw.shape == (48, 96) and raw.min() >= 0 and raw.max() == pytest.approx(1.0)
        terms = float32_terms(loaded.module, tokens, backward=explanation.method not in FORWARD_ONLY)
        s = upsample(cams[explanation.method][0][0], (48, 96)).double()
        bound = 2 * 4 * LAMBDA * math.sqrt(terms) * UNIT_ROUNDOFF * float(s.abs().max() / (s.max() - s.min()))
        assert bound < 0.05, (explanation.method, bound)  # well enough conditioned that the check means something
        difference = float(np.abs(raw - explanation.saliency.numpy()).max())
        print(f"{explanation.method}: differs by {difference:.2e}, bound {bound:.2e}")
        assert difference <= bound, (explanation.method, difference, bound)


def test_list_layers_marks_the_attention_modules() -> None:
    result = _run("--list-layers", "--model", VIT, "--input-size", 32)
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if "default layer" not in line]
    marked = [line.split()[1] for line in rows if line.endswith(" attention")]
    assert marked == ["blocks.0.attn", "blocks.1.attn", "blocks.2.attn"]


def test_method_all_says_which_methods_a_cnn_leaves_out(tmp_path: Path) -> None:
    from square_model import square_image

    image = tmp_path / "square.png"
    square_image().save(image)
    square = f"{Path(__file__).parents[1].joinpath('square_model.py')}:build"
    result = _run(image, "--model", square, "--method", "rollout", "-o", tmp_path / "a")
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: --method rollout is for transformers")
    cheap = ["--rise-masks", 10, "--occlusion-window", 160, "--occlusion-stride", 160, "-t", 0]
    result = _run(image, "--model", square, "--method", "all", *cheap, "-o", tmp_path / "b")
    assert result.exit_code == 0, result.output
    assert "--method all leaves out rollout, attn-grad, attention, legrad (for transformers only)" in result.stderr
    assert not [p for p in (tmp_path / "b").iterdir() if any(m in p.name for m in ("rollout", "attn-grad"))]


KNOWN_FIGURES = {"rollout": (0.35, 0.9), "attn-grad": (0.5, 0.5)}
"""The least mean share of the patch map on the deciding patch, and the least share of images whose map peaks
there (a uniform map: 1/16 and 1/16), for the methods expected to find it."""


def test_known_answer_rollout_and_attn_grad_find_the_deciding_patch() -> None:
    """A ViT trained here (seeded, seconds) to tell a red patch from a blue one among green and yellow distractors:
    rollout and attn-grad put their mass on the deciding patch. Every method's figures are printed (the table in
    docs/methods.md)."""
    from attention_known import SIZE, make_images, train_vit

    model = train_vit()
    inputs, classes, cells = make_images(64, seed=1)
    with torch.no_grad():
        assert (model(inputs).argmax(dim=1) == classes).float().mean() >= 0.95
    loaded = LoadedModel(model, "known", "trained", ["red", "blue"], InputSpec(SIZE, (SIZE, SIZE)), prefix_tokens=1)
    methods = [*METHODS, "gradcam"]
    _, _, cams = Explainer(loaded, methods=methods).compute(inputs, target=None)
    figures = {}
    for method in methods:
        maps = cams[method][0][0].flatten(1).clamp(min=0)
        share = maps.gather(1, cells[:, None]).squeeze(1) / maps.sum(dim=1).clamp(min=1e-12)
        figures[method] = (float(share.mean()), float((maps.argmax(dim=1) == cells).float().mean()))
    print({method: f"mass {mass:.2f}, peak {peak:.2f}" for method, (mass, peak) in figures.items()})
    for method, (least_mass, least_peak) in KNOWN_FIGURES.items():
        mass, peak = figures[method]
        assert mass >= least_mass and peak >= least_peak, (method, figures)


def test_serve_explains_with_the_attention_methods_class_after_class(tmp_path: Path) -> None:
    """gradcam serve: an attention method's maps for two classes of one image equal the library's (the second
    class runs a pass of its own: the attention is read from the pass, never replayed without it)."""
    import io

    from starlette.testclient import TestClient

    from gradcam_cli.options import ServeOptions
    from gradcam_cli.serve.app import create_app
    from gradcam_cli.serve.model import ModelService

    image = Image.fromarray((np.random.default_rng(1).random((48, 96, 3)) * 255).astype(np.uint8))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    loaded = load_model(ModelOptions(VIT, input_size=32))
    service = ModelService(loaded)
    app = create_app(service, work_dir=tmp_path / "work", options=ServeOptions())
    with TestClient(app, base_url="http://127.0.0.1:8765") as client:
        image_id = client.post("/api/upload?name=a.png", content=buffer.getvalue()).json()["id"]
        for method in ("attn-grad", "legrad", "rollout"):
            for target in (0, 2):
                answer = client.get(f"/api/map?image={image_id}&method={method}&target={target}")
                assert answer.status_code == 200, answer.text
                sent = np.load(io.BytesIO(client.get(f"/api/maps/{answer.json()['id']}/map.npy").content))
                expected = Explainer(loaded, methods=[method]).explain(image, target=target).explanations[0]
                np.testing.assert_allclose(sent, expected.saliency.numpy(), atol=1e-5)


@pytest.mark.parametrize("family", ["timm-mean-pooled", "hf-siglip-tower"])
def test_a_model_without_a_class_token_uses_the_mean_over_the_patch_rows(
    family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ViT pooling its patches by their mean (no class token, two registers) and a SigLIP tower (no class token,
    an attention-pooling head, whose attention is left out): each map is the mean of the patch rows over the patch
    columns, prefix tokens dropped from both."""
    if family == "timm-mean-pooled":
        module, prefix = _timm("vit_tiny_patch16_224", class_token=False, global_pool="avg", reg_tokens=2)()
    else:
        module, prefix = _hf_siglip()
    inputs = torch.randn(2, 3, SIZE, SIZE)
    loaded = LoadedModel(module, "gap", "none", None, InputSpec(SIZE, (SIZE, SIZE)), prefix_tokens=prefix)
    explainer = Explainer(loaded, methods=["rollout", "attention"])
    assert explainer.attention is not None and not explainer.attention.class_token
    _, targets, cams = explainer.compute(inputs)
    attentions, _, _ = _reference_attention(module, inputs, targets[:, 0], monkeypatch)
    expected = {
        "rollout": _rollout_matrix(attentions)[:, prefix:, prefix:].mean(dim=1),
        "attention": attentions[-1].mean(dim=1)[:, prefix:, prefix:].mean(dim=1),
    }
    for method, maps in expected.items():
        for n in range(2):
            assert _pearson(cams[method][0][0][n], maps[n]) >= 0.999, method


def test_each_of_several_targets_gets_its_own_gradients() -> None:
    """Top 3 classes in one pass (the graph kept for each target, LeGrad's layer pass shared) give each class the
    maps that explaining it alone gives."""
    module, prefix = FAMILIES["timm-dinov2-registers"]()
    loaded = LoadedModel(module, "dinov2", "none", None, InputSpec(SIZE, (SIZE, SIZE)), prefix_tokens=prefix)
    explainer = Explainer(loaded, methods=["attn-grad", "legrad", "gradcam"])
    inputs = torch.randn(2, 3, SIZE, SIZE)
    _, targets, cams = explainer.compute(inputs, top_k=3)
    for k in range(3):
        for n in range(2):
            _, _, alone = explainer.compute(inputs[n : n + 1], target=int(targets[n, k]))
            for method in ("attn-grad", "legrad"):
                assert torch.allclose(cams[method][k][0][n], alone[method][0][0][0], atol=1e-5), (method, k, n)
