"""Each ``gradcam eval`` metric against its paper's formula written out as plain numpy loops, and, where Quantus
implements it (Sparseness, Complexity, FaithfulnessCorrelation; Quantus has no Average Drop), against Quantus on the
same maps and model.

Where Quantus differs from the paper or from us by construction, the test says how and checks the difference:
Sparseness adds 1e-7 to every value, Complexity is not divided by ln n, and FaithfulnessCorrelation draws its
subsets from a map broadcast to every channel (docs/evaluation.md, "Against Quantus").
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from method_reference import gradcam, probability
from square_model import OneChannel, square_image

from gradcam_cli.cam.explainer import Explainer
from gradcam_cli.errors import UsageError
from gradcam_cli.evaluation import metrics
from gradcam_cli.evaluation.choose import evaluator_for
from gradcam_cli.evaluation.evaluate import Evaluator
from gradcam_cli.evaluation.rank import rank
from gradcam_cli.io.images import load_image, to_input_tensor
from gradcam_cli.options import EvalOptions


def random_maps(count: int = 6, shape: tuple[int, int] = (12, 16), seed: int = 0) -> list[np.ndarray]:
    """Non-negative maps of several kinds: uniform noise, sparse spikes, a smooth blob, one with exact zeros."""
    rng = np.random.default_rng(seed)
    maps = []
    for k in range(count):
        a = rng.random(shape)
        if k % 3 == 1:
            a = np.where(rng.random(shape) < 0.1, a, 0.0)
        elif k % 3 == 2:
            rows, cols = np.mgrid[: shape[0], : shape[1]]
            a = np.exp(-((rows - 5.0) ** 2 + (cols - 7.0) ** 2) / 8.0) + 0.01 * a
        maps.append(a)
    return maps


# ----------------------------------------------------------------------------- the papers' formulas, as loops


def average_drop_loop(full: list[float], masked: list[float]) -> float:
    """Chattopadhay et al. 2018, eq. (8): 100 / N sum_i max(0, Y_i - O_i) / Y_i."""
    total = 0.0
    for y, o in zip(full, masked, strict=True):
        total += max(0.0, y - o) / y
    return 100.0 * total / len(full)


def increase_loop(full: list[float], masked: list[float]) -> float:
    """Chattopadhay et al. 2018, eq. (9): 100 / N sum_i 1[Y_i < O_i]."""
    count = 0
    for y, o in zip(full, masked, strict=True):
        if y < o:
            count += 1
    return 100.0 * count / len(full)


def gini_loop(a: np.ndarray) -> float:
    """Chalasani et al. 2020 (after Hurley and Rickard 2009): sum_k (2k - n - 1) v_(k) / (n sum_k v_k)."""
    values = sorted(float(v) for v in a.flatten())
    n, total = len(values), sum(values)
    acc = 0.0
    for k, v in enumerate(values, 1):
        acc += (2 * k - n - 1) * v
    return acc / (n * total)


def entropy_loop(a: np.ndarray) -> float:
    """Bhatt et al. 2020, eq. (6): the entropy of P_g(i) = |g_i| / sum_j |g_j| (here divided by ln n)."""
    values = [abs(float(v)) for v in a.flatten()]
    total = sum(values)
    h = 0.0
    for v in values:
        if v > 0:
            p = v / total
            h -= p * math.log(p)
    return h / math.log(len(values))


def pearson_loop(x: list[float], y: list[float]) -> float:
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy)


def faithfulness_correlation_loop(
    score: object, x: np.ndarray, a: np.ndarray, subsets: list[np.ndarray], baseline: float = 0.0
) -> float:
    """Bhatt et al. 2020, eq. (3): corr over subsets S of (sum_{i in S} g_i, f(x) - f(x with x_S = baseline)); the
    pixels of S replaced in every channel of the (C, H, W) ``x``; ``score`` maps a (C, H, W) array to the score."""
    width = x.shape[-1]
    full = score(x)  # type: ignore[operator]
    sums, drops = [], []
    for subset in subsets:
        perturbed = x.copy()
        total = 0.0
        for index in subset:
            row, col = divmod(int(index), width)
            perturbed[:, row, col] = baseline
            total += float(a[row, col])
        sums.append(total)
        drops.append(full - score(perturbed))  # type: ignore[operator]
    return pearson_loop(sums, drops)


# ----------------------------------------------------------------------------- against the loops


@pytest.mark.quick
def test_average_drop_and_increase_match_the_papers_sums() -> None:
    rng = np.random.default_rng(1)
    full = rng.uniform(0.05, 1.0, 40).tolist()
    masked = (np.array(full) * rng.uniform(0.2, 1.3, 40)).clip(0, 1).tolist()
    assert metrics.average_drop(full, masked) == pytest.approx(average_drop_loop(full, masked), abs=1e-12)
    assert metrics.increase_in_confidence(full, masked) == pytest.approx(increase_loop(full, masked), abs=1e-12)
    assert 0 < metrics.increase_in_confidence(full, masked) < 100  # both cases occur


@pytest.mark.quick
def test_sparseness_and_complexity_match_the_papers_sums() -> None:
    for a in random_maps():
        saliency = torch.from_numpy(a).float()
        assert metrics.gini(saliency) == pytest.approx(gini_loop(a.astype(np.float32)), abs=1e-12)
        assert metrics.entropy(saliency) == pytest.approx(entropy_loop(a.astype(np.float32)), abs=1e-12)


@pytest.mark.quick
def test_pearson_and_faithfulness_correlation_match_the_loops() -> None:
    rng = np.random.default_rng(2)
    x, y = rng.random(30), rng.random(30)
    assert metrics.pearson(torch.from_numpy(x), torch.from_numpy(y)) == pytest.approx(pearson_loop(x, y), abs=1e-12)
    assert math.isnan(metrics.pearson(torch.ones(5), torch.arange(5.0)))  # constant: undefined
    subsets = metrics.correlation_subsets(12 * 16, 20, 30, seed=3)
    assert subsets.shape == (30, 20)
    assert all(len(set(row.tolist())) == 20 for row in subsets)  # without replacement
    assert torch.equal(subsets, metrics.correlation_subsets(12 * 16, 20, 30, seed=3))  # seeded
    assert not torch.equal(subsets, metrics.correlation_subsets(12 * 16, 20, 30, seed=4))
    masks = metrics.subset_masks(subsets, (12, 16))
    assert masks.shape == (30, 12, 16) and masks.flatten(1).sum(1).tolist() == [20] * 30
    a = random_maps(1)[0]
    weights = rng.random((12, 16))

    def score(image: np.ndarray) -> float:  # a linear "model": the drops are the removed pixels' weights
        return float((image.sum(0) * weights).sum())

    image = rng.random((3, 12, 16))
    drops = torch.tensor([score(image) - score(np.where(m.numpy(), 0.0, image)) for m in masks], dtype=torch.float64)
    ours = metrics.faithfulness_correlation(torch.from_numpy(a), subsets, drops)
    loop = faithfulness_correlation_loop(score, image, a, [s.numpy() for s in subsets])
    assert ours == pytest.approx(loop, abs=1e-12)
    assert -1.0 <= ours <= 1.0
    # a map equal to the model's own weights x input is perfectly faithful to a linear model
    exact = torch.from_numpy(image.sum(0) * weights)
    assert metrics.faithfulness_correlation(exact, subsets, drops) == pytest.approx(1.0, abs=1e-12)


# ----------------------------------------------------------------------------- through gradcam eval


@pytest.fixture
def square_dir(tmp_path: Path) -> Path:
    for i, corners in enumerate([(60, 10, 90, 40), (5, 30, 35, 60), (40, 40, 70, 62)]):
        square_image(size=(96, 64), box=corners).save(tmp_path / f"s{i}.png")
    return tmp_path


def test_eval_figures_match_an_independent_computation(square_model, square_dir: Path) -> None:
    """Average Drop's masked image, the sparseness and complexity of the map and faithfulness correlation, as
    ``gradcam eval`` measures them on the colour-square model, against Grad-CAM written out by hand
    (tests/method_reference.py), the model run on images perturbed by hand and the loops above."""
    runs, size = 25, 300
    options = EvalOptions(steps=2, correlation=True, correlation_runs=runs, correlation_subset=size, seed=5)
    report = Evaluator(Explainer(square_model, "features", methods="gradcam"), options).run([square_dir])
    assert not report.failed and len(report.ok) == 3
    model = square_model.module.eval()
    full, masked = [], []
    for image in report.ok:
        scores = image.methods["gradcam"]
        x = to_input_tensor(load_image(image.image), square_model.input_spec)[None]
        target = image.target.index
        saliency = gradcam(model, model.features, x, target)  # (H, W), min-max normalised
        y, o = probability(model, x, target), probability(model, x * saliency.float(), target)
        assert image.target.probability == pytest.approx(y, abs=1e-5)
        assert scores.masked_probability == pytest.approx(o, abs=1e-5)
        full.append(y)
        masked.append(o)
        a = saliency.numpy()
        assert scores.gini == pytest.approx(gini_loop(a), abs=1e-4)
        assert scores.entropy == pytest.approx(entropy_loop(a), abs=1e-4)
        generator = torch.Generator().manual_seed(5)  # the documented draw: randperm per run, its first `size`
        subsets = [torch.randperm(x[0, 0].numel(), generator=generator)[:size].numpy() for _ in range(runs)]
        loop = faithfulness_correlation_loop(
            lambda v, t=target: probability(model, torch.from_numpy(v)[None], t), x[0].numpy(), a, subsets
        )
        assert scores.faithfulness_correlation == pytest.approx(loop, abs=1e-3)
    summary = report.summary("gradcam")
    assert summary["average_drop"] == pytest.approx(average_drop_loop(full, masked), abs=1e-3)
    assert summary["increase_in_confidence"] == increase_loop(full, masked)
    assert summary["faithfulness_correlation"] > 0.5  # removing the square's pixels is what lowers "red"
    data = report.to_dict()
    assert data["faithfulness_correlation"] == {
        "runs": runs,
        "subset": size,
        "baseline": "zero in normalised input space (the mean colour)",
        "seed": 5,
    }
    assert "faithfulness_correlation" in data["per_image"][0]["methods"]["gradcam"]
    ranked = [row for row in rank(report) if row.metric == "faithfulness_correlation"]
    assert [(row.method, row.better, row.images) for row in ranked] == [("gradcam", "higher", 3)]
    assert ranked[0].mean == pytest.approx(summary["faithfulness_correlation"])


def test_cli_eval_faithfulness_correlation_table_and_json(monkeypatch, capsys, tmp_path: Path) -> None:
    from gradcam_cli import cli

    square_image(size=(96, 64), box=(60, 10, 90, 40)).save(tmp_path / "square.png")
    model = f"{Path(__file__).resolve().parents[1] / 'square_model.py'}:build"
    args = ["gradcam", "eval", str(tmp_path / "square.png"), "--model", model, "--steps", "2"]
    args += ["--faithfulness-correlation", "--input-size", "64", "--device", "cpu", "--batch-size", "50"]
    for extra in ([], ["--json", "--quiet"]):
        monkeypatch.setattr("sys.argv", args + extra)
        with pytest.raises(SystemExit) as exited:
            cli.main()
        out, err = capsys.readouterr()
        assert exited.value.code == 0, err
        if not extra:
            lines = out.splitlines()
            header = next(line for line in lines if line.startswith("method"))
            assert "faith. corr.  sparseness  complexity" in header
            assert "lower is better: deletion AUC, avg drop, complexity" in out
    data = json.loads(out)
    assert data["faithfulness_correlation"]["runs"] == 100 and data["faithfulness_correlation"]["subset"] == 224
    assert 0.0 < data["methods"]["gradcam"]["faithfulness_correlation"] <= 1.0


@pytest.mark.quick
def test_detectors_refuse_faithfulness_correlation_in_one_line() -> None:
    from task_models import build_detector

    message = (
        r"^--faithfulness-correlation is for classifiers; "
        r"a detector's maps are evaluated per detection, in its own box$"
    )
    with pytest.raises(UsageError, match=message):
        evaluator_for(Explainer(build_detector()), EvalOptions(correlation=True))


# ----------------------------------------------------------------------------- against Quantus


@pytest.mark.quick
def test_sparseness_and_complexity_agree_with_quantus() -> None:
    """Quantus' Sparseness adds 1e-7 to every value (float32, divided by the largest of the whole batch) before the
    Gini index: on the values shifted as it shifts them the two agree to float32 rounding, on the maps themselves
    within 1e-5 (the shift weighs most on a map of mostly exact zeros). Quantus' Complexity is the entropy in nats,
    not divided by ln n, in float32 with 1e-12 inside the log: ours x ln n agrees within 1e-5."""
    quantus = pytest.importorskip("quantus")
    maps = np.stack(random_maps(shape=(8, 8)))[:, None].astype(np.float32)  # (N, 1, H, W)
    x = np.zeros_like(maps)
    y = np.zeros(len(maps), dtype=int)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sparseness = quantus.Sparseness(disable_warnings=True, return_aggregate=False)
        complexity = quantus.Complexity(disable_warnings=True, return_aggregate=False)
        theirs_gini = sparseness(model=None, x_batch=x, y_batch=y, a_batch=maps.copy(), device="cpu")
        theirs_entropy = complexity(model=None, x_batch=x, y_batch=y, a_batch=maps.copy(), device="cpu")
    n = maps[0].size
    for a, gini, entropy in zip(maps, theirs_gini, theirs_entropy, strict=True):
        saliency = torch.from_numpy(a[0]).double()
        shifted = torch.from_numpy(a[0] / np.abs(maps).max() + np.float32(1e-7))  # as Quantus does, in float32
        assert metrics.gini(shifted) == pytest.approx(float(gini), abs=1e-7)  # Quantus sums in float32
        assert metrics.gini(saliency) == pytest.approx(float(gini), abs=1e-5)
        assert metrics.entropy(saliency) * math.log(n) == pytest.approx(float(entropy), abs=1e-5)


@pytest.mark.quick
def test_faithfulness_correlation_agrees_with_quantus_on_its_own_subsets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Quantus' FaithfulnessCorrelation on a 1-channel model, black (0) baseline, softmax scores, its subsets
    recorded as it draws them (``np.random.choice``, one per image per run) and handed to ours: the same
    correlations to float rounding. (On C channels Quantus broadcasts the map to C x H x W and draws single
    channel values, where we draw pixels and remove all their channels: the paper's features are pixels.)"""
    quantus = pytest.importorskip("quantus")
    model = OneChannel().eval()
    rng = np.random.default_rng(4)
    x = rng.normal(size=(3, 1, 8, 8)).astype(np.float32)
    a = rng.random((3, 1, 8, 8)).astype(np.float32)
    y = np.array([0, 1, 2])
    drawn: list[np.ndarray] = []
    choice = np.random.choice

    def recording(*args: object, **kwargs: object) -> np.ndarray:
        picked = choice(*args, **kwargs)  # type: ignore[call-overload]
        drawn.append(np.asarray(picked))
        return picked  # type: ignore[no-any-return]

    monkeypatch.setattr(np.random, "choice", recording)
    runs, size = 20, 10
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric = quantus.FaithfulnessCorrelation(
            nr_runs=runs, subset_size=size, perturb_baseline=0.0, disable_warnings=True, return_aggregate=False
        )
        theirs = metric(model=model, x_batch=x, y_batch=y, a_batch=a.copy(), device="cpu", softmax=True)
    assert len(drawn) == runs * len(x)
    for i in range(len(x)):
        subsets = torch.from_numpy(np.stack([drawn[run * len(x) + i] for run in range(runs)])).long()
        image = torch.from_numpy(x[i])
        masks = metrics.subset_masks(subsets, (8, 8))
        with torch.no_grad():
            perturbed = torch.where(masks[:, None], 0.0, image)
            full = torch.softmax(model(image[None]), 1)[0, y[i]].double()
            drops = full - torch.softmax(model(perturbed), 1)[:, y[i]].double()
        ours = metrics.faithfulness_correlation(torch.from_numpy(a[i, 0]), subsets, drops)
        assert ours == pytest.approx(float(theirs[i]), abs=1e-5)
