"""``gradcam eval`` on scans (evaluation/scans.py, docs/volumes.md "Evaluating maps on scans"): voxel deletion and
insertion along a scan's map, scored through the model's sliding windows. A known answer: a tiny 3-D segmenter
trained here (seeded, 80 steps) to find a bright blob in noise; at its bottleneck, Grad-CAM's deletion AUC on new
scans clearly below randomcam's, its peak on the blob, its energy and the Dice of its top voxels against the blobs'
masks (``--masks``), and the ranking; at the default layer (the head), most of the Grad-CAM, HiResCAM and LayerCAM
maps on the blob (the blob's positive logits); the segmenter's Dice against the blobs reported. Pointing, energy
and Dice against numpy; the stitched probabilities against the network's own softmax where one window covers the
volume; the command line on a tiny MONAI UNet (``--rank --masks``, resumed), and what it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner
from volume_models import CLASSES, TinySegmenter, classifier, segmenter

from gradcam_cli import Explainer
from gradcam_cli.cam.windows import Windows, explain_volume
from gradcam_cli.cli.eval import app
from gradcam_cli.errors import EXIT_OK, EXIT_USAGE
from gradcam_cli.evaluation import metrics
from gradcam_cli.evaluation.choose import evaluator_for
from gradcam_cli.evaluation.rank import rank
from gradcam_cli.evaluation.report import ImageScores
from gradcam_cli.evaluation.scans import ScanEvaluator, blurred, stitched_probabilities
from gradcam_cli.io.images import InputSpec
from gradcam_cli.models.profile import LoadedModel
from gradcam_cli.models.volume_spec import VolumeSpec
from gradcam_cli.options import EvalOptions

SIDE = 16


def blobs(count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, 1, 16, 16, 16) noise with one bright blob each, and the blobs' masks (N, 16, 16, 16)."""
    grid = torch.stack(torch.meshgrid(*[torch.arange(SIDE, dtype=torch.float32)] * 3, indexing="ij"))
    centres = torch.randint(4, SIDE - 4, (count, 3), generator=generator).float()
    squared = ((grid[None] - centres.view(count, 3, 1, 1, 1)) ** 2).sum(dim=1)
    x = torch.randn(count, 1, SIDE, SIDE, SIDE, generator=generator) * 0.5
    return x + 2.0 * torch.exp(-squared / 6.0)[:, None], (squared <= 4.0).long()


def trained_segmenter() -> TinySegmenter:
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    network = TinySegmenter(classes=2)
    optimiser = torch.optim.Adam(network.parameters(), lr=0.03)
    for _ in range(80):
        x, y = blobs(4, generator)
        loss = F.cross_entropy(network(x), y, weight=torch.tensor([1.0, 10.0]))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    return network.eval()


def as_scan_model(network: torch.nn.Module, classes: list[str] | None = None) -> LoadedModel:
    spec = VolumeSpec((SIDE, SIDE, SIDE))
    shape = InputSpec(shape=(1, SIDE, SIDE, SIDE))
    names = classes or ["background", "blob"]
    return LoadedModel(network, "blob", "trained", names, shape, task="segment", volume=spec)


