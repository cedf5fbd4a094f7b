"""Detectors and segmenters on the command line: rows and files per detection and per class, the drawn boxes and
outlines, images without detections, --save-raw, --report, --skip-existing, --list-layers, gradcam eval against
ground-truth boxes, gradcam diff of their runs, their provenance, and the one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image
from square_model import square_image
from typer.testing import CliRunner

from gradcam_cli.cli import app
from gradcam_cli.cli.diff import app as diff_app
from gradcam_cli.cli.eval import app as eval_app
from gradcam_cli.errors import EXIT_IMAGE_FAILED, EXIT_OK, EXIT_USAGE
from gradcam_cli.io.naming import RUN_RECORD_NAME
from gradcam_cli.render.boxes import PALETTE

MODELS = Path(__file__).parents[1].joinpath("task_models.py")
DETECTOR, SEGMENTER, PUZZLE = (f"{MODELS}:{name}" for name in ("build_detector", "build_segmenter", "build_puzzle"))
RED_BOX = (250, 60, 290, 100)


def run(*args: str | Path) -> object:
    return CliRunner().invoke(app, [str(a) for a in args])


def run_diff(*args: str | Path) -> object:
    return CliRunner().invoke(diff_app, [str(a) for a in args])


def run_eval(*args: str | Path) -> object:
    return CliRunner().invoke(eval_app, [str(a) for a in args])


def rows(result) -> list[dict]:
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.fixture
def inputs(tmp_path) -> Path:
    """grey.png (nothing to find), red.png (a red square by the right edge), two.png (green and red squares), and
    the class names of the square models."""
    folder = tmp_path / "in"
    folder.mkdir()
    Image.new("RGB", (300, 200), (128, 128, 128)).save(folder / "grey.png")
    square_image((300, 200), RED_BOX).save(folder / "red.png")
    two = square_image((240, 320), (30, 40, 90, 100), "green")
    two.paste((230, 20, 20), (120, 200, 200, 280))
    two.save(folder / "two.png")
    (tmp_path / "classes.txt").write_text("__background__\nred\ngreen\nblue\n", encoding="utf-8")
    return folder


def detect(what: Path, out: Path, *more: str | Path) -> object:
    """The square detector on ``what`` (the inputs folder or a file in it), with the class names."""
    folder = what if what.is_dir() else what.parent
    return run(what, "-m", DETECTOR, "--labels", folder.parent / "classes.txt", "-o", out, "--workers", "0", *more)


@pytest.mark.quick
def test_a_detector_writes_a_row_and_an_overlay_per_detection_and_a_combined_overlay(inputs, tmp_path):
    out = tmp_path / "out"
    result = detect(inputs, out, "--json", "--method", "gradcam,layercam")
    assert result.exit_code == EXIT_OK, result.output
    found = rows(result)
    by_image = {
        name: [r for r in found if Path(r["input"]).name == name] for name in ("grey.png", "red.png", "two.png")
    }
    assert [(r["method"], r["target"], r["outputs"]) for r in by_image["grey.png"]] == [
        ("gradcam", None, [str(out / "grey_gradcam_boxes.png")]),
        ("layercam", None, [str(out / "grey_layercam_boxes.png")]),
    ]
    (red_gradcam, red_layercam) = by_image["red.png"]
    assert red_gradcam["target"]["name"] == "red" and red_gradcam["target"]["index"] == 1
    x1, y1, x2, y2 = red_gradcam["target"]["box"]  # in the original image's pixels
    assert abs(x1 - 250) <= 5 and abs(y1 - 60) <= 5 and abs(x2 - 290) <= 5 and abs(y2 - 100) <= 5
    assert red_gradcam["outputs"] == [str(out / "red_gradcam_box1_1-red.png"), str(out / "red_gradcam_boxes.png")]
    assert red_layercam["outputs"][1] == str(out / "red_layercam_boxes.png")
    two = by_image["two.png"]
    assert len(two) == 4 and {r["target"]["name"] for r in two} == {"red", "green"}
    assert all(len(r["predictions"]) == 2 and all("box" in p for p in r["predictions"]) for r in two)
    written = sorted(p.name for p in out.glob("two_*"))
    assert len(written) == 6 and "two_gradcam_boxes.png" in written and "two_layercam_box2_2-green.png" in written


def test_the_overlay_draws_the_box_and_the_console_names_it(inputs, tmp_path):
    out = tmp_path / "out"
    result = detect(inputs / "red.png", out)
    assert result.exit_code == EXIT_OK, result.output
    lines = result.stdout.splitlines()
    assert lines[1].startswith("  1. red ") and "(class 1) at [" in lines[1]
    assert lines[2].startswith("  gradcam for red (99.9% at [") and lines[2].endswith("red_gradcam_box1_1-red.png")
    overlay = np.asarray(Image.open(out / "red_gradcam_box1_1-red.png"))
    x1, y1, x2, y2 = rows(detect(inputs / "red.png", tmp_path / "again", "--json"))[0]["target"]["box"]
    middle = (int(y1 + y2) // 2, int(x2) - 1)  # the right edge of the box, half-way down
    assert tuple(overlay[middle]) == PALETTE[0]
    assert tuple(overlay[middle[0], int(x1) + 12]) != PALETTE[0]  # inside the box: the map, not the line


def test_an_image_without_detections_is_a_row_that_says_so(inputs, tmp_path):
    result = detect(inputs / "grey.png", tmp_path / "out")
    assert result.exit_code == EXIT_OK, result.output
    assert "  gradcam: no detection above --score-threshold 0.5 -> " in result.stdout
    assert result.stderr.count("error") == 0


def test_save_raw_and_report_cover_every_detection(inputs, tmp_path):
    out = tmp_path / "out"
    result = detect(inputs, out, "--save-raw", "--report")
    assert result.exit_code == EXIT_OK, result.output
    raw = np.load(out / "red_gradcam_box1_1-red.npy")
    assert raw.shape == (200, 300) and raw.dtype == np.float32
    row, col = np.unravel_index(int(raw.argmax()), raw.shape)
    assert 250 <= col < 290 and 60 <= row < 100
    assert (out / "red_gradcam_boxes.npy").exists() and (out / "grey_gradcam_boxes.npy").exists()
    page = (out / "index.html").read_text(encoding="utf-8")
    assert page.count('"views":[') == 3 and '"target":null' in page  # grey.png's card says nothing was found
    assert len(list((out / "_thumbs").glob("*.jpg"))) == 1 + 2 + 3  # each detection's overlay, each combined one
    assert '["all detections","red_gradcam_boxes.png"]' in page  # linked from the detection's card as such


def test_skip_existing_resumes_a_detectors_run(inputs, tmp_path):
    out = tmp_path / "out"
    manifest = out / "rows.jsonl"
    first = detect(inputs, out, "--manifest", manifest, "--json")
    assert first.exit_code == EXIT_OK
    (out / "two_gradcam_boxes.png").unlink()  # two.png is no longer complete
    again = detect(inputs, out, "--manifest", manifest, "--json", "--skip-existing")
    assert again.exit_code == EXIT_OK, again.output
    statuses = {(Path(r["input"]).name, r["status"]) for r in rows(again)}
    assert statuses == {("grey.png", "skipped"), ("red.png", "skipped"), ("two.png", "ok")}
    kept = [r for r in rows(again) if r["status"] == "skipped" and r["target"]]
    assert [r["target"]["name"] for r in kept] == ["red"]  # the earlier row, from the manifest
    first_rows = {(Path(r["input"]).name, r["method"]): r for r in rows(first)}
    for row in (r for r in rows(again) if r["status"] == "skipped"):  # the earlier rows, fingerprints and all
        earlier = first_rows[(Path(row["input"]).name, row["method"])]
        assert row["fingerprint"] == earlier["fingerprint"] and row["provenance"] == earlier["provenance"]
    refused = detect(inputs, out, "--skip-existing", "--score-threshold", "0.3")
    assert refused.exit_code == EXIT_USAGE and "--score-threshold 0.5 (this run: 0.3)" in refused.stderr


@pytest.mark.parametrize("model", [DETECTOR, SEGMENTER], ids=["detector", "segmenter"])
def test_an_image_with_nothing_to_explain_is_no_drift_against_itself(inputs, tmp_path, model, restore_determinism):
    """Two identical --deterministic runs over a grey image (no detection; only the background) and a red one:
    its rows carry the fingerprint of their empty map, and gradcam diff finds no drift."""
    manifests = []
    for name in ("one", "two"):
        out = tmp_path / name
        args = ["-m", model, "--labels", inputs.parent / "classes.txt", "-o", out, "--workers", "0"]
        result = run(inputs / "grey.png", inputs / "red.png", *args, "--manifest", out / "m.jsonl", "--deterministic")
        assert result.exit_code == EXIT_OK, result.output
        manifests.append(out / "m.jsonl")
    grey = [json.loads(line) for line in manifests[0].read_text().splitlines() if "grey.png" in line]
    assert [(row["target"], row["fingerprint"]) for row in grey] == [
        (None, {"size": [200, 300], "grid": ["00" * 16] * 16})
    ]
    compared = run_diff(*manifests)
    assert compared.exit_code == EXIT_OK, compared.output
    assert compared.stderr.startswith("no drift: 2 image(s)")
    line = next(line for line in compared.stdout.splitlines() if "grey.png" in line)
    assert line.split()[1:7] == ["gradcam", "none", "-", "1.000", "1.000", "1.00"]


@pytest.mark.parametrize(
    ("model", "nothing"),
    [(DETECTOR, "no detection"), (SEGMENTER, "only the background")],
    ids=["detector", "segmenter"],
)
def test_a_detection_that_comes_or_goes_is_drift(inputs, tmp_path, model, nothing):
    """grey.png explained, then a red square painted on it: drift both ways, whatever --allow-class-change says; a
    run whose only rows found nothing compares equal with itself."""

    def explained(name: str) -> Path:
        out = tmp_path / name
        result = run(inputs / "grey.png", "-m", model, "--labels", inputs.parent / "classes.txt", "-o", out,
                     "--manifest", out / "m.jsonl")  # fmt: skip
        assert result.exit_code == EXIT_OK, result.output
        return out / "m.jsonl"

    before = explained("grey")
    square_image((300, 200), RED_BOX).save(inputs / "grey.png")
    after = explained("red")
    assert run_diff(before, before).exit_code == EXIT_OK  # nothing but rows without a target: no drift
    came = run_diff(before, after)
    assert came.exit_code == EXIT_IMAGE_FAILED
    assert (
        f"drift: {inputs / 'grey.png'} (gradcam, class 1 red): {nothing} in the baseline run (1 red in the current)"
        in came.stdout
    )
    went = run_diff(after, before, "--allow-class-change")
    assert went.exit_code == EXIT_IMAGE_FAILED
    reasons = next(line for line in went.stdout.splitlines() if line.startswith("drift: "))
    assert reasons.startswith(
        f"drift: {inputs / 'grey.png'} (gradcam): {nothing} in the current run (1 red in the baseline); spearman 0.000"
    )
    assert "  gradcam  1 -> none  " in next(line for line in went.stdout.splitlines() if "grey.png" in line)


@pytest.mark.parametrize(
    ("model", "more", "settings"),
    [
        (DETECTOR, [], {"task": "detect", "score_threshold": 0.5, "max_detections": 10}),
        (SEGMENTER, [], {"task": "segment"}),
        (
            f"{Path(__file__).parents[1].joinpath('square_model.py')}:build",
            ["--score", "softmax"],
            {"task": "classify", "score": "softmax"},
        ),
    ],
    ids=["detector", "segmenter", "classifier"],
)
def test_rows_record_the_tasks_own_score_as_the_run_record_does(inputs, tmp_path, model, more, settings):
    """A detector's or segmenter's rows name no classifier --score; a classifier's name the one it ran with."""
    out = tmp_path / "out"
    result = run(inputs / "red.png", "-m", model, "-o", out, "--json", *more)
    assert result.exit_code == EXIT_OK, result.output
    provenance = rows(result)[0]["provenance"]
    record = json.loads((out / RUN_RECORD_NAME).read_text())
    keys = ("task", "score", "score_threshold", "max_detections")
    assert {key: provenance[key] for key in keys if key in provenance} == settings
    assert {key: record[key] for key in keys if key in record} == settings


