"""ARCC (the RefineCAM paper, ICPR 2026): against its formula written out as a plain loop (the harmonic mean of
coherency, 1 - complexity and ROAD, as ADCC before it), against pytorch-grad-cam's ``ARCC`` on the same maps (its
docstring says "geometric mean"; its code, like the paper, takes the harmonic one: checked here), and through
``gradcam eval`` against Grad-CAM written out by hand. Quantus has no ARCC."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from method_reference import gradcam
from square_model import square_image

from gradcam_cli.cam.explainer import Explainer
from gradcam_cli.evaluation import metrics, road
from gradcam_cli.evaluation.evaluate import Evaluator
from gradcam_cli.evaluation.rank import rank
from gradcam_cli.io.images import load_image, to_input_tensor
from gradcam_cli.options import EvalOptions


def pearson_loop(x: list[float], y: list[float]) -> float:
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    return sxy / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))


def arcc_loop(saliency: np.ndarray, remapped: np.ndarray, road_combined: float) -> float:
    """ARCC = 3 / (1/Coherency + 1/(1 - Complexity) + 1/ROAD'): Coherency = (Pearson(map, map of input x map) + 1)
    / 2, Complexity = ||map||_1 / n, ROAD' = clip(2 ROAD, 0, 1)."""
    values = [float(v) for v in saliency.flatten()]
    coherency = (pearson_loop(values, [float(v) for v in remapped.flatten()]) + 1) / 2
    complexity = sum(abs(v) for v in values) / len(values)
    road_part = min(max(2 * road_combined, 0.0), 1.0)
    return 3 / (1 / coherency + 1 / (1 - complexity) + 1 / road_part)


def blobs(count: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(N, H, W) maps in [0, 1] and, for each, a 'remapped' map that partly follows it."""
    rng = np.random.default_rng(seed)
    rows, cols = np.mgrid[:12, :16]
    saliency, remapped = [], []
    for k in range(count):
        blob = np.exp(-((rows - 3.0 - k) ** 2 + (cols - 5.0 - 2 * k) ** 2) / 10.0)
        saliency.append(blob / blob.max())
        other = blob + (0.3 + 0.2 * k) * rng.random(blob.shape)
        remapped.append(other / other.max())
    return np.stack(saliency).astype(np.float32), np.stack(remapped).astype(np.float32)


@pytest.mark.quick
def test_arcc_matches_the_papers_harmonic_mean() -> None:
    saliency, remapped = blobs()
    for a, b, road_score in zip(saliency, remapped, (0.05, 0.2, 0.45, 0.8), strict=True):
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        coherency = metrics.coherency(ta, tb)
        assert coherency == pytest.approx((pearson_loop(a.ravel().tolist(), b.ravel().tolist()) + 1) / 2, abs=1e-9)
        ours = metrics.arcc(float(ta.double().mean()), coherency, road_score)
        assert ours == pytest.approx(arcc_loop(a, b, road_score), abs=1e-9)
        assert 0.0 < ours < 1.0
    assert metrics.arcc(0.3, 0.9, -0.1) == 0.0  # ROAD below 0: the harmonic mean's limit
    assert metrics.arcc(0.0, 1.0, 0.5) == pytest.approx(1.0)  # ROAD' clipped at 1
    assert metrics.coherency(torch.ones(4, 4), torch.rand(4, 4)) == 0.5  # a constant map has no correlation


@pytest.mark.quick
def test_arcc_agrees_with_pytorch_grad_cam_on_the_same_maps() -> None:
    """pytorch-grad-cam's ``ARCC`` with its base method answering with the remapped maps (the input it is given
    checked to be the input times the map) and its ROADCombined answering with given scores: ours on the same maps
    and scores agrees to its 1e-8 guards. Its docstring's geometric mean is not what it computes."""
    arcc_module = pytest.importorskip("pytorch_grad_cam.metrics.arcc")
    saliency, remapped = blobs(seed=1)
    inputs = torch.from_numpy(np.random.default_rng(2).normal(size=(len(saliency), 3, 12, 16)).astype(np.float32))
    roads = np.array([0.1, 0.25, 0.4, -0.05])
    seen: list[torch.Tensor] = []

    def base_method(input_tensor: torch.Tensor, targets: object) -> np.ndarray:
        seen.append(input_tensor)
        return remapped

    metric = arcc_module.ARCC(base_method=base_method)
    metric.road = lambda *args: roads
    theirs = metric(inputs, saliency, targets=None, model=None)
    assert torch.allclose(seen[0], inputs * torch.from_numpy(saliency)[:, None])
    for a, b, road_score, their in zip(saliency, remapped, roads, theirs, strict=True):
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        ours = metrics.arcc(float(ta.double().mean()), metrics.coherency(ta, tb), float(road_score))
        assert ours == pytest.approx(float(their), abs=1e-6)
    parts = [
        (metrics.coherency(torch.from_numpy(a), torch.from_numpy(b)), 1 - float(a.mean()), 2 * r)
        for a, b, r in zip(saliency[:3], remapped[:3], roads[:3], strict=True)
    ]
    geometric = [math.prod(p) ** (1 / 3) for p in parts]
    assert max(abs(g - float(t)) for g, t in zip(geometric, theirs[:3], strict=True)) > 1e-3


def test_eval_arcc_matches_grad_cam_by_hand(small_square_model, tmp_path: Path) -> None:
    """``gradcam eval --arcc`` (which measures ROAD with it) on the colour-square model: each image's ARCC against
    Grad-CAM by hand on the image and on the image times its map, the map's mean and ROAD at 20/40/60/80 %."""
    for i, corners in enumerate([(20, 4, 30, 14), (2, 10, 12, 20)]):
        square_image(size=(32, 24), box=corners).save(tmp_path / f"s{i}.png")
    report = Evaluator(
        Explainer(small_square_model, "features", methods="gradcam"), EvalOptions(steps=2, arcc=True)
    ).run([tmp_path])
    assert not report.failed and len(report.ok) == 2
    model = small_square_model.module.eval()
    at = [road.ROAD_FRACTIONS.index(f) for f in (0.2, 0.4, 0.6, 0.8)]
    for image in report.ok:
        scores = image.methods["gradcam"]
        assert len(scores.road_morf) == len(road.ROAD_FRACTIONS)  # ARCC measured ROAD
        x = to_input_tensor(load_image(image.image), small_square_model.input_spec)[None]
        saliency = gradcam(model, model.features, x, image.target.index)
        remapped = gradcam(model, model.features, x * saliency.float(), image.target.index)
        road_score = sum((scores.road_lerf[k] - scores.road_morf[k]) / 2 for k in at) / len(at)
        expected = arcc_loop(saliency.numpy(), remapped.numpy(), road_score)
        assert scores.extra["arcc"] == pytest.approx(expected, abs=1e-3)
    summary = report.summary("gradcam")
    assert 0.0 < summary["arcc"] <= 1.0 and "road" in summary
    ranked = [row for row in rank(report) if row.metric == "arcc"]
    assert [(row.method, row.better, row.images) for row in ranked] == [("gradcam", "higher", 2)]
