"""Reading scans: NIfTI (``.nii``, ``.nii.gz``), DICOM series folders and ``.npy`` volumes, as a :class:`Volume`.

A scan keeps its own voxel grid, spacing and affine (voxel index to RAS millimetres); nothing here resamples. nibabel
and pydicom are imported only when a scan of theirs is read (the ``medical`` extra), with a one-line error if missing.
Channels are several files of one grid: named together, or by nnU-Net's rule ``CASE_0000.nii.gz``,
``CASE_0001.nii.gz``... (four digits, from 0000, no gaps), grouped into one input by :func:`group_channels`.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from ..errors import GradcamError, UsageError

VOLUME_SUFFIXES = (".nii.gz", ".nii", ".npy")
DICOM_SUFFIX = ".dcm"
NIFTI_OFFSET = 352
"""Where a single-file NIfTI-1's voxels start: its 348-byte header and 4 bytes saying no extensions follow."""
_CHANNEL = re.compile(r"^(?P<case>.+)_(?P<index>\d{4})(?P<suffix>\.nii\.gz|\.nii|\.npy)$", re.IGNORECASE)
_LPS_TO_RAS = np.diag([-1.0, -1.0, 1.0, 1.0])


@dataclass(frozen=True, eq=False)
class Volume:
    """A scan as read: ``data`` (C, I, J, K) float32, one entry per channel on the scan's own voxel grid;
    ``affine``: the 4 x 4 matrix from voxel index (i, j, k, 1) to RAS millimetres; ``sources``: the files (or the
    DICOM folder) it came from, one per channel."""

    data: np.ndarray[Any, np.dtype[np.float32]]
    affine: np.ndarray[Any, np.dtype[np.float64]]
    sources: tuple[Path, ...]

    @property
    def grid(self) -> tuple[int, int, int]:
        """The voxel grid's shape (I, J, K)."""
        i, j, k = self.data.shape[1:]
        return int(i), int(j), int(k)

    @property
    def channels(self) -> int:
        return int(self.data.shape[0])

    @property
    def spacing(self) -> tuple[float, float, float]:
        """Millimetres between voxel centres along each voxel axis (the lengths of the affine's columns)."""
        a, b, c = np.linalg.norm(self.affine[:3, :3], axis=0)
        return float(a), float(b), float(c)

    def world(self, voxel: Sequence[float]) -> tuple[float, float, float]:
        """A voxel index's RAS position in millimetres."""
        x, y, z = (self.affine @ np.array([*voxel, 1.0]))[:3]
        return float(x), float(y), float(z)


def is_volume_path(path: Path) -> bool:
    """A NIfTI or ``.npy`` file by its suffix, or a folder holding DICOM (``.dcm``) files."""
    if path.is_dir():  # by the names and the entries' types, without a stat per file (a folder of a million photos)
        with os.scandir(path) as entries:
            return any(entry.name.lower().endswith(DICOM_SUFFIX) and entry.is_file() for entry in entries)
    return path.name.lower().endswith(VOLUME_SUFFIXES)


def volume_stem(path: Path) -> str:
    """The name a scan's outputs are named after: its file name without ``.nii.gz``, ``.nii`` or ``.npy``."""
    lower = path.name.lower()
    for suffix in VOLUME_SUFFIXES:
        if lower.endswith(suffix):
            return path.name[: -len(suffix)]
    return path.name


def group_channels(paths: Sequence[Path]) -> list[tuple[Path, ...]]:
    """Scans in input order, files named by nnU-Net's rule grouped into one multi-channel input (in channel order).

    ``case_0000.nii.gz`` and ``case_0001.nii.gz`` in one folder are one scan of two channels; a group whose numbers
    do not run 0000, 0001... without a gap is a usage error naming the case. Other files stay single-channel."""
    groups: dict[tuple[Path, str], list[tuple[int, Path]]] = {}
    order: list[tuple[Path, str] | Path] = []
    for path in paths:
        match = _CHANNEL.match(path.name)
        if match is None or path.is_dir():
            order.append(path)
            continue
        key = (path.parent, match["case"])
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append((int(match["index"]), path))
    result: list[tuple[Path, ...]] = []
    for entry in order:
        if isinstance(entry, Path):
            result.append((entry,))
            continue
        members = sorted(groups[entry])
        if [index for index, _ in members] != list(range(len(members))):
            numbers = ", ".join(f"{index:04d}" for index, _ in members)
            raise UsageError(f"{entry[0] / entry[1]}: channels {numbers} do not run 0000, 0001... without a gap")
        result.append(tuple(path for _, path in members))
    return result