def test_a_detectors_image_whose_rows_the_resumed_manifest_lacks_is_explained_again(inputs, tmp_path):
    """A killed run may leave an image's files without its rows, or with some of them (two.png has a row per
    detection): resuming that manifest explains such an image again, so that it ends with every full row."""
    out = tmp_path / "out"
    manifest = out / "rows.jsonl"
    assert detect(inputs, out, "--manifest", manifest).exit_code == EXIT_OK
    before = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert [Path(row["input"]).name for row in before] == ["grey.png", "red.png", "two.png", "two.png"]
    manifest.write_text("".join(json.dumps(row) + "\n" for row in before[1:-1]))  # grey.png's row, one of two.png's
    again = detect(inputs, out, "--manifest", manifest, "--skip-existing")
    assert again.exit_code == EXIT_OK, again.output
    after = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert [row["status"] for row in after] == ["ok", "skipped", "ok", "ok"]
    # the same rows as the first run's, the skipped one's fingerprint and provenance included
    assert [{**row, "status": "ok", "seconds": 0} for row in after] == [{**row, "seconds": 0} for row in before]


def _boxes(tmp_path: Path, *rows: str) -> Path:
    """A ground-truth boxes CSV (``gradcam eval --boxes``) of ``rows``, each ``image,x1,y1,x2,y2,class``."""
    boxes = tmp_path / "boxes.csv"
    boxes.write_text("".join(f"{row}\n" for row in ["image,x1,y1,x2,y2,class", *rows]), encoding="utf-8")
    return boxes


