"""``--format auto`` (the default): JPEG outputs for JPEG inputs, lossless PNG for every other input; a named format
forces one for all; ``--skip-existing`` finds the outputs of either kind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from square_model import square_image
from typer.testing import CliRunner

from gradcam_cli.cli import app
from gradcam_cli.io.naming import RUN_RECORD_NAME
from gradcam_cli.options import ImageFormat, OutputOptions

SQUARE = f"{Path(__file__).parents[1].joinpath('square_model.py')}:build"
PIL_FORMATS = {".jpg": "JPEG", ".png": "PNG", ".webp": "WEBP"}


def gradcam(inputs: Path, out: Path, *more: str | Path):
    labels = inputs.parent / "colours.txt"
    labels.write_text("red\ngreen\nblue\n", encoding="utf-8")
    args = [inputs, "-m", SQUARE, "--labels", labels, "-o", out, "--workers", "0", "-t", "red", *more]
    return CliRunner().invoke(app, [str(a) for a in args])


def rows(manifest: Path) -> list[dict]:
    return [json.loads(line) for line in manifest.read_text().splitlines()]


def written(out: Path) -> set[str]:
    """The output files in ``out``: every file but the manifest and the hidden ones (run record, lock)."""
    return {p.name for p in out.iterdir() if p.is_file() and not p.name.startswith(".") and p.suffix != ".jsonl"}


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    """The same red-square picture as .jpg, .JPEG, .png and .bmp."""
    folder = tmp_path / "in"
    folder.mkdir()
    picture = square_image()
    picture.save(folder / "a.jpg", quality=95)
    picture.save(folder / "b.JPEG", format="JPEG", quality=95)
    picture.save(folder / "c.png")
    picture.save(folder / "d.bmp")
    return folder


@pytest.mark.quick
@pytest.mark.parametrize(
    ("image_format", "source", "suffix"),
    [
        (ImageFormat.AUTO, "x.jpg", ".jpg"),
        (ImageFormat.AUTO, "dir.png/x.JPEG", ".jpg"),
        (ImageFormat.AUTO, "x.jpg.png", ".png"),
        (ImageFormat.AUTO, "x.tiff", ".png"),
        (ImageFormat.AUTO, "x.webp", ".png"),
        (ImageFormat.PNG, "x.jpg", ".png"),
        (ImageFormat.WEBP, "x.png", ".webp"),
    ],
)
def test_the_suffix_follows_the_input_under_auto_only(image_format, source, suffix):
    assert image_format.suffix_for(Path(source)) == suffix


def test_auto_is_the_default_and_parses():
    assert OutputOptions().image_format is None and OutputOptions().chosen_format is ImageFormat.AUTO
    assert ImageFormat.parse(" AUTO ") is ImageFormat.AUTO


def test_auto_writes_jpeg_for_jpeg_inputs_and_png_for_the_others(mixed, tmp_path):
    out = tmp_path / "out"
    more = ["--save-raw", "--save-heatmap", "--panel", "--manifest", out / "m.jsonl"]
    result = gradcam(mixed, out, *more)
    assert result.exit_code == 0, result.output
    found = rows(out / "m.jsonl")
    assert sorted(Path(row["input"]).name for row in found) == ["a.jpg", "b.JPEG", "c.png", "d.bmp"]
    for row in found:
        kind = ".jpg" if Path(row["input"]).suffix.lower() in (".jpg", ".jpeg") else ".png"
        overlay, raw, heatmap, panel = (Path(p) for p in row["outputs"])
        assert [overlay.suffix, raw.suffix, heatmap.suffix, panel.suffix] == [kind, ".npy", kind, kind], row
        assert "_heatmap-" in heatmap.name and panel.name.endswith("_panel" + kind)
        for path in (overlay, heatmap, panel):
            with Image.open(path) as image:
                assert image.format == PIL_FORMATS[kind], path
    assert written(out) == {Path(p).name for row in found for p in row["outputs"]}  # nothing else, e.g. no .png twin
    assert np.load(out / "a_gradcam_0-red.npy").dtype == np.float32


@pytest.mark.quick
def test_a_named_format_applies_to_every_input(mixed, tmp_path):
    for name, fmt in (("png", "PNG"), ("webp", "WEBP")):
        out = tmp_path / name
        result = gradcam(mixed, out, "--format", name)
        assert result.exit_code == 0, result.output
        assert written(out) == {f"{stem}_gradcam_0-red.{name}" for stem in "abcd"}
        for path in out.glob(f"*.{name}"):
            with Image.open(path) as image:
                assert image.format == fmt, path


def test_the_jpeg_overlay_at_the_default_quality_is_close_to_the_exact_one(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    square_image().save(folder / "photo.jpg", quality=95)
    assert gradcam(folder, tmp_path / "auto").exit_code == 0
    assert gradcam(folder, tmp_path / "png", "--format", "png").exit_code == 0
    lossy = np.asarray(Image.open(tmp_path / "auto" / "photo_gradcam_0-red.jpg").convert("RGB"), dtype=np.float64)
    exact = np.asarray(Image.open(tmp_path / "png" / "photo_gradcam_0-red.png"), dtype=np.float64)
    assert lossy.shape == exact.shape == (320, 480, 3)
    # Measured, against the PNG: quality 90 (the default) 0.19, 0.12, 0.29 levels per channel on average and PSNR
    # 40.3 dB (the largest difference, 85, lies on the saturated square's edge: chroma subsampling); quality 75 about
    # 1.2 levels, quality 50 up to 2.1, quality 10 up to 7.2 levels and 31 dB.
    mean_error = np.abs(lossy - exact).mean(axis=(0, 1))
    psnr = 10 * np.log10(255**2 / ((lossy - exact) ** 2).mean())
    assert (mean_error < 1).all() and psnr > 36, (mean_error, psnr)


def test_skip_existing_finds_jpeg_and_png_outputs_alike(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    square_image().save(folder / "a.jpg", quality=95)
    square_image().save(folder / "b.png")
    out, manifest = tmp_path / "out", tmp_path / "out" / "m.jsonl"
    more = ["--save-raw", "--save-heatmap", "--panel", "--manifest", manifest]
    assert gradcam(folder, out, *more).exit_code == 0
    first = {Path(row["input"]).name: row["outputs"][0] for row in rows(manifest)}
    assert first == {"a.jpg": str(out / "a_gradcam_0-red.jpg"), "b.png": str(out / "b_gradcam_0-red.png")}
    record = json.loads((out / RUN_RECORD_NAME).read_text())
    assert (record["format"], record["quality"]) == ("auto", 90)
    before = {name: (out / name).stat().st_mtime_ns for name in written(out)}

    again = gradcam(folder, out, "--skip-existing", *more)
    assert again.exit_code == 0, again.output
    resumed = {Path(row["input"]).name: (row["status"], row["outputs"][0]) for row in rows(manifest)}
    assert resumed == {name: ("skipped", overlay) for name, overlay in first.items()}
    assert {name: (out / name).stat().st_mtime_ns for name in written(out)} == before  # nothing written again


def test_a_folder_made_with_png_before_auto_resumes_with_format_png(tmp_path, mixed):
    out = tmp_path / "out"
    assert gradcam(mixed, out, "--format", "png").exit_code == 0  # as the default wrote it before auto
    refused = gradcam(mixed, out, "--skip-existing")
    assert refused.exit_code == 2
    assert "format png (this run: auto); add --format png to resume them" in refused.stderr
    resumed = gradcam(mixed, out, "--skip-existing", "--format", "png")
    assert resumed.exit_code == 0, resumed.stderr
