"""Video models on videos (issue 38): a video read as the model's clips (its profile's frames per clip, sampling
rate, size and normalisation), one prediction and one T x H x W map per clip, the maps against the papers' formulas
on the layer's activations and gradients taken with ``torch.autograd.grad``, and the outputs: the overlay video, the
temporal importance curve, ``--save-raw``, rows with fingerprints for ``gradcam diff``, ``--skip-existing``."""

from __future__ import annotations

import json
import urllib.error
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision
from cam_reference import pearson
from conftest import ROOT
from typer.testing import CliRunner
from video_models import (
    REFERENCES,
    cached_weights,
    captured,
    centre_frames,
    clip_input,
    model_with,
    read_frames,
    resized,
    write_video,
)

from gradcam_cli import Explainer, load_model
from gradcam_cli.cam.reshape import Layout, infer_layout, to_spatial
from gradcam_cli.cli import app
from gradcam_cli.cli.diff import app as diff_app
from gradcam_cli.drift.compare import diff_runs
from gradcam_cli.drift.fingerprint import map_fingerprint
from gradcam_cli.errors import EXIT_OK, EXIT_USAGE
from gradcam_cli.io.discovery import InputImage
from gradcam_cli.io.images import InputSpec
from gradcam_cli.io.video import frames, probe, read_ahead
from gradcam_cli.models.clip_spec import ClipSpec, sample_offsets
from gradcam_cli.models.profile import LoadedModel
from gradcam_cli.options import OutputOptions, RunOptions
from gradcam_cli.pipeline.clips import ClipRunner
from gradcam_cli.render.gallery import gallery_entries

FRAMES, FPS, WIDTH, HEIGHT = 40, 30.0, 80, 64
"""The test video: 40 frames at 30 fps, 80 x 64. A model sampling at 15 fps covers 32 of its frames per 16-frame
clip."""
SIZE = 56
"""--input-size of the runs: the frames' shorter side at the network input (56 x 70), small to keep them fast."""


def _square(number: int) -> np.ndarray:
    frame = np.full((HEIGHT, WIDTH, 3), 120, np.uint8)
    x = 4 + number
    frame[20:40, x : x + 20] = (30, 40, 220)  # BGR red, moving right a pixel per frame
    frame[:, :, 1] += np.uint8(number)  # each frame its own shade
    return frame


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_video(tmp_path_factory.mktemp("video") / "walk.mp4", FRAMES, FPS, (WIDTH, HEIGHT), _square)


@pytest.fixture
def torch_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """TORCH_HOME in tmp_path, no download possible."""
    home = tmp_path / "torch"
    monkeypatch.setenv("TORCH_HOME", str(home))

    def no_network(url: str, *args: object, **kwargs: object) -> None:
        raise urllib.error.URLError("no network in this test")

    monkeypatch.setattr(torch.hub, "download_url_to_file", no_network)
    return home


def run(*args: str | Path) -> object:
    return CliRunner().invoke(app, [str(a) for a in args])


def rows_of(manifest: Path) -> list[dict]:
    return [json.loads(line) for line in manifest.read_text().splitlines()]


# --- clips from the model's profile ---------------------------------------------------------------------------------


@pytest.mark.quick
@pytest.mark.parametrize(
    ("name", "frames", "rate", "fixed"),
    [
        ("r3d_18", 16, 15.0, None),
        ("s3d", 128, 15.0, None),
        ("mvit_v2_s", 16, 7.5, (224, 224)),
        ("swin3d_t", 32, 15.0, None),
    ],
)
def test_torchvision_video_models_take_clips_as_their_weights_say(name, frames, rate, fixed):
    weights = torchvision.models.get_model_weights(name).DEFAULT
    transforms = weights.transforms()
    with torch.device("meta"):  # the architecture only: no memory, no weights
        loaded = load_model(name, "none")
    assert loaded.profile.clips == ClipSpec(frames, rate)
    spec = loaded.input_spec
    crop = transforms.crop_size[0]
    assert (spec.size, spec.fixed_size, spec.shape) == (crop, fixed, (3, frames, crop, crop))
    assert (spec.mean, spec.std) == (tuple(transforms.mean), tuple(transforms.std))
    assert loaded.categories == list(weights.meta["categories"]) and len(loaded.categories) == 400  # Kinetics-400