def test_gradcam_eval_scores_a_segmenters_class_maps_against_the_boxes_of_their_label(inputs, tmp_path):
    two = ["two.png,120,200,200,280,red", "two.png,30,40,90,100,GREEN", "two.png,200,10,230,40,blue"]
    boxes = _boxes(tmp_path, *two, "two.png,0,0,10,10,cat")
    labels = inputs.parent / "classes.txt"
    result = run_eval(inputs / "two.png", "-m", SEGMENTER, "--labels", labels, "--boxes", boxes, "--json")
    assert result.exit_code == EXIT_OK, result.output
    report = json.loads(result.stdout)
    pointing = report["methods"]["gradcam"]["pointing"]
    assert pointing["overall"] == {**pointing["overall"], "count": 2, "hits": 2}  # red and green, any case
    assert report["undetected_boxes"] == 2  # blue is predicted nowhere; no class is named cat


def test_list_layers_marks_the_backbones_last_stage(inputs):
    result = run("-m", DETECTOR, "--list-layers")
    assert result.exit_code == EXIT_OK, result.output
    table = result.stdout.split("\n\n")[0]  # the legend follows a blank line
    assert [line.split()[1] for line in table.splitlines() if line.startswith("*")] == ["backbone.body"]


@pytest.mark.quick
def test_a_segmenter_writes_one_overlay_per_class_with_its_share_and_outline(inputs, tmp_path):
    out = tmp_path / "out"
    labels = inputs.parent / "classes.txt"
    result = run(inputs / "two.png", "-m", SEGMENTER, "--labels", labels, "-o", out, "-k", "3", "--json")
    assert result.exit_code == EXIT_OK, result.output
    found = rows(result)
    assert [(r["target"]["name"], Path(r["outputs"][0]).name) for r in found] == [
        ("red", "two_gradcam_1-red.png"),
        ("green", "two_gradcam_2-green.png"),
    ]
    assert found[0]["target"]["share"] == pytest.approx(6400 / (240 * 320), rel=0.1)
    assert found[0]["predictions"][0]["name"] == "__background__"
    overlay = np.asarray(Image.open(out / "two_gradcam_1-red.png"))
    assert tuple(overlay[240, 121]) == (255, 255, 255)  # the red region's left edge is outlined
    assert tuple(overlay[240, 160]) != (255, 255, 255)
    grey = run(inputs / "grey.png", "-m", SEGMENTER, "-o", out)
    assert grey.exit_code == EXIT_OK and "gradcam: no class other than the background" in grey.stdout


