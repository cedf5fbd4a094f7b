"""The montage of three planes (render/montage.py): the same anatomy is drawn the same whatever the order and the
direction of the scan's voxel axes (the affine says where each voxel is), superior up and the patient's right on the
left, the peak marked."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradcam_cli.render.colour import colormap_table
from gradcam_cli.render.montage import LABEL_HEIGHT, Window, montage, plane_axes, planes, strips

SHAPE = (6, 8, 10)


def scene() -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int, int]]:
    """A RAS-ordered scan (x right, y anterior, z superior; 2 x 3 x 4 mm voxels), a map and its peak voxel."""
    generator = np.random.default_rng(0)
    scan = generator.normal(size=SHAPE).astype(np.float32)
    values = generator.uniform(size=SHAPE).astype(np.float32) * 0.5
    peak = (1, 5, 7)
    values[peak] = 1.0
    affine = np.diag([2.0, 3.0, 4.0, 1.0])
    affine[:3, 3] = (-5.0, 7.0, 11.0)
    return scan, values, affine, peak


def drawn(scan, values, affine, voxel) -> torch.Tensor:
    """The montage below its labels (which name the voxel's indices, not the same in each storage)."""
    return montage(scan, values, affine, voxel, colormap_table("jet"), 0.5, Window(-2.0, 2.0))[LABEL_HEIGHT:]


@pytest.mark.quick
def test_the_planes_do_not_depend_on_the_voxel_axes_order_or_direction() -> None:
    scan, values, affine, peak = scene()
    expected = drawn(scan, values, affine, peak)
    # the x axis stored the other way round (as LPS-ordered files store it): same anatomy
    flipped = affine.copy()
    flipped[:3, 0] *= -1
    flipped[:3, 3] = affine[:3, :3] @ np.array([SHAPE[0] - 1, 0, 0]) + affine[:3, 3]
    voxel = (SHAPE[0] - 1 - peak[0], peak[1], peak[2])
    torch.testing.assert_close(drawn(scan[::-1], values[::-1], flipped, voxel), expected)
    # the axes stored as (z, y, x), as a DICOM series is read: same anatomy
    reversed_affine = affine[:, [2, 1, 0, 3]]
    turned = drawn(scan.transpose(2, 1, 0), values.transpose(2, 1, 0), reversed_affine, peak[::-1])
    torch.testing.assert_close(turned, expected)
    assert plane_axes(reversed_affine) == (2, 1, 0) and plane_axes(affine) == (0, 1, 2)


@pytest.mark.quick
def test_superior_is_up_and_the_patients_right_on_the_left() -> None:
    scan = np.zeros(SHAPE, dtype=np.float32)
    scan[-1, :, -1] = 2.0  # the right (+x), superior (+z) edge: white; the cross at its inferior, posterior end
    values = np.zeros(SHAPE, dtype=np.float32)
    shown = planes(scan, values, np.diag([2.0, 3.0, 4.0, 1.0]), (SHAPE[0] - 1, 0, 0), colormap_table("jet"))
    (axial, first), (coronal, second), (sagittal, third) = shown
    assert (axial, coronal, sagittal) == ("axial k=0", "coronal j=0", "sagittal i=5")
    for panel, up, left in ((first, False, True), (second, True, True), (third, True, None)):
        grey = panel.float().mean(dim=2)
        rows, columns = torch.nonzero(grey > grey.median() + 20, as_tuple=True)  # the white edge and the cross
        if up is not None:
            assert (rows.float().mean() < panel.shape[0] / 4) == up  # superior at the top (axial: anterior)
        if left is not None:
            assert (columns.float().mean() < panel.shape[1] / 4) == left  # the patient's right on the left


@pytest.mark.quick
def test_the_window_is_given_or_the_models_clipping_range_or_the_scans_percentiles() -> None:
    from gradcam_cli.io.volumes import Volume
    from gradcam_cli.models.volume_spec import Intensity, VolumeSpec
    from gradcam_cli.options import WindowLevel
    from gradcam_cli.pipeline.volumes import scan_window

    data = np.arange(1000, dtype=np.float32).reshape(1, 10, 10, 10)
    scan = Volume(data, np.eye(4), ())
    ct = VolumeSpec((4, 4, 4), (Intensity("ct", 80.0, 150.0, -900.0, 1200.0),))
    assert scan_window(ct, scan, WindowLevel.parse("40,400")) == Window(-160.0, 240.0)
    assert scan_window(ct, scan) == Window(-900.0, 1200.0)
    assert scan_window(VolumeSpec((4, 4, 4)), scan) == Window(4.995, 994.005)
    grey = Window(-160.0, 240.0).grey(torch.tensor([[-500.0, 40.0, 240.0]]))
    assert grey[0, :, 0].tolist() == [0, 128, 255]
    with pytest.raises(ValueError, match="LEVEL,WIDTH"):
        WindowLevel.parse("40")


@pytest.mark.quick
def test_the_galleries_strip_holds_each_axial_slice_inferior_first_whatever_the_storage() -> None:
    """One square per axial slice, from inferior to superior: a map hot on slice k only colours the strip's k-th
    square; stored upside down (z decreasing), the strip is the same."""
    scan = np.zeros(SHAPE, dtype=np.float32)
    values = np.zeros(SHAPE, dtype=np.float32)
    values[:, :, 3] = 1.0
    affine = np.diag([2.0, 3.0, 4.0, 1.0])
    strip = strips(scan, values, affine, colormap_table("jet"), 0.5, Window(-1.0, 1.0), side=32)["axial"]
    assert strip.shape == (SHAPE[2] * 32, 32, 3)
    squares = strip.reshape(SHAPE[2], 32, 32, 3).float()
    red = (squares[..., 0] - squares[..., 2]).flatten(1).amax(dim=1)  # jet: the map's 1 red, its 0 blue
    assert torch.nonzero(red > 50).flatten().tolist() == [3]
    upside_down = affine.copy()
    upside_down[2, 2] = -4.0
    again = strips(
        scan[:, :, ::-1], values[:, :, ::-1], upside_down, colormap_table("jet"), 0.5, Window(-1.0, 1.0), side=32
    )["axial"]
    torch.testing.assert_close(again, strip)
    fewer = strips(scan, values, affine, colormap_table("jet"), 0.5, Window(-1.0, 1.0), side=16, most=4)["axial"]
    assert fewer.shape == (4 * 16, 16, 3)


def _red_centre(pixels: torch.Tensor) -> tuple[float, float]:
    """Where jet's red (the map's 1) lies in (H, W, 3) pixels, as fractions of the height and width."""
    red = (pixels[..., 0].float() - pixels[..., 2].float()) > 50
    rows, columns = torch.nonzero(red, as_tuple=True)
    assert len(rows), "no red in the panel"
    return float(rows.float().mean() + 0.5) / pixels.shape[0], float(columns.float().mean() + 0.5) / pixels.shape[1]


@pytest.mark.quick
@pytest.mark.parametrize("plane", ["axial", "coronal", "sagittal"])
def test_each_planes_strip_is_drawn_as_the_montage_draws_that_plane_in_world_order(plane: str) -> None:
    """A map hot on one voxel colours one square of each plane's strip: the square of its slice counted along the
    world axis (the strip the same whatever the storage), the hot spot where the montage's panel of that plane has
    it."""
    from gradcam_cli.render.montage import plane_order, plane_view

    scan, _, affine, hot = scene()
    values = np.zeros(SHAPE, dtype=np.float32)
    values[hot] = 1.0
    table, window = colormap_table("jet"), Window(-2.0, 2.0)
    strip = strips(scan, values, affine, table, 0.5, window, side=64)[plane]
    axis, count, backwards = plane_order(SHAPE, affine, plane)
    assert not backwards and strip.shape == (count * 64, 64, 3)
    squares = strip.reshape(count, 64, 64, 3)
    coloured = [k for k in range(count) if ((squares[k, ..., 0].float() - squares[k, ..., 2].float()) > 50).any()]
    assert coloured == [hot[axis]]
    _, panel = plane_view(scan, values, affine, hot, plane, table, 0.5, window)
    square = squares[hot[axis]]
    content = torch.nonzero(square.float().sum(dim=2) > 0, as_tuple=True)  # the plane inside its black square
    top, left = int(content[0].min()), int(content[1].min())
    inner = square[top : int(content[0].max()) + 1, left : int(content[1].max()) + 1]
    np.testing.assert_allclose(_red_centre(inner), _red_centre(panel), atol=0.08)
    # the x axis stored the other way round: the same strips
    flipped = affine.copy()
    flipped[:3, 0] *= -1
    flipped[:3, 3] = affine[:3, :3] @ np.array([SHAPE[0] - 1, 0, 0]) + affine[:3, 3]
    again = strips(scan[::-1], values[::-1], flipped, table, 0.5, window, side=64)[plane]
    torch.testing.assert_close(again, strip)
