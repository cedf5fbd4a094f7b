"""``gradcam eval --rank``'s seed spread: a few images re-run with other seeds (RISE's masks, randomcam's and ROAD's
noise, stability's copies), each method's spread reported beside the intervals: exactly 0 where nothing it measures
draws noise, above 0 where something does; and its cost stated in the plan."""

from __future__ import annotations

import json
from pathlib import Path

from square_model import square_image
from typer.testing import CliRunner

from gradcam_cli.cam.results import Prediction
from gradcam_cli.cli.eval import app
from gradcam_cli.evaluation.plan import SEED_RERUNS, rerun_images
from gradcam_cli.evaluation.rank import format_ranking, rank
from gradcam_cli.evaluation.rank_page import write_rank_report
from gradcam_cli.evaluation.report import EvalReport, ImageScores, MethodScores
from gradcam_cli.options import EvalOptions

SQUARE_MODEL = f"{Path(__file__).resolve().parents[1] / 'square_model.py'}:build"


def test_rank_reports_each_methods_seed_spread(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    for i, corners in enumerate([(8, 8, 28, 28), (30, 30, 50, 50)]):
        square_image((64, 64), corners).save(folder / f"square{i}.png")
    args = [str(folder), "--model", SQUARE_MODEL, "--layer", "features", "--steps", "4", "--sanity-layers", "1"]
    args += ["--input-size", "32", "--rank", "--method", "gradcam,rise", "--rise-masks", "40", "--json"]
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert f"the seed spread re-runs 2 image(s) with {SEED_RERUNS} other seeds" in result.stderr  # in the plan
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    spread = {(row["method"], row["metric"]): row["seed_sd"] for row in rows}
    for metric in ("deletion_auc", "insertion_auc", "average_drop", "gini", "entropy"):
        assert spread[("gradcam", metric)] == 0.0, metric  # a deterministic map, perturbed without noise
        assert spread[("rise", metric)] > 0.0, metric  # other masks, another map
        assert spread[("randomcam", metric)] > 0.0, metric
    assert spread[("gradcam", "road")] > 0.0  # ROAD's imputation noise moves even a deterministic map's score
    assert spread[("gradcam", "stability")] > 0.0  # other noisy copies
    assert spread[("gradcam", "faithfulness_correlation")] > 0.0  # other random pixel subsets
    assert spread[("gradcam", "sanity")] is None  # the cascade is not re-run
    images = [
        ImageScores(f"{i}.png", Prediction(0, "red", 0.9), {m: MethodScores([v, v], [v, v], 0.0) for m in methods})
        for i, v in enumerate([0.1, 0.3])
        for methods in [("gradcam", "randomcam")]
    ]
    report = EvalReport("synthetic", ["layer"], ["gradcam", "randomcam"], EvalOptions(), [], images)
    table = format_ranking(rank(report, spread={"gradcam": {"deletion_auc": 0.0}}))
    assert "seed sd" in table[3] and "±0.000" in table[4]  # the table's column, where measured
    page = write_rank_report(tmp_path / "page", report, rank(report, spread={"gradcam": {"deletion_auc": 0.0}}), [])
    html = page.read_text()
    assert "<th>seed SD</th>" in html and "<td>±0.000</td>" in html and "<td>(1)</td>" in html  # groups: 2 images
    # nothing drawn from a seed: no re-runs, nothing to report
    quiet = EvalOptions(road=False, stability=False)
    assert rerun_images(["gradcam", "layercam"], quiet, 5) == 0
    assert rerun_images(["gradcam", "rise"], quiet, 5) == 2 * 3 and rerun_images(["rise"], quiet, 1) == 2
