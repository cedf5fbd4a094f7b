"""A folder of frames read as one video by a video model (issue 38, point 1): its images in natural order of their
names, at ``--fps`` (default 25), through the same clips and outputs as a video file; the same folder given to an
image model stays a folder of photos, each explained alone."""

from __future__ import annotations

import json
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch
from cam_reference import pearson
from PIL import Image
from typer.testing import CliRunner
from video_models import REFERENCES, cached_weights, captured, centre_frames, clip_input, model_with, resized

from gradcam_cli import load_model
from gradcam_cli.cli import app
from gradcam_cli.errors import EXIT_IMAGE_FAILED, EXIT_OK, EXIT_USAGE
from gradcam_cli.io.discovery import InputKind, discover_clips, frame_files, natural_key

FRAMES, WIDTH, HEIGHT, SIZE = 40, 80, 64, 56
"""The frames: 40 of 80 x 64 pixels; the network's frames' shorter side (--input-size)."""


def _frame(number: int) -> np.ndarray:
    """RGB: a red square walking right a pixel per frame, each frame its own shade of green."""
    frame = np.full((HEIGHT, WIDTH, 3), 120, np.uint8)
    frame[20:40, 4 + number : 24 + number] = (220, 40, 30)
    frame[:, :, 1] += np.uint8(number)
    return frame


def write_frames(folder: Path, count: int = FRAMES) -> list[np.ndarray]:
    """``count`` PNG frames named ``f1.png`` ... ``f40.png`` (so that a plain sort of the names gets them wrong),
    written in shuffled order; the frames in their true order."""
    folder.mkdir(parents=True)
    frames = [_frame(number) for number in range(count)]
    for number in np.random.default_rng(0).permutation(count):
        Image.fromarray(frames[number]).save(folder / f"f{number + 1}.png")
    return frames


@pytest.fixture
def torch_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "torch"
    monkeypatch.setenv("TORCH_HOME", str(home))

    def no_network(url: str, *args: object, **kwargs: object) -> None:
        raise urllib.error.URLError("no network in this test")

    monkeypatch.setattr(torch.hub, "download_url_to_file", no_network)
    return home


def run(*args: str | Path | float) -> object:
    return CliRunner().invoke(app, [str(a) for a in args])


def rows_of(manifest: Path) -> list[dict]:
    return [json.loads(line) for line in manifest.read_text().splitlines()]


@pytest.mark.quick
def test_a_folders_frames_are_its_images_in_natural_order(tmp_path):
    folder = tmp_path / "frames"
    write_frames(folder, 12)
    (folder / ".hidden.png").write_bytes(b"")
    (folder / "notes.txt").write_text("not a frame")
    (folder / "sub").mkdir()
    Image.fromarray(_frame(0)).save(folder / "sub" / "f0.png")
    assert [path.name for path in frame_files(folder)] == [f"f{n}.png" for n in range(1, 13)]
    assert sorted(["img10.jpg", "IMG9.jpg", "img1.jpg"], key=natural_key) == ["img1.jpg", "IMG9.jpg", "img10.jpg"]


@pytest.mark.quick
def test_every_folder_that_holds_frames_is_one_video(tmp_path):
    root = tmp_path / "clips"
    write_frames(root / "walk", 3)
    write_frames(root / "run" / "take2", 2)
    (root / "empty").mkdir()
    images, videos = discover_clips([root])
    assert images == []
    assert [(video.path, video.output_stem, video.kind) for video in videos] == [
        (root / "run" / "take2", Path("clips/run/take2"), InputKind.VIDEO),
        (root / "walk", Path("clips/walk"), InputKind.VIDEO),
    ]
    _, [alone] = discover_clips([root / "walk"])
    assert alone.output_stem == Path("walk") and alone.frames


