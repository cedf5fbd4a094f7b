"""Colour mapping and blending: drawn from the float map in [0, 1], any matplotlib colormap, documented alpha; a
detection's label drawn whole inside the image."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gradcam_cli.errors import UsageError
from gradcam_cli.render.boxes import colour, draw_boxes
from gradcam_cli.render.colour import blend, colorize, colormap_table, heatmap_image
from gradcam_cli.render.encode import encode_image, save_image

pytestmark = pytest.mark.quick


def _byte(colour: torch.Tensor) -> torch.Tensor:
    return (colour * 255).round().to(torch.uint8)


@pytest.mark.parametrize("name", ["jet", "viridis", "gray", "magma", "coolwarm", "turbo"])
def test_full_intensity_is_the_top_colour_and_zero_the_bottom(name: str) -> None:
    table = colormap_table(name)
    ones, zeros = torch.ones(4, 5), torch.zeros(4, 5)
    assert torch.equal(colorize(ones, table), table[-1].expand(4, 5, 3))
    assert torch.equal(colorize(zeros, table), table[0].expand(4, 5, 3))
    assert torch.equal(heatmap_image(ones, table)[0, 0], _byte(table[-1]))
    assert torch.equal(heatmap_image(zeros, table)[0, 0], _byte(table[0]))


def test_no_uint8_wrap_around_at_one() -> None:
    """1.0 * 256 would wrap to 0 in uint8 (the bottom colour); it must be jet's dark red, not its dark blue."""
    table = colormap_table("jet")
    pixels = torch.full((2, 3, 3), 200, dtype=torch.uint8)
    top = blend(pixels, torch.ones(2, 3), table, alpha=1.0)
    assert top[0, 0].tolist() == [128, 0, 0]
    assert blend(pixels, torch.zeros(2, 3), table, alpha=1.0)[0, 0].tolist() == [0, 0, 128]
    # Values just inside and beyond the range clamp instead of wrapping.
    assert torch.equal(colorize(torch.full((1, 1), 1.7), table)[0, 0], table[-1])
    assert torch.equal(colorize(torch.full((1, 1), -0.3), table)[0, 0], table[0])
    assert torch.equal(colorize(torch.full((1, 1), 0.999), table)[0, 0], table[-1])


def test_the_map_is_read_as_floats_across_the_whole_table() -> None:
    table = colormap_table("viridis")
    ramp = torch.linspace(0, 1, 256).view(1, 256)
    assert torch.equal(colorize(ramp, table)[0], table)


def test_alpha_blends_as_documented() -> None:
    """Overlay = (1 - alpha) * image + alpha * colour(map), rounded to uint8."""
    table = colormap_table("jet")
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (6, 7, 3), dtype=torch.uint8, generator=generator)
    saliency = torch.rand(6, 7, generator=generator)
    assert torch.equal(blend(pixels, saliency, table, alpha=0.0), pixels)
    assert torch.equal(blend(pixels, saliency, table, alpha=1.0), heatmap_image(saliency, table))
    for alpha in (0.25, 0.5, 0.8):
        expected = (1 - alpha) * pixels.float() + alpha * colorize(saliency, table) * 255
        got = blend(pixels, saliency, table, alpha).float()
        assert (got - expected).abs().max() <= 0.5 + 1e-4


def test_any_matplotlib_colormap_by_name_and_a_helpful_error() -> None:
    viridis, reversed_ = colormap_table("viridis"), colormap_table("viridis_r")
    assert torch.equal(reversed_[-1], viridis[0])
    assert colormap_table("cividis").shape == (256, 3)
    with pytest.raises(UsageError, match="Did you mean: viridis"):
        colormap_table("viridiss")


@pytest.mark.quick
def test_the_default_jet_is_matplotlibs_bit_for_bit_without_importing_it() -> None:
    import subprocess
    import sys

    import matplotlib

    reference = matplotlib.colormaps["jet"](np.linspace(0.0, 1.0, 256))[:, :3].astype(np.float32)
    assert torch.equal(colormap_table("jet"), torch.from_numpy(reference))
    code = "import sys; from gradcam_cli.render.colour import colormap_table; colormap_table('jet'); "
    code += "print('matplotlib' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


@pytest.mark.parametrize(("suffix", "fmt"), [(".png", "PNG"), (".jpg", "JPEG"), (".webp", "WEBP")])
def test_formats_and_quality(tmp_path: Path, suffix: str, fmt: str) -> None:
    generator = torch.Generator().manual_seed(1)
    pixels = torch.randint(0, 256, (64, 64, 3), dtype=torch.uint8, generator=generator)
    save_image(pixels, tmp_path / f"x{suffix}", quality=90)
    with Image.open(tmp_path / f"x{suffix}") as image:
        assert image.format == fmt and image.size == (64, 64)
    if fmt != "PNG":
        assert len(encode_image(pixels, suffix, quality=20)) < len(encode_image(pixels, suffix, quality=95))
    assert [p.name for p in tmp_path.iterdir()] == [f"x{suffix}"]  # written atomically: no temporaries left


