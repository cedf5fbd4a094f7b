"""Video: `gradcam clip.mp4` writes an overlay clip with the input's frame rate, size and frame count."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2")

from gradcam_cli.cam.explainer import Explainer  # noqa: E402
from gradcam_cli.io.discovery import InputImage  # noqa: E402
from gradcam_cli.io.naming import RUN_RECORD_NAME, preview_path  # noqa: E402
from gradcam_cli.io.video import probe  # noqa: E402
from gradcam_cli.options import OutputOptions, RunOptions  # noqa: E402
from gradcam_cli.pipeline.video import VideoRunner  # noqa: E402

FRAMES, WIDTH, HEIGHT, FPS, SIDE = 20, 96, 64, 12.0, 16


def _square_x(frame: int) -> int:
    return 4 + 4 * frame  # the red square's left edge moves 4 px right per frame


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """20 frames, 96x64, 12 fps: a grey field with a 16 px red square moving left to right."""
    path = tmp_path_factory.mktemp("video") / "clip.mp4"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), FPS, (WIDTH, HEIGHT))
    assert writer.isOpened()
    for frame in range(FRAMES):
        image = np.full((HEIGHT, WIDTH, 3), 128, np.uint8)
        image[24 : 24 + SIDE, _square_x(frame) : _square_x(frame) + SIDE] = (20, 20, 230)  # BGR red
        writer.write(image)
    writer.release()
    return path


@pytest.fixture
def explainer(square_model) -> Explainer:
    return Explainer(square_model, "features")


def _read(path: Path | str) -> list[np.ndarray]:
    capture = cv2.VideoCapture(str(path))
    frames = []
    while True:
        ok, frame = capture.read()
        if not ok:
            break
        frames.append(frame)
    capture.release()
    return frames


def _peak_x(frame: np.ndarray) -> float:
    """Column of the brightest region of a grey-colormap, alpha=1 overlay (the map itself): plateau centre."""
    grey = cv2.GaussianBlur(frame[:, :, 1].astype(np.float32), (5, 5), 0)
    columns = np.nonzero(grey >= grey.max() - 2)[1]
    return float(columns.mean())


def _run(explainer: Explainer, clip: Path, out: Path, every: int, **options) -> tuple[list, list[int]]:
    calls: list[int] = []
    explainer = explainer.with_options(target_class=0)
    output = OutputOptions(output_dir=out, alpha=1.0, colormap="gray", **options)
    runner = VideoRunner(explainer, output, RunOptions(every=every))
    records = runner.run(InputImage(clip, Path("clip")), on_frame=lambda: calls.append(1))
    return records, calls


def test_overlay_video_keeps_rate_size_and_frames_and_the_map_follows_the_square(
    explainer: Explainer, clip: Path, tmp_path: Path
) -> None:
    records, calls = _run(explainer, clip, tmp_path, every=1)
    assert [r.status for r in records] == ["ok"]
    output = Path(records[0].outputs[0])
    assert output.name == "clip_gradcam_0-red.mp4"
    info = probe(output)
    assert (info.fps, info.width, info.height) == (FPS, WIDTH, HEIGHT)
    frames = _read(output)
    assert len(frames) == FRAMES and len(calls) == FRAMES  # progress: one call per frame
    for number, frame in enumerate(frames):
        centre = _square_x(number) + SIDE / 2
        assert abs(_peak_x(frame) - centre) <= 4, number
    assert records[0].target.name == "red"
    assert [p.name for p in tmp_path.iterdir()] == [output.name]  # no temporaries left


@pytest.mark.quick
@pytest.mark.parametrize("every", [5, 40])  # 40: frames stream out behind each explained frame (no buffering)
def test_every_n_explains_every_nth_frame_and_holds_the_map(
    explainer: Explainer, clip: Path, tmp_path: Path, every: int
) -> None:
    records, calls = _run(explainer, clip, tmp_path, every=every)
    frames = _read(records[0].outputs[0])
    assert len(frames) == FRAMES and len(calls) == FRAMES
    for number, frame in enumerate(frames):
        key = number - number % every  # the explained frame whose map this frame shows
        assert abs(_peak_x(frame) - (_square_x(key) + SIDE / 2)) <= 4, number
        if number % every:
            held = frames[key].astype(np.float32)
            assert np.abs(frame.astype(np.float32) - held).mean() < 3  # alpha=1: the held map, unchanged


def test_top_k_writes_one_video_per_rank_and_report_thumbnails(explainer: Explainer, clip: Path, tmp_path: Path):
    explainer = explainer.with_options(top_k=2)
    options = OutputOptions(output_dir=tmp_path, report=True)
    records = VideoRunner(explainer, options, RunOptions(every=4)).run(InputImage(clip, Path("sub/clip")))
    names = [Path(r.outputs[0]).name for r in records]
    assert names == ["clip_gradcam_top1.mp4", "clip_gradcam_top2.mp4"]
    assert all(len(_read(r.outputs[0])) == FRAMES for r in records)
    assert records[0].predictions[0].name == "red"  # mean over the explained frames
    assert sorted(p.name for p in (tmp_path / "_thumbs" / "sub").iterdir()) == [
        "clip_gradcam_top1.jpg",
        "clip_gradcam_top1.webm",
        "clip_gradcam_top2.jpg",
        "clip_gradcam_top2.webm",
    ]
    for record in records:  # the gallery's previews: every frame, at the clip's size (under 480 px: not scaled)
        preview = preview_path(tmp_path, record.outputs[0])
        assert preview.parent == tmp_path / "_thumbs" / "sub"
        info = probe(preview)
        assert (info.width, info.height, info.fps) == (WIDTH, HEIGHT, FPS) and len(_read(preview)) == FRAMES


def test_a_preview_that_cannot_be_written_leaves_nothing_behind(
    explainer: Explainer, clip: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gradcam_cli.io.video

    def full_disk(source: Path, target: Path, side: int = 480) -> int:
        target.write_bytes(b"half")  # as a writer stopped half way
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gradcam_cli.io.video, "write_preview", full_disk)
    out = tmp_path / "out"
    (record,) = VideoRunner(explainer, OutputOptions(out, report=True)).run(InputImage(clip, Path("clip")))
    assert record.status == "error" and record.error == f"{clip}: no space left on device"
    assert [p for p in out.rglob("*") if p.is_file()] == []  # neither the overlay nor its thumbnail stays


def test_a_clip_that_fails_midway_leaves_no_video_and_no_thumbnail(
    explainer: Explainer, clip: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flush = VideoRunner._flush
    calls: list[int] = []

    def fails_the_second_time(self: VideoRunner, *args: object) -> None:
        calls.append(1)
        if len(calls) == 2:  # the first frames (and their overlays) are done: the disk fills up, say
            raise OSError(28, "No space left on device")
        flush(self, *args)

    monkeypatch.setattr(VideoRunner, "_flush", fails_the_second_time)
    out = tmp_path / "out"
    runner = VideoRunner(explainer, OutputOptions(out, report=True), RunOptions(batch_size=2))
    (record,) = runner.run(InputImage(clip, Path("clip")))
    assert record.status == "error" and record.error == f"{clip}: no space left on device"
    assert len(calls) == 2
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == []


def test_unreadable_video_is_one_error_and_leaves_nothing(explainer: Explainer, tmp_path: Path) -> None:
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"\x00" * 1000)
    out = tmp_path / "out"
    records, _ = _run(explainer, bad, out, every=1)
    assert [r.status for r in records] == ["error"]
    assert records[0].error == f"{bad}: not a video OpenCV can read"
    assert not out.exists() or not any(out.rglob("*.mp4"))


def test_cli_routes_videos_by_suffix(clip: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """`gradcam clip.mp4 IMAGE --report`: the clip goes to the video runner, the image to the batch runner."""
    from square_model import CLI_OPTIONS, square_image
    from typer.testing import CliRunner

    from gradcam_cli.cli import app

    image = tmp_path / "still.png"
    square_image().save(image)
    out = tmp_path / "out"
    args = [str(clip), str(image), *CLI_OPTIONS, "-o", str(out), "--every", "3", "--report", "--workers", "0"]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    assert probe(out / "clip_gradcam_top1.mp4").width == WIDTH
    assert len(_read(out / "clip_gradcam_top1.mp4")) == FRAMES
    assert len(list(out.glob("still_gradcam_*.png"))) == 1
    page = (out / "index.html").read_text()
    assert "clip_gradcam_top1.mp4" in page and "still_gradcam_" in page
    assert '"preview":"_thumbs/clip_gradcam_top1.webm"' in page  # the WebM the card plays
    capture = cv2.VideoCapture(str(out / "_thumbs" / "clip_gradcam_top1.webm"))
    fourcc = int(capture.get(cv2.CAP_PROP_FOURCC)).to_bytes(4, "little").decode()
    capture.release()
    assert fourcc == "VP80" and len(_read(out / "_thumbs" / "clip_gradcam_top1.webm")) == FRAMES
    assert "VP80" not in capfd.readouterr().err  # OpenCV's complaint about the tag, printed by C, is kept off


# --- options that do not apply to videos, the seconds column, unreadable files ----------------------------------


def _square_cli_args(out: Path) -> list[str]:
    from square_model import CLI_OPTIONS

    return [*CLI_OPTIONS, "-o", str(out), "--workers", "0"]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--panel"], "--panel does not apply"),
        (["--save-heatmap", "--report"], "--save-heatmap does not apply"),
        (["--panel", "--save-raw", "--save-heatmap"], "--save-raw, --save-heatmap and --panel do not apply"),
    ],
)
def test_image_only_options_are_refused_for_videos_before_the_model_loads(
    clip: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str], expected: str
) -> None:
    from typer.testing import CliRunner

    from gradcam_cli.cli import app
    from gradcam_cli.errors import EXIT_USAGE

    def no_model(*_args: object, **_kwargs: object) -> Explainer:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(Explainer, "from_options", no_model)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [str(clip), *flags, *_square_cli_args(out)])
    assert result.exit_code == EXIT_USAGE, result.output
    them = "them" if "do not" in expected else "it"
    assert result.stderr.splitlines() == [f"error: {expected} to video inputs ({clip}); run the videos without {them}"]
    assert not out.exists()


@pytest.mark.quick
def test_video_option_check_names_the_videos_and_lets_report_through(tmp_path: Path) -> None:
    from gradcam_cli.errors import UsageError
    from gradcam_cli.pipeline.video import check_video_options

    videos = [InputImage(Path("a.mp4"), Path("a")), InputImage(Path("b/c.mkv"), Path("c"))]
    check_video_options(OutputOptions(report=True, manifest=tmp_path / "m.jsonl"), videos)  # no error
    check_video_options(OutputOptions(panel=True, save_raw=True), [])  # images only: no error
    with pytest.raises(UsageError) as raised:
        check_video_options(OutputOptions(save_raw=True), videos)
    assert str(raised.value) == "--save-raw does not apply to video inputs (a.mp4, b/c.mkv); run the videos without it"
    many = [InputImage(Path(f"{n}.mp4"), Path(str(n))) for n in range(5)]
    with pytest.raises(
        UsageError, match=r"^--panel does not apply to video inputs \(0.mp4, 1.mp4, 2.mp4 and 2 more\);"
    ):
        check_video_options(OutputOptions(panel=True), many)


def test_each_row_of_a_clip_reports_the_whole_clips_seconds(
    explainer: Explainer, clip: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fake clock that moves one second per frame written: the clip took FRAMES seconds, and so does each row."""
    import types

    import gradcam_cli.pipeline.video as video_module

    now = [100.0]
    monkeypatch.setattr(video_module, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    explainer = explainer.with_options(top_k=2)
    runner = VideoRunner(explainer, OutputOptions(output_dir=tmp_path), RunOptions(every=4))

    def tick() -> None:
        now[0] += 1.0

    records = runner.run(InputImage(clip, Path("clip")), on_frame=tick)
    assert [r.status for r in records] == ["ok", "ok"]
    assert [r.seconds for r in records] == [float(FRAMES), float(FRAMES)]


@pytest.mark.slow  # a subprocess of its own
def test_unreadable_videos_are_one_line_each_with_no_decoder_noise(clip: Path, tmp_path: Path) -> None:
    """A text file, an empty file, a truncated mp4 and a clip with no frames: one `error:` line each, naming the
    file and the reason, exit 1, and the good clip beside them still explained. Run as a real process, so that what
    FFmpeg and OpenCV print from C onto file descriptor 2 is captured too."""
    import subprocess
    import sys

    from conftest import ROOT

    from gradcam_cli.errors import EXIT_IMAGE_FAILED

    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "text.mp4").write_text("not a video\n")
    (inputs / "empty.mp4").write_bytes(b"")
    (inputs / "truncated.mp4").write_bytes(clip.read_bytes()[: clip.stat().st_size // 2])
    writer = cv2.VideoWriter(str(inputs / "noframes.avi"), cv2.VideoWriter_fourcc(*"MJPG"), FPS, (WIDTH, HEIGHT))
    writer.release()
    good = inputs / "good.mp4"
    good.write_bytes(clip.read_bytes())
    bad = ["text.mp4", "empty.mp4", "truncated.mp4", "noframes.avi"]
    out = tmp_path / "out"
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    for name in ("OPENCV_FFMPEG_LOGLEVEL", "OPENCV_LOG_LEVEL"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-m", "gradcam_cli", *[str(inputs / n) for n in [*bad, "good.mp4"]], *_square_cli_args(out)],
        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == EXIT_IMAGE_FAILED, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    *errors, summary = lines
    assert errors == [
        f"error: {inputs / 'text.mp4'}: not a video OpenCV can read",
        f"error: {inputs / 'empty.mp4'}: not a video OpenCV can read",
        f"error: {inputs / 'truncated.mp4'}: not a video OpenCV can read",
        f"error: {inputs / 'noframes.avi'}: no frames could be decoded",
    ]
    assert summary.startswith("done: 1 ok, 4 failed, 0 skipped")
    assert len(_read(out / "good_gradcam_top1.mp4")) == FRAMES
    assert sorted(p.name for p in out.iterdir() if p.name != RUN_RECORD_NAME) == ["good_gradcam_top1.mp4"]


@pytest.mark.quick
def test_a_preview_is_scaled_down_to_480_pixels_keeping_every_frame(tmp_path: Path) -> None:
    from gradcam_cli.io.video import preview_size, write_preview

    source = tmp_path / "big.mp4"
    writer = cv2.VideoWriter(str(source), cv2.VideoWriter_fourcc(*"mp4v"), FPS, (960, 540))
    for frame in range(5):
        image = np.zeros((540, 960, 3), np.uint8)
        image[:, : 192 * (frame + 1)] = (0, 200, 0)  # green grows from the left, a fifth per frame
        writer.write(image)
    writer.release()
    target = tmp_path / "_thumbs" / "big.webm"
    assert write_preview(source, target) == 5
    info = probe(target)
    assert (info.width, info.height, info.fps) == (480, 270, FPS)
    frames = _read(target)
    assert len(frames) == 5
    for number, frame in enumerate(frames):  # the frames in order, scaled (not cropped)
        green = (frame[135, :, 1] > 100).mean()
        assert abs(green - (number + 1) / 5) < 0.05, number
    assert sorted(p.name for p in target.parent.iterdir()) == ["big.webm"]  # no temporary left
    assert preview_size(100, 300) == (100, 300) and preview_size(1001, 3001) == (160, 480)