@pytest.mark.quick
def test_clip_sampling_takes_the_centre_frame_of_each_part():
    clip = ClipSpec(16, 15.0)
    assert clip.step(30.0) == 2.0 and clip.span(30.0) == 32
    assert clip.span(25.0) == 27 and clip.span(10.0) == 11  # a slower video: frames repeat
    assert sample_offsets(16, 32) == list(range(1, 32, 2))
    assert sample_offsets(4, 4) == [0, 1, 2, 3]
    assert sample_offsets(4, 2) == [0, 0, 1, 1]
    assert ClipSpec(8).span(30.0) == 8


def test_default_weights_load_from_the_cache_and_each_clip_is_one_prediction(video, torch_home, tmp_path):
    state = cached_weights(torch_home, "mc3_18")
    out = tmp_path / "out"
    result = run(
        video, "-m", "mc3_18", "--input-size", SIZE, "--clip-stride", 8, "-o", out, "--manifest", out / "m.jsonl"
    )
    assert result.exit_code == EXIT_OK, result.output
    rows = rows_of(out / "m.jsonl")
    assert [(row["clip"]["index"], row["clip"]["start"], row["clip"]["end"]) for row in rows] == [
        (0, 0, 32),
        (1, 8, 40),
    ]
    model = model_with("mc3_18", state)
    frames = read_frames(video)
    spec = load_model("mc3_18").input_spec
    for row in rows:
        start = row["clip"]["start"]
        x = clip_input(frames, centre_frames(start, 16, 32), SIZE, spec.mean, spec.std)
        with torch.no_grad():
            probabilities = model(x).softmax(dim=1)[0]
        top = probabilities.topk(5)
        assert [p["index"] for p in row["predictions"]] == top.indices.tolist()
        assert [p["probability"] for p in row["predictions"]] == pytest.approx(top.values.tolist(), abs=2e-6)
        assert row["target"]["index"] == row["predictions"][0]["index"] and row["layer"] == "layer4"
        assert row["clip"]["seconds"] == [round(start / FPS, 4), round(row["clip"]["end"] / FPS, 4)]
        assert sum(row["clip"]["shares"]) == pytest.approx(1.0, abs=1e-4) and len(row["clip"]["shares"]) == 32
        assert row["clip"]["score"] == row["target"]["probability"]
        assert row["fingerprint"]["size"] == [32, SIZE, 70] and len(row["fingerprint"]["depth"]) == 32


# --- maps in time and space -----------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("name", "layer"), [("r3d_18", "layer4"), ("mc3_18", "layer4"), ("r2plus1d_18", "layer4")])
def test_3d_cnn_maps_through_the_command_line_match_the_papers_formulas(video, torch_home, tmp_path, name, layer):
    state = cached_weights(torch_home, name, seed=3)
    out = tmp_path / "out"
    methods = list(REFERENCES)
    args = [video, "-m", name, "--input-size", SIZE, "--method", ",".join(methods), "--save-raw", "-o", out]
    result = run(*args, "--manifest", out / "m.jsonl")
    assert result.exit_code == EXIT_OK, result.output
    rows = rows_of(out / "m.jsonl")
    model = model_with(name, state)
    frames = read_frames(video)
    spec = load_model(name, "none").input_spec
    for row in rows:
        start, end = row["clip"]["start"], row["clip"]["end"]
        x = clip_input(frames, centre_frames(start, 16, 32), SIZE, spec.mean, spec.std)
        a, g, top = captured(model, dict(model.named_modules())[layer], x)
        assert row["target"]["index"] == top
        expected = resized(REFERENCES[row["method"]](a, g), (32, SIZE, 70))[: end - start]
        got = np.load(row["outputs"][2])
        assert got.shape == (end - start, SIZE, 70)
        assert pearson(got, expected) >= 0.999, (row["method"], start)
    assert {row["method"] for row in rows} == set(methods)


@pytest.mark.quick
@pytest.mark.parametrize("method", ["occlusion", "fullgrad", "guided-backprop"])
def test_methods_not_defined_for_clips_are_refused_in_one_line(video, tmp_path, method):
    result = run(video, "-m", "mc3_18", "--weights", "none", "--input-size", SIZE, "--method", method, "-o", tmp_path)
    assert result.exit_code == EXIT_USAGE
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {method} is defined for 2-D maps only; ")


@pytest.mark.quick
def test_options_that_do_not_apply_are_refused(video, tmp_path):
    message = "--every is for image models; mc3_18 takes clips: space them with --clip-stride"
    for every in ("2", "1"):  # 1 is given too, though it is what image models default to
        result = run(video, "-m", "mc3_18", "--weights", "none", "--every", every, "-o", tmp_path)
        assert result.exit_code == EXIT_USAGE
        assert result.stderr.strip() == f"error: {message}"
    image = ROOT / "sample_images" / "chelsea.jpg"
    result = run(video, image, "-m", "mc3_18", "--weights", "none", "-o", tmp_path)
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.strip() == f"error: mc3_18 takes clips: give it videos; {image} is an image"


