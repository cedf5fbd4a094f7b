"""``--input-size H,W``: a non-square network input for a model that takes it (a timm ViT built with
``dynamic_img_size``, a Hugging Face ViT whose config's ``image_size`` is a (height, width) pair), refused in one line
otherwise; the maps come at the original image's shape from an H/p x W/p patch grid."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from typer.testing import CliRunner

from gradcam_cli.cli import app
from gradcam_cli.cli.input_size import parse_input_size
from gradcam_cli.models.loading import load_model
from gradcam_cli.models.timm_models import describe_timm
from gradcam_cli.options import ModelOptions

VIT = f"{Path(__file__).parents[1] / 'attention_models.py'}:build_vit"
"""A timm ViT (8-pixel patches, a class token and two registers) built with ``dynamic_img_size=True``."""


def _run(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


def _image(tmp_path: Path, width: int = 90, height: int = 40) -> Path:
    path = tmp_path / "wide.png"
    pixels = (np.random.default_rng(0).random((height, width, 3)) * 255).astype(np.uint8)
    Image.fromarray(pixels).save(path)
    return path


@pytest.fixture
def grids(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The patch grid of every map attention rollout makes."""
    from gradcam_cli.cam.attention import rollout

    seen: list[tuple[int, int]] = []
    original = rollout.patch_map

    def recorded(relevance, maps):
        seen.append(maps.grid)
        return original(relevance, maps)

    monkeypatch.setattr(rollout, "patch_map", recorded)
    return seen


def test_the_option_reads_one_side_or_a_height_and_width() -> None:
    assert parse_input_size("64") == 64 and parse_input_size("48,24") == (48, 24)
    for bad in ("48,", "a,b", "48,24,8", "8,24"):
        with pytest.raises(Exception, match=r"N or H,W|at least 16"):
            parse_input_size(bad)
    result = _run("x.png", "--input-size", "48,x")
    assert result.exit_code == 2 and "N or H,W" in result.output


def test_a_dynamic_timm_vit_takes_any_multiple_of_its_patch(tmp_path: Path, grids: list[tuple[int, int]]) -> None:
    image, out = _image(tmp_path), tmp_path / "out"
    result = _run(image, "-m", VIT, "--input-size", "48,24", "--method", "rollout", "-t", 1, "--save-raw", "-o", out)
    assert result.exit_code == 0, result.output
    assert grids == [(6, 3)]  # 48 / 8 rows, 24 / 8 columns
    raw = np.load(out / "wide_rollout_1-1.npy")
    assert raw.shape == (40, 90) and raw.max() == pytest.approx(1.0)
    assert load_model(ModelOptions(VIT, input_size=(48, 24))).input_spec.resized_shape(40, 90) == (48, 24)
    refused = _run(image, "-m", VIT, "--input-size", "44,24", "--method", "rollout", "-o", out)
    assert refused.exit_code == 2 and refused.stderr.count("\n") == 1
    assert "does not fit" in refused.stderr and "multiples of 8 (height)" in refused.stderr


def test_timm_profiles_say_a_dynamic_vit_takes_any_shape() -> None:
    def tiny(**kwargs: object) -> torch.nn.Module:
        return timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1, embed_dim=48, **kwargs)

    assert not describe_timm(tiny()).any_shape and describe_timm(tiny(dynamic_img_size=True)).any_shape
    shaped = load_model(ModelOptions("timm:test_vit", weights="none", input_size=(64, 32)))  # dynamic_img_size
    assert shaped.input_spec.fixed_size == (64, 32) and shaped.input_spec.resized_shape(40, 90) == (64, 32)


def test_a_hugging_face_vit_with_an_image_size_pair(tmp_path: Path, grids: list[tuple[int, int]]) -> None:
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        image_size=[16, 40],
        patch_size=8,
        num_labels=3,
    )
    folder = tmp_path / "vit"
    ViTForImageClassification(config).eval().save_pretrained(folder)
    model = f"hf:{folder}"
    assert load_model(ModelOptions(model)).input_spec.fixed_size == (16, 40)
    image, out = _image(tmp_path), tmp_path / "out"
    for given in ((), ("--input-size", "16,40")):  # its own shape, and the same given
        result = _run(image, "-m", model, *given, "--method", "rollout", "-t", 1, "--save-raw", "-o", out)
        assert result.exit_code == 0, result.output
        assert np.load(out / "wide_rollout_1-1.npy").shape == (40, 90)
    assert grids == [(2, 5), (2, 5)]
    refused = _run(image, "-m", model, "--input-size", "40,16", "--method", "rollout", "-o", out)
    assert refused.exit_code == 2 and refused.stderr.count("\n") == 1
    assert "takes a fixed 16x40 input" in refused.stderr


def test_a_dynamic_timm_vit_at_one_input_size_takes_images_of_any_aspect(
    tmp_path: Path, grids: list[tuple[int, int]]
) -> None:
    for width, height in ((64, 48), (48, 64)):  # at 32 the longer side would be 43 pixels: not whole 8-pixel patches
        folder = tmp_path / f"{width}x{height}"
        folder.mkdir()
        image, out = _image(folder, width, height), folder / "out"
        result = _run(image, "-m", VIT, "--input-size", 32, "--method", "rollout", "-t", 1, "--save-raw", "-o", out)
        assert result.exit_code == 0, result.output
        assert np.load(out / "wide_rollout_1-1.npy").shape == (height, width)
    assert grids == [(4, 5), (5, 4)]  # a 32 x 40 (then 40 x 32) network input: 43 rounded to 40


def test_the_network_input_of_a_patch_model_that_takes_any_shape_has_whole_patches() -> None:
    spec = load_model(ModelOptions(VIT, input_size=32)).input_spec
    assert spec.multiple == (8, 8) and load_model(ModelOptions(VIT)).input_spec.multiple == (8, 8)
    for height, width in ((48, 64), (64, 48), (40, 90), (500, 20), (33, 33)):
        rows, columns = spec.resized_shape(height, width)
        assert rows % 8 == 0 and columns % 8 == 0 and min(rows, columns) == 32
    assert spec.resized_shape(48, 64) == (32, 40) and spec.resized_shape(64, 48) == (40, 32)
    assert load_model(ModelOptions(VIT, input_size=30)).input_spec.resized_shape(30, 30) == (32, 32)
    assert load_model(ModelOptions("resnet18", weights="none")).input_spec.multiple is None  # no patches
