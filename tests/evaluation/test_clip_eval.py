"""``gradcam eval`` of a video model, clip by clip (issue 38, point 5): temporal deletion and insertion (frames
replaced by the clip's mean frame in order of their share of the map) and spatio-temporal deletion and insertion
(the T x H x W map's voxels), each against a loop written here from the formula; the known answer: on the tiny 3-D
CNN trained in :mod:`clip_models`, Grad-CAM's temporal deletion AUC is lower than a random map's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from clip_models import CLASSES, GREEN, RED, SIDE, SQUARE, T, trained
from PIL import Image
from typer.testing import CliRunner
from video_models import REFERENCES, captured, resized, write_video

from gradcam_cli import Explainer
from gradcam_cli.cli.eval import app
from gradcam_cli.errors import EXIT_OK, EXIT_USAGE
from gradcam_cli.evaluation.choose import evaluator_for
from gradcam_cli.evaluation.clips import ClipEvaluator, measure_in_time, rank_options
from gradcam_cli.evaluation.correlation import correlation_drops
from gradcam_cli.evaluation.metrics import auc, faithfulness_correlation
from gradcam_cli.evaluation.rank import rank
from gradcam_cli.evaluation.seeds import seed_spread
from gradcam_cli.io.images import InputSpec
from gradcam_cli.models.clip_spec import clip_starts
from gradcam_cli.models.profile import LoadedModel
from gradcam_cli.options import EvalOptions


def _loop_curves(clip: torch.Tensor, saliency: torch.Tensor, steps: int, score) -> tuple[list[float], list[float]]:
    """Temporal deletion and insertion written from the formula: frames sorted by their share (largest first,
    ties by position), the first k of them replaced by the clip's mean frame (deletion) or kept in a clip of mean
    frames (insertion), for k = round(i T / n), i = 0..n, n = min(steps, T)."""
    count = clip.shape[1]
    shares = [float(saliency[t].double().sum()) for t in range(count)]
    order = sorted(range(count), key=lambda t: (-shares[t], t))
    mean = clip.mean(dim=1)
    n = min(steps, count)
    deletion, insertion = [], []
    for i in range(n + 1):
        chosen = set(order[: round(i * count / n)])
        deleted, inserted = clip.clone(), clip.clone()
        for t in range(count):
            if t in chosen:
                deleted[:, t] = mean
            else:
                inserted[:, t] = mean
        deletion.append(score(deleted))
        insertion.append(score(inserted))
    return deletion, insertion


@pytest.mark.quick
@pytest.mark.parametrize("steps", [3, 8, 50])
def test_temporal_curves_follow_the_formula(steps):
    generator = torch.Generator().manual_seed(0)
    clip = torch.rand(3, 8, 5, 6, generator=generator)
    saliency = torch.rand(8, 5, 6, generator=generator)
    saliency[5] = saliency[2]  # a tie between frames 2 and 5: the earlier first
    weights = torch.rand(3, 8, 5, 6, generator=generator)

    def score(copy: torch.Tensor) -> float:
        return float(torch.sigmoid((copy * weights).sum() - 100))

    expected = _loop_curves(clip, saliency, steps, score)
    got = measure_in_time(clip, saliency, steps, score(clip), lambda copies: [score(c) for c in copies])
    assert got[0] == pytest.approx(expected[0], abs=1e-6) and got[1] == pytest.approx(expected[1], abs=1e-6)
    assert len(got[0]) == min(steps, 8) + 1


@pytest.mark.quick
def test_faithfulness_correlation_of_a_clip_removes_random_voxels():
    """A clip's subsets are of its T x H x W voxels: with a linear score, each run's drop is the sum of its removed
    voxels' weights over the channels, computed here voxel by voxel, and a map of those weights correlates 1."""
    generator = torch.Generator().manual_seed(1)
    clip = torch.rand(3, 4, 5, 6, generator=generator)
    weights = torch.rand(3, 4, 5, 6, generator=generator)

    def score(copy: torch.Tensor) -> float:
        return float((copy * weights).sum())

    def scores(jobs, build):
        return (score(build(job)) for job in jobs)

    options = EvalOptions(correlation=True, correlation_runs=12, correlation_subset=9, seed=5)
    measured = correlation_drops(clip, score(clip), options, scores)
    assert measured is not None
    subsets, drops = measured
    assert subsets.shape == (12, 9) and int(subsets.max()) < 4 * 5 * 6
    for run, subset in enumerate(subsets.tolist()):
        expected = 0.0
        for voxel in subset:
            t, rest = divmod(voxel, 5 * 6)
            y, x = divmod(rest, 6)
            expected += float((clip[:, t, y, x] * weights[:, t, y, x]).sum())
        assert float(drops[run]) == pytest.approx(expected, rel=1e-5)
    faithful = (clip * weights).sum(0)
    assert faithfulness_correlation(faithful, subsets, drops) == pytest.approx(1.0, abs=1e-9)