@pytest.mark.quick
@pytest.mark.parametrize(
    ("option", "message"),
    [
        (
            "--clip-stride",
            "--clip-stride is for video models; resnet18 takes images, explained frame by frame (--every)",
        ),
        ("--save-raw", "--save-raw does not apply to video inputs ({video}); run the videos without it"),
    ],
)
def test_an_image_model_on_a_video_keeps_explaining_frame_by_frame_and_refuses_clip_options(
    video, tmp_path, option, message
):
    extra = [option, "4"] if option == "--clip-stride" else [option]
    result = run(video, "-m", "resnet18", "--weights", "none", *extra, "-o", tmp_path)
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.strip().startswith("error: " + message.format(video=video))


# --- outputs ----------------------------------------------------------------------------------------------------------


def _grey_run(video: Path, out: Path, *extra: str | Path) -> object:
    """An mc3_18 run (its cached weights) with alpha 1 and the grey colormap: the overlay is the map itself."""
    args = ["-m", "mc3_18", "--input-size", SIZE, "--clip-stride", 8, "--alpha", 1, "--colormap", "gray"]
    return run(video, *args, "--save-raw", "-o", out, "--manifest", out / "m.jsonl", *extra)


def test_overlay_video_blends_overlapping_clips_at_the_videos_size_and_rate(video, torch_home, tmp_path):
    cached_weights(torch_home, "mc3_18")
    out = tmp_path / "out"
    result = _grey_run(video, out)
    assert result.exit_code == EXIT_OK, result.output
    first, second = rows_of(out / "m.jsonl")
    overlay = Path(first["outputs"][0])
    assert overlay == out / "walk_gradcam_top1.mp4" and second["outputs"][0] == str(overlay)
    info = probe(overlay)
    assert (info.fps, info.width, info.height) == (FPS, WIDTH, HEIGHT)
    shown = read_frames(overlay)
    assert len(shown) == FRAMES
    maps = [np.load(row["outputs"][2]) for row in (first, second)]
    assert [m.shape for m in maps] == [(32, SIZE, 70)] * 2
    for number in (0, 5, 12, 20, 30, 36):  # clip 0 alone, both (frames 8 to 31), clip 1 alone
        clips = [(m, row["clip"]["start"]) for m, row in zip(maps, (first, second), strict=True)]
        covering = [m[number - start] for m, start in clips if start <= number < start + 32]
        mean = torch.from_numpy(np.mean(covering, axis=0))[None, None]
        expected = F.interpolate(mean, (HEIGHT, WIDTH), mode="bilinear", align_corners=False)[0, 0]
        assert pearson(shown[number][:, :, 1].astype(np.float64), expected) >= 0.98, number
    curve = Path(first["outputs"][1])
    assert curve == out / "walk_gradcam_top1_curve.png" and curve.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "m.jsonl",
        "walk_gradcam_top1.mp4",
        "walk_gradcam_top1_clip000.npy",
        "walk_gradcam_top1_clip001.npy",
        "walk_gradcam_top1_curve.png",
    ]