@pytest.mark.slow
def test_known_answer_grad_cams_deletion_falls_far_faster_than_randomcams(tmp_path: Path):
    network = trained_segmenter()
    x, y = blobs(3, torch.Generator().manual_seed(7))
    with torch.no_grad():
        predicted = network(x).argmax(dim=1)
    dice = [float(2 * (p & t).sum() / (p.sum() + t.sum())) for p, t in zip(predicted == 1, y == 1, strict=True)]
    print(f"the trained segmenter's Dice against the blobs: {', '.join(f'{d:.2f}' for d in dice)}")
    assert min(dice) > 0.5
    paths, labels = [], tmp_path / "labelsTr"
    labels.mkdir()
    for n, scan in enumerate(x):
        paths.append(tmp_path / f"scan{n}_0000.npy")  # nnU-Net's names: the mask of scanN_0000 is labelsTr/scanN
        np.save(paths[-1], scan.numpy())
        np.save(labels / f"scan{n}.npy", y[n].numpy().astype(np.uint8))
    model, options = as_scan_model(network), EvalOptions(steps=10, masks=labels)
    default = Explainer(model, methods=["gradcam", "hirescam", "layercam", "randomcam"])
    assert default.layer_label == "head"  # the last spatial layer, as for any model: the segmenter's class logits
    bottleneck = Explainer(model, methods=["gradcam", "randomcam"], layers=["bottleneck"])
    evaluator = evaluator_for(bottleneck, options)
    assert isinstance(evaluator, ScanEvaluator)
    report, at_head = evaluator.run(paths), evaluator_for(default, options).run(paths)
    assert [image.error for image in (*report.images, *at_head.images)] == [None] * 6
    for image in report.images:
        assert image.target is not None and image.target.name == "blob"
        deletion = {method: metrics.auc(scores.deletion) for method, scores in image.methods.items()}
        assert deletion["gradcam"] < 0.5 * deletion["randomcam"], deletion
        assert len(image.methods["gradcam"].deletion) == len(image.methods["gradcam"].insertion) == 11
        assert image.methods["gradcam"].deletion[0] == pytest.approx(image.target.probability)
    for layer, scans in (("bottleneck", report), ("head", at_head)):
        for method in scans.images[0].methods:
            figures = [image.methods[method] for image in scans.images]
            print(
                f"{method} at the {layer} against the blobs' masks: "
                + "; ".join(
                    f"energy {f.boxes[0].energy:.2f}, Dice {f.extra['dice']:.2f}, "
                    f"deletion {metrics.auc(f.deletion):.2f}"
                    for f in figures
                )
            )
    for n, (image, head) in enumerate(zip(report.images, at_head.images, strict=True)):  # peak, mass, top voxels
        f, (box,), (floor,) = image.methods["gradcam"], image.methods["gradcam"].boxes, image.methods["randomcam"].boxes
        share = float(y[n].float().mean())  # the blob's share of the voxels (about 0.8 %): a uniform map's energy
        assert box.hit and box.label == "blob" and f.extra["dice"] > 0.5, (box, f.extra)
        assert box.energy > 0.2 and box.energy > 20 * share and box.energy > 10 * floor.energy, (box, floor, share)
        (floor,) = head.methods["randomcam"].boxes
        for method in ("gradcam", "hirescam", "layercam"):  # at the default layer, most of the map is on the blob
            (box,), extra = head.methods[method].boxes, head.methods[method].extra
            assert box.energy > 0.5 and box.energy > 10 * floor.energy and extra["dice"] > 0.5, (method, box, extra)
        assert head.methods["gradcam"].boxes[0].hit
    at_bottleneck = Explainer(model, methods=["hirescam", "layercam"], layers=["bottleneck"], target=1)
    at_logits = Explainer(model, methods=["gradcam"], target=1)
    for scan in x:  # no bottleneck voxel where a feature is on and raises the blob's logits: nothing positive
        maps = explain_volume(at_bottleneck, scan, Windows((SIDE,) * 3), [1]).maps
        assert all(float(maps[method].abs().max()) == 0.0 for method in ("hirescam", "layercam"))
        ours = explain_volume(at_logits, scan, Windows((SIDE,) * 3), [1]).maps["gradcam"][0].double().flatten()
        with torch.no_grad():  # at the head, Grad-CAM is the blob's positive logits: the segmentation itself
            logits = network(scan[None])[0, 1].clamp_min(0).double().flatten()
        assert float(torch.corrcoef(torch.stack([ours, logits]))[0, 1]) > 0.999
    summary = report.summary("gradcam")
    assert summary["pointing"]["overall"]["accuracy"] == 100.0 and summary["dice"] > 0.5
    rows = {(row.metric, row.method): row for row in rank(report)}  # what --rank prints, over the three scans
    assert rows["deletion_auc", "gradcam"].rank == 1 and rows["deletion_auc", "randomcam"].rank == 2
    assert rows["deletion_auc", "gradcam"].vs_random < 0 and rows["dice", "gradcam"].rank == 1
    assert {"pointing", "energy", "dice", "insertion_auc"} <= {metric for metric, _ in rows}


def numpy_figures(saliency: np.ndarray, inside: np.ndarray) -> tuple[bool, float, float]:
    """Pointing, energy and Dice of a map against a mask, in plain numpy: the peak (first of equal maxima in C
    order) in the mask; the map's non-negative mass in it over all of it; the map's top voxels, as many as the mask's
    (a stable sort: ties in C order), against the mask."""
    flat, mask = saliency.ravel(), inside.ravel()
    mass = np.clip(flat, 0, None)
    top = np.zeros_like(mask)
    top[np.argsort(-flat, kind="stable")[: mask.sum()]] = True
    return bool(mask[np.argmax(flat)]), float(mass[mask].sum() / mass.sum()), 2 * (top & mask).sum() / (2 * mask.sum())


