"""Batch processing: shape buckets that change no result, bounded memory, isolation of bad files, resume, CLI."""

from __future__ import annotations

import contextlib
import io
import math
import os
import select
import struct
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import split_options
from model_state import with_random_statistics
from PIL import Image, JpegImagePlugin
from square_model import square_image
from typer.testing import CliRunner

from gradcam_cli import Explainer, load_model
from gradcam_cli.cli import app
from gradcam_cli.io.discovery import discover
from gradcam_cli.io.images import InputSpec
from gradcam_cli.options import OutputOptions, RunOptions
from gradcam_cli.pipeline.batch import BatchRunner
from gradcam_cli.pipeline.decode import Sample, bucketed, decode_in_thread, default_workers
from gradcam_cli.pipeline.outputs import OutputKind

ROOT = Path(__file__).resolve().parents[2]
SQUARE_MODEL = f"{ROOT / 'tests' / 'square_model.py'}:build"


def gradcam_command() -> list[str]:
    script = Path(sys.executable).parent / "gradcam"
    return [str(script)] if script.exists() else [sys.executable, "-m", "gradcam_cli"]


def photo(size: tuple[int, int], seed: int = 0) -> Image.Image:
    """A sample photo resized to ``size`` (W, H) with a little noise: real structure, different per seed."""
    names = sorted((ROOT / "sample_images").glob("*.jpg"))
    image = Image.open(names[seed % len(names)]).convert("RGB").resize(size, Image.Resampling.BILINEAR)
    noise = np.random.default_rng(seed).normal(0, 4, (size[1], size[0], 3))
    return Image.fromarray(np.clip(np.asarray(image) + noise, 0, 255).astype(np.uint8))


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that claims width x height pixels in a few bytes: a decompression bomb's calling card."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def jpeg_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def make_bad_files(folder: Path) -> dict[str, str]:
    """Every kind of bad file a real folder holds, with a word its error message must contain."""
    folder.mkdir(parents=True, exist_ok=True)
    good = jpeg_bytes(square_image())
    (folder / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (folder / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(2000))
    (folder / "notes.jpg").write_text("this is not an image\n")
    (folder / "empty.png").write_bytes(b"")
    (folder / "bomb.png").write_bytes(png_header_only(20_000, 20_000))
    os.symlink(folder / "gone.jpg", folder / "dangling.jpg")
    os.mkfifo(folder / "pipe.jpg")  # would block forever if opened
    return {
        "truncated.jpg": "truncated",
        "corrupt.png": "",
        "notes.jpg": "not an image",
        "empty.png": "empty",
        "bomb.png": "too many pixels",
        "dangling.jpg": "broken symbolic link",
        "pipe.jpg": "not a regular file",
    }


@pytest.fixture(scope="module")
def resnet18():
    torch.manual_seed(0)
    # random weights, BatchNorm in eval mode while explaining; a 112-pixel input keeps the test quick
    loaded = load_model("resnet18", "none", input_size=112)
    with_random_statistics(loaded.module)
    return loaded


@pytest.mark.parametrize("fold", [False, True])
def test_mixed_sizes_batched_give_the_same_maps_as_each_image_alone(tmp_path, resnet18, monkeypatch, fold):
    # 640x480 and 320x240 share a resized shape (112 x 149), so they share a batch; the others get their own.
    # fold: as in runs of FOLD_MIN_IMAGES or more, batch norms folded into convolutions (with statistics far from
    # the identity), compared with the unfolded model explaining each image alone
    import gradcam_cli.pipeline.batch as batch_module

    monkeypatch.setattr(batch_module, "FOLD_MIN_IMAGES", 1 if fold else 10**9)
    sizes = [(320, 240), (640, 480), (320, 240), (240, 320), (320, 240), (240, 320), (300, 300), (301, 300)]
    for i, size in enumerate(sizes):
        photo(size, seed=i).save(tmp_path / f"img{i}.png")
    explainer = Explainer(resnet18, "layer4", top_k=2)
    folded_runs = []
    real_folded = explainer.folded

    @contextlib.contextmanager
    def recording_folded():
        with real_folded() as folded:
            folded_runs.append(folded is not explainer)
            yield folded

    monkeypatch.setattr(explainer, "folded", recording_folded)
    output, run = OutputOptions(tmp_path / "out", save_raw=True), RunOptions(batch_size=4, workers=1)
    records = list(BatchRunner(explainer, output, run).run(discover([tmp_path], exclude=tmp_path / "out")))
    assert folded_runs == ([True] if fold else [])
    assert len(records) == 2 * len(sizes) and all(r.status == "ok" for r in records), records
    alone_results = {}
    for record in records:
        if record.input not in alone_results:
            alone_results[record.input] = explainer.explain(record.input, top_k=2)
        alone = alone_results[record.input]
        (match,) = [e for e in alone.explanations if e.target.index == record.target.index]
        batched = np.load(record.outputs[1])
        assert batched.shape == tuple(match.saliency.shape)
        assert np.abs(batched - match.saliency.numpy()).max() <= 1e-4, record.input
        assert batched.max() == pytest.approx(1.0)  # a real map, not a constant
        assert abs(record.target.probability - match.target.probability) < 1e-5


def test_every_format_in_any_case_is_read_from_its_content(tmp_path, square_model):
    red = square_image(colour="red")
    red.save(tmp_path / "a.JPG", "JPEG", quality=95)
    red.save(tmp_path / "b.Jpeg", "JPEG", quality=95)
    red.save(tmp_path / "c.TIFF", "TIFF")
    red.save(tmp_path / "d.bmp", "BMP")
    red.save(tmp_path / "e.WebP", "WEBP", lossless=True)
    red.save(tmp_path / "disguised.jpg", "PNG")  # a PNG named .jpg
    green = square_image(colour="green")
    red.save(tmp_path / "f.gif", "GIF", save_all=True, append_images=[green])  # the first frame is explained
    records = run_batch(Explainer(square_model, "features"), [tmp_path], output_dir=tmp_path / "out")
    assert len(records) == 7
    for record in records:
        assert record.status == "ok", record.error
        assert record.target.name == "red", record.input


def fake_sample(index: int, shape: tuple[int, int], pixels: int = 100) -> Sample:
    """A decoded sample with an input of ``shape`` and ``pixels`` pixels (a stride-0 view: no memory used)."""
    return Sample(index, torch.zeros(3, *shape), torch.zeros(1, 1, 3, dtype=torch.uint8).expand(pixels, 1, 3), None)


@pytest.mark.quick
def test_buckets_hold_one_shape_each_and_never_hold_many_samples():
    shapes = [(4, 4 + (i * 7919) % 5) for i in range(500)]  # five shapes, interleaved
    pulled = 0

    def stream():
        nonlocal pulled
        for i, shape in enumerate(shapes):
            pulled += 1
            yield fake_sample(i, shape) if i % 50 else Sample(i, None, None, "bad")

    emitted = []
    for batch in bucketed(stream(), batch_size=8):
        assert len(batch) <= 8
        assert len({tuple(s.tensor.shape) if s.tensor is not None else None for s in batch}) == 1
        emitted.extend(s.index for s in batch)
        assert pulled - len(emitted) <= 4 * 8  # samples waiting in buckets stay bounded
    assert sorted(emitted) == list(range(500))


def test_a_lone_shape_waits_a_bounded_number_of_samples():
    """Records come out in input order, so an image whose shape stays rare must not wait to the end of the run:
    the rows of every image after it would pile up in the reorder buffer. It waits at most 4 * batch_size samples."""
    shapes = [(4, 9)] + [(4, 4)] * 200 + [(4, 9)] + [(4, 4)] * 200
    pulled = 0

    def stream():
        nonlocal pulled
        for i, shape in enumerate(shapes):
            pulled += 1
            yield fake_sample(i, shape)

    emitted_at: dict[int, int] = {}
    for batch in bucketed(stream(), batch_size=8):
        for sample in batch:
            emitted_at[sample.index] = pulled
    assert sorted(emitted_at) == list(range(len(shapes)))
    assert max(emitted_at[i] - i for i in emitted_at) <= 4 * 8 + 1


def test_buckets_flush_early_when_images_are_large():
    stream = (fake_sample(i, (4, 4 + i), pixels=30_000_000) for i in range(5))
    batches = list(bucketed(stream, batch_size=8, max_waiting_pixels=64_000_000))
    assert max(len(b) for b in batches) == 1 and len(batches) == 5


def test_network_input_of_extreme_aspect_ratios_is_capped():
    # Changed on purpose (defect 12): the aspect ratio is clamped to 4:1 with the shorter side kept at the input
    # size, so a 4000 x 40 strip runs as 224 x 896 (it used to be 896 x 9, too thin for EfficientNet-Lite0).
    assert InputSpec().resized_shape(40, 4000) == (224, 896)
    assert InputSpec().resized_shape(4000, 1) == (896, 224)
    assert InputSpec().resized_shape(480, 640) == (224, 299)


def test_extreme_aspect_ratio_images_are_explained(tmp_path, square_model):
    square_image(size=(4000, 40), box=(3000, 5, 3030, 35)).save(tmp_path / "strip.png")
    square_image(size=(30, 2000), box=(5, 100, 25, 120), colour="green").save(tmp_path / "pole.png")
    options = OutputOptions(output_dir=tmp_path / "out", save_raw=True)
    images = discover([tmp_path / "strip.png", tmp_path / "pole.png"])
    records = list(BatchRunner(Explainer(square_model, "features"), options).run(images))
    assert [r.status for r in records] == ["ok", "ok"], records
    assert Image.open(records[0].outputs[0]).size == (4000, 40)
    saliency = np.load(records[0].outputs[1])
    assert 2990 <= np.unravel_index(saliency.argmax(), saliency.shape)[1] <= 3040  # the map still finds the square


@pytest.mark.slow
def test_a_48_megapixel_photo_is_downscaled_to_max_side_not_refused(tmp_path, square_model, monkeypatch):
    big = Image.new("RGB", (8000, 6000), (128, 128, 128))
    big.paste((230, 20, 20), (6000, 1000, 6400, 1400))
    big.save(tmp_path / "big.jpg", quality=85)
    del big
    options = OutputOptions(output_dir=tmp_path / "out", save_raw=True, image_format="jpg")
    decoded = []  # the size of every JPEG decode (decoding in this process): the 48 MP are never all decoded
    real_load = JpegImagePlugin.JpegImageFile.load
    monkeypatch.setattr(
        JpegImagePlugin.JpegImageFile, "load", lambda image: decoded.append(image.size) or real_load(image)
    )
    runner = BatchRunner(Explainer(square_model, "features"), options, RunOptions(workers=0))
    (record,) = runner.run(discover([tmp_path / "big.jpg"]))
    assert record.status == "ok", record.error
    assert decoded and set(decoded) == {(4000, 3000)}  # decoded at half scale (draft), not at 8000 x 6000
    assert Image.open(record.outputs[0]).size == (4000, 3000)  # halved: the smallest whole factor within 4096
    assert np.load(record.outputs[1]).shape == (3000, 4000)
    saliency = np.load(record.outputs[1])
    y, x = np.unravel_index(saliency.argmax(), saliency.shape)
    assert 3000 - 20 <= x <= 3200 + 20 and 500 - 20 <= y <= 700 + 20  # the red square, at half scale


@pytest.mark.parametrize(("colormap", "alpha"), [("jet", 0.5), ("viridis", 0.3), ("gray", 1.0), ("magma", 0.0)])
def test_table_blending_equals_render_blend_bit_for_bit(colormap, alpha, monkeypatch):
    import gradcam_cli.render.colour as batch_module
    from gradcam_cli.render.colour import blend, colormap_table

    monkeypatch.setattr(batch_module, "BLEND_CHUNK_PIXELS", 1000)  # several bands of rows
    rng = np.random.default_rng(0)
    pixels = torch.from_numpy(rng.integers(0, 256, (97, 61, 3), dtype=np.uint8))
    saliency = torch.from_numpy(rng.uniform(-0.2, 1.2, (97, 61)).astype(np.float32))
    saliency[0, :4] = torch.tensor([0.0, 1.0, 0.5, 127.5 / 255])
    table = colormap_table(colormap)
    expected = blend(pixels, saliency, table, alpha)
    assert torch.equal(batch_module.Blender(table, alpha)(pixels, saliency), expected)


@pytest.mark.quick
@pytest.mark.parametrize("unnamed", [True, False])
def test_atomic_writes_from_many_threads_at_once(tmp_path, monkeypatch, unnamed):
    from concurrent.futures import ThreadPoolExecutor

    import gradcam_cli.io.atomic as render

    monkeypatch.setattr(render, "_LINKERS", list(render._LINKERS))  # first calls find out which linker works
    monkeypatch.setattr(render, "_unnamed_files", [unnamed and render._unnamed_files[0]])
    payloads = {tmp_path / "sub" / f"f{i}.bin": os.urandom(1000 + i) for i in range(64)}
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "f0.bin").write_bytes(b"old")  # one replaces an existing file
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda item: render.write_atomic(*item), payloads.items()))
    assert all(path.read_bytes() == data for path, data in payloads.items())
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == sorted(p.name for p in payloads)


