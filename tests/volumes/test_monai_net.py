"""MONAI networks by name (``--model monai:NAME``, models/families/monai_net.py, docs/volumes.md "MONAI networks") and
volume classifiers from the command line (cam/whole_volume.py): tiny networks built here, saved as state dicts with a
JSON profile beside them; a classifier's NIfTI map against an autograd Grad-CAM of the volume resized to the
profile's size and put back on the scan's grid, and against MONAI's own ``GradCAM`` where the whole volume is taken
as it is; a UNet's stitched map against the sliding-window reference (tests/volume_models.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from cam_reference import pearson
from typer.testing import CliRunner
from volume_models import CT_AFFINE, CT_SHAPE, reference_stitched, save_ct_scan, volume

from gradcam_cli import Explainer, load_model
from gradcam_cli.cam.whole_volume import explain_classified
from gradcam_cli.cam.windows import Windows, explain_volume
from gradcam_cli.cli import app
from gradcam_cli.errors import EXIT_IMAGE_FAILED, EXIT_OK, EXIT_USAGE, UsageError
from gradcam_cli.models.families import monai_net

monai = pytest.importorskip("monai")
nibabel = pytest.importorskip("nibabel")
SHAPE, AFFINE = CT_SHAPE, CT_AFFINE
DENSENET = "monai:DenseNet121?in_channels=1&out_channels=3&init_features=4&growth_rate=4&block_config=2,2,2,2"
DENSENET_LAYER = "features.transition2.conv"
RESNET = "monai:ResNet?block=basic&layers=1,1,1,1&block_inplanes=4,8,8,8&n_input_channels=1&num_classes=3"
UNET = "monai:UNet?in_channels=1&out_channels=3&channels=4,8,16&strides=2,2&num_res_units=0"
UNET_BOTTLENECK = "model.1.submodule.1.submodule"


def run(*args: str | Path):
    return CliRunner().invoke(app, [str(a) for a in args])


def rows(manifest: Path) -> list[dict]:
    return [json.loads(line) for line in manifest.read_text().splitlines()]


@pytest.fixture(scope="module")
def scan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_ct_scan(tmp_path_factory.mktemp("scans") / "head.nii.gz")


def saved(spec: str, folder: Path, profile: dict | None = None, seed: int = 0) -> tuple[Path, torch.nn.Module]:
    """The network ``spec`` names, seeded, saved as ``folder/model.pt`` with ``profile`` as ``model.json``."""
    name, arguments = monai_net.parse_spec(spec.removeprefix("monai:"))
    torch.manual_seed(seed)
    network = getattr(monai.networks.nets, name)(spatial_dims=3, **arguments).eval()
    weights = folder / "model.pt"
    torch.save(network.state_dict(), weights)
    if profile is not None:
        weights.with_suffix(".json").write_text(json.dumps(profile))
    return weights, network


def grad_cam(network: torch.nn.Module, layer: str, x: torch.Tensor, c: int, grid: tuple[int, ...]) -> torch.Tensor:
    """Grad-CAM (Selvaraju et al.) of class ``c``'s logit on (1, C, D, H, W) ``x`` by ``torch.autograd.grad``,
    upsampled trilinearly to ``grid``, min-max normalised."""
    kept: list[torch.Tensor] = []

    def keep(_module: object, _inputs: object, output: torch.Tensor) -> torch.Tensor:
        kept.append(output.detach().requires_grad_(True))
        return kept[-1]

    handle = network.get_submodule(layer).register_forward_hook(keep)
    try:
        with torch.enable_grad():
            (g,) = torch.autograd.grad(network(x)[0, c], kept[-1])
    finally:
        handle.remove()
    a = kept[-1].detach().double()
    cam = torch.relu((g.double().mean(dim=(2, 3, 4), keepdim=True) * a).sum(dim=1, keepdim=True))
    up = F.interpolate(cam, size=grid, mode="trilinear", align_corners=False)[0, 0]
    return (up - up.min()) / (up.max() - up.min())


@pytest.mark.quick
def test_the_spec_reads_json_values_lists_and_text():
    name, arguments = monai_net.parse_spec("UNet?in_channels=1&channels=4,8,16&dropout=0.1&norm=batch&bias=false")
    assert name == "UNet"
    assert arguments == {"in_channels": 1, "channels": (4, 8, 16), "dropout": 0.1, "norm": "batch", "bias": False}


@pytest.mark.quick
def test_an_unknown_name_is_refused_with_the_closest_ones(tmp_path: Path, scan: Path):
    result = run(scan, "--model", "monai:DenseNet12", "-o", tmp_path)
    assert result.exit_code == EXIT_USAGE
    assert "unknown MONAI network 'DenseNet12'; did you mean DenseNet121" in result.output


@pytest.mark.quick
def test_without_monai_one_sentence_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch):
    found = monai_net.importlib.util.find_spec
    monkeypatch.setattr(
        monai_net.importlib.util, "find_spec", lambda name, *rest: None if name == "monai" else found(name, *rest)
    )
    with pytest.raises(UsageError, match=r"MONAI networks need monai: pip install 'gradcam-cli\[medical\]'"):
        load_model(UNET, weights="none")


@pytest.mark.quick
def test_the_profile_beside_the_weights_says_how_the_network_takes_a_scan(tmp_path: Path):
    profile = {
        "network": {"num_res_units": 0},
        "patch": [16, 16, 16],
        "step": 0.25,
        "spacing": [1.5, 1.5, 2.0],
        "intensity": {"scheme": "range", "low": -100, "high": 200},
        "labels": ["background", "liver", "tumour"],
    }
    weights, network = saved(UNET, tmp_path, profile)
    model = load_model(UNET.replace("&num_res_units=0", ""), weights=str(weights))
    spec = model.profile.volume
    assert model.task == "segment" and model.categories == ["background", "liver", "tumour"]
    assert spec.patch == (16, 16, 16) and spec.step == 0.25 and spec.spacing == (1.5, 1.5, 2.0)
    assert spec.intensities[0].describe() == "range [-100, 200] -> [0, 1]"
    assert model.profile.default_layers == (UNET_BOTTLENECK,)  # the bottleneck
    for mine, theirs in zip(model.module.state_dict().values(), network.state_dict().values(), strict=True):
        assert torch.equal(mine, theirs)
    assert load_model(DENSENET, weights="none").profile.volume.patch == ()  # a classifier: the whole volume
    with pytest.raises(UsageError, match="no pretrained weights; pass --weights FILE"):
        load_model(UNET)


@pytest.mark.slow
def test_a_classifier_explains_the_scan_resized_to_its_profiles_size(scan: Path, tmp_path: Path):
    profile = {"patch": [32, 32, 32], "intensity": {"scheme": "zscore"}, "labels": ["none", "benign", "malignant"]}
    weights, network = saved(DENSENET, tmp_path, profile)
    out = tmp_path / "out"
    result = run(
        scan, "--model", DENSENET, "--weights", weights, "--layer", DENSENET_LAYER,
        "-o", out, "--manifest", out / "m.jsonl", "--top-k", "2", "--save-raw",
    )  # fmt: skip
    assert result.exit_code == EXIT_OK, result.output
    assert "resized from 18x22x26 to 32x32x32" in result.output
    x = torch.from_numpy(np.asarray(nibabel.load(scan).dataobj, dtype=np.float32))
    x = ((x.double() - x.double().mean()) / x.double().std(correction=0)).float()[None, None]
    resized = F.interpolate(x, size=(32, 32, 32), mode="trilinear", align_corners=False)
    with torch.no_grad():
        probabilities = network(resized).softmax(dim=1)[0]
    found = rows(out / "m.jsonl")
    order = probabilities.argsort(descending=True).tolist()
    assert [row["target"]["index"] for row in found] == order[:2]
    for row in found:
        c = row["target"]["index"]
        assert row["target"]["probability"] == pytest.approx(float(probabilities[c]), abs=1e-5)
        assert [p["index"] for p in row["predictions"]] == order
        image = nibabel.load(row["outputs"][0])
        written = np.asarray(image.dataobj)
        assert written.dtype == np.float32 and written.shape == SHAPE
        np.testing.assert_allclose(image.affine, AFFINE, atol=1e-6)
        assert pearson(written, grad_cam(network, DENSENET_LAYER, resized, c, SHAPE)) >= 0.999
        np.testing.assert_array_equal(np.load(row["outputs"][2]), written)
        peak = np.unravel_index(int(np.argmax(written)), SHAPE)
        assert row["volume"]["peak"] == [int(i) for i in peak] and row["volume"]["windows"] == 1


def test_a_scan_too_small_for_the_network_is_its_own_error_row_and_the_run_goes_on(tmp_path: Path):
    scans = tmp_path / "scans"
    scans.mkdir()
    generator = np.random.default_rng(0)
    np.save(scans / "a_small.npy", generator.normal(size=(6, 6, 6)).astype(np.float32))  # below the pooling's size
    np.save(scans / "b_whole.npy", generator.normal(size=(40, 40, 40)).astype(np.float32))
    out = tmp_path / "out"
    result = run(scans, "--model", DENSENET, "--weights", "none", "--layer", DENSENET_LAYER, "-o", out,
                 "--manifest", out / "m.jsonl")  # fmt: skip
    assert result.exit_code == EXIT_IMAGE_FAILED, result.output
    assert "Traceback" not in result.output
    found = rows(out / "m.jsonl")
    assert [(Path(row["input"]).name, row["status"]) for row in found] == [
        ("a_small.npy", "error"),
        ("b_whole.npy", "ok"),
    ]
    assert "smaller than kernel size" in found[0]["error"] and "\n" not in found[0]["error"]
    assert sorted(path.name for path in out.glob("a_small*")) == []


@pytest.mark.slow
def test_a_whole_volume_classifier_agrees_with_monais_grad_cam(scan: Path, tmp_path: Path):
    visualize = pytest.importorskip("monai.visualize")
    weights, network = saved(RESNET, tmp_path)
    out = tmp_path / "out"
    result = run(
        scan, "--model", RESNET, "--weights", weights, "--layer", "layer2", "-o", out, "--target-class", "2"
    )  # fmt: skip
    assert result.exit_code == EXIT_OK, result.output
    written = np.asarray(nibabel.load(out / "head_gradcam_2-2.nii.gz").dataobj)
    x = torch.from_numpy(np.asarray(nibabel.load(scan).dataobj, dtype=np.float32))[None, None]
    theirs = visualize.GradCAM(network, target_layers="layer2", postprocessing=lambda m: m)(x, class_idx=2)[0, 0]
    theirs = theirs.detach()
    assert pearson(written, (theirs - theirs.min()) / (theirs.max() - theirs.min())) >= 0.999
    assert pearson(written, grad_cam(network, "layer2", x, 2, SHAPE)) >= 0.999


@pytest.mark.slow
def test_a_unet_is_explained_over_sliding_windows(scan: Path, tmp_path: Path):
    pytest.importorskip("nnunetv2", reason="the reference stitches with nnU-Net's own windows and Gaussian")
    profile = {"patch": [16, 16, 16], "intensity": {"scheme": "zscore"}, "labels": ["background", "bright", "dark"]}
    weights, network = saved(UNET, tmp_path, profile)
    out = tmp_path / "out"
    result = run(
        scan, "--model", UNET, "--weights", weights, "--layer", UNET_BOTTLENECK, "-o", out, "--target-class", "bright"
    )  # fmt: skip
    assert result.exit_code == EXIT_OK, result.output
    written = np.asarray(nibabel.load(out / "head_gradcam_1-bright.nii.gz").dataobj)
    spec = load_model(UNET, weights=str(weights)).profile.volume
    x = spec.normalise(torch.from_numpy(np.asarray(nibabel.load(scan).dataobj, dtype=np.float32))[None])
    layer = network.get_submodule(UNET_BOTTLENECK)
    reference = reference_stitched(network, layer, x, 1, spec.patch, spec.step)
    assert written.shape == SHAPE and pearson(torch.from_numpy(written), reference) >= 0.999


@pytest.mark.parametrize(
    ("spec", "side"),
    [
        ("monai:SegResNet?in_channels=1&out_channels=2&init_filters=8&blocks_down=1,1&blocks_up=1,", 32),
        pytest.param(
            "monai:SwinUNETR?in_channels=1&out_channels=2&feature_size=12&depths=1,1,1,1", 64, marks=pytest.mark.slow
        ),
        ("monai:resnet10?n_input_channels=1&num_classes=2", 32),
    ],
)
def test_the_other_named_networks_load_as_their_task_and_explain_a_scan(spec: str, side: int):
    """SwinUNETR halves its input five times, and its instance norms need more than one voxel: 64^3 at least."""
    model = load_model(spec, weights="none")
    assert model.task == ("classify" if "resnet10" in spec else "segment")
    x = volume((side, side, side))
    explainer = Explainer(model, methods=["gradcam"])
    if model.task == "classify":
        found = explain_classified(explainer, x, (), top_k=1)
    else:
        found = explain_volume(explainer, x, Windows((side, side, side)), classes=[1])
    assert found.maps["gradcam"].shape == (1, side, side, side) and torch.isfinite(found.maps["gradcam"]).all()


@pytest.mark.slow
def test_a_bundle_classifier_explains_the_scan_resized_to_its_roi(scan: Path, tmp_path: Path):
    name, arguments = monai_net.parse_spec(DENSENET.removeprefix("monai:"))
    folder = tmp_path / "bundle"
    (folder / "configs").mkdir(parents=True)
    (folder / "models").mkdir()
    network_def = {"_target_": name, "spatial_dims": 3} | {
        k: list(v) if isinstance(v, tuple) else v for k, v in arguments.items()
    }
    scale = {"_target_": "ScaleIntensityRanged", "keys": "image", "a_min": -200, "a_max": 300, "clip": True}
    config = {
        "network_def": network_def,
        "preprocessing": {"_target_": "Compose", "transforms": [{"_target_": "LoadImaged", "keys": "image"}, scale]},
        "inferer": {"_target_": "SimpleInferer", "roi_size": [32, 32, 32]},
    }
    (folder / "configs" / "inference.json").write_text(json.dumps(config))
    labels = {"0": "normal", "1": "abnormal", "2": "other"}
    image = {"type": "image", "num_channels": 1}
    meta = {
        "network_data_format": {
            "inputs": {"image": image},
            "outputs": {"pred": {"type": "probabilities", "channel_def": labels}},
        }
    }
    (folder / "configs" / "metadata.json").write_text(json.dumps(meta))
    _, network = saved(DENSENET, folder / "models")
    out = tmp_path / "out"
    result = run(
        scan, "--model", f"bundle:{folder}", "--layer", DENSENET_LAYER, "-o", out, "--target-class", "abnormal"
    )
    assert result.exit_code == EXIT_OK, result.output
    written = np.asarray(nibabel.load(out / "head_gradcam_1-abnormal.nii.gz").dataobj)
    x = torch.from_numpy(np.asarray(nibabel.load(scan).dataobj, dtype=np.float32))
    x = ((x.clamp(-200, 300) + 200) / 500)[None, None]
    resized = F.interpolate(x, size=(32, 32, 32), mode="trilinear", align_corners=False)
    assert written.shape == SHAPE and pearson(written, grad_cam(network, DENSENET_LAYER, resized, 1, SHAPE)) >= 0.999