@pytest.mark.quick
def test_gradcam_eval_scores_a_detectors_maps_against_ground_truth_boxes(inputs, tmp_path):
    two = ["two.png,120,200,200,280,red", "two.png,30,40,90,100,green", "two.png,200,10,230,40,blue"]
    boxes = _boxes(tmp_path, "red.png,250,60,290,100,red", *two)
    base = [inputs, "-m", DETECTOR, "--labels", inputs.parent / "classes.txt", "--boxes", boxes]
    result = run_eval(*base, "--json")
    assert result.exit_code == EXIT_OK, result.output
    report = json.loads(result.stdout)
    pointing = report["methods"]["gradcam"]["pointing"]
    assert pointing["overall"] == {**pointing["overall"], "count": 3, "hits": 3}
    assert report["undetected_boxes"] == 1 and "deletion_auc" not in report["methods"]["gradcam"]
    assert "1 box(es) match no explained detection or class: not scored" in result.stderr
    refused = run_eval(*base, "--sanity")
    assert refused.exit_code == EXIT_USAGE
    assert refused.stderr.splitlines()[-1].startswith("error: --sanity is for classifiers; a detector's maps")
    unboxed = run_eval(inputs, "-m", DETECTOR, "--steps", "4", "--json")  # each detection measured on its own
    assert unboxed.exit_code == EXIT_OK, unboxed.output
    assert json.loads(unboxed.stdout)["methods"]["gradcam"]["detections"]["count"] == 3
    segmented = run_eval(inputs, "-m", SEGMENTER)
    assert (
        segmented.stderr.splitlines()[-1]
        == "error: gradcam eval of a segmenter needs --boxes: it measures where its maps point"
    )


