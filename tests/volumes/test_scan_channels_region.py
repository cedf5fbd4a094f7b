"""Scans' channels and region masks from the command line (docs/volumes.md, "From the command line"): ``--channels
a.nii.gz,b.nii.gz`` is one scan of two channels, explained as the library explains the stacked volume and as
nnU-Net's ``_0000``, ``_0001`` naming gives it; ``--target region:MASK.nii.gz`` scores each class over the mask's
voxels, the NIfTI map voxel for voxel the library's ``explain_volume`` with that region; the grids, the channel
count and the misplaced options refused in one line. Tiny MONAI UNets saved here (16^3 windows, 16^3 scans)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from gradcam_cli import Explainer, load_model
from gradcam_cli.cam.windows import Windows, explain_volume
from gradcam_cli.cli import app
from gradcam_cli.errors import EXIT_IMAGE_FAILED, EXIT_OK, EXIT_USAGE

monai = pytest.importorskip("monai")
nibabel = pytest.importorskip("nibabel")
SHAPE = (16, 16, 12)
AFFINE = np.array([[1.2, 0.0, 0.0, -5.0], [0.0, 1.0, 0.0, 3.0], [0.0, 0.0, 2.0, 1.0], [0.0, 0.0, 0.0, 1.0]])
PROFILE = {"patch": [16, 16, 16], "labels": ["background", "liver", "tumour"]}


def unet(channels: int) -> str:
    return f"monai:UNet?in_channels={channels}&out_channels=3&channels=4,8&strides=2,&num_res_units=0"


def run(*args: str | Path):
    return CliRunner().invoke(app, [str(a) for a in args])


def rows(manifest: Path) -> list[dict]:
    return [json.loads(line) for line in manifest.read_text().splitlines()]


def save(path: Path, values: np.ndarray, affine: np.ndarray = AFFINE) -> Path:
    nibabel.save(nibabel.Nifti1Image(values.astype(np.float32), affine), path)
    return path


def weights(folder: Path, channels: int) -> Path:
    """A seeded UNet of ``channels`` input channels saved as ``folder/unetC.pt`` with its profile beside it."""
    torch.manual_seed(channels)
    network = monai.networks.nets.UNet(3, channels, 3, channels=(4, 8), strides=(2,), num_res_units=0).eval()
    path = folder / f"unet{channels}.pt"
    torch.save(network.state_dict(), path)
    path.with_suffix(".json").write_text(json.dumps(PROFILE))
    return path


@pytest.fixture(scope="module")
def scans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("scans")
    generator = np.random.default_rng(0)
    t1, t2 = (generator.normal(size=SHAPE) * 50 + 100 for _ in range(2))
    mask = np.zeros(SHAPE)
    mask[3:9, 4:12, 2:7] = 1
    named = folder / "nnunet"
    named.mkdir()
    return {
        "t1": save(folder / "t1.nii.gz", t1),
        "t2": save(folder / "t2.nii.gz", t2),
        "case_0000": save(named / "case_0000.nii.gz", t1),
        "case_0001": save(named / "case_0001.nii.gz", t2),
        "short": save(folder / "short.nii.gz", t2[:, :, :10]),
        "moved": save(folder / "moved.nii.gz", t2, AFFINE + np.outer(np.eye(4)[0], np.eye(4)[3]) * 5),
        "mask": save(folder / "mask.nii.gz", mask),
        "bad_mask": save(folder / "bad_mask.nii.gz", mask[:, :, :10]),
    }


def library_map(model: str, w: Path, stacked: np.ndarray, c: int, region: np.ndarray | None = None) -> np.ndarray:
    """The library's map of a (C, I, J, K) scan for class ``c`` (a MONAI network reads nibabel's axis order)."""
    loaded = load_model(model, weights=str(w))
    spec = loaded.profile.volume
    x = spec.normalise(torch.from_numpy(stacked.astype(np.float32)))
    mask = None if region is None else torch.from_numpy(region)
    result = explain_volume(Explainer(loaded, methods=["gradcam"]), x, Windows(spec.patch, spec.step), [c], 1, mask)
    return result.maps["gradcam"][0].numpy()


@pytest.mark.quick
def test_channels_are_one_scan_stacked_as_the_nnunet_naming_stacks_them(scans, tmp_path: Path):
    w = weights(tmp_path, 2)
    out, named = tmp_path / "out", tmp_path / "named"
    given = f"{scans['t1']},{scans['t2']}"
    result = run(
        "--channels", given, "-m", unet(2), "--weights", w, "-o", out, "-t", "1", "--manifest", out / "m.jsonl"
    )
    assert result.exit_code == EXIT_OK, result.output
    assert [row["input"] for row in rows(out / "m.jsonl")] == [str(scans["t1"])]
    written = nibabel.load(out / "t1_gradcam_1-liver.nii.gz")
    assert written.shape == SHAPE and np.allclose(written.affine, AFFINE)
    stacked = np.stack([np.asarray(nibabel.load(scans[n]).dataobj) for n in ("t1", "t2")])
    ours = library_map(unet(2), w, stacked, 1)
    np.testing.assert_allclose(np.asarray(written.dataobj), ours, atol=1e-6)
    result = run(scans["case_0000"].parent, "-m", unet(2), "--weights", w, "-o", named, "-t", "1")
    assert result.exit_code == EXIT_OK, result.output
    np.testing.assert_array_equal(
        np.asarray(nibabel.load(named / "case_gradcam_1-liver.nii.gz").dataobj), np.asarray(written.dataobj)
    )


@pytest.mark.quick
def test_channels_on_other_grids_are_refused_before_the_model_loads(scans, tmp_path: Path):
    missing = f"nnunet:{tmp_path / 'missing'}"  # never loaded: the grids are read from the headers first
    result = run("--channels", f"{scans['t1']},{scans['short']}", "-m", missing, "-o", tmp_path)
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.strip() == (
        f"error: --channels: {scans['short']} is not on the grid of {scans['t1']} (16x16x10 vs 16x16x12); resample "
        "it first (gradcam never resamples a scan)"
    )
    result = run("--channels", f"{scans['t1']},{scans['moved']}", "-m", missing, "-o", tmp_path)
    assert result.exit_code == EXIT_USAGE and "(another affine)" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = run("--channels", f"{scans['t1']},{tmp_path / 'none.nii.gz'}", "-m", missing, "-o", tmp_path)
    assert result.exit_code == EXIT_USAGE and result.stderr.strip().endswith("none.nii.gz does not exist")


def test_a_channel_count_the_model_does_not_take_names_both(scans, tmp_path: Path):
    w = weights(tmp_path, 1)
    result = run("--channels", f"{scans['t1']},{scans['t2']}", "-m", unet(1), "--weights", w, "-o", tmp_path / "o")
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: --channels gives 2 channel(s) (t1.nii.gz, t2.nii.gz); {unet(1)} takes 1 channel(s)"
    )
    result = run("--channels", f"{scans['t1']},{scans['t2']}", "-o", tmp_path / "p", "--weights", "none")
    assert result.exit_code == EXIT_USAGE and "t1.nii.gz is a scan; resnet50 takes images" in result.stderr


@pytest.mark.quick
def test_a_region_target_scores_each_class_over_the_masks_voxels(scans, tmp_path: Path):
    w = weights(tmp_path, 1)
    out, plain = tmp_path / "out", tmp_path / "plain"
    region = f"region:{scans['mask']}"
    for folder, extra in ((out, ["--target", region]), (plain, [])):
        result = run(scans["t1"], "-m", unet(1), "--weights", w, "-o", folder, "-t", "2", *extra)
        assert result.exit_code == EXIT_OK, result.output
    written = np.asarray(nibabel.load(out / "t1_gradcam_2-tumour.nii.gz").dataobj)
    image = np.asarray(nibabel.load(scans["t1"]).dataobj)[None]
    mask = np.asarray(nibabel.load(scans["mask"]).dataobj) != 0
    np.testing.assert_allclose(written, library_map(unet(1), w, image, 2, mask), atol=1e-6)
    unmasked = np.asarray(nibabel.load(plain / "t1_gradcam_2-tumour.nii.gz").dataobj)
    assert np.abs(written - unmasked).max() > 0.05  # another score: another map


def test_a_region_mask_off_the_scans_grid_and_misplaced_regions_are_one_line(scans, tmp_path: Path):
    w = weights(tmp_path, 1)
    bad = f"region:{scans['bad_mask']}"
    result = run(scans["t1"], "-m", unet(1), "--weights", w, "-o", tmp_path / "o", "--target", bad)
    assert result.exit_code == EXIT_IMAGE_FAILED
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .endswith(
            f"region mask {scans['bad_mask']} is not on the grid of {scans['t1']} (16x16x10 vs 16x16x12); give a mask "
            "of the scan"
        )
    )
    region = f"region:{scans['mask']}"
    refused = {
        ("--target", region, "--target", "class:1"): "error: --target region: is scored for a class (--target-class), "
        "not for --target class:1",
        ("--target", region, "--target", region): "error: --target region: takes one mask; give it once",
    }
    for options, message in refused.items():
        result = run(scans["t1"], "-m", unet(1), "--weights", w, "-o", tmp_path / "o", *options)
        assert result.exit_code == EXIT_USAGE and result.stderr.strip() == message
    from PIL import Image

    photo = tmp_path / "photo.png"
    Image.new("RGB", (32, 32)).save(photo)
    result = run(photo, "--target", region, "--weights", "none", "-o", tmp_path / "o")
    assert result.exit_code == EXIT_USAGE
    assert (
        result.stderr.strip()
        == "error: --target region: is for scans (.nii, .nii.gz, .npy, DICOM folders); none was given"
    )
