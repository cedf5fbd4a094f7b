"""Scans from the command line (pipeline/volumes.py, docs/volumes.md "From the command line"): a NIfTI written here
explained by a tiny nnU-Net folder and a tiny MONAI bundle (tests/volume_models.py); the NIfTI map back on the scan's
grid and affine, voxel for voxel the library's ``explain_volume`` map of the scan as the model reads it (an nnU-Net
model through SimpleITK, whose axes are nibabel's reversed), and so the autograd reference's; the row's peak; two
runs without drift; --skip-existing; the options refused (--shard: tests/volumes/test_scan_shards.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from cam_reference import pearson
from PIL import Image
from typer.testing import CliRunner
from volume_models import (
    BUNDLE_BOTTLENECK,
    CT_AFFINE,
    CT_SHAPE,
    reference_stitched,
    save_bundle,
    save_ct_scan,
    save_nnunet_folder,
    volume,
)

from gradcam_cli import Explainer, load_model
from gradcam_cli.cam.windows import Windows, explain_volume
from gradcam_cli.cli import app
from gradcam_cli.cli.diff import app as diff_app
from gradcam_cli.drift.compare import diff_runs
from gradcam_cli.errors import EXIT_IMAGE_FAILED, EXIT_OK, EXIT_USAGE

nibabel = pytest.importorskip("nibabel")
pytest.importorskip("dynamic_network_architectures")
SHAPE, AFFINE = CT_SHAPE, CT_AFFINE


def run(*args: str | Path):
    return CliRunner().invoke(app, [str(a) for a in args])


def rows(manifest: Path) -> list[dict]:
    return [json.loads(line) for line in manifest.read_text().splitlines()]


@pytest.fixture(scope="module")
def scan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_ct_scan(tmp_path_factory.mktemp("scans") / "head.nii.gz")


@pytest.fixture(scope="module")
def nnunet(tmp_path_factory: pytest.TempPathFactory):
    folder, network = save_nnunet_folder(tmp_path_factory.mktemp("nnunet"))
    return f"nnunet:{folder}", network


@pytest.fixture(scope="module")
def explained(nnunet, scan, tmp_path_factory: pytest.TempPathFactory):
    """One run: two classes, --save-raw, a manifest."""
    out = tmp_path_factory.mktemp("out")
    result = run(scan, "--model", nnunet[0], "-o", out, "--manifest", out / "m.jsonl", "--top-k", "2", "--save-raw")
    assert result.exit_code == EXIT_OK, result.output
    return out


@pytest.mark.slow
def test_the_nifti_map_is_the_librarys_on_the_scans_grid(nnunet, scan, explained):
    sitk = pytest.importorskip("SimpleITK")
    pytest.importorskip("nnunetv2", reason="the reference stitches with nnU-Net's own windows and Gaussian")
    found = rows(explained / "m.jsonl")
    assert [row["status"] for row in found] == ["ok", "ok"] and len({row["target"]["index"] for row in found}) == 2
    model = load_model(nnunet[0])
    spec = model.profile.volume
    explainer = Explainer(model, methods=["gradcam"])
    # the scan as nnU-Net reads it: SimpleITK's array, (z, y, x), nibabel's axes reversed
    as_read = torch.from_numpy(sitk.GetArrayFromImage(sitk.ReadImage(str(scan))).astype(np.float32))[None]
    x = spec.normalise(as_read)
    for row in found:
        c = row["target"]["index"]
        nifti, montage, raw = (Path(path) for path in row["outputs"])
        image = nibabel.load(nifti)
        written = np.asarray(image.dataobj)
        assert written.dtype == np.float32 and written.shape == SHAPE
        np.testing.assert_allclose(image.affine, AFFINE, atol=1e-6)
        ours = explain_volume(explainer, x, Windows(spec.patch, spec.step), classes=[c]).maps["gradcam"][0]
        np.testing.assert_allclose(written, ours.permute(2, 1, 0).numpy(), atol=1e-6)
        np.testing.assert_array_equal(np.load(raw), written)
        layer = nnunet[1].get_submodule("encoder.stages.2")
        reference = reference_stitched(nnunet[1], layer, x, c, spec.patch, spec.step)
        assert pearson(torch.from_numpy(written), reference.permute(2, 1, 0)) >= 0.999
        peak = np.unravel_index(int(np.argmax(written)), SHAPE)
        assert row["volume"]["peak"] == [int(i) for i in peak] and row["volume"]["grid"] == list(SHAPE)
        world = AFFINE @ np.array([*peak, 1.0])
        np.testing.assert_allclose(row["volume"]["peak_mm"], world[:3], atol=1e-3)
        assert row["volume"]["spacing"] == pytest.approx([0.8, 0.9, 2.5])
        assert row["target"]["voxels"] == round(row["target"]["share"] * np.prod(SHAPE))
        assert row["fingerprint"]["size"] == list(SHAPE) and "depth" in row["fingerprint"]
        assert montage.name.endswith("_montage.png") and montage.stat().st_size > 0


@pytest.mark.slow
def test_two_runs_do_not_drift_and_skip_existing_keeps_the_rows(nnunet, scan, explained, tmp_path: Path):
    again = tmp_path / "again"
    result = run(scan, "--model", nnunet[0], "-o", again, "--manifest", again / "m.jsonl", "--top-k", "2")
    assert result.exit_code == EXIT_OK, result.output
    report = diff_runs(explained / "m.jsonl", again / "m.jsonl")
    assert not report.drift and len(report.results) == 2
    assert all(r.compared == "fingerprints" and r.pearson > 0.9999 for r in report.results)
    assert CliRunner().invoke(diff_app, [str(explained / "m.jsonl"), str(again / "m.jsonl")]).exit_code == EXIT_OK
    before = {path: path.stat().st_mtime_ns for path in again.glob("head_*")}
    result = run(
        scan, "--model", nnunet[0], "-o", again, "--manifest", again / "m.jsonl", "--top-k", "2", "--skip-existing"
    )
    assert result.exit_code == EXIT_OK, result.output
    resumed = rows(again / "m.jsonl")
    assert [row["status"] for row in resumed] == ["skipped", "skipped"]
    assert all(row["volume"] is not None and row["fingerprint"] is not None for row in resumed)
    assert {path: path.stat().st_mtime_ns for path in again.glob("head_*")} == before


@pytest.mark.slow
def test_a_bundle_explains_the_scan_in_its_own_axis_order(scan, tmp_path: Path):
    pytest.importorskip("monai")
    pytest.importorskip("nnunetv2", reason="the reference stitches with nnU-Net's own windows and Gaussian")
    folder, network = save_bundle(tmp_path)
    out = tmp_path / "out"
    result = run(
        scan, "--model", f"bundle:{folder}", "--layer", BUNDLE_BOTTLENECK, "-o", out, "--target-class", "spleen"
    )
    assert result.exit_code == EXIT_OK, result.output
    written = np.asarray(nibabel.load(out / "head_gradcam_1-spleen.nii.gz").dataobj)
    spec = load_model(f"bundle:{folder}").profile.volume
    x = spec.normalise(torch.from_numpy(np.asarray(nibabel.load(scan).dataobj, dtype=np.float32))[None])
    reference = reference_stitched(network, network.get_submodule(BUNDLE_BOTTLENECK), x, 1, spec.patch, spec.step)
    assert written.shape == SHAPE and pearson(torch.from_numpy(written), reference) >= 0.999


def test_a_folder_of_scans_and_npy_volumes(nnunet, scan, tmp_path: Path):
    folder = tmp_path / "in"
    (folder / "sub").mkdir(parents=True)
    (folder / "head.nii.gz").write_bytes(scan.read_bytes())
    np.save(folder / "sub" / "cube.npy", volume((16, 17, 18)).numpy() * 300)
    (folder / "notes.png").write_bytes(b"")  # an image in the folder: left out for a volume model
    np.save(folder / "flat.npy", np.zeros((4, 4)))  # not a scan: its error row, the others explained
    out = tmp_path / "out"
    options = ["-t", "liver", "--window-level", "40,400", "--report", "--manifest", out / "m.jsonl"]
    result = run(folder, "-m", nnunet[0], "-o", out, *options)
    assert result.exit_code == EXIT_IMAGE_FAILED, result.output
    found = [(Path(r["input"]).name, r["status"]) for r in rows(out / "m.jsonl")]
    assert found == [("flat.npy", "error"), ("head.nii.gz", "ok"), ("cube.npy", "ok")]
    assert "flat.npy: a scan has 3 axes" in result.stderr
    assert "% of the voxels) -> " in result.stdout
    gallery = (out / "index.html").read_text()  # each scan shown by its montage's thumbnail, linking its NIfTI
    assert (out / "_thumbs" / "sub" / "cube_gradcam_1-liver.nii.jpg").is_file()
    assert "cube_gradcam_1-liver.nii.gz" in gallery
    # the card's sliders: a square per slice of each plane, all 18 axial slices of the cube (its third axis runs
    # along S), its 17 coronal and 16 sagittal ones, each from the slice through the map's peak
    peak = next(r["volume"]["peak"] for r in rows(out / "m.jsonl") if Path(r["input"]).name == "cube.npy")
    for axis, plane, count in ((2, "axial", 18), (1, "coronal", 17), (0, "sagittal", 16)):
        strip = f"_thumbs/sub/cube_gradcam_1-liver.nii_{plane}_slices.jpg"
        with Image.open(out / strip) as image:
            assert image.size == (192, count * 192)
        assert f'{{"plane":"{plane}","src":"{strip}","count":{count},"start":{peak[axis]}}}' in gallery
    cube = nibabel.load(out / "sub" / "cube_gradcam_1-liver.nii.gz")
    assert cube.shape == (16, 17, 18) and np.allclose(cube.affine, np.eye(4))
    # the window the montages drew each scan in (--window-level 40,400), which gradcam serve draws its slices in
    windows = [r["volume"]["intensity_window"] for r in rows(out / "m.jsonl") if r["status"] == "ok"]
    assert windows == [[-160.0, 240.0]] * 2
    _served_scan(out, 2, {"axial": 18, "coronal": 17, "sagittal": 16})


def _served_scan(out: Path, row: int, counts: dict[str, int]) -> None:
    """``gradcam serve out/``: row ``row``'s scan (read where the manifest names it) with its planes' slices."""
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from gradcam_cli.serve import create_app

    app = create_app(None, run_dir=out, manifest=out / "m.jsonl", work_dir=out.parent / "serve")
    with TestClient(app, base_url="http://127.0.0.1:8765") as client:
        facts = client.get(f"/api/run/rows/{row}/scan").json()
        assert facts["missing"] == "" and {p["plane"]: p["count"] for p in facts["planes"]} == counts
        assert [c["name"] for c in facts["classes"]] == ["liver"]
        last = client.get(f"/api/run/rows/{row}/scan/axial/{counts['axial'] - 1}.png")
        assert last.status_code == 200 and last.content.startswith(b"\x89PNG")


@pytest.mark.quick
@pytest.mark.parametrize(
    ("option", "refused"),
    [
        (["--panel"], "--panel"),
        (["--every", "2"], "--every"),
        (["--every", "1"], "--every"),  # given, though it is the frames' default: refused as any other value
        (["--format", "auto"], "--format"),
        (["--engine", "ray"], "--engine ray"),
    ],
)
def test_options_that_do_not_apply_are_refused_before_the_model_loads(scan, tmp_path: Path, option, refused):
    result = run(scan, "--model", f"nnunet:{tmp_path / 'missing'}", "-o", tmp_path / "out", *option)
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.strip() == f"error: {refused} does not apply to scans ({scan}); run the scans without it"


@pytest.mark.quick
def test_scans_and_images_go_to_their_own_models(nnunet, scan, tmp_path: Path):
    from PIL import Image

    photo = tmp_path / "photo.png"
    Image.new("RGB", (32, 32), "red").save(photo)
    result = run(scan, "--model", f"{Path(__file__).parents[1] / 'square_model.py'}:build", "-o", tmp_path / "a")
    assert result.exit_code == EXIT_USAGE and "is a scan" in result.stderr and "nnunet:DIR" in result.stderr
    result = run(photo, "--model", nnunet[0], "-o", tmp_path / "b")
    assert result.exit_code == EXIT_USAGE and "takes scans" in result.stderr
    result = run(photo, "--window-level", "40,400", "-o", tmp_path / "c")
    assert result.exit_code == EXIT_USAGE and result.stderr.startswith("error: --window-level is for scans")


@pytest.mark.quick
def test_a_volume_model_of_a_task_that_explains_no_scans_is_refused(nnunet, scan, tmp_path: Path):
    """The task adapter says whether its scans are explained (``TaskAdapter.scans``): a detector's are not."""
    result = run(scan, "--model", nnunet[0], "--task", "detect", "-o", tmp_path / "out")
    assert result.exit_code == EXIT_USAGE
    expected = f"error: {nnunet[0]} is a volume detector: only segmenters' and classifiers' scans are explained"
    assert result.stderr.strip() == expected


