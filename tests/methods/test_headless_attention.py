"""Rollout and attention on a headless backbone (an embedding model) without ``--target``: through the command line,
on timm's DINOv2 with registers (``timm:vit_small_patch14_reg4_dinov2`` built from a tiny configuration, random
weights) and a Hugging Face ``Dinov2Model`` saved to a folder (``hf:DIR``).

Each map is checked against the formulas on attention read independently of the engine (timm: a plain softmax put in
place of ``F.scaled_dot_product_attention``; Hugging Face: the eager attention's own ``output_attentions``), and,
timm, against the same methods on the same backbone given a classifier head."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from attention_models import PATCH, SIZE
from PIL import Image
from typer.testing import CliRunner

from gradcam_cli import Explainer
from gradcam_cli.cam.methods import METHODS
from gradcam_cli.cli import app
from gradcam_cli.cli.diff import app as diff_app
from gradcam_cli.cli.eval import app as eval_app
from gradcam_cli.errors import EXIT_OK, EXIT_USAGE
from gradcam_cli.io.images import load_image, to_input_tensor
from gradcam_cli.models.loading import LoadedModel, load_model

timm = pytest.importorskip("timm")
CREATE = timm.create_model
"""timm's own, whatever the fixture below puts in its place."""

DINO = "vit_small_patch14_reg4_dinov2"
MODEL = f"timm:{DINO}"
PREFIX = 5
"""The class token and DINOv2's four registers."""
NO_TARGET = {"index": 0, "name": "no target", "probability": None, "score": "none"}
GRID = SIZE // PATCH