def read_volume(paths: Sequence[Path]) -> Volume:
    """One scan from one file or folder, or several channel files of one grid (same shape and affine)."""
    if not paths:
        raise UsageError("no scan to read")
    parts = [_read_one(Path(path)) for path in paths]
    first_data, first_affine = parts[0]
    for path, (data, affine) in zip(paths[1:], parts[1:], strict=True):
        if data.shape[1:] != first_data.shape[1:] or not np.allclose(affine, first_affine, atol=1e-4):
            raise UsageError(
                f"channel {path} is not on the grid of {paths[0]} ({_shape(data)} vs {_shape(first_data)}, or "
                "another affine); resample it first (gradcam never resamples a scan)"
            )
    arrays = [data for data, _ in parts]  # float32 already; one file's data is not copied
    data = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
    return Volume(data, first_affine, tuple(Path(p) for p in paths))


def channel_files(paths: Sequence[Path], option: str = "--channels") -> int:
    """How many channels the scan of the channel files ``paths`` (``--channels a.nii.gz,b.nii.gz``) has, read from
    their headers alone (a NIfTI's header, a ``.npy``'s, a DICOM series counts one): a usage error in one line,
    beginning with ``option``, for a file that is not a scan or does not exist, or one that is not on the first
    file's grid (shape and affine)."""
    first: tuple[Path, tuple[int, ...], np.ndarray[Any, Any]] | None = None
    channels = 0
    for path in paths:
        if not path.exists():
            raise UsageError(f"{option}: {path} does not exist")
        if not is_volume_path(path):
            raise UsageError(f"{option}: {path} is not a scan (.nii, .nii.gz, .npy or a DICOM folder)")
        grid, affine = read_header(path)
        channels += grid[0]
        if first is None:
            first = (path, grid[1:], affine)
        elif grid[1:] != first[1] or not np.allclose(affine, first[2], atol=1e-4):
            shapes = "x".join(map(str, grid[1:])), "x".join(map(str, first[1]))
            differs = f"{shapes[0]} vs {shapes[1]}" if grid[1:] != first[1] else "another affine"
            raise UsageError(
                f"{option}: {path} is not on the grid of {first[0]} ({differs}); resample it first (gradcam never "
                "resamples a scan)"
            )
    return channels


def read_region(path: Path, scan: Volume) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """The region mask at ``path`` (``--target region:MASK``) for ``scan``: its non-zero voxels, (I, J, K) bool; a
    usage error in one line where it is not one channel on the scan's grid (shape and affine) or has no voxel."""
    region: np.ndarray[Any, np.dtype[np.bool_]] = np.asarray(read_labels(path, scan) != 0)
    if not region.any():
        raise UsageError(f"region mask {path} has no voxel (every voxel is 0)")
    return region


def read_labels(
    path: Path, scan: Volume, what: str = "region mask", error: type[GradcamError] = UsageError
) -> np.ndarray[Any, Any]:
    """The mask at ``path`` for ``scan``: its (I, J, K) values; ``error`` in one line, naming it as ``what``, where
    it is not one channel on the scan's grid (shape and affine)."""
    mask = read_volume([path])
    if mask.channels != 1 or mask.grid != scan.grid or not np.allclose(mask.affine, scan.affine, atol=1e-4):
        shapes = _shape(mask.data), _shape(scan.data)
        differs = f"{shapes[0]} vs {shapes[1]}" if mask.data.shape[1:] != scan.data.shape[1:] else "another affine"
        differs = f"{mask.channels} channels" if mask.channels != 1 else differs
        source = scan.sources[0] if scan.sources else "the scan"
        raise error(f"{what} {path} is not on the grid of {source} ({differs}); give a mask of the scan")
    labels: np.ndarray[Any, Any] = mask.data[0]
    return labels


def read_header(path: Path) -> tuple[tuple[int, ...], np.ndarray[Any, Any]]:
    """A scan file's (C, I, J, K) and affine from its header (a DICOM folder: read whole); a file that cannot be
    read is a :class:`~gradcam_cli.errors.UsageError`."""
    name = path.name.lower()
    affine: np.ndarray[Any, Any] = np.eye(4)
    if path.is_dir() or not name.endswith((".nii", ".nii.gz", ".npy")):
        data, affine = _read_one(path)
        return tuple(int(side) for side in data.shape), affine
    if name.endswith(".npy"):
        try:
            shape = np.load(path, mmap_mode="r", allow_pickle=False).shape
        except (OSError, ValueError) as error:
            raise UsageError(f"{path}: cannot read as a .npy volume ({error})") from None
    else:
        nibabel = _extra("nibabel")
        try:
            image = nibabel.load(str(path))
        except Exception as error:  # nibabel raises many kinds for a damaged file
            raise UsageError(f"{path}: cannot read as NIfTI ({type(error).__name__}: {error})") from None
        shape, affine = tuple(image.shape), np.asarray(image.affine, dtype=np.float64)
        if len(shape) == 5 and shape[3] == 1:  # time as the 4th axis, vector components as the 5th: _read_nifti's
            shape = (*shape[:3], shape[4])
    if len(shape) == 3:
        return (1, *map(int, shape)), affine
    if len(shape) != 4:
        raise UsageError(f"{path}: a scan has 3 axes (or 4 with channels), not {len(shape)} ({shape})")
    channels_first = name.endswith(".npy")
    c, *grid = shape if channels_first else (shape[3], *shape[:3])
    return (int(c), *map(int, grid)), affine


