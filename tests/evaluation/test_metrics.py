"""The metric functions on hand-made maps and curves whose answers are known in advance."""

from __future__ import annotations

import math

import pytest
import torch

from gradcam_cli.evaluation import metrics

pytestmark = pytest.mark.quick
BOX = (10.0, 10.0, 20.0, 20.0)  # pixels 10..19 in both directions


def map_with_peak(row: int, col: int, shape: tuple[int, int] = (64, 64)) -> torch.Tensor:
    saliency = torch.zeros(shape)
    saliency[row, col] = 1.0
    return saliency


# ------------------------------------------------------------------------------------------------ curves


def test_auc_of_known_curves() -> None:
    assert metrics.auc([0.7, 0.7, 0.7]) == pytest.approx(0.7)
    assert metrics.auc([0.0, 0.25, 0.5, 0.75, 1.0]) == pytest.approx(0.5)  # the diagonal
    assert metrics.auc([1.0, 0.0, 0.0, 0.0, 0.0]) == pytest.approx(0.125)  # a triangle over the first quarter
    assert metrics.auc([0.0, 1.0]) == pytest.approx(0.5)
    x = [k / 100 for k in range(101)]
    assert metrics.auc([v * v for v in x]) == pytest.approx(1 / 3, abs=1e-4)  # trapezoids converge to the integral


def test_auc_needs_two_points() -> None:
    with pytest.raises(ValueError):
        metrics.auc([0.5])


def test_step_counts_cover_zero_to_all_pixels() -> None:
    assert metrics.step_counts(100, 4) == [0, 25, 50, 75, 100]
    counts = metrics.step_counts(224 * 224, 224)
    assert counts[0] == 0 and counts[-1] == 224 * 224 and counts[1] == 224  # RISE: 224 pixels per step
    with pytest.raises(ValueError):
        metrics.step_counts(10, 0)


def test_importance_ranks_most_salient_first_ties_in_row_major_order() -> None:
    saliency = torch.tensor([[0.1, 0.9], [0.5, 0.9]])
    assert metrics.importance_ranks(saliency).tolist() == [[3, 0], [2, 1]]


# ------------------------------------------------------------------------------- drop and increase


def test_average_drop_and_increase_in_confidence() -> None:
    full = [0.5, 0.8, 0.4]
    masked = [0.25, 0.9, 0.0]
    # drops: 0.25/0.5 = 50 %, none (it rose), 100 %  -> mean 50 %; one of three rose
    assert metrics.average_drop(full, masked) == pytest.approx(50.0)
    assert metrics.increase_in_confidence(full, masked) == pytest.approx(100 / 3)
    assert metrics.average_drop([0.3], [0.3]) == 0.0
    assert metrics.increase_in_confidence([0.3], [0.3]) == 0.0  # equal is not an increase
    with pytest.raises(ValueError):
        metrics.average_drop([0.5], [])


# ---------------------------------------------------------------------------------------- pointing


def test_peak_is_the_first_maximum() -> None:
    saliency = torch.zeros(5, 7)
    saliency[3, 1] = saliency[4, 6] = 1.0
    assert metrics.peak(saliency) == (3, 1)


@pytest.mark.parametrize(
    ("row", "col", "hit"),
    [
        (15, 15, True),  # inside
        (15, 19, True),  # last pixel inside
        (15, 34, True),  # 15th pixel right of the box: centre 34.5 is 14.5 from x2 = 20
        (15, 35, False),  # 16th pixel: 15.5 away
        (15, 0, True),  # 10th pixel left of the box: centre 0.5 is 9.5 from x1 = 10
        (34, 15, True),  # below, same tolerance
        (35, 15, False),
        (30, 30, True),  # diagonal: hypot(10.5, 10.5) = 14.85
        (31, 31, False),  # hypot(11.5, 11.5) = 16.26
    ],
)
def test_pointing_game_tolerance_at_the_box_edge(row: int, col: int, hit: bool) -> None:
    assert metrics.pointing_hit(map_with_peak(row, col), [BOX]) is hit