def test_saved_heatmap_and_overlay_match_the_saved_float_map(tmp_path: Path, square_model) -> None:
    """--save-heatmap / --save-raw / --alpha / --colormap end to end through the batch runner."""
    from square_model import square_image

    from gradcam_cli.cam.explainer import Explainer
    from gradcam_cli.io.discovery import discover
    from gradcam_cli.options import OutputOptions
    from gradcam_cli.pipeline.batch import BatchRunner

    square_image().save(tmp_path / "sq.png")
    options = OutputOptions(output_dir=tmp_path / "out", alpha=0.3, colormap="magma", save_raw=True, save_heatmap=True)
    explainer = Explainer(square_model, "features", target=0)
    records = list(BatchRunner(explainer, options).run(discover([tmp_path / "sq.png"])))
    assert [r.status for r in records] == ["ok"]
    overlay_file, raw_file, heatmap_file = map(Path, records[0].outputs)
    assert heatmap_file.name == "sq_heatmap-gradcam_0-red.png"
    saliency = torch.from_numpy(np.load(raw_file))
    table = colormap_table("magma")
    heat = torch.from_numpy(np.array(Image.open(heatmap_file).convert("RGB")))
    assert torch.equal(heat, heatmap_image(saliency, table))
    peak = np.unravel_index(int(saliency.argmax()), tuple(saliency.shape))
    assert heat[peak].tolist() == _byte(table[-1]).tolist()  # the map's maximum is the colormap's top colour
    pixels = torch.from_numpy(np.array(Image.open(tmp_path / "sq.png").convert("RGB")))
    overlay = torch.from_numpy(np.array(Image.open(overlay_file).convert("RGB")))
    assert torch.equal(overlay, blend(pixels, saliency, table, 0.3))


def test_jpeg_quality_reaches_the_files(tmp_path: Path, square_model) -> None:
    from square_model import square_image

    from gradcam_cli.cam.explainer import Explainer
    from gradcam_cli.io.discovery import discover
    from gradcam_cli.options import OutputOptions
    from gradcam_cli.pipeline.batch import BatchRunner

    square_image().save(tmp_path / "sq.png")
    explainer = Explainer(square_model, "features", target=0)
    sizes = {}
    for quality in (20, 95):
        options = OutputOptions(output_dir=tmp_path / f"q{quality}", image_format="jpg", quality=quality)
        (record,) = BatchRunner(explainer, options).run(discover([tmp_path / "sq.png"]))
        data = Path(record.outputs[0]).read_bytes()
        assert Image.open(io.BytesIO(data)).format == "JPEG"
        sizes[quality] = len(data)
    assert sizes[20] < sizes[95]


def _label_patch(image: np.ndarray, fill: tuple[int, int, int], above: int) -> np.ndarray:
    """The label drawn above row ``above``: the bounding box of ``fill``'s pixels there, text included."""
    ys, xs = np.nonzero((image[:above] == fill).all(axis=2))
    return image[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1]


def _contains(image: np.ndarray, patch: np.ndarray) -> bool:
    height, width = patch.shape[:2]
    return any(
        np.array_equal(image[y : y + height, x : x + width], patch)
        for y in range(image.shape[0] - height + 1)
        for x in range(image.shape[1] - width + 1)
    )


@pytest.mark.parametrize(
    "box", [(80.0, 30.0, 100.0, 55.0), (85.0, 0.0, 100.0, 40.0), (0.0, 0.0, 100.0, 60.0)], ids=["right", "top", "all"]
)
def test_a_boxs_label_is_drawn_whole_inside_the_image(box) -> None:
    """At the right edge and in the top-right corner, the label is the very one drawn for a box in open space
    (the same caption at the same size), moved inside the image, not cut off."""
    caption, rank = "person 99.9%", 2
    open_space = draw_boxes(torch.zeros(60, 400, 3, dtype=torch.uint8), [((200.0, 30.0, 230.0, 55.0), caption, rank)])
    label = _label_patch(open_space.numpy(), colour(rank), 30)
    assert label.shape[1] > 40 and (label.sum(axis=2) < 150).any()  # wider than the boxes, with dark text in it
    edge = draw_boxes(torch.zeros(60, 100, 3, dtype=torch.uint8), [(box, caption, rank)]).numpy()
    assert _contains(edge, label)


def _places(image: np.ndarray, patch: np.ndarray) -> list[tuple[int, int]]:
    height, width = patch.shape[:2]
    return [
        (y, x)
        for y in range(image.shape[0] - height + 1)
        for x in range(image.shape[1] - width + 1)
        if np.array_equal(image[y : y + height, x : x + width], patch)
    ]


def test_labels_of_nearby_boxes_do_not_cover_each_other() -> None:
    """A combined overlay's labels of two nearly coincident boxes (and a third at the bottom edge, whose label
    cannot move down): each label is the very one drawn for its box in open space, found whole once, inside the
    image, and the labels' rectangles do not intersect."""
    captions = [("person 0.97", 1), ("person 0.91", 2), ("dog 0.88", 3)]
    labels = []
    for caption, rank in captions:
        alone = draw_boxes(torch.zeros(60, 400, 3, dtype=torch.uint8), [((200.0, 30.0, 230.0, 55.0), caption, rank)])
        labels.append(_label_patch(alone.numpy(), colour(rank), 30))
    boxes = [(20.0, 40.0, 90.0, 100.0), (24.0, 44.0, 94.0, 104.0), (30.0, 100.0, 80.0, 119.0)]
    marks = [(box, caption, rank) for box, (caption, rank) in zip(boxes, captions, strict=True)]
    combined = draw_boxes(torch.zeros(120, 160, 3, dtype=torch.uint8), marks).numpy()
    rectangles = []
    for label in labels:
        places = _places(combined, label)
        assert len(places) == 1, places  # drawn whole: no label or box line over it
        (y, x), (height, width) = places[0], label.shape[:2]
        rectangles.append((x, y, x + width - 1, y + height - 1))
    for i, (ax1, ay1, ax2, ay2) in enumerate(rectangles):
        for bx1, by1, bx2, by2 in rectangles[i + 1 :]:
            assert ax2 < bx1 or bx2 < ax1 or ay2 < by1 or by2 < ay1, rectangles
