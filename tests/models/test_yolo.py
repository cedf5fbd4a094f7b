"""Ultralytics YOLO models (``--model yolo:...``): loading, each detection traced to its anchor, its map against an
independent ``torch.autograd.grad`` reference, boxes in the original pixels, the CLI (folders, rows, eval with YOLO
labels). The model is a tiny YOLO trained in the session on coloured squares (tests/yolo_model.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from PIL import Image
from typer.testing import CliRunner
from yolo_model import CLASSES, square_scene, tiny_config

from gradcam_cli import Explainer, load_model, overlay
from gradcam_cli.cli import app
from gradcam_cli.cli.diff import app as diff_app
from gradcam_cli.cli.eval import app as eval_app
from gradcam_cli.errors import EXIT_MODEL, EXIT_OK, EXIT_USAGE, ModelLoadError, UsageError
from gradcam_cli.io.images import to_input_tensor
from gradcam_cli.models.yolo import offline_ultralytics
from gradcam_cli.options import ModelOptions

try:  # ultralytics as gradcam imports it: offline, and PIL.Image.open left as it was (it patches it on import)
    offline_ultralytics()
except UsageError:
    pytest.skip("ultralytics is not installed: pip install -e '.[yolo]'", allow_module_level=True)

RED, BLUE = (0, 8, 8, 32, 32), (1, 36, 30, 60, 54)
"""Two squares (class, x1, y1, x2, y2) of the 64 x 64 test scene."""
WIDE = [(0, 10, 10, 46, 46), (1, 80, 20, 116, 56)]
"""Two squares of a 128 x 64 scene (letterboxed to 64 x 32: padded above and below)."""


@pytest.fixture(scope="session")
def squares(checkpoint):
    return load_model(ModelOptions(f"yolo:{checkpoint}"))


def peak(saliency: torch.Tensor) -> tuple[int, int]:
    index = int(saliency.flatten().argmax())
    return index // saliency.shape[1], index % saliency.shape[1]


def overlaps(box: tuple[float, ...], square: tuple[int, ...]) -> bool:
    return box[0] < square[3] and square[1] < box[2] and box[1] < square[4] and square[2] < box[3]


def check_peaks(result, squares: list[tuple[int, int, int, int, int]], cell: float = 8) -> None:
    """Each detection's map peaks inside its box, give or take one P3 cell (``cell``: 8 input pixels, in the original
    image's pixels: the maps' resolution), and is brighter there than on the squares outside its box."""
    assert {p.name for p in result.predictions} == {"red", "blue"}, result.predictions
    for explanation in result.explanations:
        if explanation.rank == 0:
            continue
        box = explanation.target.box
        saliency = explanation.saliency
        y, x = peak(saliency)
        assert box[0] - cell <= x < box[2] + cell and box[1] - cell <= y < box[3] + cell, (box, (y, x))
        x1, y1, x2, y2 = (round(v) for v in box)
        own = saliency[y1:y2, x1:x2].mean()
        for square in squares:
            if not overlaps(box, square):
                assert own > 2 * saliency[square[2] : square[4], square[1] : square[3]].mean(), explanation.method


@pytest.mark.slow
def test_each_detections_map_peaks_inside_its_box_not_on_the_other_square(squares):
    result = Explainer(squares, methods=["layercam"]).explain(square_scene([RED, BLUE]))
    check_peaks(result, [RED, BLUE])


@pytest.mark.slow
def test_boxes_and_maps_line_up_with_a_non_square_images_pixels(squares, tmp_path):
    wide = square_scene(WIDE, (128, 64))
    tall = wide.transpose(Image.Transpose.ROTATE_90)  # stored on its side, EXIF says: turn 90 degrees clockwise
    exif = tall.getexif()
    exif[0x0112] = 6
    tall.save(tmp_path / "tall.jpg", exif=exif, quality=98)
    for image in (wide, tmp_path / "tall.jpg"):
        result = Explainer(squares, methods=["layercam"]).explain(image)
        found = {p.name: p for p in result.predictions}
        for label, *box in WIDE:
            assert max(abs(a - b) for a, b in zip(found[CLASSES[label]].box, box, strict=True)) <= 4
        assert all(explanation.saliency.shape == (64, 128) for explanation in result.explanations)
        check_peaks(result, WIDE, cell=16)  # the input is the image at half its size


def reference_gradcam(net, image: Image.Image, spec) -> tuple[list[int], list[list[torch.Tensor]]]:
    """Independently of gradcam's engine: the letterboxed input through the ultralytics model with its head inputs
    kept, torchvision's NMS on the decoded output (class-aware, IoU 0.7, confidence 0.25), and each kept anchor's
    class logit differentiated with torch.autograd.grad: (anchors, [per detection: coarse Grad-CAM per layer])."""
    from torchvision.ops import batched_nms, box_convert

    batch = to_input_tensor(image, spec).unsqueeze(0)
    height, width = batch.shape[-2:]
    pad_h, pad_w = -height % 32, -width % 32
    padded = F.pad(batch, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2), value=114 / 255)
    kept: dict[int, torch.Tensor] = {}
    hooks = [
        net.model[i].register_forward_hook(lambda m, i, o, at=i: kept.__setitem__(at, o.detach().requires_grad_()))
        for i in net.model[-1].f
    ]
    with torch.no_grad():
        decoded = net(padded)[0][0]  # (4 + classes, anchors)
    for hook in hooks:
        hook.remove()
    features = [kept[i] for i in net.model[-1].f]
    raw = net.model[-1](list(features))[1]  # the head alone, run again on the kept inputs
    logits = raw.get("one2many", raw)["scores"][0]
    confidence, label = decoded[4:].max(dim=0)
    candidates = (confidence >= 0.25).nonzero().flatten()
    boxes = box_convert(decoded[:4, candidates].T, "cxcywh", "xyxy")
    order = batched_nms(boxes, confidence[candidates], label[candidates], 0.7)
    anchors = [int(candidates[i]) for i in order]
    maps = []
    for anchor in anchors:
        gradients = torch.autograd.grad(logits[label[anchor], anchor], features, retain_graph=True)
        maps.append(
            [F.relu((g.mean(dim=(2, 3), keepdim=True) * a).sum(1)) for g, a in zip(gradients, features, strict=True)]
        )
    return anchors, maps


@pytest.mark.slow
def test_maps_equal_autograd_of_the_traced_anchors_logit(squares, checkpoint):
    from ultralytics.nn.tasks import torch_safe_load

    net = torch_safe_load(str(checkpoint), safe_only=True)[0]["model"].float().eval()
    image = square_scene([RED, BLUE])
    anchors, reference = reference_gradcam(net, image, squares.input_spec)
    explainer = Explainer(squares, score_threshold=0.25, max_detections=10)
    targets, cams = explainer.compute_targets(to_input_tensor(image, squares.input_spec).unsqueeze(0))
    traced = [int(targets.detections[0]["anchors"][i]) for i in targets.picked[0]]
    assert traced == anchors and len(anchors) >= 2
    assert max(anchors) < 8 * 8  # P3's cells: their logits do not depend on P4 and P5, so the head is the whole path
    for k, layers in enumerate(reference):
        assert layers[0].amax() > 0  # the traced anchors are P3's; P4 and P5 do not reach their logits (maps of 0)
        for got, expected in zip(cams["gradcam"][k], layers, strict=True):
            if expected.amax() == 0:
                assert got.amax() == 0
            else:
                assert torch.corrcoef(torch.stack([got.flatten(), expected.flatten()]))[0, 1] >= 0.999


def test_nms_tracing_picks_the_anchor_that_won_when_two_overlapping_anchors_compete():
    from ultralytics.nn.tasks import DetectionModel

    from gradcam_cli.models.yolo_net import YoloNet

    model = YoloNet(DetectionModel(tiny_config(), verbose=False), "detect")
    logits = torch.full((1, 2, 8), -9.0)
    decoded = torch.zeros(1, 6, 8)  # (x, y, w, h, confidence per class) per anchor, as the head decodes them
    decoded[0, :4] = torch.tensor([[5.0, 5, 10, 10]] * 8).T
    decoded[0, :4, 2] = torch.tensor([30.0, 30, 40, 40])  # anchors 2 and 4 overlap (IoU 0.95), 4 scores higher
    decoded[0, :4, 4] = torch.tensor([30.5, 30.5, 39, 39])
    decoded[0, :4, 1] = torch.tensor([75.0, 75, 30, 30])  # anchor 1: elsewhere, lower
    for anchor, score in ((2, 0.6), (4, 0.9), (1, 0.5)):
        decoded[0, 4 + 1, anchor] = score
        logits[0, 1, anchor] = torch.logit(torch.tensor(score))
    rows, traced = model._suppress(decoded, logits)
    assert traced[0].tolist() == [4, 1]
    assert rows[0][:, 4].tolist() == pytest.approx([0.9, 0.5])


def test_yolo_models_refuse_with_one_line(tmp_path):
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(tiny_config()), encoding="utf-8")
    with pytest.raises(ModelLoadError, match=r"^yolo11n\.pt is not in the local cache .* gradcam never downloads"):
        load_model(ModelOptions("yolo:yolo11n.pt"))
    with pytest.raises(UsageError, match=r"no such file, nor one of ultralytics' model files\. Did you mean"):
        load_model(ModelOptions("yolo:yolo11q.yaml", "none"))
    with pytest.raises(UsageError, match=r"is an architecture without weights: add --weights none"):
        load_model(ModelOptions("yolo:yolo11n.yaml"))
    with pytest.raises(UsageError, match=r"--task classify does not fit yolo:.*tiny.yaml, a YOLO detect model"):
        load_model(ModelOptions(f"yolo:{tmp_path / 'tiny.yaml'}", "none", task="classify"))


def test_checkpoints_that_are_not_ultralytics_models_are_refused_in_one_line(tmp_path):
    """A plain module as the model, random bytes, a plain pickle: one line naming the path once (with its leading
    /), exit code 3, no torch warning on stderr (docs/yolo.md)."""
    import pickle
    import warnings

    square_scene([RED]).save(tmp_path / "red.png")
    torch.save({"model": torch.nn.Linear(3, 3)}, tmp_path / "linear.pt")
    (tmp_path / "random.pt").write_bytes(bytes(range(7, 256)) * 8)
    (tmp_path / "plain.pt").write_bytes(pickle.dumps({"a": 1}, protocol=4))
    expected = {
        "linear.pt": "holds a Linear as its model, not an ultralytics model",
        "random.pt": "loads with weights_only=True (not a file torch.save writes)",
        "plain.pt": "is not an ultralytics checkpoint that loads with weights_only=True (the file references types",
    }
    for name, message in expected.items():
        path = tmp_path / name
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = CliRunner().invoke(app, [str(tmp_path / "red.png"), "-m", f"yolo:{path}", "-o", str(tmp_path)])
        assert result.exit_code == EXIT_MODEL, result.output
        assert result.stderr.splitlines() == [result.stderr.strip()] and result.stderr.startswith(f"error: {path} ")
        assert message in result.stderr and result.stderr.count(name) == 1, result.stderr
        assert not [w for w in caught if "pickle" in str(w.message)], [str(w.message) for w in caught]


@pytest.mark.slow
def test_every_method_serves_yolo_and_box_scores_differ(squares):
    batch = to_input_tensor(square_scene([RED, BLUE]), squares.input_spec).unsqueeze(0)
    methods = ["gradcam", "gradcam++", "xgradcam", "layercam", "eigencam", "ablationcam", "scorecam"]
    explainer = Explainer(squares, "model.3", methods, max_detections=1, score_batch_size=64)
    _, cams = explainer.compute_targets(batch)
    _, boxed = Explainer(squares, "model.3", score="box").compute_targets(batch)
    for method in methods:
        assert torch.isfinite(cams[method][0][0]).all() and cams[method][0][0].amax() > 0, method
    assert not torch.allclose(boxed["gradcam"][0][0], cams["gradcam"][0][0])
    only_red = Explainer(squares, target="red").explain(square_scene([RED, BLUE]))
    assert [p.name for p in only_red.predictions] == ["red"]


def test_a_yolo_detector_is_explained_by_the_yolo_adapter_with_or_without_task(tmp_path):
    """The YOLO family names its adapter in the profile: ``--task detect`` and ``segment`` (a segment model's) keep
    it (YOLO's score, its own threshold, 0.25), ``--task classify`` is refused; a torchvision-style detector given
    ``--task detect`` is the detector adapter's."""
    config = tiny_config(["Segment", ["nc", 8, 16]])
    (tmp_path / "seg.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    square_scene([RED, BLUE]).save(tmp_path / "two.png")
    model = ["-m", f"yolo:{tmp_path / 'seg.yaml'}", "-w", "none", "--input-size", "64", "--method", "gradcam"]
    for task in ([], ["--task", "detect"], ["--task", "segment"]):
        out = tmp_path / f"out{len(task)}{task[-1] if task else ''}"
        result = CliRunner().invoke(app, [str(tmp_path / "two.png"), *model, *task, "-o", str(out), "--json"])
        assert result.exit_code == EXIT_OK, result.output
        rows = [json.loads(line) for line in result.stdout.splitlines()]
        assert {(row["provenance"]["task"], row["provenance"]["score"]) for row in rows} == {("detect", "logit")}
        assert {row["provenance"]["score_threshold"] for row in rows} == {0.25}
    refused = CliRunner().invoke(app, [str(tmp_path / "two.png"), *model, "--task", "classify", "-o", str(tmp_path)])
    assert refused.exit_code == EXIT_USAGE and "--task classify does not fit yolo:" in refused.stderr
    detector = Explainer(
        load_model(f"{Path(__file__).parents[1] / 'task_models.py'}:build_detector", "none", task="detect")
    )
    assert detector.adapter.name == "detect"


def test_a_library_task_naming_the_yolo_adapter_is_refused_in_one_line():
    """The YOLO adapter is chosen by its family's profile, never by name: ``task="yolo"`` on another model is a
    UsageError (it failed inside YOLO's score with an AttributeError), an unknown name one with close matches."""
    with pytest.raises(UsageError, match=r"^the yolo task explains models loaded as yolo:\.\.\., not a ResNet$"):
        Explainer(load_model(ModelOptions("resnet18", "none", task="yolo"))).explain(Image.new("RGB", (32, 32)))
    with pytest.raises(UsageError, match="Did you mean: detect"):
        Explainer(load_model(ModelOptions("resnet18", "none", task="detct")))


@pytest.mark.slow
def test_segment_and_pose_models_run_from_their_yaml(tmp_path):
    image = square_scene([RED, BLUE])
    for head, key in ((["Segment", ["nc", 8, 16]], "masks"), (["Pose", ["nc", "kpt_shape"]], "keypoints")):
        config = {**tiny_config(head), "kpt_shape": [17, 3]}
        (tmp_path / f"{key}.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
        model = load_model(ModelOptions(f"yolo:{tmp_path / key}.yaml", "none", input_size=64))
        explainer = Explainer(model, score_threshold=0.001, max_detections=2)
        result = explainer.explain(image)
        assert len(result.predictions) == 2
        if key == "masks":
            assert all(p.area is not None for p in result.predictions)
        else:
            assert all(len(p.keypoints or []) == 17 for p in result.predictions)
        assert overlay(result, 0).size == image.size


@pytest.mark.slow
def test_a_yolo_classifier_is_explained_as_any_classifier(tmp_path):
    config = {**tiny_config(), "head": [[-1, 1, "Classify", ["nc"]]]}
    (tmp_path / "cls.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    model = load_model(ModelOptions(f"yolo:{tmp_path / 'cls.yaml'}", "none", input_size=64))
    assert model.task == "classify" and model.input_spec.size == 64
    result = Explainer(model, "model.5", top_k=2).explain(square_scene([RED, BLUE], (96, 64)))
    assert [e.saliency.shape for e in result.explanations] == [(64, 96), (64, 96)]
    assert sum(p.probability for p in result.predictions) == pytest.approx(1.0, abs=1e-4)  # softmax of the logits


@pytest.mark.slow
def test_the_cli_explains_a_folder_writes_rows_and_evaluates_against_yolo_labels(checkpoint, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    square_scene([RED, BLUE]).save(folder / "two.png")
    square_scene(WIDE, (128, 64)).save(folder / "wide.png")
    clip = tmp_path / "clip.mp4"
    writer = cv2.VideoWriter(str(clip), cv2.VideoWriter_fourcc(*"mp4v"), 5, (64, 64))
    for _ in range(3):
        writer.write(np.asarray(square_scene([RED, BLUE]))[:, :, ::-1].copy())
    writer.release()
    out = tmp_path / "out"
    model = f"yolo:{checkpoint}"
    arguments = [str(folder), str(clip), "-m", model, "-o", str(out), "--json", "--workers", "0", "--every", "2"]
    result = CliRunner().invoke(app, [*arguments, "--report", "--manifest", str(out / "rows.jsonl")])
    assert result.exit_code == EXIT_OK, result.output
    assert (out / "index.html").is_file() and len((out / "rows.jsonl").read_text().splitlines()) == 5
    images = [line for line in (out / "rows.jsonl").read_text().splitlines() if "clip.mp4" not in line]
    (tmp_path / "images.jsonl").write_text("\n".join(images) + "\n")  # gradcam diff compares images' maps
    same = CliRunner().invoke(diff_app, [str(tmp_path / "images.jsonl"), str(tmp_path / "images.jsonl")])
    assert same.exit_code == EXIT_OK and "4 pairs, 4 from fingerprints" in same.stdout and "no drift" in same.stderr
    found = [json.loads(line) for line in result.stdout.splitlines()]
    video = found.pop()
    assert video["outputs"] == [str(out / "clip_gradcam_boxes.mp4")] and Path(video["outputs"][0]).is_file()
    assert {p["name"] for p in video["predictions"]} == {"red", "blue"}
    assert {(Path(r["input"]).name, r["target"]["name"]) for r in found} == {
        (name, colour) for name in ("two.png", "wide.png") for colour in ("red", "blue")
    }
    wide_red = next(r for r in found if r["input"].endswith("wide.png") and r["target"]["name"] == "red")
    assert max(abs(a - b) for a, b in zip(wide_red["target"]["box"], WIDE[0][1:], strict=True)) <= 4
    assert all(Path(path).is_file() for r in found for path in r["outputs"])
    labels = tmp_path / "labels"
    labels.mkdir()
    (labels / "two.txt").write_text("0 0.3125 0.3125 0.375 0.375\n1 0.75 0.65625 0.375 0.375\n", encoding="utf-8")
    (labels / "wide.txt").write_text("1 0.765625 0.59375 0.28125 0.5625\n", encoding="utf-8")
    evaluated = CliRunner().invoke(
        eval_app, [str(folder), "-m", model, "--boxes", str(labels), "--method", "layercam", "--json"]
    )
    assert evaluated.exit_code == EXIT_OK, evaluated.output
    pointing = json.loads(evaluated.stdout)["methods"]["layercam"]["pointing"]["overall"]
    assert pointing["count"] == 3 and pointing["hits"] == 3
    timed = evaluated.stderr.splitlines()[-1]  # the time of 2 tiny images: milliseconds, never "0.0s"
    assert re.fullmatch(r"evaluated 2 image\(s\), 0 failed, in ([1-9]\d* ms|\d+\.\ds)", timed) and "0.0s" not in timed


def test_the_cli_says_how_to_get_a_missing_checkpoint_in_one_line(tmp_path):
    square_scene([RED]).save(tmp_path / "red.png")
    result = CliRunner().invoke(app, [str(tmp_path), "-m", "yolo:yolo11n.pt", "-o", str(tmp_path / "out")])
    assert result.exit_code in (EXIT_MODEL, EXIT_USAGE)
    assert len(result.stderr.splitlines()) == 1 and "gradcam never downloads it" in result.stderr


@pytest.mark.slow
def test_an_end_to_end_heads_detections_are_traced_to_their_query():
    model = load_model(ModelOptions("yolo:yolo26n.yaml", "none", input_size=64)).module
    model.conf = 1e-6
    torch.manual_seed(0)
    with torch.no_grad():
        (found,) = model(torch.rand(1, 3, 48, 64))
    assert len(found["scores"]) > 10
    traced = found["class_logits"][found["labels"], found["anchors"]].sigmoid()
    assert torch.allclose(traced, found["scores"], atol=1e-6)  # each row's confidence is its query's class score


def test_importing_ultralytics_leaves_pillow_as_it_was(tmp_path):
    """ultralytics patches PIL.Image.open (a non-image then fails on a missing pi-heif, or pip-installs it)."""
    offline_ultralytics()
    assert Image.open.__module__ == "PIL.Image"
    (tmp_path / "notes.jpg").write_text("not an image")
    with pytest.raises(Image.UnidentifiedImageError):
        Image.open(tmp_path / "notes.jpg")


@pytest.mark.slow
def test_merged_shards_of_a_yolo_run_equal_one_local_run(checkpoint, tmp_path):
    """The merged rows are the local run's, detection for detection, to float rounding: another batching (2 images
    per shard instead of 4) or thread count may move a probability's 6th decimal or a box's 0.1 px rounding."""
    from conftest import RAY_MAP_TOLERANCE, assert_rows_agree, comparable

    from gradcam_cli.cli.merge import app as merge_app

    folder = tmp_path / "in"
    folder.mkdir()
    for k, scene in enumerate([[RED, BLUE], [RED], [BLUE], [BLUE, RED]]):
        square_scene(scene).save(folder / f"scene{k}.png")
    common = [str(folder), "-m", f"yolo:{checkpoint}", "--save-raw", "--workers", "0"]
    local, sharded = tmp_path / "local", tmp_path / "sharded"
    ran = CliRunner().invoke(app, [*common, "-o", str(local), "--manifest", str(local / "manifest.jsonl")])
    assert ran.exit_code == EXIT_OK, ran.output
    for k in range(2):
        shard = CliRunner().invoke(app, [*common, "-o", str(sharded), "--shard", f"{k}/2"])
        assert shard.exit_code == EXIT_OK, shard.output
    merged = CliRunner().invoke(merge_app, [str(sharded)])
    assert merged.exit_code == EXIT_OK, merged.output
    rows, expected = comparable(sharded / "manifest.jsonl", sharded), comparable(local / "manifest.jsonl", local)
    assert_rows_agree(rows, expected)
    assert len(rows) == 6  # a row per detection
    for row, theirs in zip(rows, expected, strict=True):
        for p, q in zip([*row["predictions"], row["target"]], [*theirs["predictions"], theirs["target"]], strict=True):
            assert max(abs(a - b) for a, b in zip(p["box"], q["box"], strict=True)) <= 0.1 + 1e-9, (p, q)
    maps = sorted(local.glob("*.npy"))
    assert len(maps) == 10  # a map per detection and a combined one per image
    for path in maps:  # another batch (2 images instead of 4): float rounding, as a Ray run (docs/scale.md)
        assert np.abs(np.load(path) - np.load(sharded / path.name)).max() <= RAY_MAP_TOLERANCE, path.name


@pytest.mark.slow
def test_an_explicit_score_threshold_is_used_at_any_value_and_an_image_without_detections_says_so(checkpoint, tmp_path):
    """--score-threshold 0.5 given is 0.5 (not given: the model's own conf, 0.25); an image without detections says
    what removed them, as a torchvision detector's does (no video wording)."""
    square_scene([RED, BLUE]).save(tmp_path / "two.png")
    Image.new("RGB", (64, 64), (128, 128, 128)).save(tmp_path / "grey.png")
    model = f"yolo:{checkpoint}"

    def rows(*more: str) -> list[dict]:
        result = CliRunner().invoke(app, [str(tmp_path / "two.png"), "-m", model, "--json", *more])
        assert result.exit_code == EXIT_OK, result.output
        return [json.loads(line) for line in result.stdout.splitlines()]

    given = rows("-o", str(tmp_path / "given"), "--score-threshold", "0.5")
    assert {row["provenance"]["score_threshold"] for row in given} == {0.5}
    assert all(p["probability"] >= 0.5 for row in given for p in row["predictions"])
    assert {row["provenance"]["score_threshold"] for row in rows("-o", str(tmp_path / "own"))} == {0.25}
    grey = CliRunner().invoke(app, [str(tmp_path / "grey.png"), "-m", model, "-o", str(tmp_path / "grey")])
    assert grey.exit_code == EXIT_OK, grey.output
    assert "  gradcam: no detection above --score-threshold 0.25 -> " in grey.stdout
    assert "frame" not in grey.stdout


@pytest.mark.slow
def test_rows_are_in_the_original_images_pixels_above_max_side(checkpoint, tmp_path):
    """A 512 x 256 image at --max-side 128 is explained at 128 x 64 (maps, overlays, .npy), and its boxes are in
    the original image's pixels, as a --max-side 0 run gives them (docs/yolo.md, docs/batch.md)."""
    big = square_scene(WIDE, (128, 64)).resize((512, 256), Image.Resampling.NEAREST)
    big.save(tmp_path / "big.png")

    def found(out: str, max_side: str) -> list[dict]:
        arguments = [str(tmp_path / "big.png"), "-m", f"yolo:{checkpoint}", "-o", str(tmp_path / out), "--json"]
        result = CliRunner().invoke(app, [*arguments, "--max-side", max_side, "--save-raw"])
        assert result.exit_code == EXIT_OK, result.output
        return [json.loads(line) for line in result.stdout.splitlines()]

    shrunk, full = found("shrunk", "128"), found("full", "0")
    assert [r["target"]["name"] for r in shrunk] == [r["target"]["name"] for r in full] and len(shrunk) == 2
    for small, large in zip(shrunk, full, strict=True):
        assert max(abs(a - b) for a, b in zip(small["target"]["box"], large["target"]["box"], strict=True)) <= 4
        label = CLASSES.index(small["target"]["name"])
        square = next(box for c, *box in WIDE if c == label)
        assert max(abs(a - 4 * b) for a, b in zip(small["target"]["box"], square, strict=True)) <= 24  # 6 px at 128
        assert small["fingerprint"]["size"] == [64, 128] and large["fingerprint"]["size"] == [256, 512]
        overlay, raw = small["outputs"][:2]
        assert Image.open(overlay).size == (128, 64) and np.load(raw).shape == (64, 128)


def test_two_explainers_with_their_own_thresholds_on_one_model_keep_their_own_detections(tmp_path):
    """The score threshold is each explainer's own (the NMS's confidence for its passes), not set on the shared model:
    built and run interleaved, each keeps what it keeps alone."""
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(tiny_config()), encoding="utf-8")
    model = load_model(ModelOptions(f"yolo:{tmp_path / 'tiny.yaml'}", "none", input_size=64))
    inputs = to_input_tensor(square_scene([RED, BLUE]), model.input_spec).unsqueeze(0)

    def scores(explainer: Explainer) -> torch.Tensor:
        return explainer.compute_targets(inputs)[0].detections[0]["scores"]

    low = Explainer(model, methods=["gradcam"], score_threshold=1e-6, max_detections=2)
    alone = scores(low)
    threshold = float(alone.median())
    high = Explainer(model, methods=["gradcam"], score_threshold=threshold, max_detections=2)
    kept = scores(high)
    assert 0 < len(kept) < len(alone) and bool((kept >= threshold).all())
    assert torch.equal(scores(low), alone)  # building and running `high` left `low`'s threshold alone
    assert torch.equal(scores(high), kept)
    assert model.module.conf == model.module.default_conf  # nothing set on the model