@pytest.mark.quick
def test_pointing_energy_and_dice_against_a_label_mask_match_numpy(tmp_path: Path):
    network = segmenter(seed=2)
    model = as_scan_model(network, list(CLASSES))
    x, _ = blobs(1, torch.Generator().manual_seed(5))
    labels = np.zeros((SIDE, SIDE, SIDE), dtype=np.uint8)
    labels[2:9, 3:12, 5:11], labels[10:14, 2:8, 1:6] = 1, 2  # nnU-Net's labels: 0 background, 1 bright, 2 dark
    for name in ("case_0000", "binary_0000", "shifted", "alone"):
        np.save(tmp_path / f"{name}.npy", x[0].numpy())
    (tmp_path / "labelsTr").mkdir()
    np.save(tmp_path / "labelsTr" / "case.npy", labels)
    np.save(tmp_path / "labelsTr" / "binary.npy", (labels == 2).astype(np.float32))  # binary: the target whatever
    np.save(tmp_path / "labelsTr" / "shifted.npy", labels[:, :, :-1])  # not on the scan's grid: that scan's error
    explainer = Explainer(model, methods=["gradcam"], target=1)
    options = EvalOptions(steps=4, masks=tmp_path / "labelsTr")
    scans = [tmp_path / f"{name}.npy" for name in ("case_0000", "binary_0000", "shifted", "alone")]
    case, binary, shifted, alone = ScanEvaluator(explainer, options).run(scans).images
    saliency = explain_volume(explainer, x[0], Windows((SIDE,) * 3), [1]).maps["gradcam"][0].numpy()
    for image, inside in ((case, labels == 1), (binary, labels == 2)):
        (box,) = image.methods["gradcam"].boxes
        hit, energy, dice = numpy_figures(saliency, inside)
        assert box.hit == hit and box.label == "bright"
        assert box.energy == pytest.approx(energy, abs=1e-5)
        assert image.methods["gradcam"].extra["dice"] == pytest.approx(dice, abs=1e-9)
    assert 0.0 < energy < 1.0 and 0.0 < dice < 1.0  # neither trivial
    assert shifted.error == (
        f"label mask {tmp_path / 'labelsTr' / 'shifted.npy'} is not on the grid of {scans[2]} (16x16x15 vs 16x16x16); "
        "give a mask of the scan"
    )
    assert alone.error is None and not alone.methods["gradcam"].boxes and "dice" not in alone.methods["gradcam"].extra


@pytest.mark.quick
def test_a_scans_finished_methods_are_kept_and_the_others_run(tmp_path: Path):
    model = as_scan_model(segmenter(seed=2), list(CLASSES))
    x, _ = blobs(1, torch.Generator().manual_seed(5))
    np.save(tmp_path / "scan.npy", x[0].numpy())
    both = ScanEvaluator(Explainer(model, methods=["gradcam", "gradcam++"], target=1), EvalOptions(steps=3))
    (first,) = both.run([tmp_path / "scan.npy"]).images
    kept = ImageScores(first.image, first.target, {"gradcam": first.methods["gradcam"]})  # as --skip-existing reads
    told: list[ImageScores] = []
    (resumed,) = both.run([tmp_path / "scan.npy"], on_result=told.append, done={first.image: kept}).images
    assert resumed.methods["gradcam"] is kept.methods["gradcam"]  # not computed again
    assert resumed.methods["gradcam++"].deletion == pytest.approx(first.methods["gradcam++"].deletion, abs=1e-6)
    assert [list(row.methods) for row in told] == [["gradcam++"]]  # the rows file gets the new method's row alone


@pytest.mark.quick
def test_one_window_over_the_volume_gives_the_networks_own_softmax():
    torch.manual_seed(0)
    network = TinySegmenter().eval()
    x = torch.randn(2, 1, 12, 16, 10)
    with torch.no_grad():
        ours = stitched_probabilities(network, x, Windows((12, 16, 10)))
        np.testing.assert_allclose(ours.numpy(), network(x).softmax(dim=1).numpy(), atol=1e-5)
        padded = stitched_probabilities(network, x[:, :, :, :, :8], Windows((12, 16, 10)))  # padded, cut back
        reference = network(F.pad(x[:, :, :, :, :8], (1, 1))).softmax(dim=1)[..., 1:9]
        np.testing.assert_allclose(padded.numpy(), reference.numpy(), atol=1e-5)