def test_the_session_explains_scans_with_a_bar_of_windows(nnunet, scan, tmp_path: Path):
    """The library's path (docs/internals.md): ``Session.explain(..., scans=...)``, one tick per window of each pass
    (the classes counted first, then explained: 3 x 2 x 2 windows of 16 voxels each time)."""
    from gradcam_cli.io.discovery import discover_inputs
    from gradcam_cli.options import OutputOptions
    from gradcam_cli.pipeline.session import Session

    bars: list[tuple[str, int]] = []
    ticks: list[bool] = []

    class Recording:
        def __init__(self, label: str, total: int) -> None:
            bars.append((label, total))

        def __enter__(self):
            return lambda skipped=False: ticks.append(skipped)

        def __exit__(self, *exc_info: object) -> None:
            pass

    _, _, scans = discover_inputs([scan])
    explainer = Explainer(load_model(nnunet[0]), methods=["gradcam"])
    with Session(OutputOptions(tmp_path / "out")) as session:
        records = list(session.explain(explainer, [], scans=scans, progress=Recording))
    assert [r.status for r in records] == ["ok"] and records[0].volume.windows == 12
    assert bars == [("head.nii.gz: windows", 24)] and ticks == [False] * 24


@pytest.mark.quick
def test_diff_says_a_scans_map_moved_along_its_first_axis(tmp_path: Path):
    from gradcam_cli.drift.fingerprint import map_fingerprint

    near, far = torch.zeros(16, 8, 8), torch.zeros(16, 8, 8)
    near[2:4], far[12:14] = 1.0, 1.0  # the same (y, z) pattern, on slices at either end
    for name, values in (("a", near), ("b", far)):
        row = {"input": "ct.nii.gz", "status": "ok", "error": None, "outputs": [], "method": "gradcam"}
        row |= {"target": {"index": 1, "name": "liver", "probability": 0.3}, "predictions": []}
        row |= {"fingerprint": map_fingerprint(values), "volume": {"grid": [16, 8, 8], "peak": [2, 0, 0]}}
        (tmp_path / f"{name}.jsonl").write_text(json.dumps(row) + "\n")
    report = diff_runs(tmp_path / "a.jsonl", tmp_path / "b.jsonl")
    assert report.drift and report.results[0].pearson == pytest.approx(1.0)
    assert report.results[0].reasons[0].startswith("along the first voxel axis: pearson")
