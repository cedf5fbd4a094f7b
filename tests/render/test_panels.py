"""--panel: one matplotlib figure per image (image | heatmap + colorbar | overlay, or a classes x methods grid)."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from gradcam_cli.cam.results import Explanation, Prediction
from gradcam_cli.io.naming import panel_path
from gradcam_cli.render.panels import panel_figure, render_panel, save_panel


def _explanations(targets: list[Prediction], methods: list[str], size: tuple[int, int] = (48, 64)) -> list:
    generator = torch.Generator().manual_seed(0)
    return [Explanation(m, t, torch.rand(size, generator=generator)) for t in targets for m in methods]


@pytest.fixture
def pixels() -> torch.Tensor:
    return torch.randint(0, 256, (48, 64, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))


def _texts(figure) -> list[str]:
    texts = [t.get_text() for t in figure.texts]
    if figure._suptitle is not None:
        texts.append(figure._suptitle.get_text())
    for ax in figure.axes:
        texts += [ax.get_title(), ax.get_ylabel()]
    return [t for t in texts if t]


def test_single_panel_layout_and_title(pixels: torch.Tensor) -> None:
    cat = Prediction(285, "Egyptian cat", 0.4404)
    figure = panel_figure(pixels, _explanations([cat], ["gradcam"]), "viridis", 0.5, "chelsea.jpg")
    titles = [ax.get_title() for ax in figure.axes]
    assert titles[:3] == ["image", "gradcam heatmap", "overlay"]
    colorbars = [ax for ax in figure.axes if ax.get_label() == "<colorbar>"]
    assert len(colorbars) == 1 and colorbars[0].get_ylabel() == "importance"
    heat = figure.axes[1].images[0]
    assert heat.get_cmap().name == "viridis" and heat.get_clim() == (0.0, 1.0)
    headline = figure._suptitle.get_text()
    assert "chelsea.jpg" in headline and "Egyptian cat: 44.0% (class 285)" in headline
    assert figure.canvas.__class__.__name__ == "FigureCanvasAgg"


@pytest.mark.quick
def test_grid_rows_are_classes_and_columns_methods(pixels: torch.Tensor) -> None:
    targets = [Prediction(0, "red", 0.7), Prediction(2, "blue", 0.2), Prediction(1, "green", 0.1)]
    figure = panel_figure(pixels, _explanations(targets, ["gradcam", "other"]), "jet", 0.5, "x.png")
    overlays = [ax for ax in figure.axes if ax.images and ax.get_label() != "<colorbar>"]
    assert len(overlays) == 1 + 3 * 2  # the photo, then 3 classes x 2 methods
    assert [ax.get_title() for ax in overlays[1:3]] == ["gradcam", "other"]
    labels = [ax.get_ylabel() for ax in overlays if ax.get_ylabel()]
    assert [label.split("\n")[0] for label in labels] == ["red", "blue", "green"]
    assert "70.0% (class 0)" in labels[0]
    assert sum(ax.get_label() == "<colorbar>" for ax in figure.axes) == 1


def test_panel_encodes_png_jpg_webp_and_grid_is_taller(pixels: torch.Tensor) -> None:
    one = _explanations([Prediction(0, "red", 0.9)], ["gradcam"])
    grid = _explanations([Prediction(0, "red", 0.9), Prediction(1, "green", 0.1)], ["gradcam"])
    sizes = {}
    for fmt, pil_name in (("png", "PNG"), ("jpg", "JPEG"), ("webp", "WEBP")):
        with Image.open(io.BytesIO(render_panel(pixels, one, image_format=fmt, quality=80))) as image:
            assert image.format == pil_name
            sizes[fmt] = image.size
    width, height = sizes["png"]
    assert width > 2.5 * height  # three side-by-side cells
    with Image.open(io.BytesIO(render_panel(pixels, grid))) as image:
        assert image.size[1] > 1.5 * height  # two rows


def test_class_names_are_not_mathtext(pixels: torch.Tensor) -> None:
    """'$5 bill' must be drawn as text: an odd number of $ would otherwise make matplotlib raise."""
    data = render_panel(pixels, _explanations([Prediction(7, "$5 bill", 0.5)], ["gradcam"]), title="a $ b.jpg")
    assert data.startswith(b"\x89PNG")


def test_large_images_are_shrunk_before_drawing() -> None:
    big = torch.zeros(3000, 4000, 3, dtype=torch.uint8)
    figure = panel_figure(big, _explanations([Prediction(0, "red", 0.9)], ["gradcam"], (3000, 4000)))
    assert max(figure.axes[0].images[0].get_array().shape[:2]) <= 640


def test_save_panel_is_atomic_and_named_after_the_image(tmp_path: Path, pixels: torch.Tensor) -> None:
    from gradcam_cli.io.discovery import InputImage

    path = panel_path(tmp_path, InputImage(Path("a/b/cat.jpg"), Path("b/cat")), ".png")
    assert path == tmp_path / "b" / "cat_panel.png"
    save_panel(path, pixels, _explanations([Prediction(0, "red", 0.9)], ["gradcam"]))
    assert [p.name for p in path.parent.iterdir()] == ["cat_panel.png"]


def test_runner_writes_one_panel_per_image_listed_in_every_row(tmp_path: Path, square_model) -> None:
    from square_model import square_image

    from gradcam_cli.cam.explainer import Explainer
    from gradcam_cli.io.discovery import discover
    from gradcam_cli.options import OutputOptions
    from gradcam_cli.pipeline.batch import BatchRunner

    square_image().save(tmp_path / "sq.png")
    square_image(colour="blue").save(tmp_path / "blue.png")
    options = OutputOptions(output_dir=tmp_path / "out", panel=True)
    records = list(BatchRunner(Explainer(square_model, "features", top_k=2), options).run(discover([tmp_path])))
    assert len(records) == 4 and all(r.status == "ok" for r in records)
    for record in records:
        panel = Path(record.outputs[-1])
        assert panel.name == f"{Path(record.input).stem}_panel.png"
    panels = sorted(p.name for p in (tmp_path / "out").glob("*_panel.png"))
    assert panels == ["blue_panel.png", "sq_panel.png"]
    with Image.open(tmp_path / "out" / "sq_panel.png") as image:
        width, height = image.size
        assert height > 1.2 * width * 0.5  # a two-row grid (top-2)


@pytest.mark.slow  # a subprocess of its own
def test_matplotlib_and_opencv_are_imported_lazily() -> None:
    code = (
        "import sys, gradcam_cli.cli, gradcam_cli.pipeline.session, gradcam_cli.render.panels;"
        "import gradcam_cli.render.gallery;"
        "bad = [m for m in ('matplotlib', 'cv2') if m in sys.modules]; print(bad); sys.exit(bool(bad))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
