"""``gradcam eval --rank``'s plan against the run it plans (issue 41), on a fake clock: every call of ROAD's
imputation advances it 10 s and nothing else does, so the plan's arithmetic is checked exactly, never a machine's
speed. The plan measures a sample of the real work (ROAD's imputation and the seed spread included), counts only
what ``--skip-existing`` has left, never ranks randomcam alone, and is printed beside the time taken; Ctrl-C during
the seed spread prints the table of what finished and keeps the spread's rows for the resume."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from square_model import square_image
from typer.testing import CliRunner

from gradcam_cli.cli.eval import app
from gradcam_cli.cli.ranking import MethodSteps
from gradcam_cli.evaluation import evaluate
from gradcam_cli.evaluation.evaluate import Evaluator
from gradcam_cli.evaluation.meta import META_PERTURBATIONS
from gradcam_cli.evaluation.plan import SEED_RERUNS, Costs, choose
from gradcam_cli.options import EvalOptions

SQUARE_MODEL = f"{Path(__file__).resolve().parents[1] / 'square_model.py'}:build"
PLACES = [(8, 8, 28, 28), (30, 30, 50, 50), (10, 36, 30, 56)]
IMPUTATION = 10.0
"""Fake seconds one call of ROAD's imputation (one map's 18 images) takes."""


def run(*args: str):
    return CliRunner().invoke(app, [*args], catch_exceptions=False)  # gradcam eval ARGS


@pytest.fixture
def squares(tmp_path: Path) -> Path:
    folder = tmp_path / "in"
    folder.mkdir()
    for i, corners in enumerate(PLACES):
        square_image((64, 64), corners).save(folder / f"square{i}.png")
    return folder


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """A clock that only ROAD's imputation advances (and every reading by a nanosecond, to stay increasing)."""
    now = [0.0]

    def perf_counter() -> float:
        now[0] += 1e-9
        return now[0]

    impute = evaluate.impute

    def slow_impute(*args, **kwargs):  # type: ignore[no-untyped-def]
        now[0] += IMPUTATION
        return impute(*args, **kwargs)

    monkeypatch.setattr("time.perf_counter", perf_counter)
    monkeypatch.setattr(evaluate, "impute", slow_impute)
    return now


def common(folder: Path, *more: str) -> list[str]:
    return [
        str(folder),
        *("--model", SQUARE_MODEL, "--layer", "features", "--steps", "4", "--sanity-layers", "1"),
        *("--input-size", "32", "--rank", *more),
    ]


def planned_and_taken(stderr: str) -> tuple[float, float, float]:
    """The plan's total, and the closing line's time taken and the plan it quotes."""
    total = float(re.search(r"plan: .* about (\d+)s in all", stderr)[1])  # type: ignore[index]
    taken, said = re.search(r"in ([\d.]+)s \(the plan said about ([\d.]+)s", stderr).groups()  # type: ignore[union-attr]
    return total, float(taken), float(said)


@pytest.mark.quick
def test_the_plan_counts_roads_imputation_and_the_seed_spread(squares: Path, clock: list[float]) -> None:
    result = run(*common(squares, "--method", "gradcam,layercam,scorecam"))
    assert result.exit_code == 0, result.output
    # per image: gradcam, layercam, scorecam 1 map each, randomcam 4: 7 imputations; 3 images, then 2 x 3 re-runs
    taken = 7 * (3 + SEED_RERUNS * 3) * IMPUTATION
    total, measured, said = planned_and_taken(result.stderr)
    assert measured == pytest.approx(taken, abs=0.1) and clock[0] == pytest.approx(taken, abs=0.1)
    assert total == pytest.approx(taken, abs=1) and said == pytest.approx(taken, abs=0.1)
    assert f"the seed spread re-runs 3 image(s) with {SEED_RERUNS} other seeds (~{7 * 6 * IMPUTATION:.0f}s" in (
        result.stderr
    )
    assert "scorecam ~10.0s" in result.stderr and "randomcam ~40.0s" in result.stderr  # one map's scoring: 10 s