def _shape(data: np.ndarray[Any, Any]) -> str:
    return "x".join(map(str, data.shape[1:]))


Read = tuple[np.ndarray[Any, np.dtype[np.float32]], np.ndarray[Any, np.dtype[np.float64]]]


def _read_one(path: Path) -> Read:
    if path.is_dir():
        return _read_dicom(path)
    name = path.name.lower()
    if name.endswith(".npy"):
        return _read_npy(path)
    if name.endswith((".nii", ".nii.gz")):
        return _read_nifti(path)
    raise UsageError(f"{path}: not a scan (.nii, .nii.gz, .npy or a DICOM folder)")


def _channels_first(path: Path, data: np.ndarray[Any, Any], last: bool) -> np.ndarray[Any, np.dtype[np.float32]]:
    """3-D data as one channel; 4-D data's channel axis (NIfTI's 4th, a .npy's 1st) first; anything else refused."""
    if data.ndim == 3:
        data = data[None]
    elif data.ndim == 4 and last:
        data = np.moveaxis(data, -1, 0)
    elif data.ndim != 4:
        raise UsageError(f"{path}: a scan has 3 axes (or 4 with channels), not {data.ndim} ({data.shape})")
    return np.ascontiguousarray(data, dtype=np.float32)


def _read_npy(path: Path) -> Read:
    """A .npy scan: (I, J, K) or (C, I, J, K); it has no affine, so voxels are 1 mm cubes at the origin."""
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise UsageError(f"{path}: cannot read as a .npy volume ({error})") from None
    if not np.issubdtype(data.dtype, np.number):
        raise UsageError(f"{path}: a .npy volume holds numbers, not {data.dtype}")
    return _channels_first(path, data, last=False), np.eye(4)


def _extra(module: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UsageError(f"reading scans needs {module}: pip install 'gradcam-cli[medical]'") from None


def _read_nifti(path: Path) -> Read:
    nibabel = _extra("nibabel")
    try:
        image = nibabel.load(str(path))
        data = np.asanyarray(image.dataobj, dtype=np.float32)
    except Exception as error:  # nibabel raises many kinds for a damaged file
        raise UsageError(f"{path}: cannot read as NIfTI ({type(error).__name__}: {error})") from None
    if data.ndim == 5 and data.shape[3] == 1:  # NIfTI keeps time as the 4th axis, vector components as the 5th
        data = data[:, :, :, 0]
    return _channels_first(path, data, last=True), np.asarray(image.affine, dtype=np.float64)


def _read_dicom(folder: Path) -> Read:
    """A DICOM series: its slices sorted by position along the slice normal (not by file name), rescaled to stored
    units (RescaleSlope, RescaleIntercept), with the affine from ImagePositionPatient, ImageOrientationPatient and
    PixelSpacing (DICOM's LPS turned into RAS). Uneven slice gaps are refused, not resampled."""
    pydicom = _extra("pydicom")
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() == DICOM_SUFFIX)
    try:
        slices = [pydicom.dcmread(str(p)) for p in files]
        orientation = np.array(slices[0].ImageOrientationPatient, dtype=np.float64)
        row, column = orientation[:3], orientation[3:]
        normal = np.cross(row, column)
        slices.sort(key=lambda s: float(np.dot(normal, np.array(s.ImagePositionPatient, dtype=np.float64))))
        positions = np.array([s.ImagePositionPatient for s in slices], dtype=np.float64)
        pixels = np.stack([_rescaled(s) for s in slices])
        spacing = [float(v) for v in slices[0].PixelSpacing]
    except (AttributeError, IndexError, ValueError, OSError) as error:
        raise UsageError(f"{folder}: not a readable DICOM series ({type(error).__name__}: {error})") from None
    gaps = np.diff(positions @ normal)
    if len(gaps) and (np.any(gaps <= 0) or np.ptp(gaps) > 1e-3 * max(float(np.mean(gaps)), 1e-6)):
        raise UsageError(f"{folder}: slices are not evenly spaced (or repeat a position); gradcam never resamples")
    step = (
        positions[1] - positions[0] if len(positions) > 1 else normal * float(getattr(slices[0], "SliceThickness", 1))
    )
    lps = np.eye(4)
    lps[:3, 0] = step  # data[k, r, c]: slice, row (along the column direction), column (along the row direction)
    lps[:3, 1] = column * spacing[0]
    lps[:3, 2] = row * spacing[1]
    lps[:3, 3] = positions[0]
    return _channels_first(folder, pixels, last=False), _LPS_TO_RAS @ lps


