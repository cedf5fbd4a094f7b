"""``gradcam eval --rank --report DIR``'s rows file, one row per (image, method) as each finishes: Ctrl-C part-way
through an image keeps its finished methods (in the file and in the partial table, exit 130), ``--skip-existing``
computes only the missing (image, method) pairs and ends with the uninterrupted run's table; a rows file of the
older kind (one line per image) still resumes. And the methods that share a pass give the same figures as each
method explained alone, and are timed together by the plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from square_model import square_image
from typer.testing import CliRunner

from gradcam_cli.cam.explainer import Explainer
from gradcam_cli.cam.results import Prediction
from gradcam_cli.cli.eval import app
from gradcam_cli.cli.ranking import MethodSteps
from gradcam_cli.evaluation import evaluate, plan
from gradcam_cli.evaluation.evaluate import Evaluator
from gradcam_cli.evaluation.plan import SEED_RERUNS
from gradcam_cli.evaluation.rank import format_ranking, rank
from gradcam_cli.evaluation.report import EvalReport, ImageScores, MethodScores
from gradcam_cli.evaluation.shared import pass_groups
from gradcam_cli.options import EvalOptions

SQUARE_MODEL = f"{Path(__file__).resolve().parents[1] / 'square_model.py'}:build"
PLACES = [(8, 8, 28, 28), (30, 30, 50, 50), (10, 36, 30, 56)]


def run(*args: str):
    return CliRunner().invoke(app, [*args], catch_exceptions=False)  # gradcam eval ARGS


def json_rows(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


@pytest.fixture
def squares(tmp_path: Path) -> Path:
    folder = tmp_path / "in"
    folder.mkdir()
    for i, corners in enumerate(PLACES):
        square_image((64, 64), corners).save(folder / f"square{i}.png")
    return folder


def common(folder: Path, page: Path) -> list[str]:
    return [
        str(folder),
        *("--model", SQUARE_MODEL, "--layer", "features", "--steps", "4", "--sanity-layers", "1"),
        *("--input-size", "32", "--rank", "--method", "gradcam,layercam", "--json", "--report", str(page)),
    ]


@pytest.mark.slow
def test_ctrl_c_keeps_each_finished_image_method_and_skip_existing_computes_only_the_rest(
    squares: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = run(*common(squares, tmp_path / "whole"))  # the uninterrupted run, to compare with
    assert whole.exit_code == 0, whole.output
    page = tmp_path / "page"
    begun = MethodSteps.method

    def interrupted(self: MethodSteps, name: str) -> None:  # Ctrl-C as the 5th (image, method) begins: the plan's
        interrupted.calls += 1  # type: ignore[attr-defined]  # sample evaluated image 1's gradcam and randomcam
        if interrupted.calls == 3:  # type: ignore[attr-defined]
            raise KeyboardInterrupt
        begun(self, name)

    interrupted.calls = 0  # type: ignore[attr-defined]
    monkeypatch.setattr(MethodSteps, "method", interrupted)
    stopped = run(*common(squares, page))
    assert stopped.exit_code == 130, stopped.output
    first, second = str(squares / "square0.png"), str(squares / "square1.png")
    lines = (page / "rows.jsonl").read_text().splitlines()
    written = [(row["image"], *row["methods"]) for row in map(json.loads, lines[1:])]
    # image 1's three methods (the plan's sample first), then image 2's first: the method in hand (layercam on
    # image 2) is not written
    assert written == [(first, "gradcam"), (first, "randomcam"), (first, "layercam"), (second, "gradcam")]
    partial = {(row["metric"], row["method"]): row for row in json_rows(stopped.stdout)}
    assert partial[("deletion_auc", "gradcam")]["images"] == 2  # the image in hand's finished method is ranked
    assert set(partial[("deletion_auc", "gradcam")]["per_image"]) == {first, second}
    assert partial[("deletion_auc", "layercam")]["images"] == partial[("deletion_auc", "randomcam")]["images"] == 1
    assert "interrupted: the ranking of the 4 (image, method) result(s) finished, on 2 image(s)" in stopped.stderr

    # the file as an older version wrote it, one line per finished image (image 1 whole), resumes the same way
    settings, *rows = (json.loads(line) for line in lines)
    rows[:3] = [rows[0], rows[2], rows[1]]  # the methods' order
    older = {**rows[0], "methods": {k: v for row in rows[:3] for k, v in row["methods"].items()}}
    (page / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in [settings, older, rows[3]]) + "\n")

    monkeypatch.setattr(MethodSteps, "method", begun)
    computed: list[tuple[str, str]] = []
    paths: list[Path] = []
    scored, evaluate_image = Evaluator._method_scores, Evaluator.evaluate_image

    def counted(self: Evaluator, *args):  # type: ignore[no-untyped-def]
        if self.options.seed == 0:  # not the seed spread's re-runs
            computed.append((paths[-1].name, args[2]))
        return scored(self, *args)

    monkeypatch.setattr(Evaluator, "_method_scores", counted)
    monkeypatch.setattr(
        Evaluator,
        "evaluate_image",
        lambda self, path, boxes=(): paths.append(path) or evaluate_image(self, path, boxes),
    )
    resumed = run(*common(squares, page), "--skip-existing")
    assert resumed.exit_code == 0, resumed.output
    assert computed == [  # image 2's randomcam first: the plan's sample
        ("square1.png", "randomcam"),
        ("square1.png", "layercam"),
        ("square2.png", "gradcam"),
        ("square2.png", "layercam"),
        ("square2.png", "randomcam"),
    ]
    assert json_rows(resumed.stdout) == json_rows(whole.stdout)  # the uninterrupted run's table, value for value
    kept = [json.loads(line) for line in (page / "rows.jsonl").read_text().splitlines()[1:]]
    assert len([row for row in kept if "seed_run" not in row]) == 1 + 1 + 5
    assert len([row for row in kept if "seed_run" in row]) == SEED_RERUNS * 3 * 3  # the seed spread's, kept too


SHARED = "gradcam,gradcam++,layercam,xgradcam,hirescam,eigencam,scorecam"


@pytest.mark.slow
def test_methods_sharing_a_pass_score_as_each_method_alone(
    squares: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--rank --json`` (curves, ROAD, stability, the cascade, the boxes of the explained and of another class)
    with the shared passes equals the run that explains one method at a time, value for value."""
    assert pass_groups(["gradcam", "eigencam", "scorecam"]) == {
        "gradcam": ("gradcam", "eigencam"),
        "eigencam": ("gradcam", "eigencam"),
        "scorecam": ("scorecam",),
    }
    boxes = tmp_path / "boxes.csv"
    boxes.write_text(
        "image,x1,y1,x2,y2,class\nsquare0.png,8,8,28,28,red\nsquare0.png,40,40,60,60,green\n"
        "square1.png,30,30,50,50,red\n",
        encoding="utf-8",
    )
    args = [str(squares), "--model", SQUARE_MODEL, "--layer", "features", "--steps", "4", "--sanity-layers", "2"]
    args += ["--input-size", "32", "--rank", "--method", SHARED, "--json", "--boxes", str(boxes)]
    shared = run(*args)
    assert shared.exit_code == 0, shared.output
    monkeypatch.setattr(evaluate, "pass_groups", lambda methods: {m: (m,) for m in methods})
    alone = run(*args)
    assert alone.exit_code == 0, alone.output
    rows = json_rows(shared.stdout)
    assert {row["metric"] for row in rows} >= {"deletion_auc", "road", "stability", "sanity", "pointing", "energy"}
    assert rows == json_rows(alone.stdout)