def test_skip_existing_keeps_the_clip_rows_and_diff_pairs_each_clip(video, torch_home, tmp_path):
    cached_weights(torch_home, "mc3_18")
    out = tmp_path / "out"
    assert _grey_run(video, out).exit_code == EXIT_OK
    earlier = rows_of(out / "m.jsonl")
    stamps = {path: path.stat().st_mtime_ns for path in out.glob("walk_*")}  # the overlay, plot and raw maps
    again = _grey_run(video, out, "--skip-existing")
    assert again.exit_code == EXIT_OK, again.output
    rows = rows_of(out / "m.jsonl")
    assert [row["status"] for row in rows] == ["skipped", "skipped"]
    assert [row["clip"] for row in rows] == [row["clip"] for row in earlier]
    assert [row["fingerprint"] for row in rows] == [row["fingerprint"] for row in earlier]
    assert len(stamps) == 4 and all(path.stat().st_mtime_ns == stamp for path, stamp in stamps.items())
    refused = _grey_run(video, out, "--skip-existing", "--clip-stride", "16")
    assert refused.exit_code == EXIT_USAGE and "--clip-stride 8 (this run: 16)" in refused.stderr

    same = CliRunner().invoke(diff_app, [str(out), str(out), "--json"])
    assert same.exit_code == EXIT_OK, same.output
    report = json.loads(same.stdout)
    assert [pair["input"] for pair in report["pairs"]] == [f"{video}#clip0", f"{video}#clip1"]
    cached_weights(torch_home, "mc3_18", seed=9)  # other weights: other maps
    other = tmp_path / "other"
    assert _grey_run(video, other).exit_code == EXIT_OK
    drifted = json.loads(CliRunner().invoke(diff_app, [str(out), str(other), "--json"]).stdout)
    assert [pair["input"] for pair in drifted["pairs"]] == [f"{video}#clip0", f"{video}#clip1"]
    assert [pair["pearson"] < 0.99 for pair in drifted["pairs"]] == [True, True]  # each clip's own map compared


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "size", "layer", "grid"),
    [
        ("swin3d_t", 64, "norm", (16, 2, 2)),
        ("mvit_v2_s", None, "blocks.15.norm1", (8, 7, 7)),
        ("s3d", None, "features", (2, 7, 7)),
    ],
)
def test_video_models_maps_at_their_default_layer_match_the_papers_formulas(name, size, layer, grid):
    """Swin3D's channel-last (N, t, h, w, C) stage after its windows are merged back, MViT's (N, 1 + t*h*w, C)
    tokens after its pooling (the class token dropped, the grid time slowest), before its last attention (the head
    reads the class token only), S3D's last stage (on 16 frames, not its 128, to stay light). Eigen-CAM is left out
    of the transformers: its maps' sign follows the channel sum, which a LayerNorm output (both layers are one) holds
    near zero at every position, so the sign is arbitrary there."""
    torch.manual_seed(1)  # the random weights
    loaded = load_model(name, "none", input_size=size)
    frames, side = loaded.input_spec.shape[1], loaded.input_spec.shape[2]
    if name == "s3d":
        frames = 16
        loaded = loaded.with_profile(input_spec=replace(loaded.input_spec, shape=(3, frames, side, side)))
    x = torch.randn(1, 3, frames, side, side, generator=torch.Generator().manual_seed(0))
    methods = [method for method in REFERENCES if method != "eigencam" or name == "s3d"]
    explainer = Explainer(loaded, methods=methods)
    assert explainer.chosen.layers == (layer,)
    result = explainer.explain_batch(x, [(frames, side, side)])[0]
    a, g, top = captured(loaded.module.eval(), dict(loaded.module.named_modules())[layer], x)
    if a.dim() == 3:  # tokens: the class token, then t x h x w
        a, g = (t[:, 1:].reshape(1, *grid, -1).movedim(-1, 1) for t in (a, g))
    elif name.startswith("swin"):  # channel-last
        a, g = a.movedim(-1, 1), g.movedim(-1, 1)
    assert a.shape[2:] == grid
    for explanation in result.explanations:
        assert explanation.target.index == top
        expected = resized(REFERENCES[explanation.method](a, g), (frames, side, side))
        assert pearson(explanation.saliency, expected) >= 0.999, explanation.method


@pytest.mark.quick
def test_a_clips_tokens_are_read_as_a_grid_in_time_and_space():
    clip = (16, 224, 224)
    assert infer_layout((1, 1 + 8 * 7 * 7, 768), clip, prefix_tokens=1) == Layout("tokens", 7, 7, 1, leading=(8,))
    assert infer_layout((1, 8 * 14 * 14, 384), clip) == Layout("tokens", 14, 14, 0, leading=(8,))  # not 2 x 28 x 28
    assert infer_layout((1, 8 * 14 * 14, 384), clip, tokens=False) is None
    tokens = torch.arange(2 * (1 + 2 * 3 * 4) * 5.0).view(2, 25, 5)
    maps = to_spatial(tokens, Layout("tokens", 3, 4, 1, leading=(2,)))
    assert maps.shape == (2, 5, 2, 3, 4)
    assert torch.equal(maps[:, :, 1, 2, 3], tokens[:, 1 + 1 * 12 + 2 * 4 + 3])  # time slowest, then rows, columns