def run(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


def tiny_dinov2(**options: object) -> torch.nn.Module:
    """timm's DINOv2 with registers, tiny (as :func:`attention_models.tiny_vit` builds it: 32 px, 8 px patches, 3
    blocks of 4 heads), seeded: the same weights each call. Headless (``num_classes`` 0) as timm builds it for
    ``timm:`` + the name, unless ``options`` say."""
    tiny = {"img_size": SIZE, "patch_size": PATCH, "embed_dim": 32, "depth": 3, "num_heads": 4, "num_classes": 0}
    torch.manual_seed(0)
    return CREATE(DINO, pretrained=False, **{**tiny, **options}).eval()


@pytest.fixture
def tiny_timm(monkeypatch: pytest.MonkeyPatch) -> None:
    """``timm.create_model`` builds :func:`tiny_dinov2` for the DINOv2 name (nothing downloaded: ``--weights none``),
    every other name as it comes."""

    def create(name: str, pretrained: bool = False, **options: object) -> torch.nn.Module:
        return tiny_dinov2(**options) if name == DINO else CREATE(name, pretrained=pretrained, **options)

    monkeypatch.setattr(timm, "create_model", create)


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "photo.png"
    Image.fromarray((np.random.default_rng(0).random((SIZE, SIZE, 3)) * 255).astype(np.uint8)).save(path)
    return path


@pytest.fixture
def hf_dinov2(tmp_path: Path) -> Path:
    """A tiny transformers ``Dinov2Model`` (no head: an embedding model) saved with save_pretrained."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.Dinov2Config(
        hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64, image_size=SIZE, patch_size=8
    )
    folder = tmp_path / "dinov2"
    transformers.Dinov2Model(config).save_pretrained(folder)
    return folder


def plain_attention(module: torch.nn.Module, inputs: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> list:
    """Each layer's attention probabilities (N, heads, L, L), from a plain softmax attention put in place of the
    fused kernel that timm calls."""
    probabilities: list[torch.Tensor] = []

    def plain(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **_kwargs):
        weights = (q @ k.transpose(-2, -1) * (scale or 1 / math.sqrt(q.shape[-1]))).softmax(dim=-1)
        probabilities.append(weights)
        return weights @ v

    with monkeypatch.context() as patch, torch.no_grad():
        patch.setattr(F, "scaled_dot_product_attention", plain)
        module(inputs)
    return probabilities


def expected_maps(attentions: list[torch.Tensor], prefix: int) -> dict[str, torch.Tensor]:
    """The papers' maps of one image at the image's size (bilinear, min-max normalised, as every map is shown):
    rollout, R[0, P:] with R = Ã_L ... Ã_1, Ã = (0.5 mean_h A + 0.5 I) row-normalised; attention, mean_h A_L[0, P:]."""
    rollout = None
    for a in attentions:
        mixed = 0.5 * a[0].mean(dim=0) + 0.5 * torch.eye(a.shape[-1])
        mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        rollout = mixed if rollout is None else mixed @ rollout
    assert rollout is not None
    coarse = {"rollout": rollout[0, prefix:], "attention": attentions[-1][0].mean(dim=0)[0, prefix:]}
    shown = {}
    for method, values in coarse.items():
        grid = values.reshape(1, 1, GRID, GRID).float()
        up = F.interpolate(grid, size=(SIZE, SIZE), mode="bilinear", align_corners=False)[0, 0]
        shown[method] = (up - up.min()) / (up.max() - up.min())
    return shown


def rows_of(result) -> list[dict]:
    assert result.exit_code == EXIT_OK, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def check_rows(rows: list[dict], out: Path, stem: str, expected: dict[str, torch.Tensor]) -> None:
    """One row per method, no target and no predictions, the stable file names, each map as ``expected``."""
    assert [row["method"] for row in rows] == ["rollout", "attention"]
    for row in rows:
        assert row["target"] == NO_TARGET and row["predictions"] == [] and row["status"] == "ok"
        name = f"{stem}_{row['method']}_0-no-target"
        assert row["outputs"] == [str(out / f"{name}.png"), str(out / f"{name}.npy")]
        saved = torch.from_numpy(np.load(out / f"{name}.npy"))
        assert saved.shape == (SIZE, SIZE)
        assert torch.allclose(saved, expected[row["method"]], atol=1e-4), row["method"]


@pytest.mark.quick
def test_timm_dinov2_with_registers_gives_the_attention_maps_without_a_target(
    tiny_timm: None, image: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    result = run(image, "--model", MODEL, "--weights", "none", "--method", "rollout,attention", "--save-raw", "--json",
                 "-o", out)  # fmt: skip
    rows = rows_of(result)
    loaded = load_model(MODEL, "none")
    assert loaded.embeds and loaded.prefix_tokens == PREFIX
    inputs = to_input_tensor(load_image(image), loaded.input_spec).unsqueeze(0)
    expected = expected_maps(plain_attention(loaded.module, inputs, monkeypatch), PREFIX)
    check_rows(rows, out, image.stem, expected)
    # the same backbone with a classifier head: the same maps (they read the attention alone)
    headed = tiny_dinov2(num_classes=5)
    headed.load_state_dict(loaded.module.state_dict(), strict=False)
    classifier = LoadedModel(headed, "headed", "none", None, loaded.input_spec, prefix_tokens=PREFIX)
    for smooth in (False, True):  # --aug-smooth: the flipped and rescaled views' maps averaged, as with a head
        if smooth:
            result = run(image, "--model", MODEL, "--weights", "none", "--method", "rollout,attention", "--save-raw",
                         "--aug-smooth", "-o", out)  # fmt: skip
            assert result.exit_code == EXIT_OK, result.output
        explainer = Explainer(classifier, methods=["rollout", "attention"], aug_smooth=smooth)
        for explanation in explainer.explain(image).explanations:
            saved = torch.from_numpy(np.load(out / f"{image.stem}_{explanation.method}_0-no-target.npy"))
            assert torch.allclose(saved, explanation.saliency, atol=1e-6), (explanation.method, smooth)
            assert smooth or torch.allclose(saved, expected[explanation.method], atol=1e-4)
            assert not smooth or not torch.allclose(saved, expected[explanation.method], atol=1e-2)


def test_a_hugging_face_dinov2_model_gives_the_attention_maps_without_a_target(
    hf_dinov2: Path, image: Path, tmp_path: Path
) -> None:
    import transformers

    out = tmp_path / "out"
    model = f"hf:{hf_dinov2}"
    result = run(image, "--model", model, "--method", "rollout,attention", "--save-raw", "--json", "-o", out)
    rows = rows_of(result)
    loaded = load_model(model)
    assert loaded.embeds and loaded.prefix_tokens == 1
    inputs = to_input_tensor(load_image(image), loaded.input_spec).unsqueeze(0)
    eager = transformers.Dinov2Model.from_pretrained(hf_dinov2, attn_implementation="eager").eval()
    with torch.no_grad():
        attentions = list(eager(pixel_values=inputs, output_attentions=True).attentions)
    assert len(attentions) == 3
    check_rows(rows, out, image.stem, expected_maps(attentions, 1))


def test_method_all_keeps_the_methods_that_need_no_target_and_names_the_others(
    tiny_timm: None, image: Path, tmp_path: Path
) -> None:
    base = (image, "--model", MODEL, "--weights", "none", "-o", tmp_path / "out")
    rows = rows_of(result := run(*base, "--method", "all", "--json"))
    assert [row["method"] for row in rows] == ["rollout", "attention"]
    assert all(row["target"] == NO_TARGET for row in rows)
    notes = [line for line in result.stderr.splitlines() if "leaves out" in line]
    assert len(notes) == 1, result.stderr
    left_out = [name for name, method in METHODS.items() if method.needs_target and "classify" in method.tasks]
    assert notes[0] == (
        f"--method all leaves out {', '.join(left_out)} (they need a target: give --target similar:IMAGE_OR_FOLDER)"
    )
    assert {"gradcam", "attn-grad", "legrad"} <= set(left_out)
    refusals = {
        "gradcam": f"error: {MODEL} embeds images and has no classes: give --target similar:IMAGE_OR_FOLDER",
        "rollout,attn-grad": f"error: {MODEL} embeds images and has no classes: give --target "
        "similar:IMAGE_OR_FOLDER (attn-grad needs one)",
    }
    for methods, message in refusals.items():
        refused = run(*base, "--method", methods)
        assert refused.exit_code == EXIT_USAGE and refused.stderr.strip() == message, refused.output
    chosen = run(*base, "--method", "rollout", "--top-k", 2)
    assert chosen.exit_code == EXIT_USAGE
    assert chosen.stderr.strip() == f"error: --top-k chooses a class; {MODEL} has none, and rollout needs none"
    evaluated = CliRunner().invoke(eval_app, [str(image), "--model", MODEL, "--weights", "none", "--method", "rollout"])
    assert evaluated.exit_code == EXIT_USAGE  # deletion and insertion follow a target's score: there is none
    assert evaluated.stderr.strip().endswith(f"{MODEL} has none: give --target similar:IMAGE_OR_FOLDER")


@pytest.mark.quick
def test_only_the_attention_methods_that_read_the_attention_alone_need_no_target() -> None:
    own = [name for name, method in METHODS.items() if method.compute.__module__.startswith("gradcam_cli.")]
    assert [name for name in own if not METHODS[name].needs_target] == ["rollout", "attention"]


def test_skip_existing_the_gallery_and_diff_take_the_rows_without_a_target(
    tiny_timm: None, image: Path, tmp_path: Path
) -> None:
    out, manifest = tmp_path / "out", tmp_path / "manifest.jsonl"
    base = (image, "--model", MODEL, "--weights", "none", "--method", "rollout,attention", "-o", out, "--json")
    first = rows_of(run(*base, "--manifest", manifest, "--report"))
    assert "no target" in (out / "index.html").read_text(encoding="utf-8")
    resumed = rows_of(run(*base, "--manifest", manifest, "--skip-existing"))  # rows from the manifest
    assert [row["status"] for row in resumed] == ["skipped", "skipped"]
    assert [(row["method"], row["target"], row["outputs"]) for row in resumed] == [
        (row["method"], row["target"], row["outputs"]) for row in first
    ]
    rebuilt = rows_of(run(*base, "--skip-existing"))  # no manifest: the rows rebuilt from the file names
    assert [(row["status"], row["method"], row["target"]) for row in rebuilt] == [
        ("skipped", "rollout", NO_TARGET),
        ("skipped", "attention", NO_TARGET),
    ]
    same = CliRunner().invoke(diff_app, [str(manifest), str(manifest)])
    assert same.exit_code == EXIT_OK, same.output