@pytest.mark.quick
def test_clips_start_as_the_clip_runner_starts_them():
    assert clip_starts(40, 32, 32) == [0, 8]  # side by side, and one ending on the last frame
    assert clip_starts(40, 32, 8) == [0, 8]
    assert clip_starts(64, 32, 32) == [0, 32]
    assert clip_starts(10, 32, 32) == [0]  # shorter than a clip: one, its last frame repeated
    assert clip_starts(50, 16, 20) == [0, 20, 34]


# --- the known answer ----------------------------------------------------------------------------------------------

RED_FRAMES, GREEN_FRAMES, LATE_GREEN = range(2, 4), range(5, 7), range(11, 13)
RED_AT, GREEN_AT = (4, 10), (10, 2)
"""Frames (of 16, at the network's 16 x 16) and (y, x) of the squares: clip 0 shows both, clip 1 the green one."""


def _frame(number: int) -> np.ndarray:
    frame = np.full((SIDE, SIDE, 3), 128, np.uint8)
    for frames, (y, x), colour in (
        (RED_FRAMES, RED_AT, RED),
        (GREEN_FRAMES, GREEN_AT, GREEN),
        (LATE_GREEN, GREEN_AT, GREEN),
    ):
        if number in frames:
            frame[y : y + SQUARE, x : x + SQUARE] = colour
    return frame


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    spec = InputSpec(size=SIDE, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), shape=(3, T, SIDE, SIDE))
    return LoadedModel(trained(), "tiny3d", "trained", CLASSES, spec)