class FlattensItsInput(torch.nn.Module):
    """A model whose forward uses ``.view`` on its input, which a channels-last batch cannot satisfy."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        x = x.view(n, c * h * w).view(n, c, h, w)
        return self.head(self.features(x).mean(dim=(2, 3)))


def test_models_that_need_contiguous_inputs_still_work(tmp_path):
    for i in range(3):
        square_image().save(tmp_path / f"a{i}.png")
    runner = BatchRunner(Explainer(FlattensItsInput(), "features"), OutputOptions(output_dir=tmp_path / "out"))
    records = list(runner.run(discover([tmp_path], exclude=tmp_path / "out")))
    assert [r.status for r in records] == ["ok"] * 3, records
    assert not runner._channels_last


def run_batch(explainer: Explainer, inputs: list[Path], top_k: int = 1, **options) -> list:
    if top_k != explainer.chosen.top_k:
        explainer = explainer.with_options(top_k=top_k)
    output, run = split_options(**options)
    runner = BatchRunner(explainer, output, run)
    return list(runner.run(discover(inputs, exclude=output.output_dir)))


@pytest.mark.quick
def test_bad_files_each_give_one_error_row_and_the_batch_goes_on(tmp_path, square_model, monkeypatch):
    folder = tmp_path / "in"
    bad = make_bad_files(folder)
    for i in range(3):
        square_image().save(folder / f"good{i}.png")
    unreadable = folder / "locked.jpg"
    unreadable.write_bytes(jpeg_bytes(square_image()))
    if os.geteuid() == 0:  # root reads a chmod 000 file: make opening it fail as it would for anyone else
        real_open = Image.open

        def locked_open(fp, *args, **kwargs):
            if Path(fp) == unreadable:
                raise PermissionError(13, "Permission denied", str(fp))
            return real_open(fp, *args, **kwargs)

        monkeypatch.setattr(Image, "open", locked_open)
    unreadable.chmod(0)
    bad["locked.jpg"] = "permission denied"
    try:
        records = run_batch(Explainer(square_model, "features"), [folder], output_dir=tmp_path / "out", workers=0)
    finally:
        unreadable.chmod(0o644)
    by_name = {Path(r.input).name: r for r in records}
    assert len(records) == len(by_name) == len(bad) + 3
    for name, word in bad.items():
        row = by_name[name]
        assert row.status == "error" and row.outputs == [], name
        assert name in row.error and word in row.error.lower(), row.error
        assert "\n" not in row.error
    assert all(by_name[f"good{i}.png"].status == "ok" for i in range(3))


def test_decoding_in_worker_processes_isolates_bad_files_too(tmp_path, square_model):
    folder = tmp_path / "in"
    make_bad_files(folder)
    square_image().save(folder / "good.png")
    records = run_batch(Explainer(square_model, "features"), [folder], output_dir=tmp_path / "out", workers=2)
    assert sorted(r.status for r in records).count("ok") == 1
    assert all(r.error for r in records if r.status == "error")


@pytest.mark.quick
def test_an_input_file_is_never_overwritten(tmp_path, square_model):
    square_image().save(tmp_path / "x.png")
    victim = tmp_path / "x_gradcam_0-red.png"  # exactly the name x.png's overlay would get
    victim.write_bytes(b"precious")
    records = run_batch(
        Explainer(square_model, "features", target=0), [tmp_path / "x.png", victim], output_dir=tmp_path
    )
    (row,) = [r for r in records if r.input == str(tmp_path / "x.png")]
    assert row.status == "error" and "refusing to overwrite" in row.error
    assert victim.read_bytes() == b"precious"


def test_write_failures_are_an_error_row_not_a_crash(tmp_path, square_model):
    (tmp_path / "in" / "sub").mkdir(parents=True)
    square_image().save(tmp_path / "in" / "sub" / "a.png")
    square_image().save(tmp_path / "in" / "b.png")
    out = tmp_path / "out"
    out.mkdir()
    (out / "sub").write_text("a file where the output folder should be")
    records = run_batch(Explainer(square_model, "features"), [tmp_path / "in"], output_dir=out)
    status = {Path(r.input).name: r for r in records}
    assert status["b.png"].status == "ok"
    assert status["a.png"].status == "error" and "cannot write" in status["a.png"].error


def test_skip_existing_skips_only_images_whose_outputs_all_exist(tmp_path, square_model):
    for i in range(4):
        square_image(colour=["red", "green", "blue", "red"][i]).save(tmp_path / f"img{i}.png")
    explainer = Explainer(square_model, "features")
    out = tmp_path / "out"
    first = run_batch(explainer, [tmp_path], output_dir=out, save_raw=True, top_k=2)
    assert len(first) == 8 and all(r.status == "ok" for r in first)
    next(out.glob("img1_gradcam_*.npy")).unlink()
    again = run_batch(explainer, [tmp_path], output_dir=out, save_raw=True, top_k=2, skip_existing=True)
    statuses = {Path(r.input).name: r.status for r in again}
    assert statuses == {"img0.png": "skipped", "img1.png": "ok", "img2.png": "skipped", "img3.png": "skipped"}
    skipped = [r for r in again if Path(r.input).name == "img0.png"]  # one row per class, as the first run wrote
    outputs = [p for r in skipped for p in r.outputs]
    assert len(skipped) == 2 and len(outputs) == 4 and all(Path(p).exists() for p in outputs)
    assert {r.target.index for r in skipped} == {r.target.index for r in first if r.input == skipped[0].input}
    # asking for more classes than were written: nothing is complete
    more = run_batch(explainer, [tmp_path], output_dir=out, save_raw=True, top_k=3, skip_existing=True)
    assert all(r.status == "ok" for r in more)


def test_writers_lag_the_model_by_a_bounded_number_of_images(tmp_path, square_model):
    # Deterministic: the writer is held until the model's thread stops to wait for it, so the number of images
    # handed to the writers by then depends on the pipeline's bound alone, not on how fast the threads run.
    for i in range(40):
        square_image(size=(64, 48)).save(tmp_path / f"i{i:02d}.png")
    model_waits = threading.Event()
    submitted_when_waiting: list[int] = []

    def held_write(job, path):
        assert model_waits.wait(timeout=120), "the model's thread never waited for the writers"

    class Counting(BatchRunner):
        submitted = 0

        def _submit(self, *args):
            Counting.submitted += 1
            return super()._submit(*args)

        def _finish(self, item, on_image):
            if not model_waits.is_set():
                submitted_when_waiting.append(Counting.submitted)
                model_waits.set()
            return super()._finish(item, on_image)

    runner = Counting(
        Explainer(square_model, "features"),
        OutputOptions(tmp_path / "out"),
        RunOptions(batch_size=4, writers=1, workers=0),
    )
    runner.kinds = [OutputKind("held", True, lambda o, i, e: o.output_dir / f"{i.output_stem}.x", held_write)]
    assert len(list(runner.run(discover([tmp_path])))) == 40
    # whole batches go to the writers until more than batch_size + 2 * writers images wait for them
    limit = runner.batch_size + 2 * runner.writers
    assert submitted_when_waiting == [math.ceil((limit + 1) / runner.batch_size) * runner.batch_size]


def cli(*args: str):
    return CliRunner().invoke(app, [*args])


def test_cli_exit_codes_and_one_stderr_line_per_bad_file(tmp_path):
    folder = tmp_path / "in"
    bad = make_bad_files(folder)
    square_image().save(folder / "good.png")
    out = tmp_path / "out"
    result = cli(str(folder), "-m", SQUARE_MODEL, "-o", str(out), "--workers", "0")
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == len(bad)
    for name in bad:
        assert sum(name in line for line in lines) == 1, name
    assert "1 ok, 7 failed, 0 skipped" in result.stderr
    assert "images/s" in result.stderr
    ok = cli(str(folder / "good.png"), "-m", SQUARE_MODEL, "-o", str(out), "--workers", "0", "-q")
    assert ok.exit_code == 0 and ok.stderr == ""
    usage = cli(str(tmp_path / "missing"), "-m", SQUARE_MODEL)
    assert usage.exit_code == 2 and "no such file" in usage.stderr
    bad_option = cli(str(folder), "-m", SQUARE_MODEL, "--batch-size", "0")
    assert bad_option.exit_code == 2


@pytest.mark.slow
def test_installed_cli_reports_bad_files_without_tracebacks(tmp_path):
    folder = tmp_path / "in"
    bad = make_bad_files(folder)
    for i in range(3):
        square_image().save(folder / f"good{i}.png")
    command = [*gradcam_command(), str(folder), "-m", SQUARE_MODEL, "-o", str(tmp_path / "out"), "--workers", "1"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)  # a guard against hangs only
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert sorted(next(n for n in bad if n in line) for line in errors) == sorted(bad)
    assert result.stderr.strip().splitlines()[-1].startswith("done: 3 ok, 7 failed, 0 skipped in ")
    assert "\x1b[" not in result.stderr  # no progress bar when stderr is not a terminal


@pytest.mark.slow
def test_progress_bar_shows_on_a_terminal_only(tmp_path):
    import pty

    for i in range(12):
        square_image(size=(64, 48)).save(tmp_path / f"i{i}.png")
    base = [*gradcam_command(), str(tmp_path), "-m", SQUARE_MODEL, "-o", str(tmp_path / "out"), "--workers", "0"]
    shown = _stderr_on_a_terminal([*base, "--batch-size", "1"], pty)
    assert "12/12" in shown and "img/s" in shown and "done: 12 ok, 0 failed, 0 skipped" in shown
    quiet = _stderr_on_a_terminal([*base, "-q"], pty)
    assert "12/12" not in quiet and "done:" not in quiet


def _stderr_on_a_terminal(command: list[str], pty) -> str:
    main, child = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm"}
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=child, env=env)
    os.close(child)
    chunks = []
    while True:
        if not select.select([main], [], [], 600)[0]:  # a guard against hangs only
            process.kill()
        try:
            data = os.read(main, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    process.wait(timeout=120)
    os.close(main)
    assert process.returncode == 0
    return b"".join(chunks).decode(errors="replace")


def test_one_image_is_decoded_in_place_and_more_by_processes_or_a_thread(tmp_path, square_model, monkeypatch):
    import gradcam_cli.pipeline.batch as batch_module

    started: list[str] = []
    real_loader, real_thread = batch_module.DataLoader, batch_module.decode_in_thread

    def recording_loader(*args, **kwargs):
        started.append(f"{kwargs['num_workers']} processes")
        return real_loader(*args, **kwargs)

    def recording_thread(*args, **kwargs):
        started.append("thread")
        return real_thread(*args, **kwargs)

    monkeypatch.setattr(batch_module, "DataLoader", recording_loader)
    monkeypatch.setattr(batch_module, "decode_in_thread", recording_thread)
    for name in ("a", "b"):
        square_image().save(tmp_path / f"{name}.png")
    both = discover([tmp_path / "a.png", tmp_path / "b.png"])
    for workers, images in ((2, both[:1]), (2, both), (0, both)):
        runner = BatchRunner(
            Explainer(square_model, "features"), OutputOptions(tmp_path / f"out{workers}"), RunOptions(workers=workers)
        )
        assert [r.status for r in runner.run(images)] == ["ok"] * len(images)
    assert started == ["2 processes", "thread"]


class CountingDataset:
    """Stands in for ImageDataset: counts the samples asked for; ``release`` lets a blocked sample through."""

    def __init__(self, size: int, blocked_at: int | None = None) -> None:
        self.size, self.asked, self.blocked_at = size, 0, blocked_at
        self.release = threading.Event()

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> Sample:
        self.asked += 1
        if index == self.blocked_at:
            self.release.wait(timeout=60)
        return Sample(index, None, None, f"sample {index}")


@pytest.mark.quick
def test_decoding_thread_keeps_order_stays_a_bounded_number_ahead_and_stops_with_its_consumer():
    dataset = CountingDataset(50)
    samples = decode_in_thread(dataset, ahead=3)
    for expected in range(10):
        assert next(samples).index == expected
        # at most `ahead` samples wait in the queue and one more is in the producer's hands
        assert dataset.asked <= expected + 1 + 3 + 1
    samples.close()  # the consumer stops early: the thread ends (close joins it)
    assert not [t for t in threading.enumerate() if t.name == "gradcam-decoder"]
    assert dataset.asked < 50
    assert [s.index for s in decode_in_thread(CountingDataset(7), ahead=2)] == list(range(7))


def test_decoding_thread_ends_when_the_consumer_fails_while_it_decodes():
    dataset = CountingDataset(10, blocked_at=2)
    samples = decode_in_thread(dataset, ahead=1)
    assert next(samples).index == 0
    closer = threading.Thread(target=samples.close)
    closer.start()  # close() waits for the thread, which is inside sample 2 until released
    dataset.release.set()
    closer.join(timeout=60)
    assert not closer.is_alive()
    assert not [t for t in threading.enumerate() if t.name == "gradcam-decoder"]


def test_an_error_in_the_decoding_thread_is_raised_in_the_consumer():
    class Failing(CountingDataset):
        def __getitem__(self, index: int) -> Sample:
            if index == 3:
                raise RuntimeError("disk gone")
            return super().__getitem__(index)

    samples = decode_in_thread(Failing(10), ahead=1)
    assert [next(samples).index for _ in range(3)] == [0, 1, 2]
    with pytest.raises(RuntimeError, match="disk gone"):
        next(samples)
    assert not [t for t in threading.enumerate() if t.name == "gradcam-decoder"]


@pytest.mark.parametrize(("cores", "workers"), [(1, 0), (2, 0), (3, 2), (8, 4), (64, 4)])
def test_default_decoding_processes_by_cores(monkeypatch, cores, workers):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(cores)), raising=False)
    assert default_workers() == workers
