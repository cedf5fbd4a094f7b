"""ROAD (Rong et al. 2022) in ``gradcam eval --road``: the noisy linear imputation by hand and against the authors'
SciPy solver (as pytorch-grad-cam ships it), the masks and the combined score by hand, the known answer of the
colour-square model, and the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from square_model import build, square_image

from gradcam_cli import Explainer
from gradcam_cli.errors import UsageError
from gradcam_cli.evaluation import road
from gradcam_cli.evaluation.choose import evaluator_for
from gradcam_cli.evaluation.evaluate import Evaluator
from gradcam_cli.evaluation.road import ROAD_FRACTIONS, combined, impute, road_masks
from gradcam_cli.io.images import InputSpec
from gradcam_cli.models.loading import LoadedModel
from gradcam_cli.options import EvalOptions


def one_channel(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32).view(1, 1, len(rows), len(rows[0]))


def test_imputation_by_hand() -> None:
    # The centre of a 3 x 3 image: 1/6 of each direct neighbour, 1/12 of each diagonal one (the weights sum to 1):
    # (2 + 4 + 6 + 8) / 6 + (1 + 3 + 7 + 9) / 12 = 10 / 3 + 5 / 3 = 5.
    image = one_channel([[1, 2, 3], [4, 100, 6], [7, 8, 9]])
    centre = torch.tensor([[[False, False, False], [False, True, False], [False, False, False]]])
    filled = impute(image, centre, noise=0)
    assert filled[0, 0, 1, 1] == pytest.approx(5.0, abs=1e-5)
    assert torch.equal(filled.masked_fill(centre.unsqueeze(1), 0), image.masked_fill(centre.unsqueeze(1), 0))
    # A corner: only three neighbours lie in the image, 1/6, 1/6 and 1/12 of weight 5/12 in all:
    # (2 / 6 + 3 / 6 + 4 / 12) / (5 / 12) = 2.8.
    corner = impute(one_channel([[100, 2], [3, 4]]), torch.tensor([[[True, False], [False, False]]]), noise=0)
    assert corner[0, 0, 0, 0] == pytest.approx(2.8, abs=1e-5)
    # Two removed neighbours in a one-row image solve a system: x = (1 + y) / 2, y = (x + 4) / 2: x = 2, y = 3.
    row = impute(one_channel([[1, 50, 60, 4]]), torch.tensor([[[False, True, True, False]]]), noise=0)
    assert row[0, 0, 0].tolist() == pytest.approx([1, 2, 3, 4], abs=1e-5)


def test_imputation_matches_the_authors_solver() -> None:
    from pytorch_grad_cam.metrics.road import NoisyLinearImputer

    generator = torch.Generator().manual_seed(0)
    images = torch.randn(2, 3, 40, 56, generator=generator)
    removed = torch.rand(2, 40, 56, generator=generator) < torch.tensor([0.3, 0.9]).view(2, 1, 1)
    removed[1, :20, :28] = True  # a large removed region: the slow modes of the system
    filled = impute(images, removed, noise=0)
    for i in range(2):
        reference = NoisyLinearImputer(noise=0)(images[i], (~removed[i]).float())
        torch.testing.assert_close(filled[i], reference, rtol=0, atol=1e-4)


def test_noise_lands_on_removed_pixels_only_and_follows_the_seed() -> None:
    images = torch.zeros(1, 3, 64, 64)
    removed = torch.zeros(1, 64, 64, dtype=torch.bool)
    removed[0, 16:48, 16:48] = True
    noisy = impute(images, removed, generator=torch.Generator().manual_seed(3))
    assert torch.equal(noisy[0][:, ~removed[0]], images[0][:, ~removed[0]])
    assert float(noisy[0][:, removed[0]].std()) == pytest.approx(0.01, rel=0.05)
    assert torch.equal(noisy, impute(images, removed, generator=torch.Generator().manual_seed(3)))


def test_masks_and_combined_score_by_hand() -> None:
    saliency = torch.tensor([[0.9, 0.1, 0.5], [0.3, 0.7, 0.2]])  # most relevant first: 0.9, 0.7, 0.5, 0.3, 0.2, 0.1
    morf, lerf = road_masks(saliency, (0.5, 1 / 3))
    assert morf[0].tolist() == [[True, False, True], [False, True, False]]  # the 3 most relevant
    assert lerf[0].tolist() == [[False, True, False], [True, False, True]]  # the 3 least relevant
    assert morf[1].tolist() == [[True, False, False], [False, True, False]]  # round(6 / 3) = 2 of them
    assert lerf[1].tolist() == [[False, True, False], [False, False, True]]
    # (LeRF - MoRF) / 2 per fraction, averaged: ((0.8 - 0.2) / 2 + (0.7 - 0.5) / 2) / 2 = (0.3 + 0.1) / 2 = 0.2.
    assert combined([0.2, 0.5], [0.8, 0.7]) == pytest.approx(0.2)
    with pytest.raises(ValueError):
        combined([0.1], [])


def test_ties_are_removed_in_row_major_order_by_morf_and_lerf_alike() -> None:
    # Pixels in row-major order: 0 1 2 / 3 4 5, with saliency 0, .5, 0 / .5, 0, .9 (two groups of ties).
    saliency = torch.tensor([[0.0, 0.5, 0.0], [0.5, 0.0, 0.9]])
    most_first = [5, 1, 3, 0, 2, 4]  # .9; then the .5s, earlier pixel first; then the zeros, earlier pixel first
    least_first = [0, 2, 4, 1, 3, 5]  # the zeros, earlier pixel first; then the .5s, earlier first; then .9
    counts = range(1, 6)
    morf, lerf = road_masks(saliency, [count / 6 for count in counts])
    for mask, order in ((morf, most_first), (lerf, least_first)):
        removed = [sorted(torch.nonzero(m.flatten()).flatten().tolist()) for m in mask]
        assert removed == [sorted(order[:count]) for count in counts]


def square_explainer() -> Explainer:
    spec = InputSpec(size=64, mean=(0, 0, 0), std=(1, 1, 1))
    return Explainer(LoadedModel(build(), "squares", "none", ["red", "green", "blue"], spec), "features")


def test_the_square_model_has_the_known_answer(tmp_path: Path) -> None:
    # The map lights up the red square (9.4 % of the pixels) and nothing else. Most relevant first, even 10 % removes
    # the whole square, imputed from the grey around it: no colour is left, chance level 1/3. Least relevant first,
    # even 90 % leaves the square, so the probability never drops below the image's own (it rises where the removed
    # grey is filled in from the square: linear imputation spreads its red into the gap).
    square_image(size=(96, 64), box=(60, 10, 84, 34)).save(tmp_path / "square.png")
    report = Evaluator(square_explainer(), EvalOptions(steps=4, road=True)).run([tmp_path / "square.png"])
    scores, target = report.ok[0].methods["gradcam"], report.ok[0].target
    assert target is not None and target.name == "red" and target.probability > 0.5
    assert scores.road_morf == pytest.approx([1 / 3] * len(ROAD_FRACTIONS), abs=2e-3)
    assert min(scores.road_lerf) > target.probability - 2e-3
    assert scores.road_lerf[0] == pytest.approx(target.probability, abs=2e-3)  # 10 %: the top rows, far enough
    assert scores.road == pytest.approx(sum(le - 1 / 3 for le in scores.road_lerf) / 2 / len(ROAD_FRACTIONS), abs=2e-3)
    summary = report.summary("gradcam")
    assert summary["road"] == pytest.approx(scores.road) and len(summary["road_morf_curve"]) == len(ROAD_FRACTIONS)
    assert "road" not in Evaluator(square_explainer(), EvalOptions(steps=4)).run([tmp_path]).summary("gradcam")


def test_detectors_refuse_road_in_one_line() -> None:
    from task_models import build_detector

    with pytest.raises(
        UsageError, match=r"^--road is for classifiers; a detector's maps are evaluated per detection, in its own box$"
    ):
        evaluator_for(Explainer(build_detector()), EvalOptions(road=True))


def test_cli_eval_road_table_and_json(monkeypatch, capsys, tmp_path: Path) -> None:
    from gradcam_cli import cli

    square_image(size=(96, 64), box=(60, 10, 76, 26)).save(tmp_path / "square.png")
    model = f"{Path(__file__).resolve().parents[1] / 'square_model.py'}:build"
    args = ["gradcam", "eval", str(tmp_path / "square.png"), "--model", model, "--steps", "4", "--road"]
    args += ["--input-size", "64", "--device", "cpu"]
    for extra in ([], ["--json", "--quiet"]):
        monkeypatch.setattr("sys.argv", args + extra)
        with pytest.raises(SystemExit) as exited:
            cli.main()
        out, err = capsys.readouterr()
        assert exited.value.code == 0, err
        if not extra:
            header = next(line for line in out.splitlines() if line.startswith("method"))
            assert header.split()[-5:] == ["ROAD", "MoRF", "ROAD", "LeRF", "ROAD"]
            assert "lower is better: deletion AUC, avg drop, ROAD MoRF" in out
    data = json.loads(out)
    assert data["road"] == {"fractions": list(ROAD_FRACTIONS), "noise": 0.01}
    gradcam = data["methods"]["gradcam"]
    assert {"road", "road_morf", "road_lerf", "road_morf_curve", "road_lerf_curve"} <= set(gradcam)
    assert len(data["per_image"][0]["methods"]["gradcam"]["road_lerf_curve"]) == len(ROAD_FRACTIONS)


@pytest.mark.quick
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_direct_solve_matches_the_iterative_one_and_a_dense_solve(seed: int) -> None:
    """The CPU's sparse LU gives what the accelerators' conjugate gradients give (within their tolerance), and what
    a dense solve of the module docstring's system gives, on small random images and masks."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(4, 2, 7, 9, generator=generator)
    removed = torch.rand(4, 7, 9, generator=generator) < 0.6
    direct = road._direct(images[0], removed[0])
    iterative = torch.where(removed.unsqueeze(1), road._iterative(images, removed.float().unsqueeze(1), 1e-9), images)
    filled = impute(images, removed, noise=0)
    torch.testing.assert_close(filled, iterative, atol=1e-5, rtol=0)
    torch.testing.assert_close(filled[0], direct)
    # dense reference: for removed i, (sum_j w_ij) x_i - sum_{j removed} w_ij x_j = sum_{j kept} w_ij x_j
    for b in range(4):
        mask = removed[b]
        cells = [(i, j) for i in range(7) for j in range(9) if mask[i, j]]
        where = {cell: n for n, cell in enumerate(cells)}
        a = torch.zeros(len(cells), len(cells), dtype=torch.float64)
        rhs = torch.zeros(len(cells), 2, dtype=torch.float64)
        for (i, j), n in where.items():
            for (dy, dx), w in road._WEIGHTS.items():
                y, x = i + dy, j + dx
                if 0 <= y < 7 and 0 <= x < 9:
                    a[n, n] += w
                    if (y, x) in where:
                        a[n, where[(y, x)]] -= w
                    else:
                        rhs[n] += w * images[b, :, y, x].double()
        solution = torch.linalg.solve(a, rhs)
        for (i, j), n in where.items():
            torch.testing.assert_close(filled[b, :, i, j].double(), solution[n], atol=1e-5, rtol=0)
