"""The attention methods on Hugging Face video transformers (docs/video.md): rollout and attn-grad on the joint
space-time attention of VideoMAE (no class token) and ViViT (a class token) over their t x h x w tubelets, checked
against the formulas on the model's own ``output_attentions`` (eager attention) and autograd; TimeSformer's divided
space-time attention refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from cam_reference import pearson
from typer.testing import CliRunner
from video_models import clip_input, read_frames, resized, write_video

from gradcam_cli.cli import app
from gradcam_cli.errors import EXIT_OK, EXIT_USAGE

transformers = pytest.importorskip("transformers")

SIDE, FRAMES, PATCH, TUBELET = 32, 4, 8, 2
GRID = (FRAMES // TUBELET, SIDE // PATCH, SIDE // PATCH)
"""The tiny models' tubelets, time slowest: 2 x 4 x 4."""
LABELS = {"id2label": {0: "walk", 1: "run", 2: "sit"}, "label2id": {"walk": 0, "run": 1, "sit": 2}}
COMMON = {
    "image_size": SIDE,
    "num_frames": FRAMES,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    **LABELS,
}
MODELS = {
    "videomae": (
        lambda: transformers.VideoMAEConfig(patch_size=PATCH, tubelet_size=TUBELET, **COMMON),
        lambda: transformers.VideoMAEForVideoClassification,
        0,
    ),
    "vivit": (
        lambda: transformers.VivitConfig(tubelet_size=[TUBELET, PATCH, PATCH], **COMMON),
        lambda: transformers.VivitForVideoClassification,
        1,
    ),
}
"""name: (its config, its class, its prefix tokens)."""


def _saved(folder: Path, config: object, kind: type) -> Path:
    torch.manual_seed(5)
    kind(config).save_pretrained(folder)
    processor = transformers.VideoMAEImageProcessor(
        size={"shortest_edge": SIDE}, crop_size={"height": SIDE, "width": SIDE}
    )
    processor.save_pretrained(folder)
    return folder


def _frame(number: int) -> np.ndarray:
    frame = np.full((SIDE, SIDE, 3), 120, np.uint8)
    frame[8:20, 4 + 2 * number : 16 + 2 * number] = (30, 40, 220)  # a square moving right
    frame[:, :, 1] += np.uint8(10 * number)
    return frame


def _run(*args: str | Path) -> object:
    return CliRunner().invoke(app, [str(a) for a in args])


def _references(model: torch.nn.Module, x: torch.Tensor, prefix: int) -> tuple[dict[str, torch.Tensor], int]:
    """Rollout and attn-grad's (1, t, h, w) maps from the model's own eager attentions and autograd, for its top
    class: R = prod (0.5 mean_h A + 0.5 I), and R <- R + mean_h ReLU(dS/dA ⊙ A) R; the class token's row over the
    tubelets, or (no class token) the mean of the tubelets' rows."""
    with torch.enable_grad():
        output = model(pixel_values=x.permute(0, 2, 1, 3, 4), output_attentions=True)
        top = int(output.logits[0].argmax())
        attentions = list(output.attentions)
        gradients = torch.autograd.grad(output.logits[0, top], attentions)
    length = attentions[0].shape[-1]
    eye = torch.eye(length, dtype=torch.float64)
    rolled, weighted = eye, eye
    for a, g in zip(attentions, gradients, strict=True):
        a, g = a[0].detach().double(), g[0].double()
        rolled = (0.5 * a.mean(dim=0) + 0.5 * eye) @ rolled
        weighted = weighted + (g * a).clamp(min=0).mean(dim=0) @ weighted
    maps = {}
    for name, relevance in (("rollout", rolled), ("attn-grad", weighted)):
        columns = relevance[:, prefix:]
        rows = columns[0] if prefix else columns.mean(dim=0)
        maps[name] = rows.reshape(1, *GRID)
    return maps, top


@pytest.mark.parametrize("name", sorted(MODELS))
def test_rollout_and_attn_grad_on_joint_space_time_attention_match_their_formulas(name, tmp_path):
    config, kind, prefix = MODELS[name]
    folder = _saved(tmp_path / name, config(), kind())
    video = write_video(tmp_path / "square.mp4", FRAMES, 8.0, (SIDE, SIDE), _frame)
    out = tmp_path / "out"
    args = [video, "-m", f"hf:{folder}", "--method", "rollout,attn-grad", "--save-raw", "-o", out]
    result = _run(*args, "--manifest", out / "m.jsonl")
    assert result.exit_code == EXIT_OK, result.output
    rows = [json.loads(line) for line in (out / "m.jsonl").read_text().splitlines()]
    assert sorted(row["method"] for row in rows) == ["attn-grad", "rollout"]
    model = kind().from_pretrained(folder, attn_implementation="eager").eval()
    x = clip_input(read_frames(video), list(range(FRAMES)), SIDE, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    expected, top = _references(model, x, prefix)
    for row in rows:
        assert row["target"]["index"] == top
        got = np.load(row["outputs"][2])
        assert got.shape == (FRAMES, SIDE, SIDE)
        assert pearson(got, resized(expected[row["method"]], (FRAMES, SIDE, SIDE))) >= 0.999, row["method"]


@pytest.mark.quick
@pytest.mark.parametrize("method", ["rollout", "attn-grad"])
def test_timesformers_divided_space_time_attention_is_refused_in_one_line(method, tmp_path):
    config = transformers.TimesformerConfig(patch_size=PATCH, **COMMON)
    folder = _saved(tmp_path / "timesformer", config, transformers.TimesformerForVideoClassification)
    video = write_video(tmp_path / "square.mp4", FRAMES, 8.0, (SIDE, SIDE), _frame)
    result = _run(video, "-m", f"hf:{folder}", "--method", method, "-o", tmp_path / "out")
    assert result.exit_code == EXIT_USAGE
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [
        f"error: --method {method} needs joint attention over one token sequence; hf:{folder} divides each block's "
        "attention into time then space (TimeSformer), for which the rollout formula does not hold; "
        "use a layer method such as gradcam"
    ]