@pytest.fixture
def videomae(tmp_path: Path) -> Path:
    """A tiny VideoMAE classifier saved with save_pretrained: 4 frames of 32 x 32, tubelets of 2 x 8 x 8 (2 x 4 x 4
    tokens, no class token), 3 classes."""
    transformers = pytest.importorskip("transformers")
    config = transformers.VideoMAEConfig(
        image_size=32,
        patch_size=8,
        num_frames=4,
        tubelet_size=2,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        id2label={0: "walk", 1: "run", 2: "sit"},
        label2id={"walk": 0, "run": 1, "sit": 2},
    )
    torch.manual_seed(5)
    folder = tmp_path / "videomae"
    transformers.VideoMAEForVideoClassification(config).save_pretrained(folder)
    processor = transformers.VideoMAEImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    processor.save_pretrained(folder)
    return folder


def test_a_hugging_face_video_transformers_tubelet_maps_match_the_papers_formulas(videomae, tmp_path):
    square = write_video(tmp_path / "square.mp4", 8, FPS, (48, 48), lambda n: _square(n)[8:56, 8:56].copy())
    out = tmp_path / "out"
    methods = ["gradcam", "hirescam", "layercam", "eigengradcam"]
    args = [square, "-m", f"hf:{videomae}", "--method", ",".join(methods), "--save-raw", "-o", out]
    result = run(*args, "--manifest", out / "m.jsonl")
    assert result.exit_code == EXIT_OK, result.output
    rows = rows_of(out / "m.jsonl")
    assert [(row["clip"]["start"], row["clip"]["end"]) for row in rows[:: len(methods)]] == [(0, 4), (4, 8)]
    assert rows[0]["layer"] == "model.videomae.encoder.layer.1"  # the last layer: the head pools every token
    model = transformers_model(videomae)
    frames = read_frames(square)
    for row in rows:
        start = row["clip"]["start"]
        x = clip_input(frames, list(range(start, start + 4)), 32, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
        hf = _HuggingFaceClips(model)
        a, g, top = captured(hf, model.videomae.encoder.layer[1], x)
        assert row["target"]["index"] == top and row["predictions"][0]["name"] in ("walk", "run", "sit")
        a, g = (t.reshape(1, 2, 4, 4, -1).movedim(-1, 1) for t in (a, g))  # tubelets, time slowest
        expected = resized(REFERENCES[row["method"]](a, g), (4, 32, 32))
        assert pearson(np.load(row["outputs"][2]), expected) >= 0.999, row["method"]


class _HuggingFaceClips(torch.nn.Module):
    """(N, C, T, H, W) clips handed to a transformers video model as its (N, T, C, H, W) pixel_values, logits out."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=x.permute(0, 2, 1, 3, 4)).logits


def transformers_model(folder: Path) -> torch.nn.Module:
    import transformers

    return transformers.VideoMAEForVideoClassification.from_pretrained(folder).eval()


# --- failures and the gallery, with a bare 3-D CNN (4 frames, every frame) --------------------------------------------


def _bare_runner(out: Path, **options: object) -> ClipRunner:
    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Conv3d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool3d(1), torch.nn.Flatten()
    ).eval()
    spec = InputSpec(size=16, shape=(3, 4, 16, 16))
    model = LoadedModel(module, "bare3d", "random", ["a", "b", "c", "d"], spec)
    assert model.profile.clips == ClipSpec(4)
    explainer = Explainer(model, "1", ["gradcam"])
    return ClipRunner(explainer, ClipSpec(4), OutputOptions(out, save_raw=True, **options), RunOptions())


@pytest.mark.quick
def test_a_video_that_fails_half_way_leaves_nothing_behind(video, tmp_path, monkeypatch):
    runner = _bare_runner(tmp_path)
    calls = []
    release = ClipRunner._release

    def failing(self, state, until, *rest):
        if state.clips and len(calls) > 20:
            raise OSError(28, "No space left on device")
        calls.append(until)
        return release(self, state, until, *rest)

    monkeypatch.setattr(ClipRunner, "_release", failing)
    records = runner.run(InputImage(video, Path("walk")))
    assert [record.status for record in records] == ["error"]
    assert records[0].error == f"{video}: no space left on device"
    assert list(tmp_path.iterdir()) == []  # no raw map, overlay, plot or temporary left
    text = tmp_path / "text.mp4"
    text.write_text("not a video")
    assert [r.error for r in runner.run(InputImage(text, Path("text")))] == [f"{text}: not a video OpenCV can read"]


def test_a_video_whose_writing_thread_fails_half_way_leaves_nothing_behind(video, tmp_path, monkeypatch):
    """The overlay frames are blended and encoded in a thread of their own: its error is the video's error row."""
    runner = _bare_runner(tmp_path)
    written = []
    write_frame = ClipRunner._write_frame

    def failing(self, state):
        write = write_frame(self, state)

        def writing(item):
            if len(written) == 10:
                raise OSError(28, "No space left on device")
            written.append(write(item))

        return writing

    monkeypatch.setattr(ClipRunner, "_write_frame", failing)
    records = runner.run(InputImage(video, Path("walk")))
    assert [record.status for record in records] == ["error"] and len(written) == 10
    assert records[0].error == f"{video}: no space left on device"
    assert list(tmp_path.iterdir()) == []  # no raw map, overlay, plot or temporary left


@pytest.mark.quick
def test_the_gallery_shows_one_overlay_video_per_method_with_every_clips_files(video, tmp_path):
    import cv2

    records = _bare_runner(tmp_path, report=True).run(InputImage(video, Path("walk")))
    assert len(records) == FRAMES // 4 and {r.outputs[0] for r in records} == {str(tmp_path / "walk_gradcam_top1.mp4")}
    (entry,) = gallery_entries(records, tmp_path)
    (view,) = entry["views"]
    assert view["kind"] == "video"
    assert [kind for kind, _ in view["files"]] == ["importance over time"] + ["raw map"] * (FRAMES // 4)
    assert view["curve"] == "walk_gradcam_top1_curve.png" and (tmp_path / view["curve"]).is_file()  # beside the video
    assert view["preview"] == "_thumbs/walk_gradcam_top1.webm"  # the WebM the card plays: every frame, same size
    overlay, preview = probe(tmp_path / "walk_gradcam_top1.mp4"), probe(tmp_path / view["preview"])
    assert (preview.width, preview.height, preview.fps) == (overlay.width, overlay.height, overlay.fps)
    capture = cv2.VideoCapture(str(tmp_path / view["preview"]))
    assert sum(1 for _ in frames(capture)) == FRAMES
    capture.release()


@pytest.mark.quick
def test_frames_are_decoded_and_prepared_in_a_background_thread_in_order(video):
    import threading

    import cv2

    threads = set()

    def prepare(frame: np.ndarray) -> int:
        threads.add(threading.current_thread().name)
        return int(frame[0, 0, 1])  # each frame its own shade of green

    capture = cv2.VideoCapture(str(video))
    shades = list(read_ahead(capture, prepare, ahead=2))
    capture.release()
    assert threads == {"gradcam-video-decode"}
    assert len(shades) == FRAMES and all(abs(shade - (120 + number)) <= 3 for number, shade in enumerate(shades))

    def failing(frame: np.ndarray) -> int:
        raise ValueError("a frame it cannot take")

    capture = cv2.VideoCapture(str(video))
    with pytest.raises(ValueError, match="a frame it cannot take"):
        list(read_ahead(capture, failing))
    early = read_ahead(capture, prepare, ahead=1)
    next(early)
    early.close()  # stops the thread (it joins before close returns)
    assert "gradcam-video-decode" not in {thread.name for thread in threading.enumerate()}
    capture.release()


@pytest.mark.quick
def test_diff_sees_a_clip_map_moving_in_time_that_its_mean_over_the_frames_hides(tmp_path):
    early, late = torch.zeros(16, 32, 32), torch.zeros(16, 32, 32)
    early[:4, 8:16, 8:16] = 1.0
    late[12:, 8:16, 8:16] = 1.0  # the same place, other frames: the same mean over the frames

    def manifest(name: str, saliency: torch.Tensor) -> Path:
        target = {"index": 3, "name": "walk", "probability": 0.9}
        clip = {"index": 0, "start": 0, "end": 16, "seconds": [0, 0.5], "shares": [], "score": 0.9}
        row = {"input": "v.mp4", "status": "ok", "method": "gradcam", "target": target, "predictions": [target]}
        path = tmp_path / name
        path.write_text(json.dumps({**row, "fingerprint": map_fingerprint(saliency), "clip": clip}) + "\n")
        return path

    same = diff_runs(manifest("a.jsonl", early), manifest("b.jsonl", early))
    assert not same.drift and same.results[0].time_pearson == 1.0
    moved = diff_runs(manifest("a.jsonl", early), manifest("c.jsonl", late))
    (result,) = moved.results
    assert result.input == "v.mp4#clip0" and result.pearson == 1.0  # the grids agree
    assert moved.drift and result.reasons == [f"over the frames: pearson {result.time_pearson:.3f} < 0.95"]
    assert result.to_dict()["pearson_time"] == round(result.time_pearson, 6) and result.time_pearson < 0
