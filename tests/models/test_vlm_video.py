"""A vision-language model's answer about a video (issue 38 point 4, docs/video.md): a tiny Qwen2-VL asked about a
short synthetic clip through its processor's video path, the answer's maps over time and space (the whole answer,
per token, a contrast) against an independent ``torch.autograd.grad`` of the same log-probability at the merger, the
command line's outputs, and a family without a video path refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from cam_reference import pearson
from typer.testing import CliRunner
from video_models import read_frames, write_video

from gradcam_cli.cli import app
from gradcam_cli.cli.eval import app as eval_app
from gradcam_cli.errors import EXIT_OK, EXIT_USAGE

pytest.importorskip("transformers")

FRAMES, FPS, SIZE = 8, 4.0, (112, 84)
"""The clip: 8 frames at 4 fps, 112 x 84; the tiny processor (2 fps) sees 4 of them, 2 temporal patches of a
3 x 4 merged grid."""
SAMPLED = [1, 3, 5, 7]
"""The frames sampled at 2 fps: the centre of each of 4 equal parts of the 8."""
PROMPT = "what is the cat"


def draw(number: int) -> np.ndarray:
    """Frame ``number``: a red square moving right over grey (BGR)."""
    frame = np.full((SIZE[1], SIZE[0], 3), 60, np.uint8)
    frame[20:50, 5 + 9 * number : 35 + 9 * number] = (0, 0, 255)
    return frame


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import vlm_models

    return vlm_models.qwen2_vl(tmp_path_factory.mktemp("qwen"))


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_video(tmp_path_factory.mktemp("clip") / "clip.mp4", FRAMES, FPS, SIZE, draw)


def invoke(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


def reference_maps(
    folder: Path, video: Path, answers: list[str], terms: list[tuple[int, list[int], float]], windows: bool = False
):
    """An independent reference: the sampled frames through the processor's video path with each answer appended,
    the merger's output hooked, the sum of ``terms`` (answer, its token positions, sign) of teacher-forced
    log-probabilities differentiated with ``torch.autograd.grad``; Grad-CAM's and LayerCAM's (t, h, w) maps
    resized trilinearly to the clip's frames at the processor's pixels and min-max normalised. ``windows``: a
    Qwen2.5-VL, whose merger outputs its tokens window by window (transformers' own window index puts them back)."""
    import transformers
    from transformers.video_utils import VideoMetadata
    from transformers.vision_utils import get_vision_window_index

    model = transformers.AutoModelForImageTextToText.from_pretrained(folder).eval()
    processor = transformers.AutoProcessor.from_pretrained(folder)
    frames = np.stack([read_frames(video)[k] for k in SAMPLED])
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": PROMPT}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    grads, activations, grid = None, None, None
    for k, answer in enumerate(answers):
        metadata = VideoMetadata(FRAMES, FPS, SIZE[0], SIZE[1], frames_indices=SAMPLED)
        inputs = processor(
            videos=[frames],
            video_metadata=[metadata],
            text=[prompt + answer],
            return_tensors="pt",
            do_sample_frames=False,
            cap_pixels_per_frame=True,
        )
        kept: dict[str, torch.Tensor] = {}
        handle = model.model.visual.merger.register_forward_hook(lambda _m, _i, out, kept=kept: kept.update(out=out))
        logits = model(**inputs).logits
        handle.remove()
        ids = inputs["input_ids"][0]
        count = len(answer.split())
        logprobs = logits[0, len(ids) - count - 1 : -1].log_softmax(-1).gather(1, ids[-count:, None])[:, 0]
        total = sum(sign * logprobs[positions].sum() for which, positions, sign in terms if which == k)
        grad = torch.autograd.grad(total, kept["out"])[0]
        grads = grad if grads is None else grads + grad
        activations, grid = kept["out"].detach(), inputs["video_grid_thw"][0].tolist()
    t, h, w = grid[0], grid[1] // 2, grid[2] // 2
    if windows:
        order = torch.argsort(get_vision_window_index(torch.tensor([grid]), 2, 56, 14)[0])
        activations, grads = activations[order], grads[order]
    cams = {
        "gradcam": F.relu((activations * grads.mean(0)).sum(-1)),
        "layercam": F.relu((activations * F.relu(grads)).sum(-1)),
    }
    placed = {}
    for method, cam in cams.items():
        resized = F.interpolate(cam.reshape(1, 1, t, h, w), (FRAMES, h * 28, w * 28), mode="trilinear")[0, 0]
        placed[method] = (resized - resized.min()) / (resized.max() - resized.min())
    return placed


def test_answer_per_token_and_contrast_maps_of_a_clip_match_autograd(qwen, clip, tmp_path):
    out = tmp_path / "out"
    given = invoke(
        clip,
        "--model",
        f"hf:{qwen}",
        "--prompt",
        PROMPT,
        "--answer",
        "red cat",
        "--per-token",
        "--method",
        "gradcam,layercam",
        "--save-raw",
        "-o",
        out,
        "--manifest",
        out / "rows.jsonl",
    )
    assert given.exit_code == EXIT_OK, given.output
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert [(row["target"]["name"], row["method"]) for row in rows] == [
        (name, method) for name in ("answer", "token 0: red", "token 1: cat") for method in ("gradcam", "layercam")
    ]
    assert {row["answer"] for row in rows} == {"red cat"} and rows[0]["generated"] is False
    assert [token["text"] for token in rows[0]["tokens"]] == ["red", "cat"] and "tokens" not in rows[1]
    clip_info = rows[0]["clip"]
    assert (clip_info["start"], clip_info["end"], len(clip_info["shares"])) == (0, FRAMES, FRAMES)
    assert sum(clip_info["shares"]) == pytest.approx(1.0, abs=1e-4)
    overlay, curve, raw = (Path(path) for path in rows[0]["outputs"])
    assert overlay.name == "clip_gradcam_answer.mp4" and curve.name == "clip_gradcam_answer_curve.png"
    assert len(read_frames(overlay)) == FRAMES and curve.is_file()
    assert np.load(raw).shape == (FRAMES, 84, 112)  # the clip's frames at the processor's pixels: 3 x 4 tokens of 28
    terms = {"answer": [(0, [0, 1], 1.0)], "token 0: red": [(0, [0], 1.0)], "token 1: cat": [(0, [1], 1.0)]}
    for name, target_terms in terms.items():
        reference = reference_maps(qwen, clip, ["red cat"], target_terms)
        for row in (row for row in rows if row["target"]["name"] == name):
            saved = np.load(row["outputs"][2])
            assert pearson(saved, reference[row["method"]]) >= 0.999, (name, row["method"])

    contrast = invoke(
        clip,
        "--model",
        f"hf:{qwen}",
        "--prompt",
        PROMPT,
        "--answer",
        "red cat",
        "--target",
        "contrast:answer:cat,answer:dog",
        "--save-raw",
        "-o",
        tmp_path / "contrast",
    )
    assert contrast.exit_code == EXIT_OK, contrast.output
    saved = np.load(tmp_path / "contrast" / "clip_gradcam_cat-dog_clip000.npy")
    reference = reference_maps(qwen, clip, ["cat", "dog"], [(0, [0], 1.0), (1, [0], -1.0)])
    assert pearson(saved, reference["gradcam"]) >= 0.999


def test_a_generated_answer_about_a_clip_through_the_command_line_and_resumed(qwen, clip, tmp_path):
    out = tmp_path / "out"
    args = [clip, "--model", f"hf:{qwen}", "--prompt", PROMPT, "--max-new-tokens", "2", "-o", out, "--json"]
    args += ["--manifest", out / "rows.jsonl", "--skip-existing"]
    result = invoke(*args)
    assert result.exit_code == EXIT_OK, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert rows and rows[0]["generated"] is True and rows[0]["prompt"] == PROMPT
    assert len(rows[0]["tokens"]) <= 2 and rows[0]["provenance"]["task"] == "answer"
    assert Path(rows[0]["outputs"][0]).name == "clip_gradcam_answer.mp4"
    assert len(read_frames(Path(rows[0]["outputs"][0]))) == FRAMES

    again = invoke(*args)
    assert again.exit_code == EXIT_OK, again.output
    kept = [json.loads(line) for line in again.stdout.splitlines() if line.startswith("{")]
    assert [row["status"] for row in kept] == ["skipped"] * len(rows)
    assert [(row["answer"], row["outputs"]) for row in kept] == [(row["answer"], row["outputs"]) for row in rows]
    manifest = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert len(manifest) == len(rows)


@pytest.mark.quick
def test_a_clip_option_or_a_family_without_a_video_path_is_refused_in_one_line(qwen, llava, clip, tmp_path):
    stride = invoke(clip, "--model", f"hf:{qwen}", "--prompt", PROMPT, "--clip-stride", "4", "-o", tmp_path / "a")
    assert stride.exit_code == EXIT_USAGE
    assert "error: --clip-stride does not apply to a --prompt's answer" in stride.output
    images_only = invoke(clip, "--model", f"hf:{llava}", "--prompt", PROMPT, "-o", tmp_path / "b")
    assert images_only.exit_code == EXIT_USAGE, images_only.output
    lines = [line for line in images_only.output.splitlines() if line.startswith("error:")]
    assert (
        len(lines) == 1 and "llava vision-language model: its processor takes images only (no video path)" in lines[0]
    )
    assert not list((tmp_path / "b").glob("*.mp4"))
    measured = CliRunner().invoke(eval_app, [str(clip), "--model", f"hf:{qwen}", "--prompt", PROMPT])
    assert measured.exit_code == EXIT_USAGE
    assert f"error: gradcam eval --prompt measures an answer about an image; {clip} is a video" in measured.output


def test_a_qwen2_5_vl_clip_in_window_order_and_its_time_positions(clip, tmp_path):
    import vlm_models

    from gradcam_cli.cam.answers import SampledClip
    from gradcam_cli.cam.prompted import explain_clip_prompt

    folder = vlm_models.qwen2_5_vl(tmp_path / "qwen2.5")
    explainer = vlm_models.answerer(vlm_models.load_vlm(f"hf:{folder}", torch.device("cpu")), methods=("layercam",))
    frames = torch.from_numpy(np.stack([read_frames(clip)[k] for k in SAMPLED]))
    sampled = SampledClip(frames, tuple(SAMPLED), FRAMES, FPS)
    inputs = explainer.score.video_inputs(sampled, PROMPT)
    assert inputs["second_per_grid_ts"].tolist() == [1.0]  # a temporal patch of 2 frames sampled at 2 fps
    result = explain_clip_prompt(explainer, sampled, PROMPT, answer="red cat")
    (answer,) = result.maps
    reference = reference_maps(folder, clip, ["red cat"], [(0, [0, 1], 1.0)], windows=True)
    assert answer.saliency.shape == (FRAMES, 84, 112)
    assert pearson(answer.saliency, reference["layercam"]) >= 0.999