def _rescaled(dataset: Any) -> np.ndarray[Any, np.dtype[np.float32]]:
    slope = float(getattr(dataset, "RescaleSlope", 1.0))
    intercept = float(getattr(dataset, "RescaleIntercept", 0.0))
    return np.asarray(dataset.pixel_array, dtype=np.float32) * slope + intercept


def spacing_note(volume: Volume, expected: Sequence[float] | None) -> str | None:
    """One line when the model was trained at another voxel spacing than the scan's (``expected`` in the scan's
    axis order, millimetres), or None; the scan is never resampled, so the map is on the scan's own grid."""
    if expected is None or np.allclose(volume.spacing, tuple(expected), rtol=1e-3, atol=1e-4):
        return None
    have = " x ".join(f"{v:g}" for v in volume.spacing)
    want = " x ".join(f"{float(v):g}" for v in expected)
    sources = volume.sources[0] if volume.sources else "scan"
    return f"{sources}: spacing {have} mm, the model expects {want} mm; not resampled"


def write_nifti(path: Path, values: np.ndarray[Any, Any], affine: np.ndarray[Any, Any]) -> None:
    """A map on a scan's grid as NIfTI float32 (gzipped for ``.nii.gz``, as ``gzip.compress`` at level 9) with the
    scan's affine, written atomically (:func:`~gradcam_cli.io.atomic.write_atomic`): ``path`` only ever names the
    whole file. The file's bytes are nibabel's ``to_bytes()``'s, made without its copies of the map: a ``.nii.gz``'s
    compressed one slice at a time (only the compressed file is held), a ``.nii``'s one copy of the map."""
    from .atomic import write_atomic

    nibabel = _extra("nibabel")
    data = np.asarray(values, dtype=np.float32)  # a view of a float32 map, transposed or not
    image = nibabel.Nifti1Image(data, np.asarray(affine, dtype=np.float64))
    image.header.set_data_dtype(np.float32)
    image.update_header()
    header = image.header.copy()
    header.set_data_offset(NIFTI_OFFSET)
    header.set_slope_inter(1.0, 0.0)  # as nibabel writes float32 unscaled
    head = header.binaryblock + bytes(NIFTI_OFFSET - len(header.binaryblock))  # no extensions
    if path.name.lower().endswith(".gz"):
        import zlib

        compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # a gzip stream, mtime 0
        parts = [compressor.compress(head)]
        parts += [compressor.compress(data[..., k].tobytes(order="F")) for k in range(data.shape[-1])]
        write_atomic(path, b"".join([*parts, compressor.flush()]))
        return
    whole = bytearray(NIFTI_OFFSET + data.nbytes)
    whole[:NIFTI_OFFSET] = head
    np.frombuffer(whole, np.float32, offset=NIFTI_OFFSET).reshape(data.shape, order="F")[...] = data
    write_atomic(path, whole)


def _first_highest(values: np.ndarray[Any, Any]) -> tuple[int, ...]:
    """The index of ``values``' highest element, the first in C order on ties (``np.argmax``'s), one slice of the
    first axis at a time."""
    top = values.max()
    if values.ndim > 1 and not np.isnan(top):
        for first, plane in enumerate(values):
            hits = plane == top
            if hits.any():
                rest = np.unravel_index(int(np.argmax(hits)), hits.shape)
                return (first, *(int(i) for i in rest))
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(values)), values.shape))


def peak(values: np.ndarray[Any, Any], affine: np.ndarray[Any, Any]) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """A map's highest voxel (the first in C order on ties) and its RAS position in millimetres, for a row; ``values``
    may be a transposed view of a map in another axis order, read without a copy (``np.argmax`` would make one)."""
    voxel = _first_highest(values)
    world = (np.asarray(affine, dtype=np.float64) @ np.array([*voxel, 1.0]))[:3]
    return voxel, tuple(float(v) for v in world)