def _reference(frames: list[np.ndarray], state: dict, start: int, span: int) -> tuple[np.ndarray, int]:
    """mc3_18's Grad-CAM of the clip of ``span`` frames from ``start``, from the frames themselves (autograd)."""
    model = model_with("mc3_18", state)
    spec = load_model("mc3_18", "none").input_spec
    x = clip_input(frames, centre_frames(start, 16, span), SIZE, spec.mean, spec.std)
    a, g, top = captured(model, model.layer4, x)
    return resized(REFERENCES["gradcam"](a, g), (span, SIZE, 70)).numpy(), top


@pytest.mark.parametrize(("fps", "span"), [(30.0, 32), (None, 27)])
def test_a_folder_of_frames_is_one_video_of_a_video_model_at_its_frame_rate(torch_home, tmp_path, fps, span):
    """mc3_18 samples 16 frames at 15 fps: at --fps 30 a clip spans 32 frames, at the default 25, 27."""
    state = cached_weights(torch_home, "mc3_18", seed=3)
    frames = write_frames(tmp_path / "walk")
    out = tmp_path / "out"
    rate = ["--fps", fps] if fps is not None else []
    result = run(
        tmp_path / "walk",
        "-m",
        "mc3_18",
        "--input-size",
        SIZE,
        *rate,
        "--save-raw",
        "-o",
        out,
        "--manifest",
        out / "m.jsonl",
    )
    assert result.exit_code == EXIT_OK, result.output
    rows = rows_of(out / "m.jsonl")
    assert [(row["clip"]["start"], row["clip"]["end"]) for row in rows] == [(0, span), (FRAMES - span, FRAMES)]
    assert out / "walk_gradcam_top1.mp4" == Path(rows[0]["outputs"][0]) and Path(rows[0]["outputs"][0]).is_file()
    assert Path(rows[0]["outputs"][1]).is_file()  # the temporal importance plot
    seconds = fps or 25.0
    for row in rows:
        start = row["clip"]["start"]
        assert row["input"] == str(tmp_path / "walk")
        assert row["clip"]["seconds"] == pytest.approx([start / seconds, (start + span) / seconds], abs=1e-4)
        expected, top = _reference(frames, state, start, span)
        assert row["target"]["index"] == top
        assert pearson(np.load(row["outputs"][2]), expected) >= 0.999


def test_a_folder_of_photos_given_to_an_image_model_is_unchanged(tmp_path):
    write_frames(tmp_path / "photos", 3)
    out = tmp_path / "out"
    result = run(
        tmp_path / "photos",
        "-m",
        "resnet18",
        "--weights",
        "none",
        "--input-size",
        32,
        "-o",
        out,
        "--manifest",
        out / "m.jsonl",
    )
    assert result.exit_code == EXIT_OK, result.output
    rows = rows_of(out / "m.jsonl")
    assert sorted(Path(row["input"]).name for row in rows) == ["f1.png", "f2.png", "f3.png"]
    assert all("clip" not in row for row in rows)
    result = run(tmp_path / "photos", "-m", "resnet18", "--weights", "none", "--fps", 10, "-o", tmp_path / "o2")
    assert result.exit_code == EXIT_USAGE
    message = "--fps is the frame rate of a folder of frames given to a video model; none is among the inputs"
    assert result.stderr.strip() == f"error: {message}"


@pytest.mark.quick
def test_a_frame_that_cannot_be_read_fails_its_video_in_one_row(tmp_path):
    folder = tmp_path / "walk"
    write_frames(folder, 20)
    (folder / "f7.png").write_bytes(b"not a png")
    out = tmp_path / "out"
    result = run(
        folder, "-m", "mc3_18", "--weights", "none", "--input-size", 32, "-o", out, "--manifest", out / "m.jsonl"
    )
    assert result.exit_code == EXIT_IMAGE_FAILED
    [row] = rows_of(out / "m.jsonl")
    assert row["status"] == "error" and row["error"] == f"{folder / 'f7.png'}: not an image Pillow can read"
    assert not list(out.glob("*.mp4"))