@pytest.mark.quick
@pytest.mark.parametrize(
    ("more", "message"),
    [
        (
            ["--aug-smooth"],
            "error: --aug-smooth is for classifiers: a detector's targets in a flipped or rescaled view",
        ),
        (["--panel"], "error: --panel is for classifiers and segmenters; a detector's <stem>_<method>_boxes overlay"),
        (["--score", "sigmoid"], "error: --score sigmoid is for classifiers; a detector has its own score"),
        (["--top-k", "3"], "error: --top-k 3 is for classifiers and segmenters; a detector explains each detection"),
        (["--top-k", "1"], "error: --top-k 1 is for classifiers and segmenters; a detector explains each detection"),
    ],
)
def test_what_a_detector_cannot_do_is_refused_in_one_line(inputs, tmp_path, more, message):
    result = detect(inputs, tmp_path / "out", *more)
    assert result.exit_code == EXIT_USAGE
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert line.startswith(message) and not list((tmp_path / "out").glob("*.png"))


@pytest.mark.parametrize(
    ("model", "more", "message"),
    [
        ("square", ["--score-threshold", "0.3"], "error: --score-threshold 0.3 is for detectors; a classifier has no"),
        ("segmenter", ["--max-detections", "3"], "error: --max-detections 3 is for detectors; a segmenter has no"),
        ("square", ["--score-threshold", "0.5"], "error: --score-threshold 0.5 is for detectors; a classifier has no"),
        ("segmenter", ["--max-detections", "10"], "error: --max-detections 10 is for detectors; a segmenter has no"),
    ],
)
def test_a_detectors_options_are_refused_for_other_models_in_one_line(inputs, tmp_path, model, more, message):
    """The rule of docs/cli.md: an option for other models, given at all (its default value too), is refused."""
    square = f"{Path(__file__).parents[1].joinpath('square_model.py')}:build"
    result = run(inputs / "red.png", "-m", square if model == "square" else SEGMENTER, "-o", tmp_path / "out", *more)
    assert result.exit_code == EXIT_USAGE
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert line.startswith(message) and not list((tmp_path / "out").glob("*.png"))