@pytest.fixture(scope="module")
def frames_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 16 frames as lossless PNGs, read as one video of two clips."""
    folder = tmp_path_factory.mktemp("clips") / "squares"
    folder.mkdir()
    for number in range(16):
        Image.fromarray(_frame(number)).save(folder / f"frame{number}.png")
    return folder


def _clip(start: int) -> torch.Tensor:
    """The (3, T, H, W) input of the clip of frames ``start`` to ``start + T``, from the frames themselves."""
    planes = [torch.from_numpy(_frame(number)).permute(2, 0, 1).float() / 255 for number in range(start, start + T)]
    return torch.stack(planes, dim=1)


@pytest.mark.slow
def test_grad_cams_temporal_deletion_falls_faster_than_a_random_maps_on_a_trained_3d_cnn(tiny, frames_folder):
    explainer = Explainer(tiny, "3", ["gradcam", "randomcam"])
    evaluator = evaluator_for(explainer, EvalOptions(steps=8))
    assert isinstance(evaluator, ClipEvaluator)
    report = evaluator.run([frames_folder])
    assert not report.failed
    assert [image.image for image in report.ok] == [f"{frames_folder}#clip0", f"{frames_folder}#clip1"]
    first, second = report.ok
    assert (first.target.name, second.target.name) == ("red", "green")
    gradcam, random = first.methods["gradcam"], first.methods["randomcam"]
    # the known answer: the red square's two frames go first, and the probability of red with them
    assert gradcam.temporal_deletion_auc < random.temporal_deletion_auc - 0.1, (gradcam, random)
    assert gradcam.temporal_insertion_auc > random.temporal_insertion_auc

    model = trained()
    clip = _clip(0)

    def probability(copy: torch.Tensor) -> float:
        with torch.no_grad():
            return float(model(copy[None]).softmax(dim=1)[0, first.target.index])

    # the temporal curves, from Grad-CAM's map by its formula on autograd's gradients, and a loop
    a, g, top = captured(model, model[3], clip[None])
    assert top == first.target.index
    saliency = resized(REFERENCES["gradcam"](a, g), (T, SIDE, SIDE)).float()
    deletion, insertion = _loop_curves(clip, saliency, 8, probability)
    assert gradcam.temporal_deletion == pytest.approx(deletion, abs=1e-5)
    assert gradcam.temporal_insertion == pytest.approx(insertion, abs=1e-5)
    assert gradcam.temporal_deletion_auc == pytest.approx(auc(deletion), abs=1e-6)

    # spatio-temporal deletion: the voxels, most salient first, set to 0 in eight equal steps
    [explained] = Explainer(tiny, "3", ["gradcam"]).explain_batch(clip[None], [(T, SIDE, SIDE)])
    voxels = explained.explanations[0].saliency.flatten()
    order = sorted(range(voxels.numel()), key=lambda i: (-float(voxels[i]), i))
    expected = []
    for step in range(9):
        kept = torch.ones(voxels.numel())
        kept[order[: round(step * voxels.numel() / 8)]] = 0
        expected.append(probability(clip * kept.view(1, T, SIDE, SIDE)))
    assert gradcam.deletion[1:] == pytest.approx(expected[1:], abs=1e-5)
    assert gradcam.deletion[0] == pytest.approx(expected[0], abs=1e-5)


@pytest.mark.slow
def test_rank_on_clips_ranks_the_frames_curves_and_reruns_clips_by_name_for_the_seed_spread(tiny, frames_folder):
    explainer = Explainer(tiny, "3", ["gradcam", "randomcam"])
    options = rank_options(explainer, EvalOptions(steps=8, sanity_layers=2))
    assert options.sanity and options.stability and not options.road  # --rank's ROAD is left out on clips
    evaluator = evaluator_for(explainer, options)
    report = evaluator.run([frames_folder])
    assert not report.failed and all(len(s.sanity) == 2 for i in report.ok for s in i.methods.values())
    rows = {(row.metric, row.method): row for row in rank(report, 0)}
    assert rows[("temporal_deletion_auc", "gradcam")].mean < rows[("temporal_deletion_auc", "randomcam")].mean
    assert rows[("temporal_deletion_auc", "gradcam")].better == "lower"
    expected = np.mean([image.methods["gradcam"].temporal_insertion_auc for image in report.ok])
    assert rows[("temporal_insertion_auc", "gradcam")].mean == pytest.approx(expected)
    spread = seed_spread(evaluator, report)  # the clips re-run by their names, with other seeds
    assert spread["randomcam"]["temporal_deletion_auc"] > 0  # its noise moves with the seed
    assert spread.get("gradcam", {}).get("temporal_deletion_auc", 0.0) == pytest.approx(0.0, abs=1e-9)
    again = evaluator.evaluate_image(Path(f"{frames_folder}#clip1"))
    assert again.methods["gradcam"].temporal_deletion == pytest.approx(
        report.ok[1].methods["gradcam"].temporal_deletion
    )
    missing = evaluator.evaluate_image(Path(f"{frames_folder}#clip7"))
    assert missing.error == f"{frames_folder}#clip7: no such clip (2 in {frames_folder})"


# --- the command line ---------------------------------------------------------------------------------------------

WALK = 20


def _walk(number: int) -> np.ndarray:
    frame = np.full((48, 64, 3), 120, np.uint8)
    frame[10:30, 2 + number : 22 + number] = (30, 40, 220)
    return frame


def run(*args: str | Path) -> object:
    return CliRunner().invoke(app, [str(a) for a in args])


def test_gradcam_eval_measures_each_clip_of_a_video_in_time(tmp_path):
    video = write_video(tmp_path / "walk.mp4", WALK, 10.0, (64, 48), _walk)
    common = ["-m", "mc3_18", "--weights", "none", "--input-size", "32", "--steps", "4"]
    result = run(video, *common, "--json")
    assert result.exit_code == EXIT_OK, result.output
    report = json.loads(result.stdout)
    # 16 frames at 15 fps of a 10 fps video: a span of 11 frames; clips at 0, then one ending on frame 20
    assert [row["image"] for row in report["per_image"]] == [f"{video}#clip0", f"{video}#clip1"]
    measured = report["per_image"][0]["methods"]["gradcam"]
    assert len(measured["temporal_deletion_curve"]) == 5 and len(measured["deletion_curve"]) == 5
    assert measured["temporal_deletion_auc"] == pytest.approx(auc(measured["temporal_deletion_curve"]))
    summary = report["methods"]["gradcam"]
    assert summary["temporal_deletion_auc"] == pytest.approx(
        np.mean([row["methods"]["gradcam"]["temporal_deletion_auc"] for row in report["per_image"]])
    )
    table = run(video, *common)
    assert table.exit_code == EXIT_OK and "frames deletion AUC" in table.stdout
    refused = run(video, *common, "--road")
    assert refused.exit_code == EXIT_USAGE
    message = "error: --road imputes an image's pixels; a video model's clips are measured without it"
    assert refused.stderr.strip().splitlines()[-1] == message


def test_gradcam_eval_reads_a_folder_of_frames_at_its_frame_rate(tmp_path):
    folder = tmp_path / "walk"
    folder.mkdir()
    for number in range(WALK):
        Image.fromarray(_walk(number)[:, :, ::-1]).save(folder / f"{number}.png")
    common = ["-m", "mc3_18", "--weights", "none", "--input-size", "32", "--steps", "2", "--json"]
    names = {}
    for rate in ("10", None):
        result = run(folder, *common, *(["--fps", rate] if rate else []))
        assert result.exit_code == EXIT_OK, result.output
        names[rate] = [row["image"] for row in json.loads(result.stdout)["per_image"]]
    # at 10 fps a clip spans 11 of the 20 frames: two clips; at the default 25, 27 frames: one, its last frame repeated
    assert names == {"10": [f"{folder}#clip0", f"{folder}#clip1"], None: [f"{folder}#clip0"]}
    refused = run(folder, "-m", "resnet18", "--weights", "none", "--fps", "10")
    assert refused.exit_code == EXIT_USAGE
    message = "--fps is the frame rate of a folder of frames given to a video model; resnet18 takes images"
    assert refused.stderr.strip().splitlines()[-1] == f"error: {message}"