@pytest.mark.quick
def test_a_region_masks_score_is_the_mean_probability_inside_it(tmp_path: Path):
    torch.manual_seed(1)
    network = TinySegmenter(classes=2).eval()
    x, _ = blobs(1, torch.Generator().manual_seed(5))
    mask = np.zeros((SIDE, SIDE, SIDE), dtype=np.float32)
    mask[2:7, 3:12, 5:9] = 1.0
    np.save(tmp_path / "scan.npy", x[0].numpy())
    np.save(tmp_path / "mask.npy", mask)
    explainer = Explainer(as_scan_model(network), methods=["gradcam"], target=1, region=tmp_path / "mask.npy")
    (image,) = evaluator_for(explainer, EvalOptions(steps=4)).run([tmp_path / "scan.npy"]).images
    inside = torch.from_numpy(mask) > 0
    with torch.no_grad():  # one window covers the scan: its own softmax, averaged over the mask
        expected = [float(network(v[None]).softmax(dim=1)[0, 1][inside].mean()) for v in (x[0], torch.zeros_like(x[0]))]
    assert image.error is None and image.target is not None and image.target.index == 1
    assert image.target.probability == pytest.approx(expected[0], abs=1e-5)
    curve = image.methods["gradcam"].deletion
    assert len(curve) == 5 and curve[0] == pytest.approx(expected[0], abs=1e-5)
    assert curve[-1] == pytest.approx(expected[1], abs=1e-5)  # every voxel deleted: the zero scan


def test_a_classifiers_scan_is_scored_by_its_probability_at_the_size_it_takes(tmp_path: Path):
    network = classifier(seed=2)
    x = torch.randn(1, 12, 14, 10, generator=torch.Generator().manual_seed(4))
    np.save(tmp_path / "scan.npy", x.numpy())
    spec, shape = VolumeSpec((SIDE, SIDE, SIDE)), InputSpec(shape=(1, SIDE, SIDE, SIDE))
    model = LoadedModel(network, "cube", "random", ["a", "b", "c", "d"], shape, task="classify", volume=spec)
    (image,) = (
        evaluator_for(Explainer(model, methods=["gradcam"]), EvalOptions(steps=3)).run([tmp_path / "scan.npy"]).images
    )
    with torch.no_grad():
        resized = F.interpolate(x[None], size=(SIDE,) * 3, mode="trilinear", align_corners=False)
        probabilities = network(resized).softmax(dim=1)[0]
    assert image.error is None and image.target is not None
    assert image.target.index == int(probabilities.argmax())
    assert image.target.probability == pytest.approx(float(probabilities.max()), abs=1e-5)
    curve = image.methods["gradcam"].deletion
    with torch.no_grad():
        zero = float(network(torch.zeros(1, 1, SIDE, SIDE, SIDE)).softmax(dim=1)[0, image.target.index])
    assert len(curve) == 4 and curve[-1] == pytest.approx(zero, abs=1e-5)


@pytest.mark.quick
def test_the_insertion_start_is_a_3d_gaussian_blur():
    volume = torch.zeros(1, 15, 15, 15)
    volume[0, 7, 7, 7] = 1.0
    out = blurred(volume)[0]
    assert float(out.sum()) == pytest.approx(1.0, abs=1e-5)  # no mass lost at the centre, far from the edges
    assert float(out[7, 7, 7]) == float(out.max())
    np.testing.assert_allclose(out.numpy(), out.permute(2, 0, 1).numpy(), atol=1e-7)  # the same along every axis


UNET = "monai:UNet?in_channels=1&out_channels=3&channels=4,8&strides=2,&num_res_units=0"


def run(*args: str | Path):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def unet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    monai = pytest.importorskip("monai")
    folder = tmp_path_factory.mktemp("unet")
    torch.manual_seed(0)
    network = monai.networks.nets.UNet(3, 1, 3, channels=(4, 8), strides=(2,), num_res_units=0)
    torch.save(network.state_dict(), folder / "unet.pt")
    (folder / "unet.json").write_text(json.dumps({"patch": [16, 16, 16], "labels": ["background", "a", "b"]}))
    x, _ = blobs(1, torch.Generator().manual_seed(3))
    np.save(folder / "scan.npy", x[0].numpy())
    return folder / "unet.pt", folder / "scan.npy"


@pytest.mark.quick
def test_gradcam_eval_measures_a_scan_from_the_command_line(unet):
    weights, scan = unet
    result = run(scan, "-m", UNET, "--weights", weights, "--steps", "5", "-t", "1", "--json")
    assert result.exit_code == EXIT_OK, result.output
    report = json.loads(result.stdout)
    (image,) = report["per_image"]
    assert report["images"] == 1 and image["image"] == str(scan) and image["target"]["index"] == 1
    assert len(image["methods"]["gradcam"]["deletion_curve"]) == 6


