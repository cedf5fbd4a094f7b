"""The random-logit test (Sixt et al. 2020), sMPRT and eMPRT (Hedstrom et al. 2023): against their formulas written
out as plain loops, against Quantus 0.6 (``RandomLogit``, ``SmoothMPRT``, ``EfficientMPRT``) on the same maps and
model, through ``gradcam eval`` against Grad-CAM written out by hand, and on the command line.

Where Quantus differs by construction the test says how and checks the difference (docs/evaluation.md, "Random
logit", "sMPRT and eMPRT"): its RandomLogit takes the SSIM of the maps flattened to one row (windows of 7 running
along the rows and across their ends), ours the SSIM of the maps as images.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from method_reference import gradcam
from model_state import hook_counts, snapshot
from square_model import OneChannel, square_image
from torch import nn

from gradcam_cli.cam.explainer import Explainer
from gradcam_cli.errors import UsageError
from gradcam_cli.evaluation import metrics
from gradcam_cli.evaluation.choose import evaluator_for
from gradcam_cli.evaluation.clips import refuse_for_clips
from gradcam_cli.evaluation.evaluate import Evaluator
from gradcam_cli.evaluation.extras import MPRT_NOISE, noisy_copies, other_class
from gradcam_cli.evaluation.rank import rank
from gradcam_cli.evaluation.rows import image_from_row, image_row
from gradcam_cli.evaluation.sanity import fully_randomised
from gradcam_cli.io.images import load_image, to_input_tensor
from gradcam_cli.options import EvalOptions

# ----------------------------------------------------------------------------- the papers' formulas, as loops


def ssim_loop(a: np.ndarray, b: np.ndarray, window: int = 7) -> float:
    """Wang et al. 2004's SSIM as scikit-image computes it: over every window wholly inside the (H, W) or (n,) map,
    means, sample variances and covariance, C1 = (0.01 R)^2, C2 = (0.03 R)^2 (R: the range of both maps), and the
    mean of the index over the windows."""
    a2, b2 = np.atleast_2d(a).astype(np.float64), np.atleast_2d(b).astype(np.float64)
    rows = 1 if a.ndim == 1 else window
    value_range = max(a2.max(), b2.max()) - min(a2.min(), b2.min())
    c1, c2 = (0.01 * value_range) ** 2, (0.03 * value_range) ** 2
    total, count = 0.0, 0
    for top in range(a2.shape[0] - rows + 1):
        for left in range(a2.shape[1] - window + 1):
            x = [float(v) for v in a2[top : top + rows, left : left + window].flatten()]
            y = [float(v) for v in b2[top : top + rows, left : left + window].flatten()]
            n = len(x)
            mx, my = sum(x) / n, sum(y) / n
            vx = sum((v - mx) ** 2 for v in x) / (n - 1)
            vy = sum((v - my) ** 2 for v in y) / (n - 1)
            vxy = sum((u - mx) * (v - my) for u, v in zip(x, y, strict=True)) / (n - 1)
            total += (2 * mx * my + c1) * (2 * vxy + c2) / ((mx * mx + my * my + c1) * (vx + vy + c2))
            count += 1
    return total / count


def histogram_entropy_loop(a: np.ndarray, bins: int = 100) -> float:
    """Hedstrom et al. 2023's complexity: the entropy (nats) of the values' histogram in equal bins over their range
    (the last bin closed)."""
    values = [float(v) for v in a.flatten()]
    low, high = min(values), max(values)
    if high == low:
        return 0.0  # one bin holds every value
    counts = [0] * bins
    for v in values:
        counts[min(int((v - low) / (high - low) * bins), bins - 1)] += 1
    h = 0.0
    for c in counts:
        if c:
            p = c / len(values)
            h -= p * math.log(p)
    return h


def ranks_loop(values: list[float]) -> list[float]:
    """1-based ranks, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman_loop(a: np.ndarray, b: np.ndarray) -> float:
    x, y = ranks_loop([float(v) for v in a.flatten()]), ranks_loop([float(v) for v in b.flatten()])
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((u - mx) * (v - my) for u, v in zip(x, y, strict=True))
    return sxy / math.sqrt(sum((u - mx) ** 2 for u in x) * sum((v - my) ** 2 for v in y))


def smooth_mprt_loop(original: list[np.ndarray], randomised: list[np.ndarray]) -> float:
    """Hedstrom et al. 2023, sMPRT: Spearman of |mean of the N maps| of the trained and of the randomised model."""
    return spearman_loop(np.abs(sum(original) / len(original)), np.abs(sum(randomised) / len(randomised)))


