"""``gradcam eval --rank``: the new metrics by hand, the bootstrap, the known answers on the colour-square model
(a faithful method above randomcam; an edge detector posing as a method flagged by the sanity cascade), RISE and
occlusion on a detector, and the command line with its JSON rows and HTML page (in headless Chromium, ``slow``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from headless_browser import browse
from square_model import square_image
from test_eval import SQUARE_MODEL, box
from typer.testing import CliRunner

from gradcam_cli import Explainer
from gradcam_cli.cam.methods import METHODS, CamMethod
from gradcam_cli.cam.methods.needs import MASKED_PASSES
from gradcam_cli.cam.results import Prediction
from gradcam_cli.cli.eval import app
from gradcam_cli.evaluation import metrics
from gradcam_cli.evaluation.evaluate import Evaluator
from gradcam_cli.evaluation.intervals import bootstrap, paired_interval
from gradcam_cli.evaluation.plan import SEED_RERUNS
from gradcam_cli.evaluation.rank import MIN_IMAGES, format_ranking, rank
from gradcam_cli.evaluation.report import SANITY_MIN_REPEAT, EvalReport, ImageScores, MethodScores
from gradcam_cli.options import EvalOptions, PerturbationOptions

pytestmark = pytest.mark.quick
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
    few = PerturbationOptions(rise_masks=24, rise_grid=4)
    methods = ["gradcam", "randomcam", "edges", "rise", "copy"]
    monkeypatch.setitem(METHODS, "copy", CamMethod("copy", METHODS["gradcam"].compute))  # gradcam's maps: a tie
    explainer = Explainer(square_model, "features", methods, perturbation=few)
    options = EvalOptions(steps=8, sanity=True, sanity_layers=2, stability=True, stability_samples=2)
    report = Evaluator(explainer, options).run([folder], boxes)
    assert not report.failed
    for image in report.ok:
        rise = image.methods["rise"]
        # fresh masks for the randomised models and the redraw: RISE's own masks cannot make the maps agree
        assert rise.sanity_redraw is not None and rise.sanity_redraw < 0.99
        assert image.methods["gradcam"].sanity_redraw is None  # deterministic: not redrawn
    sanity = {m: report.summary(m)["sanity"] for m in methods}
    assert sanity["randomcam"]["redraw_spearman"] < SANITY_MIN_REPEAT  # fresh noise does not repeat: flagged
    assert sanity["rise"]["threshold"] == pytest.approx(0.9 * min(1.0, sanity["rise"]["redraw_spearman"]))
    assert sanity["rise"]["flagged"] == (
        sanity["rise"]["redraw_spearman"] < SANITY_MIN_REPEAT
        or max(sanity["rise"]["spearman"]) > sanity["rise"]["threshold"]
    )
    rows = {(row.metric, row.method): row for row in rank(report, seed=0)}
    for metric in ("deletion_auc", "insertion_auc", "pointing"):
        assert rows[(metric, "gradcam")].rank < rows[(metric, "randomcam")].rank, metric
        assert rows[(metric, "gradcam")].images == len(PLACES)
        assert rows[(metric, "copy")].rank == rows[(metric, "gradcam")].rank, metric  # identical maps tie
        assert rows[(metric, "copy")].group == rows[(metric, "gradcam")].group, metric
    low, high = rows[("deletion_auc", "gradcam")].vs_random_low, rows[("deletion_auc", "gradcam")].vs_random_high
    assert low <= high < 0  # the paired interval against randomcam excludes 0
    assert rows[("insertion_auc", "gradcam")].vs_random_low > 0
    assert rows[("pointing", "gradcam")].mean == 100.0
    assert rows[("deletion_auc", "gradcam")].ci_high < rows[("deletion_auc", "randomcam")].ci_low
    # pointing on 4 images cannot tell gradcam (4 hits) from one noise draw (often 2-3 hits): decided by the interval
    assert rows[("deletion_auc", "gradcam")].beats_random is (rows[("pointing", "gradcam")].vs_random_low > 0)
    assert rows[("deletion_auc", "randomcam")].beats_random is None  # not measured against itself
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
def test_cli_rank_report_in_headless_chromium(two_squares: Path, tmp_path: Path, chromium: str) -> None:
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
        "--target-class",
        "2",
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
        "rows.jsonl",
        "curves.png",
        "boxes.png",
        *(f"example-{i}.png" for i in (1, 2)),
    }
    dom = browse(chromium, tmp_path, (page / "index.html").as_uri(), "--dump-dom")
    assert 'data-methods="3"' in dom and 'data-images="2"' in dom
    assert "<th>vs best</th><th>vs randomcam</th>" in dom and "data-group=" in dom  # the paired comparisons
    assert "intervals are not reliable below" in dom  # two images: warned
    assert "square0.png: 2 (" in dom  # the examples explain --target-class, not the top class (red, 0)
    assert dom.count('class="ranking"') >= 8
    shot = tmp_path / "shot.png"
    browse(chromium, tmp_path, (page / "index.html").as_uri(), f"--screenshot={shot}", "--window-size=1000,800")
    import numpy as np
    from PIL import Image

    pixels = torch.from_numpy(np.asarray(Image.open(shot).convert("L"), dtype=np.float32))
    assert pixels.std() > 10  # not a blank page


def test_randomcam_draws_per_image_whatever_the_batch(tmp_path: Path) -> None:
    from gradcam_cli.cli import app as gradcam

    folder = tmp_path / "in"
    folder.mkdir()
    for i, corners in enumerate(PLACES[:3]):
        square_image((64, 64), corners).save(folder / f"square{i}.png")
    raw: dict[str, dict[str, np.ndarray]] = {}
    for name, more in (("batched", []), ("single", ["--batch-size", "1"])):
        out = tmp_path / name
        args = [str(folder), "-m", SQUARE_MODEL, "-l", "features", "--method", "randomcam", "--save-raw", "-t", "0"]
        result = CliRunner().invoke(gradcam, [*args, "-o", str(out), "--workers", "0", *more])
        assert result.exit_code == 0, result.output
        raw[name] = {path.name: np.load(path) for path in out.rglob("*.npy")}
    assert len(raw["batched"]) == 3 and raw["batched"].keys() == raw["single"].keys()
    for name, saliency in raw["batched"].items():
        assert np.array_equal(saliency, raw["single"][name]), name
    first, second, _ = raw["batched"].values()
    assert not np.allclose(first, second)  # each image its own noise


def synthetic(deletion: dict[str, list[float]]) -> EvalReport:
    """A report whose methods have the given per-image deletion AUCs (flat curves), insertion AUC 1 minus those."""
    methods = list(deletion)
    count = len(next(iter(deletion.values())))
    images = [
        ImageScores(
            f"image{i}.png",
            Prediction(0, "red", 0.9),
            {m: MethodScores([v[i], v[i]], [1 - v[i], 1 - v[i]], 0.0) for m, v in deletion.items()},
        )
        for i in range(count)
    ]
    return EvalReport("synthetic", ["layer"], methods, EvalOptions(), [], images)


def test_paired_bca_interval_covers_a_known_difference() -> None:
    """Per-image differences from a skewed distribution (exponential, mean 0.3 known): over 300 seeded replicates
    of 12 images the 95 % BCa interval holds the true mean in 85-99 % of them (the percentile interval of a mean of
    12 skewed values covers about 90 %); and it always holds the sample mean."""
    generator = torch.Generator().manual_seed(7)
    true, hits, replicates = 0.3, 0, 300
    for replicate in range(replicates):
        sample = torch.empty(12, dtype=torch.float64).exponential_(1 / true, generator=generator)
        low, high = paired_interval(sample, replicate, resamples=1000)
        hits += low <= true <= high
        assert low <= float(sample.mean()) <= high
    assert 0.85 * replicates <= hits <= 0.99 * replicates, hits  # 0.88-0.91 measured over generator seeds
    assert all(math.isnan(end) for end in paired_interval(torch.tensor([2.0]), 0))  # one image: none
    assert paired_interval(torch.tensor([0.5, 0.5, 0.5]), 0) == (0.5, 0.5)


def test_rank_float64_ties_pairs_groups_and_the_floor() -> None:
    base = [0.1 + 1e-7 * i for i in range(12)]
    report = synthetic(
        {
            "gradcam": base,
            "copy": list(base),  # identical maps: a tie, one group
            "good": [v + 0.01 + 0.001 * (i % 3) for i, v in enumerate(base)],
            "randomcam": [0.5 + 0.01 * (i % 4) for i in range(12)],
        }
    )
    rows = {row.method: row for row in rank(report, seed=0) if row.metric == "deletion_auc"}
    assert rows["gradcam"].rank == rows["copy"].rank == 1 and rows["good"].rank == 3
    assert rows["gradcam"].group == rows["copy"].group == 1 and rows["copy"].indistinguishable_from_best
    assert rows["good"].group == 2 and rows["good"].indistinguishable_from_best is False
    assert rows["good"].vs_best_low > 0  # worse than the best on every image: the paired interval excludes 0
    assert rows["randomcam"].group == 3 and rows["randomcam"].beats_random is None
    assert rows["gradcam"].beats_random is True and rows["gradcam"].vs_random_high < 0
    for row in rows.values():
        assert row.ci_low <= row.mean <= row.ci_high and row.reliable
        assert row.per_image["image3.png"] == report.images[3].methods[row.method].deletion_auc
    # two copies of one value: the interval is the value itself, never beside it
    twice = {row.method: row for row in rank(synthetic({"a": [0.1234567, 0.1234567], "randomcam": [0.3, 0.6]}))}
    assert twice["a"].ci_low <= twice["a"].mean <= twice["a"].ci_high


def test_rank_says_when_intervals_are_unreliable_or_absent() -> None:
    few = rank(synthetic({"gradcam": [0.1, 0.2, 0.15], "randomcam": [0.5, 0.4, 0.6]}))
    assert not any(row.reliable for row in few)
    assert f"not reliable below {MIN_IMAGES} images" in format_ranking(few)[0]
    # the groups too: each block says so, and shows them in parentheses
    table = format_ranking(few)
    assert f"3 image(s)): groups not reliable below {MIN_IMAGES} images" in table[2]
    assert all(line.split()[1].startswith("(") for line in table if line.lstrip()[:2] in {"1.", "2."})
    assert "seed sd" not in table[3]  # not measured: no column
    many = format_ranking(rank(synthetic({"gradcam": [0.1 + 0.01 * i for i in range(12)], "randomcam": [0.5] * 12})))
    assert "groups not reliable" not in "\n".join(many) and "  1.   1  " in "\n".join(many)
    one = rank(synthetic({"gradcam": [0.1], "randomcam": [0.5]}))
    assert all(math.isnan(row.ci_low) and row.to_dict()["ci_low"] is None for row in one)
    assert {row.method: row.beats_random for row in one} == {"gradcam": None, "randomcam": None}
    assert format_ranking(one)[0].startswith("warning: one image: no confidence intervals")


@pytest.mark.slow
def test_cli_rank_plan_rows_interrupt_and_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    for i, corners in enumerate(PLACES[:3]):
        square_image((64, 64), corners).save(folder / f"square{i}.png")
    page = tmp_path / "page"
    common = [str(folder), "--model", SQUARE_MODEL, "--layer", "features", "--steps", "4", "--sanity-layers", "1"]
    common += ["--input-size", "32", "--rank", "--report", str(page)]
    original, calls = Evaluator.evaluate_image, []

    def interrupted(self, path, boxes=()):  # Ctrl-C while the second image is evaluated
        calls.append(path.name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(self, path, boxes)

    monkeypatch.setattr(Evaluator, "evaluate_image", interrupted)
    stopped = run(*common)
    assert stopped.exit_code == 130, stopped.output
    assert "plan: 2 method(s) on 3 image(s)" in stopped.stderr  # printed before the heavy work
    assert "deletion AUC (lower is better; 1 image(s))" in stopped.stdout  # the partial table
    assert "add --skip-existing to resume" in stopped.stderr
    lines = (page / "rows.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines[1:]]  # one row per (image, method), as each finishes
    assert "settings" in json.loads(lines[0]) and [(row["image"], *row["methods"]) for row in rows] == [
        (str(folder / "square0.png"), "gradcam"),
        (str(folder / "square0.png"), "randomcam"),
    ]
    calls.clear()
    monkeypatch.setattr(
        Evaluator,
        "evaluate_image",
        lambda self, path, boxes=(): calls.append((self.options.seed, path)) or original(self, path, boxes),
    )
    resumed = run(*common, "--skip-existing", "--json")
    assert resumed.exit_code == 0, resumed.output
    evaluated = [path.name for seed, path in calls if seed == 0]
    assert evaluated == ["square1.png", "square2.png"]  # the finished image is kept
    reruns = [path.name for seed, path in calls if seed != 0]  # the seed spread's: the first 3, twice
    assert reruns == ["square0.png", "square1.png", "square2.png"] * SEED_RERUNS
    rows = [json.loads(line) for line in resumed.stdout.splitlines() if line.startswith("{")]
    assert {row["images"] for row in rows} == {3} and all(len(row["per_image"]) == 3 for row in rows)
    kept = [json.loads(line) for line in (page / "rows.jsonl").read_text().splitlines()]
    assert len([row for row in kept if "seed_run" not in row]) == 1 + 3 * 2  # settings, then 3 images x 2 methods
    other = run(*common, "--skip-existing", "--steps", "5")
    assert other.exit_code == 2 and "written by a run with other settings" in other.stderr
    # a budget no method fits: the floor and the cheapest method are kept (the floor alone ranks nothing), and the
    # plan says which were left out and why
    tight = run(*common[:-2], "--method", "gradcam,gradcam++", "--budget", "0", "--json")
    assert tight.exit_code == 0, tight.output
    assert "left out to fit the 0s budget" in tight.stderr and "fits only the randomcam baseline" in tight.stderr
    ranked = {json.loads(line)["method"] for line in tight.stdout.splitlines() if line.startswith("{")}
    assert "randomcam" in ranked and len(ranked) == 2
    assert f"(per image: {({'gradcam', 'gradcam++'} - ranked).pop()} ~" in tight.stderr


EXPECTED_SANITY = {
    "gradcam": False,  # the head's weights are its channel weights: a random head changes the map
    "rise": False,  # fresh masks on the randomised model; its draws on the trained one repeat (rho ~0.4 at 100 masks)
    "scorecam": True,  # softmax channel weights, all positive: the same positive mix of activations whatever the head
    "eigencam": True,  # the activations alone: stages after the layer cannot change them
    "kpcacam": True,
    "fem": True,
    "randomcam": True,  # fresh noise never repeats: flagged as not repeating (redraw rho ~0)
}


@pytest.mark.slow
def test_sanity_cascade_expected_outcome_per_method(two_squares: Path, square_model) -> None:
    """docs/evaluation.md's expected cascade outcomes, on the colour detector with its head re-initialised."""
    perturbation = PerturbationOptions(rise_masks=100, rise_grid=5)
    explainer = Explainer(square_model, "features", list(EXPECTED_SANITY), perturbation=perturbation)
    report = Evaluator(explainer, EvalOptions(steps=4, sanity=True, sanity_layers=1)).run([two_squares])
    flagged = {method: report.summary(method)["sanity"]["flagged"] for method in EXPECTED_SANITY}
    assert flagged == EXPECTED_SANITY
    assert report.summary("randomcam")["sanity"]["redraw_spearman"] < SANITY_MIN_REPEAT
