"""The map lines up with the original pixels: no crop, aspect kept, EXIF orientation applied, original resolution.

The hand-built colour detector (tests/square_model.py) has known evidence: for class 0 ("red") only red pixels
count, so the map's maximum must fall inside the red square wherever the square is and whatever the image's shape.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from square_model import square_image
from typer.testing import CliRunner

from gradcam_cli.cam.explainer import Explainer
from gradcam_cli.cli import app
from gradcam_cli.io.images import InputSpec, load_image, to_input_tensor
from gradcam_cli.render.overlay import overlay

pytestmark = pytest.mark.quick
RED = 0
SQUARE_MODEL = f"{Path(__file__).parents[1].joinpath('square_model.py')}:build"


def argmax_xy(saliency: torch.Tensor | np.ndarray) -> tuple[int, int]:
    saliency = np.asarray(saliency)
    y, x = np.unravel_index(int(saliency.argmax()), saliency.shape)
    return int(x), int(y)


def inside(point: tuple[int, int], box: tuple[int, int, int, int]) -> bool:
    x, y = point
    x1, y1, x2, y2 = box
    return x1 <= x < x2 and y1 <= y < y2


def hot_box(saliency: torch.Tensor, threshold: float = 0.5) -> tuple[int, int, int, int]:
    """Bounding box (x1, y1, x2, y2), exclusive ends, of the pixels above ``threshold``."""
    ys, xs = np.nonzero(np.asarray(saliency) > threshold)
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1


def iou(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> float:
    w = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    area = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
    return w * h / area


@pytest.mark.parametrize(
    ("size", "box"),
    [
        ((480, 320), (330, 40, 390, 100)),  # wide image, square top right
        ((320, 480), (30, 380, 80, 430)),  # tall image, square bottom left
        ((517, 333), (200, 150, 240, 190)),  # odd sizes
        ((640, 240), (4, 100, 44, 140)),  # square at the left border: a centre crop would cut it away
        ((640, 240), (600, 0, 640, 40)),  # square in the top right corner
    ],
)
def test_map_maximum_lies_inside_the_square_and_map_has_the_original_size(square_model, size, box):
    image = square_image(size=size, box=box)
    result = Explainer(square_model, layers="features").explain(image, target=RED)
    saliency = result.explanations[0].saliency
    assert tuple(saliency.shape) == (size[1], size[0])
    assert inside(argmax_xy(saliency), box)
    assert iou(hot_box(saliency), box) > 0.7  # the hot region is the square, not just a lucky maximum
    assert overlay(result).size == size


def raw_with_exif_orientation(display: Image.Image, orientation: int) -> Image.Image:
    """Pixels stored rotated, as a camera does, so that applying ``orientation`` shows ``display``."""
    undo = {6: Image.Transpose.ROTATE_90, 8: Image.Transpose.ROTATE_270, 3: Image.Transpose.ROTATE_180}
    return display.transpose(undo[orientation])


@pytest.mark.parametrize("orientation", [6, 8, 3])
def test_exif_orientation_is_applied_before_explaining(square_model, tmp_path, orientation):
    box = (330, 40, 390, 100)
    display = square_image(size=(480, 320), box=box)
    path = tmp_path / f"rotated{orientation}.jpg"
    raw = raw_with_exif_orientation(display, orientation)
    exif = Image.Exif()
    exif[0x0112] = orientation
    raw.save(path, quality=95, exif=exif)
    assert Image.open(path).size == raw.size  # the file really holds rotated pixels

    image = load_image(path)
    assert image.size == (480, 320)
    saliency = Explainer(square_model, layers="features").explain(image, target=RED).explanations[0].saliency
    assert tuple(saliency.shape) == (320, 480)
    assert inside(argmax_xy(saliency), box)


def test_cli_overlay_and_raw_map_are_in_the_displayed_orientation(tmp_path):
    box = (330, 40, 390, 100)
    display = square_image(size=(480, 320), box=box)
    path = tmp_path / "phone.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6
    raw_with_exif_orientation(display, 6).save(path, quality=95, exif=exif)
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        [str(path), "-m", SQUARE_MODEL, "--target-class", "0", "--save-raw", "-o", str(out), "--workers", "0"],
    )
    assert result.exit_code == 0, result.output
    (overlay,) = out.glob("phone_gradcam_0-*.jpg")
    (raw_map,) = out.glob("phone_gradcam_0-*.npy")
    assert Image.open(overlay).size == (480, 320)
    saliency = np.load(raw_map)
    assert saliency.shape == (320, 480)
    assert inside(argmax_xy(saliency), box)


@pytest.mark.parametrize(
    ("hw", "size", "expected"),
    [
        ((320, 480), 224, (224, 336)),
        ((480, 320), 224, (336, 224)),
        ((300, 451), 224, (224, 337)),
        ((1000, 1000), 224, (224, 224)),
        ((100, 50), 224, (448, 224)),  # small images are enlarged too
        ((320, 480), 160, (160, 240)),
    ],
)
def test_shorter_side_is_resized_to_input_size_with_aspect_kept(hw, size, expected):
    assert InputSpec(size=size).resized_shape(*hw) == expected
    image = Image.new("RGB", (hw[1], hw[0]))
    assert tuple(to_input_tensor(image, InputSpec(size=size)).shape) == (3, *expected)


def test_nothing_is_cropped_from_the_network_input():
    """A red frame one pixel wide around a grey image reaches every edge of the network input."""
    image = Image.new("RGB", (480, 320), (128, 128, 128))
    pixels = np.asarray(image).copy()
    pixels[0, :], pixels[-1, :], pixels[:, 0], pixels[:, -1] = (255, 0, 0), (255, 0, 0), (255, 0, 0), (255, 0, 0)
    tensor = to_input_tensor(Image.fromarray(pixels), InputSpec(mean=(0, 0, 0), std=(1, 1, 1)))
    red_excess = tensor[0] - tensor[1]
    for edge in (red_excess[0, :], red_excess[-1, :], red_excess[:, 0], red_excess[:, -1]):
        assert (edge > 0.2).all()
    assert red_excess[10:-10, 10:-10].abs().max() < 1e-6


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic", "nearest"])
def test_the_input_is_resized_with_the_models_own_filter(interpolation):
    """timm and Hugging Face configs name a resampling filter; the network input is resized with exactly it."""
    pixels = np.random.default_rng(0).integers(0, 256, (75, 100, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    spec = InputSpec(size=48, mean=(0, 0, 0), std=(1, 1, 1), interpolation=interpolation)
    expected = np.asarray(image.resize((64, 48), Image.Resampling[interpolation.upper()]), dtype=np.float32) / 255
    tensor = to_input_tensor(image, spec)
    torch.testing.assert_close(tensor, torch.from_numpy(expected).permute(2, 0, 1))
    if interpolation != "bilinear":
        assert not torch.allclose(tensor, to_input_tensor(image, InputSpec(size=48, mean=(0, 0, 0), std=(1, 1, 1))))


def test_models_that_need_a_fixed_size_get_exactly_it():
    from gradcam_cli.models.loading import load_model

    vit = load_model("vit_b_16", "none")  # --input-size cannot change a fixed size (it is refused: test_models.py)
    assert vit.input_spec.fixed_size == (224, 224)
    assert vit.input_spec.resized_shape(320, 480) == (224, 224)
    assert tuple(to_input_tensor(Image.new("RGB", (480, 320)), vit.input_spec).shape) == (3, 224, 224)
    assert load_model("resnet18", "none", input_size=160).input_spec.resized_shape(320, 480) == (160, 240)


# --- extreme aspect ratios: the network input is squeezed to at most 4:1, its shorter side always --input-size -----


@pytest.mark.parametrize(
    ("hw", "expected"),
    [
        ((40, 4000), (224, 896)),  # a strip: squeezed to 4:1, never thinner than the input size
        ((4000, 40), (896, 224)),
        ((1, 4000), (224, 896)),
        ((224, 896), (224, 896)),  # exactly 4:1: aspect kept
        ((100, 500), (224, 896)),  # 5:1: squeezed
    ],
)
def test_elongated_images_are_squeezed_to_4_to_1_with_the_shorter_side_at_input_size(hw, expected):
    assert InputSpec().resized_shape(*hw) == expected
    assert min(InputSpec(size=160).resized_shape(*hw)) == 160


@pytest.mark.parametrize(("size", "box"), [((4000, 40), (3955, 5, 3985, 35)), ((40, 4000), (5, 12, 35, 42))])
def test_the_map_of_a_squeezed_strip_still_lines_up_with_its_pixels(square_model, size, box):
    """A red square at one end of a 100:1 strip: the map, stretched back over the strip, peaks on it."""
    saliency = Explainer(square_model, layers="features").explain(square_image(size, box), target=RED)
    saliency = saliency.explanations[0].saliency
    assert tuple(saliency.shape) == (size[1], size[0])
    assert inside(argmax_xy(saliency), box)
    assert iou(hot_box(saliency), box) > 0.5


def test_efficientnet_lite0_explains_very_wide_and_tall_images(tmp_path):
    """Before the 4:1 clamp, a 4000 x 40 strip became an 896 x 9 input: too small for Lite0's 5x5 padding."""
    square_image(size=(4000, 40), box=(3955, 5, 3985, 35)).save(tmp_path / "strip.png")
    square_image(size=(40, 4000), box=(5, 12, 35, 42)).save(tmp_path / "pole.png")
    out = tmp_path / "out"
    args = [str(tmp_path / "strip.png"), str(tmp_path / "pole.png"), "-m", "efficientnet_lite0", "--weights", "none"]
    result = CliRunner().invoke(app, [*args, "--save-raw", "-o", str(out), "--workers", "0"])
    assert result.exit_code == 0, result.output
    assert np.load(next(out.glob("strip_gradcam_*.npy"))).shape == (40, 4000)
    assert np.load(next(out.glob("pole_gradcam_*.npy"))).shape == (4000, 40)
    assert Image.open(next(out.glob("strip_gradcam_*.png"))).size == (4000, 40)
