"""Scans in: NIfTI from nibabel's bundled test data (its affine as nibabel reads it), a DICOM series written here
with shuffled file names (sorted by position along the slice normal; the affine from the geometry it was written
with), ``.npy`` volumes, nnU-Net's channel naming and discovery of scans in folders."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from gradcam_cli.errors import UsageError
from gradcam_cli.io.discovery import InputKind, discover_volumes
from gradcam_cli.io.volumes import group_channels, read_volume

nibabel = pytest.importorskip("nibabel")
pydicom = pytest.importorskip("pydicom")
DATA = Path(pytest.importorskip("nibabel.testing").data_path)


@pytest.mark.quick
def test_nifti_keeps_grid_and_affine() -> None:
    volume = read_volume([DATA / "anatomical.nii"])
    image = nibabel.load(str(DATA / "anatomical.nii"))
    assert volume.data.shape == (1, 33, 41, 25) and volume.data.dtype == np.float32
    np.testing.assert_array_equal(volume.data[0], image.get_fdata(dtype=np.float32))
    np.testing.assert_array_equal(volume.affine, image.affine)
    assert volume.spacing == (2.0, 2.0, 2.0)
    assert volume.world((0, 0, 0)) == (32.0, -40.0, -16.0)
    assert volume.world((1, 2, 3)) == (30.0, -36.0, -10.0)


def test_nifti_4d_is_channels(tmp_path: Path) -> None:
    data = np.arange(2 * 3 * 4 * 2, dtype=np.float32).reshape(2, 3, 4, 2)
    nibabel.save(nibabel.Nifti1Image(data, np.diag([1.5, 2.0, 3.0, 1.0])), str(tmp_path / "two.nii.gz"))
    volume = read_volume([tmp_path / "two.nii.gz"])
    assert volume.channels == 2 and volume.grid == (2, 3, 4)
    np.testing.assert_array_equal(volume.data[1], data[..., 1])
    assert volume.spacing == (1.5, 2.0, 3.0)


def _write_series(folder: Path, pixels: np.ndarray, origin: np.ndarray, step: float) -> None:
    """One slice per file, file names in reverse order of position (a sort by name would flip the volume)."""
    from pydicom.dataset import FileDataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    folder.mkdir()
    for k, plane in enumerate(pixels):
        meta = FileMetaDataset()
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.2"
        meta.MediaStorageSOPInstanceUID = generate_uid()
        ds = FileDataset(str(folder / f"{len(pixels) - k:03d}.dcm"), {}, file_meta=meta, preamble=b"\0" * 128)
        ds.ImagePositionPatient = [float(v) for v in origin + np.array([0, 0, step * k])]
        ds.ImageOrientationPatient = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
        ds.PixelSpacing = [0.5, 0.75]  # between rows, between columns
        ds.Rows, ds.Columns = plane.shape
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.RescaleSlope, ds.RescaleIntercept = 1, -1024
        ds.PixelData = plane.astype(np.uint16).tobytes()
        ds.save_as(str(folder / f"{len(pixels) - k:03d}.dcm"), enforce_file_format=True)


@pytest.mark.quick
def test_dicom_series_sorted_by_position(tmp_path: Path) -> None:
    pixels = np.random.default_rng(0).integers(0, 3000, size=(5, 4, 6)).astype(np.uint16)
    origin = np.array([-10.0, 20.0, 30.0])
    _write_series(tmp_path / "ct", pixels, origin, step=2.5)
    volume = read_volume([tmp_path / "ct"])
    np.testing.assert_array_equal(volume.data[0], pixels.astype(np.float32) - 1024)
    # voxel (k, r, c) sits at LPS origin + c * 0.75 x + r * 0.5 y + k * 2.5 z; RAS negates x and y
    k, r, c = 3, 2, 5
    lps = origin + np.array([c * 0.75, r * 0.5, k * 2.5])
    np.testing.assert_allclose(volume.world((k, r, c)), [-lps[0], -lps[1], lps[2]])
    assert volume.spacing == pytest.approx((2.5, 0.5, 0.75))


def test_dicom_uneven_gaps_refused(tmp_path: Path) -> None:
    pixels = np.zeros((3, 2, 2), dtype=np.uint16)
    _write_series(tmp_path / "ct", pixels, np.zeros(3), step=1.0)
    last = pydicom.dcmread(str(tmp_path / "ct" / "001.dcm"))
    last.ImagePositionPatient = [0.0, 0.0, 5.0]
    last.save_as(str(tmp_path / "ct" / "001.dcm"))
    with pytest.raises(UsageError, match="not evenly spaced"):
        read_volume([tmp_path / "ct"])


def test_npy_and_channels(tmp_path: Path) -> None:
    a = np.random.default_rng(1).random((3, 4, 5))
    np.save(tmp_path / "case_0000.npy", a)
    np.save(tmp_path / "case_0001.npy", 2 * a)
    np.save(tmp_path / "other.npy", a[None])
    groups = group_channels([tmp_path / "case_0001.npy", tmp_path / "other.npy", tmp_path / "case_0000.npy"])
    assert groups == [(tmp_path / "case_0000.npy", tmp_path / "case_0001.npy"), (tmp_path / "other.npy",)]
    volume = read_volume(groups[0])
    assert volume.channels == 2 and volume.grid == (3, 4, 5)
    np.testing.assert_allclose(volume.data[1], 2 * a.astype(np.float32))
    np.testing.assert_array_equal(volume.affine, np.eye(4))
    np.save(tmp_path / "small.npy", a[:2])
    with pytest.raises(UsageError, match="not on the grid"):
        read_volume([tmp_path / "other.npy", tmp_path / "small.npy"])
    with pytest.raises(UsageError, match="without a gap"):
        group_channels([tmp_path / "case_0001.npy"])
    with pytest.raises(UsageError, match="3 axes"):
        np.save(tmp_path / "flat.npy", a[0])
        read_volume([tmp_path / "flat.npy"])


def test_discovery_finds_scans_beside_images(tmp_path: Path) -> None:
    root = tmp_path / "in"
    (root / "sub").mkdir(parents=True)
    (root / "photo.png").write_bytes(b"")
    np.save(root / "a_0000.npy", np.zeros((2, 2, 2)))
    np.save(root / "a_0001.npy", np.zeros((2, 2, 2)))
    os.symlink(DATA / "anatomical.nii", root / "sub" / "head.nii")
    _write_series(root / "sub" / "ct", np.zeros((2, 2, 2), dtype=np.uint16), np.zeros(3), step=1.0)
    scans = discover_volumes([root])
    assert [(s.output_stem.as_posix(), len(s.channels)) for s in scans] == [("a", 2), ("sub/ct", 0), ("sub/head", 0)]
    assert all(s.kind is InputKind.VOLUME for s in scans)
    explicit = discover_volumes([], channels=[root / "a_0000.npy", root / "a_0001.npy"])
    assert explicit[0].channels == (root / "a_0000.npy", root / "a_0001.npy")


def test_missing_extra_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "nibabel", None)
    with pytest.raises(UsageError, match=r"needs nibabel: pip install 'gradcam-cli\[medical\]'"):
        read_volume([DATA / "anatomical.nii"])


@pytest.mark.quick
def test_spacing_note_not_resampled() -> None:
    from gradcam_cli.io.volumes import spacing_note

    volume = read_volume([DATA / "anatomical.nii"])
    assert spacing_note(volume, None) is None and spacing_note(volume, (2.0, 2.0, 2.0)) is None
    note = spacing_note(volume, (1.0, 1.0, 2.0))
    assert note is not None and "\n" not in note and "spacing 2 x 2 x 2 mm" in note and "not resampled" in note
    assert volume.grid == (33, 41, 25)


@pytest.mark.quick
def test_map_written_as_nifti_on_the_scans_grid(tmp_path: Path) -> None:
    from gradcam_cli.io.volumes import write_nifti

    scan = read_volume([DATA / "anatomical.nii"])
    cam = np.random.default_rng(2).random(scan.grid)
    for name in ("map.nii", "map.nii.gz"):
        write_nifti(tmp_path / name, cam, scan.affine)
        back = nibabel.load(str(tmp_path / name))
        assert back.get_data_dtype() == np.float32 and back.shape == scan.grid
        np.testing.assert_array_equal(back.affine, scan.affine)
        np.testing.assert_array_equal(np.asanyarray(back.dataobj), cam.astype(np.float32))
    assert (tmp_path / "map.nii.gz").read_bytes()[:2] == b"\x1f\x8b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["map.nii", "map.nii.gz"]  # no temporary left


@pytest.mark.parametrize("name", ["map.nii", "map.nii.gz"])
def test_a_nifti_map_holds_nibabel_s_own_bytes_from_a_transposed_view(tmp_path: Path, name: str) -> None:
    """A map in the model's axis order is written through a transposed view, without nibabel's copies: the file's
    bytes (decompressed for ``.nii.gz``) are nibabel's ``to_bytes()`` of the same map."""
    import gzip

    from gradcam_cli.io.volumes import write_nifti

    scan = read_volume([DATA / "anatomical.nii"])
    model_order = np.random.default_rng(3).random(scan.grid[::-1]).astype(np.float32)
    for cam in (model_order.transpose(2, 1, 0), np.ascontiguousarray(model_order.transpose(2, 1, 0))):
        write_nifti(tmp_path / name, cam, scan.affine)
        written = (tmp_path / name).read_bytes()
        image = nibabel.Nifti1Image(np.ascontiguousarray(cam), scan.affine)
        image.header.set_data_dtype(np.float32)
        assert (gzip.decompress(written) if name.endswith(".gz") else written) == image.to_bytes()
        (tmp_path / name).unlink()


