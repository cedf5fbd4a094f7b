"""``--attention-heads mean|max|min``: rollout's and ``attention``'s head fusion from the command line, against the
formula computed from attention probabilities captured separately (timm's plain path, ``attn_drop``'s input)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from attention_models import build_vit  # tests/ is on sys.path (conftest)
from PIL import Image
from typer.testing import CliRunner

from gradcam_cli.cli import app

SUPPORT = Path(__file__).parents[1] / "attention_models.py"
VIT = f"{SUPPORT}:build_vit"
SIZE, PATCH, PREFIX = 32, 8, 3  # 4 x 4 patches after a class token and two registers
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # a file.py:factory model's normalisation


def _run(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


def _probabilities(pixels: np.ndarray) -> list[torch.Tensor]:
    """Each block's (1, heads, L, L) attention probabilities, read from a separately built copy of the model."""
    model = build_vit()
    seen: list[torch.Tensor] = []
    for block in model.blocks:
        block.attn.fused_attn = False
        block.attn.attn_drop.register_forward_hook(lambda _m, args, _out: seen.append(args[0].detach()))
    inputs = torch.from_numpy(pixels).float().permute(2, 0, 1)[None] / 255
    inputs = (inputs - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]
    with torch.no_grad():
        model(inputs)
    return seen


def _fuse(attention: torch.Tensor, heads: str) -> torch.Tensor:
    return {"mean": attention.mean(1), "max": attention.max(1).values, "min": attention.min(1).values}[heads]


def _expected(probabilities: list[torch.Tensor], method: str, heads: str) -> np.ndarray:
    """Rollout: R = Ã_L ... Ã_1, Ã_l = rows renormalised of (fused A_l + I); attention: fused A_L; then row 0 over
    the patches, upsampled bilinearly to the image and scaled to [0, 1]."""
    if method == "attention":
        relevance = _fuse(probabilities[-1], heads)
    else:
        relevance = torch.eye(probabilities[0].shape[-1])[None]
        for attention in probabilities:
            augmented = _fuse(attention, heads) + torch.eye(attention.shape[-1])
            relevance = (augmented / augmented.sum(-1, keepdim=True)) @ relevance
    grid = relevance[:, 0, PREFIX:].reshape(1, 1, SIZE // PATCH, SIZE // PATCH)
    upsampled = F.interpolate(grid, size=(SIZE, SIZE), mode="bilinear", align_corners=False)[0, 0]
    return ((upsampled - upsampled.min()) / (upsampled.max() - upsampled.min())).numpy()


def test_each_head_fusion_follows_its_formula_on_the_command_line(tmp_path: Path) -> None:
    pixels = (np.random.default_rng(3).random((SIZE, SIZE, 3)) * 255).astype(np.uint8)
    image = tmp_path / "square.png"
    Image.fromarray(pixels).save(image)
    probabilities = _probabilities(pixels)
    maps = {}
    for heads in ("mean", "max", "min"):
        out = tmp_path / heads
        given = () if heads == "mean" else ("--attention-heads", heads)  # the mean when not given
        result = _run(image, "-m", VIT, "--input-size", SIZE, "--method", "rollout,attention", *given, "-t", 0,
                      "--save-raw", "-o", out)  # fmt: skip
        assert result.exit_code == 0, result.output
        for method in ("rollout", "attention"):
            got = np.load(out / f"square_{method}_0-0.npy")
            expected = _expected(probabilities, method, heads)
            assert np.corrcoef(got.ravel(), expected.ravel())[0, 1] >= 0.999, (method, heads)
            maps[method, heads] = got
    for method in ("rollout", "attention"):  # the fusions differ, so the checks above could fail
        assert np.corrcoef(maps[method, "mean"].ravel(), maps[method, "max"].ravel())[0, 1] < 0.99
        assert np.corrcoef(maps[method, "mean"].ravel(), maps[method, "min"].ravel())[0, 1] < 0.99


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--method", "rollout", "--attention-heads", "maxx"), "'maxx' is not one of mean, max, min"),
        (("--method", "rollout", "--attention-heads", "mx"), "'mx' is not one of mean, max, min. Did you mean: max"),
        (
            ("--method", "attn-grad", "--attention-heads", "max"),
            "--attention-heads is for --method rollout or attention",
        ),
    ],
)
def test_a_fusion_that_does_not_apply_is_refused_in_one_line(tmp_path: Path, args: tuple[str, ...], message: str):
    image = tmp_path / "square.png"
    Image.new("RGB", (SIZE, SIZE), (30, 90, 200)).save(image)
    result = _run(image, "-m", VIT, "--input-size", SIZE, *args, "-o", tmp_path / "out")
    assert result.exit_code == 2 and message in result.stderr, result.output
    assert "Traceback" not in result.output


def test_the_fusion_is_in_the_run_record_and_skip_existing_refuses_another(tmp_path: Path) -> None:
    image, out = tmp_path / "square.png", tmp_path / "out"
    Image.new("RGB", (SIZE, SIZE), (30, 90, 200)).save(image)
    common = [image, "-m", VIT, "--input-size", SIZE, "--method", "rollout", "-o", out, "--skip-existing"]
    assert _run(*common, "--attention-heads", "max").exit_code == 0
    assert _run(*common, "--attention-heads", "max").exit_code == 0  # the same fusion resumes
    again = _run(*common, "--attention-heads", "min")
    assert again.exit_code == 2 and "--attention-heads max (this run: min)" in again.stderr, again.output