def maps(count: int = 4, shape: tuple[int, ...] = (12, 16), seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        a = rng.random(shape)
        out.append(np.where(rng.random(shape) < 0.3, 0.0, a) if k % 2 else a)
    return out


# ----------------------------------------------------------------------------- against the loops


@pytest.mark.quick
def test_ssim_entropy_and_smprt_match_the_loops() -> None:
    for a, b in zip(maps(), maps(seed=1), strict=True):
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        assert metrics.ssim(ta, tb) == pytest.approx(ssim_loop(a, b), abs=1e-12)
        assert metrics.ssim(ta.flatten(), tb.flatten()) == pytest.approx(ssim_loop(a.ravel(), b.ravel()), abs=1e-12)
        assert metrics.ssim(ta, ta) == pytest.approx(1.0)
        assert metrics.discrete_entropy(ta) == pytest.approx(histogram_entropy_loop(a), abs=1e-12)
        expected = (histogram_entropy_loop(b) - histogram_entropy_loop(a)) / histogram_entropy_loop(a)
        assert metrics.efficient_mprt(ta, tb) == pytest.approx(expected, abs=1e-12)
    stack = [torch.from_numpy(np.stack(maps(5, seed=s))) for s in (2, 3)]
    ours = metrics.smooth_mprt(*stack)
    assert ours == pytest.approx(smooth_mprt_loop(list(stack[0].numpy()), list(stack[1].numpy())), abs=1e-12)
    assert math.isnan(metrics.efficient_mprt(torch.ones(8, 8), torch.rand(8, 8)))  # a constant map: no entropy
    with pytest.raises(ValueError, match="each at least 7 long"):
        metrics.ssim(torch.rand(5, 9), torch.rand(5, 9))


@pytest.mark.quick
def test_ssim_agrees_with_scikit_image() -> None:
    structural_similarity = pytest.importorskip("skimage.metrics").structural_similarity
    for a, b in zip(maps(), maps(seed=4), strict=True):
        value_range = max(a.max(), b.max()) - min(a.min(), b.min())
        theirs = structural_similarity(a, b, data_range=value_range)
        assert metrics.ssim(torch.from_numpy(a), torch.from_numpy(b)) == pytest.approx(theirs, abs=1e-12)


@pytest.mark.quick
def test_noisy_copies_and_the_other_class_are_drawn_as_documented() -> None:
    image = torch.rand(3, 10, 12) * 4 - 1
    copies = noisy_copies(image, 30, seed=3)
    assert copies.shape == (30, 3, 10, 12) and torch.equal(copies[-1], image)  # the last copy is the image
    spread = MPRT_NOISE * float(image.max() - image.min())
    assert float((copies[:-1] - image).std()) == pytest.approx(spread, rel=0.05)
    assert torch.equal(copies, noisy_copies(image, 30, seed=3)) and not torch.equal(copies, noisy_copies(image, 30, 4))
    drawn = {other_class(2, 5, seed) for seed in range(60)}
    assert drawn == {0, 1, 3, 4}  # every other class, never the explained one


# ----------------------------------------------------------------------------- against Quantus


class Recorder:
    """An explain function for Quantus: Grad-CAM by hand (tests/method_reference.py) of each input for its class,
    every call recorded as (model, inputs, classes, maps)."""

    def __init__(self) -> None:
        self.calls: list[tuple[nn.Module, np.ndarray, np.ndarray, np.ndarray]] = []

    def __call__(self, model: nn.Module, inputs: np.ndarray, targets: np.ndarray, **_: object) -> np.ndarray:
        x = torch.as_tensor(np.asarray(inputs), dtype=torch.float32)
        out = np.stack([gradcam(model, model.conv, x[i : i + 1], int(t)).numpy() for i, t in enumerate(targets)])
        self.calls.append((model, np.asarray(inputs).copy(), np.asarray(targets).copy(), out[:, None]))
        return out[:, None].astype(np.float32)


def quantus_data(count: int = 3) -> tuple[OneChannel, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    return OneChannel().eval(), rng.normal(size=(count, 1, 8, 8)).astype(np.float32), np.array([0, 1, 2][:count])


@pytest.mark.quick
def test_random_logit_agrees_with_quantus_on_its_flattened_ssim() -> None:
    """Quantus' RandomLogit: its own off-class draw and explain calls recorded; its score is the SSIM of the two maps
    flattened to one row, which is ours on the flattened maps to float rounding; ours on the images differs."""
    quantus = pytest.importorskip("quantus")
    model, x, y = quantus_data()
    explain = Recorder()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric = quantus.RandomLogit(num_classes=3, seed=7, disable_warnings=True, return_aggregate=False)
        a = explain(model, x, y)
        theirs = metric(model=model, x_batch=x, y_batch=y, a_batch=a, explain_func=explain, device="cpu")
    *_, (_, _, off, perturbed) = explain.calls
    assert all(o != t for o, t in zip(off, y, strict=True))
    for i in range(len(x)):
        original, other = torch.from_numpy(a[i, 0]).double(), torch.from_numpy(perturbed[i, 0]).double()
        top = max(float(original.abs().max()), 1e-30)  # normalise_by_max: both maps already peak at 1 (or are 0)
        flat = metrics.ssim((original / top).flatten(), (other / max(float(other.abs().max()), 1e-30)).flatten())
        assert flat == pytest.approx(float(theirs[i]), abs=1e-6)
        assert metrics.ssim(original, other) == pytest.approx(ssim_loop(a[i, 0], perturbed[i, 0]), abs=1e-9)
    differs = [
        abs(metrics.ssim(torch.from_numpy(a[i, 0]), torch.from_numpy(perturbed[i, 0])) - float(theirs[i]))
        for i in range(len(x))
    ]
    assert max(differs) > 1e-3  # the image's windows are not the flattened row's


@pytest.mark.quick
def test_emprt_agrees_with_quantus_on_the_same_maps() -> None:
    """Quantus' EfficientMPRT (bottom-up, only the fully randomised model scored): the maps of the trained and of
    its fully randomised copy recorded as it asks for them; ours on them gives its scores to float rounding."""
    quantus = pytest.importorskip("quantus")
    model, x, y = quantus_data()
    explain = Recorder()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric = quantus.EfficientMPRT(disable_warnings=True, return_aggregate=False)
        a = explain(model, x, y)
        theirs = metric(model=model, x_batch=x, y_batch=y, a_batch=a, explain_func=explain, device="cpu")
    trained = [call for call in explain.calls if call[0] is model][-1][3]
    randomised = explain.calls[-1]
    assert randomised[0] is not model
    assert all(not torch.equal(p, q) for p, q in zip(model.parameters(), randomised[0].parameters(), strict=True))
    for i in range(len(x)):
        ours = metrics.efficient_mprt(torch.from_numpy(trained[i]), torch.from_numpy(randomised[3][i]))
        assert ours == pytest.approx(float(theirs[i]), abs=1e-6)


@pytest.mark.quick
def test_smprt_agrees_with_quantus_on_the_same_noisy_maps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Quantus' SmoothMPRT explains through ``quantus.explain`` (not ``explain_func``): that is recorded here; with
    ``return_last_correlation`` its score compares the smoothed map of the trained model (its first N calls) with the
    fully randomised model's (its last N calls). Ours on the same maps gives its scores to float rounding."""
    quantus = pytest.importorskip("quantus")
    model, x, y = quantus_data()
    explain, samples = Recorder(), 6
    monkeypatch.setattr(quantus, "explain", lambda model, inputs, targets, **kw: explain(model, inputs, targets))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric = quantus.SmoothMPRT(
            nr_samples=samples,
            return_last_correlation=True,
            skip_layers=True,
            disable_warnings=True,
            return_aggregate=False,
        )
        theirs = metric(model=model, x_batch=x, y_batch=y, explain_func=explain, device="cpu")
    first, last = explain.calls[:samples], explain.calls[-samples:]
    assert all(call[0] is model for call in first) and all(call[0] is not model for call in last)
    assert np.array_equal(first[-1][1], x) and np.array_equal(last[-1][1], x)  # the last copy: the input itself
    for i in range(len(x)):
        trained = torch.from_numpy(np.stack([call[3][i, 0] for call in first]))
        randomised = torch.from_numpy(np.stack([call[3][i, 0] for call in last]))
        assert metrics.smooth_mprt(trained, randomised) == pytest.approx(float(theirs[i]), abs=1e-6)


# ----------------------------------------------------------------------------- through gradcam eval


@pytest.fixture
def small_squares(tmp_path: Path) -> Path:
    for i, corners in enumerate([(20, 4, 30, 14), (2, 10, 12, 20)]):
        square_image(size=(32, 24), box=corners).save(tmp_path / f"s{i}.png")
    return tmp_path


def test_eval_random_logit_and_mprt_match_grad_cam_by_hand(small_square_model, small_squares: Path) -> None:
    """``gradcam eval``'s random logit, sMPRT and eMPRT of Grad-CAM on the colour-square model against Grad-CAM by
    hand on the images, the other class and the fully randomised copy, and the loops; the model is left exactly as
    it was (parameters, modes, gradient flags, no hooks)."""
    samples, seed = 4, 4  # seed 4: the randomised model's Grad-CAM is not all zero on these images
    module = small_square_model.module
    before = ({k: v.clone() for k, v in module.state_dict().items()}, snapshot(module), hook_counts(module))
    options = EvalOptions(steps=2, random_logit=True, mprt=True, mprt_samples=samples, seed=seed)
    report = Evaluator(Explainer(small_square_model, "features", methods="gradcam"), options).run([small_squares])
    assert not report.failed and len(report.ok) == 2
    after = module.state_dict()
    assert all(torch.equal(before[0][k], after[k]) for k in after)
    assert snapshot(module) == before[1] and hook_counts(module) == before[2] == {}
    model = module.eval()
    noise = fully_randomised(model, seed, "cpu")
    for image in report.ok:
        figures = image.methods["gradcam"].extra
        x = to_input_tensor(load_image(image.image), small_square_model.input_spec)[None]
        target = image.target.index
        saliency = gradcam(model, model.features, x, target).numpy()
        other = gradcam(model, model.features, x, other_class(target, 3, seed + target)).numpy()
        assert figures["random_logit"] == pytest.approx(ssim_loop(saliency, other), abs=1e-4)
        randomised = gradcam(noise, noise.features, x, target).numpy()
        if histogram_entropy_loop(saliency) > 0:
            expected = (histogram_entropy_loop(randomised) - histogram_entropy_loop(saliency)) / (
                histogram_entropy_loop(saliency)
            )
            assert figures["emprt"] == pytest.approx(expected, abs=1e-3)
        copies = noisy_copies(x[0], samples, seed)
        trained = [gradcam(model, model.features, c[None], target).numpy() for c in copies]
        randoms = [gradcam(noise, noise.features, c[None], target).numpy() for c in copies]
        assert all(r.max() > r.min() for r in randoms)  # a map to rank, not a constant one
        assert figures["smprt"] == pytest.approx(smooth_mprt_loop(trained, randoms), abs=2e-3)
        row = image_from_row(json.loads(json.dumps(image_row(image))))  # --rank --report's rows file
        assert row.methods["gradcam"].extra == figures
    summary = report.summary("gradcam")
    assert {"random_logit", "smprt", "emprt"} <= summary.keys()
    assert summary["smprt"] < 0.5  # Grad-CAM follows the model: its map changes once the model is noise
    methods = report.to_dict()["per_image"][0]["methods"]["gradcam"]
    assert {"random_logit", "smprt", "emprt"} <= methods.keys()
    ranked = {row.metric: row for row in rank(report)}
    assert ranked["random_logit"].better == "lower" and ranked["smprt"].better == "lower"
    assert ranked["emprt"].better == "higher" and ranked["emprt"].images == 2


@pytest.mark.quick
def test_the_randomisation_metrics_are_refused_where_they_do_not_apply(small_square_model) -> None:
    from task_models import build_detector

    with pytest.raises(UsageError, match=r"^--mprt is for classifiers; a detector's maps are evaluated per detection"):
        evaluator_for(Explainer(build_detector()), EvalOptions(mprt=True))
    with pytest.raises(UsageError, match=r"^--random-logit is for classifiers"):
        evaluator_for(Explainer(build_detector()), EvalOptions(random_logit=True))
    with pytest.raises(UsageError, match=r"^--arcc is measured on images; a video model's clips are measured without"):
        refuse_for_clips(EvalOptions(arcc=True))
    explainer = Explainer(small_square_model, "features", methods="gradcam", targets=("class:1",))
    with pytest.raises(UsageError, match=r"^--random-logit compares a class's map with another class's"):
        Evaluator(explainer, EvalOptions(random_logit=True))


def test_cli_eval_arcc_random_logit_and_mprt(monkeypatch, capsys, tmp_path: Path) -> None:
    from gradcam_cli import cli

    square_image(size=(32, 24), box=(20, 4, 30, 14)).save(tmp_path / "square.png")
    model = f"{Path(__file__).resolve().parents[1] / 'square_model.py'}:build"
    args = ["gradcam", "eval", str(tmp_path / "square.png"), "--model", model, "--steps", "2", "--device", "cpu"]
    args += ["--arcc", "--random-logit", "--mprt", "--mprt-samples", "2", "--input-size", "32"]
    for extra in ([], ["--json", "--quiet"]):
        monkeypatch.setattr("sys.argv", args + extra)
        with pytest.raises(SystemExit) as exited:
            cli.main()
        out, err = capsys.readouterr()
        assert exited.value.code == 0, err
        if not extra:
            header = next(line for line in out.splitlines() if line.startswith("method"))
            assert re.search(r"ARCC +random logit +sMPRT +eMPRT", header) and "ROAD" in header  # ARCC measures ROAD
            assert "random logit, sMPRT; higher is better" in out
    data = json.loads(out)["methods"]["gradcam"]
    assert 0.0 <= data["arcc"] <= 1.0 and -1.0 <= data["random_logit"] <= 1.0 and -1.0 <= data["smprt"] <= 1.0
    assert math.isfinite(data["emprt"]) and "road" in data