def test_what_gradcam_eval_does_not_measure_on_scans_is_refused(unet, tmp_path: Path):
    weights, scan = unet
    for option, message in (
        (["--road"], "error: --road is not measured on scans; a scan's maps are measured by deletion and insertion"),
        (  # given by the user beside --rank, which does not turn it on for scans: refused, not dropped
            ["--rank", "--sanity"],
            "error: --sanity is not measured on scans; a scan's maps are measured by deletion and insertion",
        ),
        (["--rank", "--budget", "60"], "error: --budget plans --rank on images; on scans every method named is run"),
        (
            ["--masks", tmp_path / "none"],
            f"error: --masks {tmp_path / 'none'}: no such folder (give the folder of label masks, as nnU-Net's "
            "labelsTr)",
        ),
    ):
        result = run(scan, "-m", UNET, "--weights", weights, *option)
        assert result.exit_code == EXIT_USAGE and result.stderr.strip().splitlines()[-1] == message
    from PIL import Image

    Image.new("RGB", (16, 16)).save(tmp_path / "photo.png")
    result = run(tmp_path / "photo.png", "-m", UNET, "--weights", weights)
    assert result.exit_code == EXIT_USAGE and result.stderr.strip().endswith(
        "takes scans; none found in " + str(tmp_path / "photo.png")
    )


def test_gradcam_eval_ranks_scans_with_their_masks_and_resumes(unet, tmp_path: Path):
    weights, scan = unet
    scans, labels, report = tmp_path / "imagesTr", tmp_path / "labelsTr", tmp_path / "report"
    scans.mkdir()
    labels.mkdir()
    mask = np.zeros((SIDE, SIDE, SIDE), dtype=np.uint8)
    mask[2:10, 4:12, 3:9], mask[11:15, 1:6, 8:14] = 1, 2
    for n, name in enumerate(("a_0000", "b")):
        np.save(scans / f"{name}.npy", np.load(scan) * (1.0 + n))
        np.save(labels / f"{name.removesuffix('_0000')}.npy", mask)
    command = [scans, "-m", UNET, "--weights", weights, "-t", "1", "--steps", "3", "--masks", labels, "--rank"]
    result = run(*command, "--report", report, "--json")
    assert result.exit_code == EXIT_OK, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    metrics_ranked = {row["metric"] for row in rows}
    assert {"deletion_auc", "insertion_auc", "pointing", "energy", "dice"} <= metrics_ranked
    assert not metrics_ranked & {"road", "sanity", "stability", "faithfulness_correlation"}
    assert {row["method"] for row in rows} == {"gradcam", "randomcam"}
    assert all(row["images"] == 2 for row in rows)
    written = (report / "rows.jsonl").read_text().splitlines()
    assert len(written) == 1 + 2 * 2  # the settings, then one row per (scan, method)
    again = run(*command, "--report", report, "--json", "--skip-existing")
    assert again.exit_code == EXIT_OK, again.output
    assert (report / "rows.jsonl").read_text().splitlines() == written  # nothing evaluated again
    assert [json.loads(line) for line in again.stdout.splitlines()] == rows


def test_gradcam_eval_takes_a_scans_channel_files(unet, tmp_path: Path):
    monai = pytest.importorskip("monai")
    weights, scan = unet
    second = tmp_path / "second.npy"
    np.save(second, np.load(scan) * 0.5)
    result = run("--channels", f"{scan},{second}", "-m", UNET, "--weights", weights)
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: --channels gives 2 channel(s) (scan.npy, second.npy); {UNET} takes 1 channel(s)"
    )
    torch.manual_seed(0)
    network = monai.networks.nets.UNet(3, 2, 3, channels=(4, 8), strides=(2,), num_res_units=0)
    torch.save(network.state_dict(), tmp_path / "unet2.pt")
    (tmp_path / "unet2.json").write_text(json.dumps({"patch": [16, 16, 16]}))
    two = UNET.replace("in_channels=1", "in_channels=2")
    result = run("--channels", f"{scan},{second}", "-m", two, "--weights", tmp_path / "unet2.pt", "-t", "1", "--json")
    assert result.exit_code == EXIT_OK, result.output
    assert [image["image"] for image in json.loads(result.stdout)["per_image"]] == [str(scan)]