def test_pointing_game_without_tolerance_and_with_several_boxes() -> None:
    assert metrics.pointing_hit(map_with_peak(15, 20), [BOX], tolerance=0) is False
    assert metrics.pointing_hit(map_with_peak(15, 19), [BOX], tolerance=0) is True
    assert metrics.pointing_hit(map_with_peak(50, 50), [BOX, (45, 45, 55, 55)]) is True


def test_distance_to_box() -> None:
    assert metrics.distance_to_box(15, 15, BOX) == 0.0
    assert metrics.distance_to_box(15, 25, BOX) == pytest.approx(5.5)
    assert metrics.distance_to_box(24, 24, BOX) == pytest.approx(math.hypot(4.5, 4.5))


# ------------------------------------------------------------------------------------------ energy


def test_box_mask_counts_pixels_with_exclusive_integer_ends() -> None:
    mask = metrics.box_mask((64, 64), [BOX])
    assert int(mask.sum()) == 100
    assert mask[10, 10] and mask[19, 19] and not mask[20, 19] and not mask[9, 15]
    union = metrics.box_mask((64, 64), [BOX, (15.0, 15.0, 25.0, 25.0)])
    assert int(union.sum()) == 100 + 100 - 25  # the overlap counts once
    fractional = metrics.box_mask((64, 64), [(9.6, 9.6, 20.4, 20.4)])  # centres 9.5 and 20.5 fall outside
    assert int(fractional.sum()) == 100


def test_energy_of_a_map_entirely_inside_the_box_is_one() -> None:
    saliency = torch.zeros(64, 64)
    saliency[12:18, 11:20] = torch.rand(6, 9) + 0.1
    assert metrics.energy_inside(saliency, [BOX]) == pytest.approx(1.0)


def test_energy_shares() -> None:
    saliency = torch.zeros(64, 64)
    saliency[15, 15] = 3.0  # inside
    saliency[40, 40] = 1.0  # outside
    assert metrics.energy_inside(saliency, [BOX]) == pytest.approx(0.75)
    uniform = torch.ones(64, 64)
    assert metrics.energy_inside(uniform, [BOX]) == pytest.approx(100 / 4096)
    assert metrics.energy_inside(map_with_peak(40, 40), [BOX]) == 0.0
    assert math.isnan(metrics.energy_inside(torch.zeros(8, 8), [BOX]))  # nothing to locate


# ----------------------------------------------------------------------------------------- spearman


def test_spearman_known_values() -> None:
    a = torch.arange(100, dtype=torch.float32).view(10, 10)
    assert metrics.spearman(a, a) == pytest.approx(1.0)
    assert metrics.spearman(a, a**3 + 5) == pytest.approx(1.0)  # only the order counts
    assert metrics.spearman(a, -a) == pytest.approx(-1.0)
    # x = 1..5, y = (2, 1, 4, 3, 5): sum d^2 = 4 -> rho = 1 - 6 * 4 / (5 * 24) = 0.8
    assert metrics.spearman(torch.tensor([1.0, 2, 3, 4, 5]), torch.tensor([2.0, 1, 4, 3, 5])) == pytest.approx(0.8)


def test_spearman_ties_match_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    generator = torch.Generator().manual_seed(0)
    a = torch.relu(torch.randn(40, 30, generator=generator))  # many tied zeros, as in ReLU maps
    b = torch.relu(a + 0.5 * torch.randn(40, 30, generator=generator)).round(decimals=1)
    expected = stats.spearmanr(a.flatten().numpy(), b.flatten().numpy()).statistic
    assert metrics.spearman(a, b) == pytest.approx(expected, abs=1e-9)
    assert metrics.average_ranks(torch.tensor([0.0, 0.0, 1.0, 0.5])).tolist() == [1.5, 1.5, 4.0, 3.0]


def test_spearman_of_constant_maps() -> None:
    varying = torch.rand(6, 6)
    assert metrics.spearman(torch.zeros(6, 6), torch.zeros(6, 6)) == 1.0
    assert metrics.spearman(varying, torch.zeros(6, 6)) == 0.0
    with pytest.raises(ValueError):
        metrics.spearman(varying, torch.rand(5, 6))