@pytest.mark.quick
def test_budget_needs_rank(squares: Path) -> None:
    for more in ((), ("--prompt", "what is it ?")):  # a question's deletion and insertion plan nothing either
        result = run(str(squares), "--model", SQUARE_MODEL, "--budget", "10", *more)
        assert result.exit_code == 2 and result.stderr.strip().splitlines() == [
            "error: --budget is for --rank: add --rank (gradcam eval plans nothing otherwise)"
        ]


def test_a_budget_that_fits_only_the_baseline_keeps_the_cheapest_method(squares: Path, clock: list[float]) -> None:
    result = run(*common(squares, "--method", "gradcam,layercam,scorecam", "--budget", "1", "--json"))
    assert result.exit_code == 0, result.output
    ranked = {json.loads(line)["method"] for line in result.stdout.splitlines() if line.startswith("{")}
    assert ranked == {"randomcam", "gradcam"}  # never the baseline alone
    assert "the 1s budget fits only the randomcam baseline, which ranks nothing alone: kept gradcam" in result.stderr
    assert "the seed spread re-runs 1 image(s)" in result.stderr  # cut down first
    left_out = next(line for line in result.stderr.splitlines() if "left out to fit" in line)
    assert "layercam ~" in left_out and "scorecam ~" in left_out
    assert left_out.endswith("raise --budget SECONDS") and "name them with --method" not in left_out  # named
    # plan and time taken agree: 3 images x (gradcam 1 + randomcam 4), then 2 re-runs of 1 image
    total, measured, _ = planned_and_taken(result.stderr)
    assert measured == pytest.approx(5 * (3 + SEED_RERUNS) * IMPUTATION, abs=0.1) and total == pytest.approx(
        measured, abs=1
    )


@pytest.mark.quick
def test_choose_cuts_the_seed_spread_before_forcing_a_method() -> None:
    costs = Costs({"gradcam": 10.0, "randomcam": 40.0}, {"gradcam": 10.0, "randomcam": 40.0})
    plan = choose(costs, 3, 300.0, seed_images=3)  # 3 x 50 + 2 x 3 x 50 = 450 s: only with 1 image re-run
    assert plan.kept == ["gradcam", "randomcam"] and plan.seed_images == 1 and plan.forced is None
    assert plan.total() == pytest.approx(3 * 50 + SEED_RERUNS * 50)
    whole = choose(costs, 3, 450.0, seed_images=3)
    assert whole.seed_images == 3 and whole.total() == pytest.approx(450)
    done = choose(costs, 3, None, seed_images=3, done={"gradcam": 2, "randomcam": 2})
    assert done.total() == pytest.approx(50 + SEED_RERUNS * 3 * 50)  # only the pairs left


@pytest.mark.quick
def test_choose_cuts_the_seed_spread_to_keep_more_methods() -> None:
    """A method left out at the full spread is kept where re-running fewer images makes room (issue 41: the
    Grad-CAM family on 3 photos in the default budget); with nothing left out the spread stays whole."""
    seconds = {"gradcam": 10.0, "layercam": 10.0, "hirescam": 10.0, "randomcam": 40.0}
    costs = Costs(seconds, dict(seconds))
    # 3 images and a spread of s images: each method costs its seconds x (3 + 2 s); all four: 70 x (3 + 2 s)
    full = choose(costs, 3, 480.0, seed_images=3)  # s = 3 keeps gradcam (450), s = 2 layercam too (420), s = 1 all
    assert full.seed_images == 1 and full.kept == ["gradcam", "layercam", "hirescam", "randomcam"]
    assert full.total() == pytest.approx(5 * 70) and not full.left_out
    two = choose(costs, 3, 500.0, seed_images=3)  # s = 2 fits all four (490): the finest spread that does
    assert two.seed_images == 2 and not two.left_out and two.total() == pytest.approx(7 * 70)
    roomy = choose(costs, 3, 630.0, seed_images=3)  # 9 x 70: everything at the full spread
    assert roomy.seed_images == 3 and not roomy.left_out
    tight = choose(costs, 3, 299.0, seed_images=3)  # s = 1: 200 + 50 = 250 keeps gradcam, not layercam (300)
    assert tight.seed_images == 1 and tight.kept == ["gradcam", "randomcam"] and tight.forced is None


