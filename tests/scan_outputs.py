"""A volume model's run outputs made without a model, for the gallery's and ``gradcam serve``'s tests of scans: a
CT-like scan (tests/volume_models.py's, outside the run folder as inputs are), two classes' maps of it written as the
run writes them (NIfTI on the scan's affine, the montage, with ``--report`` the thumbnail and the planes' strips:
:mod:`gradcam_cli.pipeline.volumes`'s own writers), and their rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from volume_models import CT_AFFINE, CT_SHAPE, save_ct_scan

from gradcam_cli.cam.records import Record, VolumeInfo
from gradcam_cli.cam.results import Prediction
from gradcam_cli.io.volumes import peak, read_volume, write_nifti
from gradcam_cli.render.colour import colormap_table
from gradcam_cli.render.gallery import save_scan_card
from gradcam_cli.render.montage import Window, montage, strips, write_montage

HOT = {1: (4, 6, 20), 2: (13, 15, 5)}
"""Each class's map's peak voxel: far apart on every axis."""
WINDOW = Window(-250.0, 650.0)
"""The intensity window the run drew the scan in."""


def hot_map(centre: tuple[int, int, int]) -> np.ndarray:
    """A map in [0, 1] on the scan's grid: a Gaussian blob peaking (1.0) on ``centre``."""
    grid = np.stack(np.meshgrid(*[np.arange(side) for side in CT_SHAPE], indexing="ij"))
    distance = ((grid - np.array(centre).reshape(3, 1, 1, 1)) ** 2).sum(0)
    return np.exp(-distance / 6.0).astype(np.float32)


def scan_run(out: Path, report: bool = False) -> tuple[Path, list[Record]]:
    """The scan, and the rows of its two classes' (``bright`` and ``dark``) Grad-CAM maps, written under ``out``."""
    (out.parent / "scans").mkdir(parents=True, exist_ok=True)
    scan = save_ct_scan(out.parent / "scans" / "head.nii.gz")
    data = read_volume([scan]).data[0]
    table = colormap_table("jet")
    records = []
    for index, name in ((1, "bright"), (2, "dark")):
        values = hot_map(HOT[index])
        nifti = out / f"head_gradcam_{index}-{name}.nii.gz"
        shown = out / f"head_gradcam_{index}-{name}_montage.png"
        nifti.parent.mkdir(parents=True, exist_ok=True)
        write_nifti(nifti, values, CT_AFFINE)
        voxel, mm = peak(values, CT_AFFINE)
        image = montage(data, values, CT_AFFINE, voxel, table, 0.5, WINDOW)
        write_montage(shown, image)
        if report:
            save_scan_card(image, strips(data, values, CT_AFFINE, table, 0.5, WINDOW), nifti, out, [])
        target = Prediction(index, name, 0.1, share=0.1)
        spacing = tuple(float(s) for s in np.linalg.norm(CT_AFFINE[:3, :3], axis=0))
        info = VolumeInfo(CT_SHAPE, spacing, voxel, mm, 4, (WINDOW.low, WINDOW.high))
        outputs = [str(nifti), str(shown)]
        records.append(Record(str(scan), "ok", "tiny", "bottleneck", "gradcam", target, [target], outputs, volume=info))
    return scan, records


def expected_slice(scan: Path, index: int, plane: str, voxel: tuple[int, ...]) -> torch.Tensor:
    """Class ``index``'s map over the scan in ``plane`` through ``voxel``, as the montage draws that plane."""
    from gradcam_cli.render.montage import plane_view

    data = read_volume([scan]).data[0]
    return plane_view(data, hot_map(HOT[index]), CT_AFFINE, voxel, plane, colormap_table("jet"), 0.5, WINDOW)[1]