@pytest.mark.quick
def test_a_part_finished_image_counts_for_its_finished_methods_only() -> None:
    """The ranking of an interrupted run: the image in hand counts for the methods finished on it, each paired
    comparison over the images both finished; the others' figures are those of the whole images alone."""

    def image(name: str, values: dict[str, float]) -> ImageScores:
        scores = {m: MethodScores([v, v], [1 - v, 1 - v], 0.0) for m, v in values.items()}
        return ImageScores(name, Prediction(0, "red", 0.9), scores)

    whole = [image("a.png", {"gradcam": 0.1, "randomcam": 0.5}), image("b.png", {"gradcam": 0.2, "randomcam": 0.4})]
    partial = EvalReport(
        "m", ["l"], ["gradcam", "randomcam"], EvalOptions(), [], [*whole, image("c", {"gradcam": 0.9})]
    )
    complete = EvalReport("m", ["l"], ["gradcam", "randomcam"], EvalOptions(), [], whole)
    rows = {row.method: row for row in rank(partial) if row.metric == "deletion_auc"}
    before = {row.method: row for row in rank(complete) if row.metric == "deletion_auc"}
    assert rows["gradcam"].images == 3 and rows["gradcam"].mean == pytest.approx(0.4)
    assert rows["randomcam"] == before["randomcam"]
    assert rows["gradcam"].vs_random == before["gradcam"].vs_random == pytest.approx(-0.3)  # over a and b only
    assert "deletion AUC (lower is better; 2-3 image(s))" in "\n".join(format_ranking(rank(partial)))
    assert partial.summary("randomcam")["images"] == 2


def test_the_plan_times_the_methods_sharing_a_pass_together(square_model, monkeypatch: pytest.MonkeyPatch) -> None:
    timed: list[tuple[str, ...]] = []
    monkeypatch.setattr(plan, "_timed", lambda _explainer, methods, _inputs: timed.append(methods) or 3.0)
    explainer = Explainer(square_model, "features", ["gradcam", "layercam", "scorecam", "randomcam"])
    seconds = plan.estimate(explainer, torch.rand(1, 3, 32, 32), EvalOptions(steps=4)).seconds
    assert timed == [("gradcam", "layercam", "randomcam"), ("scorecam",)]
    assert seconds["gradcam"] == seconds["layercam"] == pytest.approx(seconds["scorecam"] - 3.0 + 1.0)  # 3 s shared