ANCHOR_DETECTOR = """
import torch
from torch import nn

from task_models import SquareDetector


class AnchorHead(nn.Module):
    \"\"\"Like SSD's head: every cell of two feature levels' class scores, as (N, anchors, classes).\"\"\"

    def forward(self, features):
        levels = [features, nn.functional.avg_pool2d(features, 2)]
        return torch.cat([level.flatten(2) for level in levels], dim=2).transpose(1, 2)


class AnchorDetector(SquareDetector):
    def __init__(self):
        super().__init__()
        self.head = AnchorHead()

    def forward(self, images):
        originals = [(int(image.shape[-2]), int(image.shape[-1])) for image in images]
        batch, _ = self.transform(list(images))
        features = self.backbone.body(batch.tensors)
        scores = self.head(features)
        found = [self._detect(cells + 0 * scores.sum()) for cells in features]
        return self.transform.postprocess(found, batch.image_sizes, originals)


def build():
    return AnchorDetector()
"""


def test_a_detector_heads_anchor_scores_are_no_token_grid(inputs, tmp_path):
    """(N, 720 anchors, 3 classes) would read as a 24 x 30 token grid of the 96 x 96 input: it is neither a
    candidate nor suggested, and choosing it is refused in one line (the detector's default layer suggested)."""
    factory = tmp_path / "anchors.py"
    factory.write_text(ANCHOR_DETECTOR, encoding="utf-8")
    model = f"{factory}:build"
    listing = run("-m", model, "--list-layers")
    assert listing.exit_code == EXIT_OK, listing.output
    table = {line[2:].split()[0]: line for line in listing.stdout.split("\n\n")[0].splitlines()}
    assert table["head"].startswith("  ") and "1x720x3" in table["head"]  # shown, but no candidate
    assert [name for name, line in table.items() if line.startswith(("*", "+"))] == [
        "backbone.body",
        "backbone.body.0",
        "backbone.body.1",
        "backbone.body.2",
    ]
    for layers in (["head"], ["backbone.body.2", "head"]):
        result = run(inputs / "red.png", "-m", model, "-o", tmp_path / "out", *(f"--layer={n}" for n in layers))
        assert result.exit_code == EXIT_USAGE
        assert result.stderr.splitlines() == [
            "error: layer 'head' outputs 1x720x3: a sequence with no spatial grid (only transformer classifiers' "
            "sequences are patch tokens); choose a spatial layer such as backbone.body (see --list-layers)"
        ]
    assert not list((tmp_path / "out").glob("*.png"))


def test_no_detection_says_what_removed_them(inputs, tmp_path):
    """--score-threshold, --target-class, and the detector's own cut-off where that is the higher one."""
    own = detect(inputs / "red.png", tmp_path / "out", "--target-class", "green")
    assert own.exit_code == EXIT_OK, own.output
    assert "  gradcam: no detection of green (--target-class) above --score-threshold 0.5 -> " in own.stdout
    from gradcam_cli.cam.detection import DetectionScore, no_detection
    from gradcam_cli.models.loading import load_model

    loaded = load_model("fasterrcnn_mobilenet_v3_large_320_fpn", "none")
    assert no_detection(loaded, DetectionScore(threshold=0.0), 1) == (
        "no detection of person (--target-class) above fasterrcnn_mobilenet_v3_large_320_fpn's own cut-off 0.05 "
        "(--score-threshold 0 is lower)"
    )
    assert no_detection(loaded, DetectionScore(threshold=0.3)) == "no detection above --score-threshold 0.3"


def write_clip(clip: Path) -> Path:
    """Two frames of red.png as an mp4 clip."""
    writer = cv2.VideoWriter(str(clip), cv2.VideoWriter_fourcc(*"mp4v"), 5, (300, 200))
    for _ in range(2):
        writer.write(np.asarray(square_image((300, 200), RED_BOX))[:, :, ::-1].copy())
    writer.release()
    return clip