def test_skip_existing_plans_only_what_is_left_and_the_warning_counts_as_the_table(
    squares: Path, tmp_path: Path, clock: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    page = tmp_path / "page"
    begun = MethodSteps.method

    def interrupted(self: MethodSteps, name: str) -> None:  # Ctrl-C as layercam begins on image 3
        if self.image_number == 3 and name == "layercam":
            raise KeyboardInterrupt
        begun(self, name)

    monkeypatch.setattr(MethodSteps, "method", interrupted)
    stopped = run(*common(squares, "--method", "gradcam,layercam", "--report", str(page)))
    assert stopped.exit_code == 130, stopped.output
    assert "deletion AUC (lower is better; 2-3 image(s))" in stopped.stdout
    assert "warning: only 2-3 image(s):" in stopped.stdout  # as the table counts them
    monkeypatch.setattr(MethodSteps, "method", begun)
    resumed = run(*common(squares, "--method", "gradcam,layercam", "--report", str(page), "--skip-existing"))
    assert resumed.exit_code == 0, resumed.output
    # left: layercam and randomcam on image 3 (1 + 4 imputations), then the seed spread: 2 x 3 images x 6
    total, measured, _ = planned_and_taken(resumed.stderr)
    assert measured == pytest.approx((5 + SEED_RERUNS * 3 * 6) * IMPUTATION, abs=0.1)
    assert total == pytest.approx(measured, abs=1)


def test_resuming_where_the_plans_sample_is_already_done_plans_from_the_passes(
    squares: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupted twice on image 3's layercam: the second run's sample (gradcam and randomcam) finished image 3's
    randomcam, so the third run's sample has nothing left to time on that image: it plans the scoring from the
    forward passes instead (it failed with a traceback)."""
    page = tmp_path / "page"
    begun = MethodSteps.method

    def interrupted(self: MethodSteps, name: str) -> None:
        if self.image_number == 3 and name == "layercam":
            raise KeyboardInterrupt
        begun(self, name)

    monkeypatch.setattr(MethodSteps, "method", interrupted)
    args = common(squares, "--method", "gradcam,layercam", "--report", str(page), "--budget", "100000")
    assert run(*args).exit_code == 130
    assert run(*args, "--skip-existing").exit_code == 130
    rows = [json.loads(line) for line in (page / "rows.jsonl").read_text().splitlines()[1:]]
    assert [list(r["methods"]) for r in rows if r["image"].endswith("square2.png")] == [["gradcam"], ["randomcam"]]
    monkeypatch.setattr(MethodSteps, "method", begun)
    resumed = run(*args, "--skip-existing")
    assert resumed.exit_code == 0, resumed.output
    assert re.search(r"plan: 3 method\(s\) on 3 image\(s\), about \d+s in all", resumed.stderr)


def test_ctrl_c_in_the_seed_spread_prints_the_table_and_keeps_its_rows(
    squares: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = tmp_path / "page"
    original, reruns = Evaluator.evaluate_image, []

    def interrupted(self, path, boxes=()):  # type: ignore[no-untyped-def]  # Ctrl-C on the spread's 2nd image
        if self.options.seed != 0:
            reruns.append(path.name)
            if len(reruns) == 2:
                raise KeyboardInterrupt
        return original(self, path, boxes)

    monkeypatch.setattr(Evaluator, "evaluate_image", interrupted)
    stopped = run(*common(squares, "--method", "gradcam", "--report", str(page), "--json"))
    assert stopped.exit_code == 130, stopped.output
    assert "interrupted during the seed spread: the ranking without it" in stopped.stderr
    assert "add --skip-existing to resume" in stopped.stderr
    rows = [json.loads(line) for line in stopped.stdout.splitlines() if line.startswith("{")]
    assert {row["method"] for row in rows} == {"gradcam", "randomcam"} and {row["images"] for row in rows} == {3}
    kept = [json.loads(line) for line in (page / "rows.jsonl").read_text().splitlines()[1:]]
    spread = [(row["seed_run"], Path(row["image"]).name, *row["methods"]) for row in kept if "seed_run" in row]
    assert spread == [(1, "square0.png", "gradcam"), (1, "square0.png", "randomcam")]
    reruns.clear()
    monkeypatch.setattr(
        Evaluator,
        "evaluate_image",
        lambda self, path, boxes=(): (
            (self.options.seed != 0 and reruns.append(path.name)) or original(self, path, boxes)
        ),
    )
    resumed = run(*common(squares, "--method", "gradcam", "--report", str(page), "--skip-existing", "--json"))
    assert resumed.exit_code == 0, resumed.output
    assert reruns == ["square1.png", "square2.png", "square0.png", "square1.png", "square2.png"]  # not square0 again
    assert any(json.loads(line)["seed_sd"] for line in resumed.stdout.splitlines() if line.startswith("{"))


@pytest.mark.quick
def test_the_plan_counts_the_meta_evaluations_scorings(squares: Path, clock: list[float]) -> None:
    result = run(*common(squares, "--method", "gradcam,layercam", "--meta"))
    assert result.exit_code == 0, result.output
    total, measured, _ = planned_and_taken(result.stderr)
    # per image: gradcam, layercam and randomcam's 4 draws, 6 maps, each scored once and again on every noisy copy
    # that keeps the class (all of them, here) and on the randomised model where it changes the class; the seed
    # spread re-runs without the meta-evaluation: 6 maps x 2 x 3
    rerun = 6 * SEED_RERUNS * 3 * IMPUTATION
    assert 6 * (1 + META_PERTURBATIONS) * 3 * IMPUTATION + rerun <= measured
    assert measured <= 6 * (2 + META_PERTURBATIONS) * 3 * IMPUTATION + rerun
    assert total == pytest.approx(measured, rel=0.05)
    # of the total, the meta-evaluation's share on the images still to run after the plan's sample (the first
    # image's gradcam and randomcam): 2 x (1 + 4) + 3 maps, scored again 5 or 6 times
    checks = float(re.search(r"--meta take ~(\d+)s of it", result.stderr)[1])  # type: ignore[index]
    assert 13 * META_PERTURBATIONS * IMPUTATION <= checks <= 13 * (1 + META_PERTURBATIONS) * IMPUTATION


@pytest.mark.quick
def test_the_plan_costs_arcc_random_logit_and_mprt_by_their_explanations(
    square_model, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gradcam_cli import Explainer
    from gradcam_cli.evaluation import plan
    from gradcam_cli.evaluation.shared import pass_groups

    monkeypatch.setattr(plan, "_timed", lambda explainer, methods, inputs: 1.0)  # one pass: 1 s
    monkeypatch.setattr(plan, "_forward_scoring", lambda explainer, inputs, options: 0.0)
    explainer = Explainer(square_model, "features", ["gradcam", "layercam"])
    group = len(pass_groups(("gradcam", "layercam"))["gradcam"])
    inputs = torch.zeros(1, 3, 16, 16)
    bare = EvalOptions(sanity=True, sanity_layers=2)
    assert plan.estimate(explainer, inputs, bare).seconds["gradcam"] == pytest.approx(3 / group)  # image + 2 stages
    options = EvalOptions(sanity=True, sanity_layers=2, arcc=True, random_logit=True, mprt=True, mprt_samples=3)
    costs = plan.estimate(explainer, inputs, options)
    share = 1 / group
    # --random-logit: 1 explanation; --mprt: 1 + 2 x 3 (shared pass); --arcc: 1 of its own pass
    assert costs.checks["gradcam"] == pytest.approx(share * (1 + 1 + 2 * 3) + 1.0)
    assert costs.seconds["gradcam"] == pytest.approx(share * 3 + costs.checks["gradcam"])
    assert costs.rerun["gradcam"] == pytest.approx(costs.seconds["gradcam"] - share * 2)  # no cascade in the spread
