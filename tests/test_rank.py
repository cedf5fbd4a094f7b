"""``gradcam eval --rank``: the new metrics by hand, the bootstrap, the known answers on the colour-square model
(a faithful method above randomcam; an edge detector posing as a method flagged by the sanity cascade), RISE and
occlusion on a detector, and the command line with its JSON rows and HTML page (in headless Chromium, ``slow``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from square_model import square_image
from test_eval import SQUARE_MODEL, box
from test_gallery import _browse, chromium  # noqa: F401  (the fixture, shared)
from typer.testing import CliRunner

from gradcam_cli import Explainer
from gradcam_cli.cam.methods import METHODS, CamMethod
from gradcam_cli.cam.methods.needs import MASKED_PASSES
from gradcam_cli.cli.eval import app
from gradcam_cli.evaluation import metrics
from gradcam_cli.evaluation.evaluate import Evaluator
from gradcam_cli.evaluation.rank import bootstrap, rank
from gradcam_cli.options import EvalOptions, PerturbationOptions

PLACES = [(8, 8, 28, 28), (50, 20, 70, 40), (30, 60, 50, 80), (60, 62, 80, 82)]
SMALL = PerturbationOptions(rise_masks=60, rise_grid=5, occlusion_window=16, occlusion_stride=16)


def test_gini_entropy_and_relative_change_by_hand() -> None:
    uniform, spike = torch.ones(4, 4), torch.zeros(4, 4)
    spike[1, 2] = 3.0
    assert metrics.gini(uniform) == pytest.approx(0.0)
    assert metrics.gini(spike) == pytest.approx(15 / 16)  # (n - 1) / n for one non-zero value of n
    assert metrics.gini(torch.tensor([0.0, 1.0, 3.0])) == pytest.approx((0 * -2 + 1 * 0 + 3 * 2) / (3 * 4))
    assert metrics.entropy(uniform) == pytest.approx(1.0)
    assert metrics.entropy(spike) == pytest.approx(0.0)
    two = torch.tensor([1.0, 1.0, 0.0, 0.0])
    assert metrics.entropy(two) == pytest.approx(math.log(2) / math.log(4))
    assert metrics.relative_change(torch.tensor([3.0, 4.0]), torch.tensor([3.0, 4.0])) == 0.0
    assert metrics.relative_change(torch.tensor([3.0, 4.0]), torch.tensor([0.0, 4.0])) == pytest.approx(3 / 5)


def test_bootstrap_is_seeded_and_brackets_the_mean() -> None:
    table = torch.tensor([[1.0, 2.0, 3.0, 4.0, 10.0], [5.0, 5.0, 5.0, 5.0, 5.0]])
    first, again, other = bootstrap(table, 1), bootstrap(table, 1), bootstrap(table, 2)
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert first[0, 0] < 4.0 < first[0, 1]  # the mean, 4, inside
    assert first[1].tolist() == [5.0, 5.0]  # constant values: no spread
    picks = torch.randint(0, 5, (1000, 5), generator=torch.Generator().manual_seed(1))
    expected = torch.quantile(table[0].double()[picks].mean(dim=1), torch.tensor([0.025, 0.975]).double())
    torch.testing.assert_close(first[0], expected)


def edges(activations: object, gradients: object, passes, *, eigen_smooth: bool = False) -> torch.Tensor:
    """A Sobel edge detector on the input: L = |Sobel_x * x| + |Sobel_y * x| (Sobel, 1968), ignoring the model."""
    grey = passes.inputs.mean(dim=1, keepdim=True)
    kernel = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]], device=grey.device)
    gx = F.conv2d(grey, kernel.view(1, 1, 3, 3), padding=1)
    gy = F.conv2d(grey, kernel.t().reshape(1, 1, 3, 3), padding=1)
    return (gx.abs() + gy.abs())[:, 0]


@pytest.fixture
def squares(tmp_path: Path) -> tuple[Path, list]:
    boxes = []
    for i, corners in enumerate(PLACES):
        square_image((96, 96), corners).save(tmp_path / f"square{i}.png")
        boxes.append(box(f"square{i}.png", corners, "red"))
    return tmp_path, boxes


@pytest.mark.slow
def test_known_answers_faithful_above_randomcam_and_the_edge_detector_fails_sanity(
    squares, square_model, monkeypatch
) -> None:
    monkeypatch.setitem(
        METHODS, "edges", CamMethod("edges", edges, uses_gradients=False, needs=MASKED_PASSES, uses_layer=False)
    )
    folder, boxes = squares
    explainer = Explainer(square_model, "features", ["gradcam", "randomcam", "edges"])
    options = EvalOptions(steps=8, sanity=True, sanity_layers=2, stability=True, stability_samples=2)
    report = Evaluator(explainer, options).run([folder], boxes)
    assert not report.failed
    rows = {(row.metric, row.method): row for row in rank(report, seed=0)}
    for metric in ("deletion_auc", "insertion_auc", "pointing"):
        assert rows[(metric, "gradcam")].rank < rows[(metric, "randomcam")].rank, metric
        assert rows[(metric, "gradcam")].images == len(PLACES)
    assert rows[("pointing", "gradcam")].mean == 100.0
    assert rows[("deletion_auc", "gradcam")].ci_high < rows[("deletion_auc", "randomcam")].ci_low
    assert rows[("deletion_auc", "gradcam")].beats_random is True
    assert rows[("deletion_auc", "randomcam")].beats_random is False
    assert rows[("deletion_auc", "gradcam")].sanity_failed is False
    assert rows[("deletion_auc", "edges")].sanity_failed is True  # the model plays no part: rho 1 at every stage
    assert rows[("deletion_auc", "randomcam")].sanity_failed is True
    assert {row.metric for row in rows.values()} >= {"gini", "entropy", "stability", "sanity", "average_drop"}
    # the map is the square: sparser than the noise
    assert rows[("gini", "gradcam")].mean > rows[("gini", "randomcam")].mean


def test_quick_rise_and_occlusion_explain_a_detection_where_its_box_is() -> None:
    from task_models import build_detector

    image = square_image((96, 96), (50, 20, 74, 44), "green")
    # the detection's score is its strongest cell's: only a window hiding the whole square lowers it
    options = PerturbationOptions(rise_masks=60, rise_grid=5, occlusion_window=32, occlusion_stride=8)
    explainer = Explainer(build_detector(), None, ["rise", "occlusion"], perturbation=options, max_detections=1)
    result = explainer.explain(image)
    assert [p.index for p in result.predictions] == [2]  # green
    for explanation in result.explanations:
        row, col = divmod(int(explanation.saliency.argmax()), explanation.saliency.shape[1])
        assert 50 - 8 <= col < 74 + 8 and 20 - 8 <= row < 44 + 8, (explanation.method, row, col)


@pytest.fixture
def two_squares(tmp_path: Path) -> Path:
    folder = tmp_path / "two"
    folder.mkdir()
    for i, corners in enumerate(PLACES[:2]):
        square_image((96, 96), corners).save(folder / f"square{i}.png")
    return folder


@pytest.mark.slow
def test_rise_and_occlusion_explain_a_segmenter_class_where_its_pixels_are() -> None:
    from task_models import build_segmenter

    image = square_image((64, 64), (8, 30, 28, 50), "blue")
    options = PerturbationOptions(rise_masks=60, rise_grid=4, occlusion_window=12, occlusion_stride=6)
    explainer = Explainer(build_segmenter(), None, ["rise", "occlusion"], perturbation=options, target=3)
    result = explainer.explain(image)
    assert {e.target.index for e in result.explanations} == {3}  # blue
    for explanation in result.explanations:
        row, col = divmod(int(explanation.saliency.argmax()), explanation.saliency.shape[1])
        assert 8 - 6 <= col < 28 + 6 and 30 - 6 <= row < 50 + 6, (explanation.method, row, col)


def run(*args: str):
    return CliRunner().invoke(app, [*args], catch_exceptions=False)  # gradcam eval ARGS


@pytest.mark.slow
def test_cli_rank_json_rows(two_squares: Path) -> None:
    folder = two_squares
    common = ["--model", SQUARE_MODEL, "--layer", "features", "--steps", "6", "--sanity-layers", "1"]
    result = run(
        str(folder),
        *common,
        "--method",
        "gradcam,occlusion",
        "--rank",
        "--json",
        "--input-size",
        "32",
        "--occlusion-window",
        "16",
        "--occlusion-stride",
        "16",
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    methods = {row["method"] for row in rows}
    assert methods == {"gradcam", "occlusion", "randomcam"}  # randomcam joins as the floor
    metrics_seen = [row["metric"] for row in rows]
    assert {"deletion_auc", "insertion_auc", "road", "sanity", "gini", "entropy", "stability"} <= set(metrics_seen)
    for row in rows:
        assert row["ci_low"] - 1e-6 <= row["mean"] <= row["ci_high"] + 1e-6
    bad = run(str(folder), *common, "--report", str(folder / "page"))
    assert bad.exit_code == 2
    assert bad.stderr.splitlines() == [
        "error: --report is for --rank: add --rank (gradcam eval writes no page otherwise)"
    ]


@pytest.mark.slow
def test_cli_rank_report_in_headless_chromium(two_squares: Path, tmp_path: Path, chromium: str) -> None:  # noqa: F811
    folder = two_squares
    page = tmp_path / "ranking"
    result = run(
        str(folder),
        "--model",
        SQUARE_MODEL,
        "--layer",
        "features",
        "--steps",
        "6",
        "--sanity-layers",
        "1",
        "--method",
        "gradcam,rise",
        "--rise-masks",
        "40",
        "--rank",
        "--report",
        str(page),
        "--input-size",
        "32",
    )
    assert result.exit_code == 0, result.output
    assert "SANITY FAILED" in result.stdout  # randomcam's noise does not depend on the model
    assert {p.name for p in page.iterdir()} == {
        "index.html",
        "curves.png",
        "boxes.png",
        *(f"example-{i}.png" for i in (1, 2)),
    }
    dom = _browse(chromium, tmp_path, (page / "index.html").as_uri(), "--dump-dom")
    assert 'data-methods="3"' in dom and 'data-images="2"' in dom
    assert dom.count('class="ranking"') >= 8
    shot = tmp_path / "shot.png"
    _browse(chromium, tmp_path, (page / "index.html").as_uri(), f"--screenshot={shot}", "--window-size=1000,800")
    import numpy as np
    from PIL import Image

    pixels = torch.from_numpy(np.asarray(Image.open(shot).convert("L"), dtype=np.float32))
    assert pixels.std() > 10  # not a blank page