@pytest.mark.slow
def test_a_detectors_video_is_its_combined_map_with_the_boxes(inputs, tmp_path):
    clip = write_clip(inputs / "clip.mp4")
    result = detect(clip, tmp_path / "out", "--json")
    assert result.exit_code == EXIT_OK, result.output
    (row,) = rows(result)
    assert row["outputs"] == [str(tmp_path / "out" / "clip_gradcam_boxes.mp4")]
    assert [p["name"] for p in row["predictions"]] == ["red"]
    capture = cv2.VideoCapture(row["outputs"][0])
    assert capture.get(cv2.CAP_PROP_FRAME_COUNT) == 2 and capture.read()[1].shape == (200, 300, 3)


def test_videos_are_refused_for_segmenters(tmp_path):
    clip = write_clip(tmp_path / "clip.mp4")
    refused = run(clip, "-m", SEGMENTER, "-o", tmp_path / "seg")
    assert refused.exit_code == EXIT_USAGE
    assert f"error: videos are explained with classifiers and detectors only; {clip} is a video" in refused.stderr


def test_unrecognised_tasks_and_wrong_task_overrides_are_one_line(inputs, tmp_path):
    result = run(inputs / "red.png", "-m", PUZZLE, "-o", tmp_path / "out")
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.startswith(f"error: cannot tell what task {PUZZLE} does: it returns a tuple of Tensor")
    assert len(result.stderr.splitlines()) == 1
    forced = run(inputs / "red.png", "-m", PUZZLE, "--task", "segment", "-o", tmp_path / "out")
    assert forced.exit_code == EXIT_USAGE
    assert forced.stderr.splitlines()[-1] == (
        "error: the model returned a tuple of Tensor; a segmenter returns (N, classes, H, W) scores or a dict with "
        "'out' (see --task)"
    )
    assert run(inputs, "--task", "detection").exit_code == EXIT_USAGE


def test_a_classifiers_score_is_recorded_so_resuming_does_not_mix_scores(inputs, tmp_path):
    square = f"{Path(__file__).parents[1].joinpath('square_model.py')}:build"
    out = tmp_path / "out"
    assert run(inputs / "red.png", "-m", square, "-o", out, "--score", "softmax").exit_code == EXIT_OK
    resumed = run(inputs / "red.png", "-m", square, "-o", out, "--skip-existing")
    assert resumed.exit_code == EXIT_USAGE
    assert "were made with --score softmax (this run: logit)" in resumed.stderr
    wrong = run(inputs / "red.png", "-m", square, "-o", out, "--score", "probit")
    assert wrong.exit_code == EXIT_USAGE and "'probit': use logit, softmax, sigmoid" in wrong.stderr


@pytest.mark.parametrize("task", ["classifier", "detector", "segmenter"])
def test_rows_are_in_the_original_images_pixels_and_files_at_max_side(inputs, tmp_path, task):
    """docs/batch.md, Large images: above --max-side the maps, overlays and .npy are made at the shrunk size (the
    smallest whole factor: 300 x 200 at --max-side 64 is 60 x 40), and the rows measure in the original's pixels."""
    square = f"{Path(__file__).parents[1].joinpath('square_model.py')}:build"
    model = {"classifier": square, "detector": DETECTOR, "segmenter": SEGMENTER}[task]
    labels = [] if task == "classifier" else ["--labels", inputs.parent / "classes.txt"]
    out = tmp_path / "out"
    result = run(inputs / "red.png", "-m", model, *labels, "-o", out, "--max-side", "64", "--save-raw", "--json")
    assert result.exit_code == EXIT_OK, result.output
    (row,) = rows(result)
    assert row["fingerprint"]["size"] == [40, 60]
    overlay, raw = (Path(path) for path in row["outputs"][:2])
    assert Image.open(overlay).size == (60, 40) and np.load(raw).shape == (40, 60)
    full = rows(run(inputs / "red.png", "-m", model, *labels, "-o", tmp_path / "full", "--max-side", "0", "--json"))
    assert row["target"]["name"] == full[0]["target"]["name"]
    if task == "detector":
        assert max(abs(a - b) for a, b in zip(row["target"]["box"], RED_BOX, strict=True)) <= 5, row["target"]
        assert row["predictions"][0]["box"] == row["target"]["box"]
    if task == "segmenter":
        assert row["target"]["share"] == pytest.approx(full[0]["target"]["share"], rel=0.2)
