"""Images with more than 8 bits per channel are scaled by their bit depth, not clipped to white, or refused.

Pillow opens a 16-bit grayscale PNG or TIFF as mode ``I;16`` (``I`` for 16-bit PGM), and ``convert("RGB")`` clips
its values to 255: nearly every pixel turns white. 48-bit RGB PNGs and TIFFs already open as 8-bit ``RGB`` (Pillow
keeps each channel's high byte), so both must come out as the same picture as their 8-bit version.
"""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import SAMPLE_DIR
from PIL import Image
from square_model import square_image
from typer.testing import CliRunner

from gradcam_cli.cam.explainer import Explainer
from gradcam_cli.cli import app
from gradcam_cli.errors import EXIT_IMAGE_FAILED, EXIT_OK, ImageError
from gradcam_cli.io.images import load_image, to_rgb

pytestmark = pytest.mark.quick
SQUARE_MODEL = f"{Path(__file__).parents[1].joinpath('square_model.py')}:build"


def random_pixels(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def widen(pixels: np.ndarray, seed: int = 1) -> np.ndarray:
    """The 16-bit version of 8-bit ``pixels`` over the full 0..65535 range: v * 257, plus noise in the low byte."""
    low_byte = np.random.default_rng(seed).integers(0, 256, pixels.shape, dtype=np.uint16)
    return pixels.astype(np.uint16) * 256 + np.where(low_byte % 2 == 0, pixels.astype(np.uint16), low_byte)


def as_array(image: Image.Image) -> np.ndarray:
    assert image.mode == "RGB"
    return np.asarray(image).astype(np.int16)


def test_16_bit_grayscale_png_is_the_same_picture_as_its_8_bit_version(tmp_path):
    gray = random_pixels((48, 64))
    Image.fromarray(gray).save(tmp_path / "gray8.png")
    cv2.imwrite(str(tmp_path / "gray16.png"), widen(gray))
    assert Image.open(tmp_path / "gray16.png").mode == "I;16"  # what Pillow really gives for it
    eight, sixteen = as_array(load_image(tmp_path / "gray8.png")), as_array(load_image(tmp_path / "gray16.png"))
    assert np.abs(sixteen - eight).max() <= 1  # within rounding, not clipped to white
    assert (eight == gray[..., None]).all()


def test_16_bit_rgb_png_is_the_same_picture_as_its_8_bit_version(tmp_path):
    rgb = random_pixels((48, 64, 3))
    Image.fromarray(rgb).save(tmp_path / "rgb8.png")
    cv2.imwrite(str(tmp_path / "rgb16.png"), widen(rgb)[..., ::-1])  # OpenCV writes BGR
    eight, sixteen = as_array(load_image(tmp_path / "rgb8.png")), as_array(load_image(tmp_path / "rgb16.png"))
    assert np.abs(sixteen - eight).max() <= 1
    assert (eight == rgb).all()


@pytest.mark.parametrize(
    ("mode", "dtype"), [("I;16", "<u2"), ("I;16L", "<u2"), ("I;16B", ">u2"), ("I", "<i4"), ("F", "<f4")]
)
def test_every_wide_mode_is_scaled_by_its_bit_depth(mode, dtype):
    gray = random_pixels((8, 16), seed=3)
    wide = gray / 255 if mode == "F" else widen(gray)
    image = Image.frombytes(mode, (16, 8), wide.astype(dtype).tobytes())
    assert np.abs(as_array(to_rgb(image)) - gray[..., None]).max() <= 1


def test_16_bit_pgm_and_float_tiff_files_are_read_at_their_scale(tmp_path):
    gray = random_pixels((20, 30), seed=4)
    cv2.imwrite(str(tmp_path / "gray16.pgm"), widen(gray))
    cv2.imwrite(str(tmp_path / "unit.tif"), gray.astype(np.float32) / 255)
    for name in ("gray16.pgm", "unit.tif"):
        assert np.abs(as_array(load_image(tmp_path / name)) - gray[..., None]).max() <= 1, name


@pytest.mark.parametrize(
    ("name", "pixels", "expected"),
    [
        ("float.tif", np.full((8, 8), 200.0, np.float32), "floating-point pixels range 200..200, not 0..1"),
        ("nan.tif", np.full((8, 8), np.nan, np.float32), "floating-point pixels range nan..nan, not 0..1"),
        ("int32.tif", np.full((8, 8), 100_000, np.int32), "32-bit integer pixels range 100000..100000, beyond 16"),
        ("negative.tif", np.full((8, 8), -5, np.int32), "32-bit integer pixels range -5..-5, beyond 16 bits"),
    ],
)
def test_pixels_whose_scale_is_unknown_are_refused_in_one_line(tmp_path, name, pixels, expected):
    path = tmp_path / name
    Image.fromarray(pixels).save(path)
    with pytest.raises(ImageError) as caught:
        load_image(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: {expected}") and "\n" not in message
    assert message.endswith("save the image with 8 or 16 bits per channel")


def test_the_library_explains_a_16_bit_pil_image_like_its_8_bit_version(lite0):
    gray = np.asarray(Image.open(SAMPLE_DIR / "chelsea.jpg").convert("L").reduce(2))
    explainer = Explainer(lite0)
    eight = explainer.explain(Image.fromarray(gray))  # mode "L"
    sixteen = explainer.explain(Image.fromarray(widen(gray)))  # mode "I;16"
    assert [p.index for p in sixteen.predictions] == [p.index for p in eight.predictions]
    assert (sixteen.explanations[0].saliency - eight.explanations[0].saliency).abs().max() < 0.05


def explain_cli(tmp_path: Path, *args: str | Path) -> list[dict]:
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [*map(str, args), "--save-raw", "--json", "-o", str(out), "--workers", "0"])
    assert result.exit_code == EXIT_OK, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_a_16_bit_grayscale_photo_is_explained_like_its_8_bit_version(tmp_path):
    """End to end with the pretrained EfficientNet-Lite0: same classes, same map (a white image would differ)."""
    gray = np.asarray(Image.open(SAMPLE_DIR / "chelsea.jpg").convert("L"))
    Image.fromarray(gray).save(tmp_path / "gray8.png")
    cv2.imwrite(str(tmp_path / "gray16.png"), widen(gray))
    rows = explain_cli(tmp_path, tmp_path / "gray8.png", tmp_path / "gray16.png", "-m", "efficientnet_lite0")
    by_name = {Path(row["input"]).name: row for row in rows}
    eight, sixteen = by_name["gray8.png"], by_name["gray16.png"]
    assert [p["index"] for p in sixteen["predictions"]] == [p["index"] for p in eight["predictions"]]
    assert sixteen["predictions"][0]["probability"] == pytest.approx(eight["predictions"][0]["probability"], abs=0.02)
    map8, map16 = (np.load(next(o for o in row["outputs"] if o.endswith(".npy"))) for row in (eight, sixteen))
    assert map16.shape == map8.shape == gray.shape
    assert np.abs(map16 - map8).max() < 0.05


def test_a_16_bit_rgb_square_is_found_like_its_8_bit_version(tmp_path):
    box = (330, 40, 390, 100)
    picture = square_image(size=(480, 320), box=box)
    picture.save(tmp_path / "square8.png")
    cv2.imwrite(str(tmp_path / "square16.png"), widen(np.asarray(picture))[..., ::-1])
    rows = explain_cli(tmp_path, tmp_path / "square8.png", tmp_path / "square16.png", "-m", SQUARE_MODEL, "-t", "0")
    maps = {Path(row["input"]).name: np.load(next(o for o in row["outputs"] if o.endswith(".npy"))) for row in rows}
    y, x = np.unravel_index(int(maps["square16.png"].argmax()), maps["square16.png"].shape)
    assert box[0] <= x < box[2] and box[1] <= y < box[3]
    assert np.abs(maps["square16.png"] - maps["square8.png"]).max() < 0.02


def test_an_image_that_cannot_be_scaled_fails_alone_with_one_line(tmp_path):
    Image.fromarray(np.full((8, 8), 300.0, np.float32)).save(tmp_path / "float.tif")
    square_image().save(tmp_path / "fine.png")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [str(tmp_path), "-m", SQUARE_MODEL, "-o", str(out), "--workers", "0", "-q"])
    assert result.exit_code == EXIT_IMAGE_FAILED, result.output
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert errors == [
        f"error: {tmp_path / 'float.tif'}: floating-point pixels range 300..300, not 0..1, so their scale is "
        "unknown; save the image with 8 or 16 bits per channel"
    ]
    assert len(list(out.glob("fine_gradcam_*.png"))) == 1