def test_the_peak_of_a_transposed_view_is_argmax_s_first_in_c_order() -> None:
    from gradcam_cli.io.volumes import peak

    rng = np.random.default_rng(4)
    for _ in range(20):
        model_order = rng.integers(0, 4, size=(5, 6, 7)).astype(np.float32)  # many ties
        cam = model_order.transpose(2, 1, 0)
        voxel, _ = peak(cam, np.eye(4))
        assert voxel == tuple(int(i) for i in np.unravel_index(np.argmax(np.ascontiguousarray(cam)), cam.shape))


def test_peak_in_voxels_and_millimetres() -> None:
    from gradcam_cli.io.volumes import peak

    scan = read_volume([DATA / "anatomical.nii"])
    cam = np.zeros(scan.grid, dtype=np.float32)
    cam[4, 7, 9] = 1.0
    cam[5, 0, 0] = 1.0  # a tie later in C order loses
    assert peak(cam, scan.affine) == ((4, 7, 9), (32.0 - 8.0, -40.0 + 14.0, -16.0 + 18.0))


@pytest.mark.quick
def test_simpleitk_arrays_are_a_dicom_series_as_read_and_a_niftis_axes_reversed(tmp_path: Path) -> None:
    """What ``VolumeSpec.axes`` relies on for nnU-Net models, which read scans through SimpleITK: its array of a
    DICOM series is the series as read here, (slice, row, column); of a NIfTI, nibabel's axes reversed."""
    sitk = pytest.importorskip("SimpleITK")
    from gradcam_cli.models.volume_spec import VolumeSpec

    pixels = np.random.default_rng(1).integers(0, 3000, size=(5, 4, 6)).astype(np.uint16)
    _write_series(tmp_path / "ct", pixels, np.array([-10.0, 20.0, 30.0]), step=2.5)
    reader = sitk.ImageSeriesReader()
    reader.SetFileNames(reader.GetGDCMSeriesFileNames(str(tmp_path / "ct")))
    series = read_volume([tmp_path / "ct"]).data[0]
    itk = VolumeSpec((4, 4, 4), itk=True)
    assert itk.axes(nifti=False) == (0, 1, 2)
    np.testing.assert_array_equal(sitk.GetArrayFromImage(reader.Execute()).astype(np.float32), series)
    head = read_volume([DATA / "anatomical.nii"]).data[0]
    assert itk.axes(nifti=True) == (2, 1, 0) and VolumeSpec((4, 4, 4)).axes(nifti=True) == (0, 1, 2)
    through_itk = sitk.GetArrayFromImage(sitk.ReadImage(str(DATA / "anatomical.nii"))).astype(np.float32)
    np.testing.assert_array_equal(through_itk, head.transpose(itk.axes(nifti=True)))
    assert VolumeSpec((4, 4, 4), itk=True, transpose=(1, 0, 2)).axes(nifti=True) == (1, 2, 0)
