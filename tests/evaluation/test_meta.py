"""``gradcam eval --rank --meta``: MetaQuantus' scores against a plain reimplementation of its formulas on fixed
numbers (and against the MetaQuantus package where it is importable), the verdicts on a report built by hand, the
known answer on the colour-square model (a metric that is pure noise is not trusted, insertion AUC is), and the
command line's JSON lines validated against docs/rank.schema.json (which must be current)."""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats
from square_model import square_image
from test_eval import SQUARE_MODEL
from typer.testing import CliRunner

from gradcam_cli import Explainer
from gradcam_cli.cam.results import Prediction
from gradcam_cli.cli.eval import app
from gradcam_cli.evaluation import rank as rank_module
from gradcam_cli.evaluation.evaluate import Evaluator
from gradcam_cli.evaluation.meta import (
    META_NOISE,
    META_PERTURBATIONS,
    iac,
    iec_adversary,
    iec_resilience,
    meta_rows,
    sign_test,
    verdict,
)
from gradcam_cli.evaluation.perturbed import noise_copies
from gradcam_cli.evaluation.rank import rank
from gradcam_cli.evaluation.rank_schema import SCHEMA_PATH, schema_text
from gradcam_cli.evaluation.report import EvalReport, ImageScores, MethodScores
from gradcam_cli.options import EvalOptions

Q_STAR = np.array([[0.61, 0.72, 0.55, 0.80, 0.47], [0.35, 0.41, 0.52, 0.30, 0.44], [0.12, 0.09, 0.20, 0.15, 0.05]])
Q_HAT = np.array([[0.60, 0.70, 0.50, 0.79, 0.49], [0.36, 0.45, 0.56, 0.33, 0.40], [0.13, 0.50, 0.21, 0.14, 0.06]])


def metaquantus_iac(q: np.ndarray, q_hat: np.ndarray, indices: np.ndarray, adversary: bool) -> float:
    """MetaQuantus' MetaEvaluation.compute_iac_score, written out (meta_evaluation.py, v0.0.5)."""
    p = stats.wilcoxon(q[indices], q_hat[indices], alternative="two-sided", zero_method="zsplit")[1]
    return 1 - p if adversary else p


def metaquantus_iec_resilience(q_star: np.ndarray, q_hat: np.ndarray, indices: np.ndarray) -> float:
    """MetaQuantus' compute_iec_resilience: per image, the argsorts of the methods compared position by position."""
    agree = []
    for ix, (row_star, row_hat) in enumerate(
        zip(np.argsort(q_star, axis=0).T, np.argsort(q_hat, axis=0).T, strict=True)
    ):
        if indices[ix]:
            agree += [1 if a == b else 0 for a, b in zip(row_star, row_hat, strict=True)]
    return float(np.nanmean(agree))


def metaquantus_iec_adversary(q_star: np.ndarray, q_hat: np.ndarray, indices: np.ndarray, lower: bool) -> float:
    """MetaQuantus' compute_iec_adversary (its score_direction truthy: lower is better)."""
    worse = []
    for row_star, row_hat in zip(q_star, q_hat, strict=True):
        for a, b in zip(row_star[indices], row_hat[indices], strict=True):
            worse.append(1 if (a < b if lower else a > b) else 0)
    return float(np.nanmean(worse))


@pytest.mark.quick
def test_scores_against_metaquantus_formulas_on_fixed_numbers() -> None:
    kept = np.array([True, True, False, True, True])
    for x in range(3):
        for adversary in (False, True):
            expected = metaquantus_iac(Q_STAR[x], Q_HAT[x], kept, adversary)
            assert iac(Q_STAR[x][kept].tolist(), Q_HAT[x][kept].tolist(), adversary) == pytest.approx(expected)
    assert iec_resilience(Q_STAR[:, kept], Q_HAT[:, kept]) == pytest.approx(
        metaquantus_iec_resilience(Q_STAR, Q_HAT, kept)
    )
    for better in ("lower", "higher"):
        assert iec_adversary(Q_STAR[:, kept], Q_HAT[:, kept], better) == pytest.approx(
            metaquantus_iec_adversary(Q_STAR, Q_HAT, kept, better == "lower")
        )
    # by hand: 4 differences of one sign, no ties: the exact two-sided p-value is 2 / 2^4
    assert iac([1.0, 2.0, 3.0, 4.0], [1.1, 2.2, 3.3, 4.4], adversary=False) == pytest.approx(0.125)
    assert iac([1.0, 2.0], [1.0, 2.0], adversary=False) == 1.0  # nothing moved
    assert math.isnan(iac([1.0], [2.0], adversary=False))
    # images 1 and 2 keep one of their three positions (two methods swap), the other three images all three
    assert iec_resilience(Q_STAR, Q_HAT) == pytest.approx(11 / 15)
    assert iec_adversary(Q_STAR, Q_HAT, "higher") == pytest.approx(6 / 15)  # values that fell
    assert sign_test(7, 8) == pytest.approx(9 / 256)
    assert sign_test(4, 8) > 0.5


def test_scores_against_the_metaquantus_package() -> None:
    found = pytest.importorskip("metaquantus.meta_evaluation")  # not a dependency: checked where installed
    evaluation = found.MetaEvaluation
    kept = np.array([True, True, True, False, True])
    for x in range(3):
        q, q_hat = Q_STAR[x], Q_HAT[x]
        ours = iac(q[kept].tolist(), q_hat[kept].tolist(), adversary=False)
        assert ours == pytest.approx(evaluation.compute_iac_score(q, q_hat, kept, "Input Resilience Test"))
        ours = iac(q[kept].tolist(), q_hat[kept].tolist(), adversary=True)
        assert ours == pytest.approx(evaluation.compute_iac_score(q, q_hat, kept, "Model Adversary Test"))
    ours = iec_resilience(Q_STAR[:, kept], Q_HAT[:, kept])
    assert ours == pytest.approx(evaluation.compute_iec_resilience(Q_STAR, Q_HAT, kept))
    assert iec_adversary(Q_STAR[:, kept], Q_HAT[:, kept], "higher") == pytest.approx(
        evaluation.compute_iec_adversary(Q_STAR, Q_HAT, kept, score_direction=None)
    )
    assert iec_adversary(Q_STAR[:, kept], Q_HAT[:, kept], "lower") == pytest.approx(
        evaluation.compute_iec_adversary(Q_STAR, Q_HAT, kept, score_direction="lower")
    )


@pytest.mark.quick
def test_verdict_says_why() -> None:
    assert verdict([], 0.01, 5, 10) == (
        True,
        ["resilient to noise within its intervals and reacts to a randomised model"],
    )
    trusted, reasons = verdict([["a", "b", 0], ["a", "b", 3]], 0.3, 5, 10)
    assert trusted is False
    assert reasons == [
        "reorders under noise beyond its intervals (a > b)",
        "does not react to a randomised model (sign test p = 0.300)",
    ]
    assert verdict([], 0.01, 1, 10)[0] is None


@pytest.mark.quick
def test_noise_copies_are_seeded_bounded_and_clipped() -> None:
    inputs = torch.linspace(-1.0, 1.0, 48).reshape(1, 3, 4, 4)
    copies = noise_copies(inputs, META_PERTURBATIONS, seed=3)
    assert copies.shape == (META_PERTURBATIONS, 3, 4, 4)
    assert torch.equal(copies, noise_copies(inputs, META_PERTURBATIONS, seed=3))
    assert (copies - inputs).abs().max() <= META_NOISE + 1e-6
    assert copies.min() >= -1.0 and copies.max() <= 1.0
    assert not torch.equal(copies[0], copies[1])


def _hand_report(seed: int = 0) -> EvalReport:
    """12 images, 3 methods: ``arcc`` follows the methods (apart, kept under noise, lower on the randomised model),
    ``random_logit`` is noise, ``emprt`` is apart but swaps its first two methods under noise."""
    generator = np.random.default_rng(seed)
    levels = {"a": 0.9, "b": 0.5, "c": 0.1}
    images = []
    for i in range(12):
        methods = {}
        for m, level in levels.items():
            follows = level + 0.01 * generator.standard_normal()
            apart = level + 0.01 * generator.standard_normal()
            extra = {"arcc": follows, "random_logit": float(generator.random()), "emprt": apart}
            noisy = []
            for _ in range(3):
                swapped = {"a": levels["b"], "b": levels["a"], "c": levels["c"]}[m]
                noisy.append(
                    {
                        "arcc": follows + 1e-3 * generator.standard_normal(),
                        "random_logit": float(generator.random()),
                        "emprt": swapped + 1e-3 * generator.standard_normal(),
                    }
                )
            model = {"arcc": follows - 0.3, "random_logit": float(generator.random()), "emprt": apart - 0.3}
            methods[m] = MethodScores([1.0, 0.0], [0.0, 1.0], 0.5, extra=extra, meta_input=noisy, meta_model=model)
        images.append(ImageScores(f"image{i}.png", Prediction(0, "red", 0.9), methods))
    return EvalReport("hand", ["features"], list(levels), EvalOptions(), [], images)


@pytest.mark.quick
def test_meta_rows_trust_what_follows_the_methods_and_flag_noise_and_reordering() -> None:
    report = _hand_report()
    rows = rank(report, seed=0)
    meta = {row.metric: row for row in meta_rows(report, rows)}
    assert set(meta) >= {"arcc", "random_logit", "emprt"}
    assert meta["arcc"].trusted is True and meta["arcc"].iec_ar == 1.0 and meta["arcc"].iec_nr == 1.0
    assert meta["arcc"].react_p == pytest.approx(0.5**36)
    assert meta["random_logit"].trusted is False
    assert any(reason.startswith("does not react to a randomised model") for reason in meta["random_logit"].reasons)
    assert meta["random_logit"].iec_nr < meta["arcc"].iec_nr
    assert meta["emprt"].trusted is False
    assert meta["emprt"].reasons == ["reorders under noise beyond its intervals (a > b)"]
    assert meta["emprt"].copies == 36 and meta["emprt"].images_model == 12
    for row in meta.values():
        assert row.mc == pytest.approx(np.mean([row.iac_nr, row.iec_nr, row.iac_ar, row.iec_ar]))
    assert "deletion_auc" not in meta  # not measured under perturbation here


def _noise(_image: ImageScores, scores: MethodScores) -> float:
    """A metric that is pure noise: a hash of the insertion curve, in [0, 1)."""
    return zlib.crc32(np.asarray(scores.insertion, dtype=np.float32).tobytes()) / 2**32


@pytest.fixture
def coloured_squares(tmp_path: Path) -> Path:
    places = [(8, 8, 28, 28), (50, 20, 70, 40), (30, 60, 50, 80), (60, 62, 80, 82), (10, 50, 30, 70), (40, 8, 60, 28)]
    for i, corners in enumerate(places):
        square_image((96, 96), corners, ("red", "green", "blue")[i % 3]).save(tmp_path / f"square{i}.png")
    return tmp_path


@pytest.mark.slow
def test_known_answer_noise_is_not_trusted_and_insertion_auc_is(
    coloured_squares: Path, square_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(rank_module.RANKED, "noise", ("pure noise", "higher", _noise))
    explainer = Explainer(square_model, "features", ["gradcam", "gradcam++", "randomcam"])
    options = EvalOptions(steps=8, sanity=True, sanity_layers=2, meta=True)
    report = Evaluator(explainer, options).run([coloured_squares])
    assert not report.failed
    scores = report.ok[0].methods["gradcam"]
    assert len(scores.meta_input) == META_PERTURBATIONS and "insertion_auc" in scores.meta_model
    meta = {row.metric: row for row in meta_rows(report, rank(report, seed=0))}
    assert meta["noise"].trusted is False, meta["noise"]
    assert any(reason.startswith("does not react") for reason in meta["noise"].reasons)
    assert meta["insertion_auc"].trusted is True, meta["insertion_auc"]
    assert meta["noise"].iec_nr < meta["insertion_auc"].iec_nr


def validate(value: Any, schema: dict[str, Any], root: dict[str, Any]) -> list[str]:
    """A tiny JSON Schema validator, of what docs/rank.schema.json uses: $ref, oneOf, const, enum, type, properties,
    required, additionalProperties, items. Returns the errors."""
    if "$ref" in schema:
        return validate(value, root["$defs"][schema["$ref"].rsplit("/", 1)[1]], root)
    if "oneOf" in schema:
        matched = [s for s in schema["oneOf"] if not validate(value, s, root)]
        return [] if len(matched) == 1 else [f"{value!r:.80}: matches {len(matched)} of oneOf"]
    if "const" in schema and value != schema["const"]:
        return [f"{value!r} is not {schema['const']!r}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{value!r} not in {schema['enum']}"]
    if "type" in schema and not _fits(value, schema["type"]):
        return [f"{value!r:.80} is not {schema['type']}"]
    errors = _object_errors(value, schema, root) if isinstance(value, dict) else []
    if isinstance(value, list) and "items" in schema:
        for item in value:
            errors += validate(item, schema["items"], root)
    return errors


def _object_errors(value: dict[str, Any], schema: dict[str, Any], root: dict[str, Any]) -> list[str]:
    errors = [f"missing {key}" for key in schema.get("required", []) if key not in value]
    extra = schema.get("additionalProperties")
    for key, item in value.items():
        if key in schema.get("properties", {}):
            errors += validate(item, schema["properties"][key], root)
        elif extra is False:
            errors.append(f"unexpected {key}")
        elif isinstance(extra, dict):
            errors += validate(item, extra, root)
    return errors


def _fits(value: Any, kind: str | list[str]) -> bool:
    """Whether ``value`` is of the JSON type ``kind`` (or one of them); a bool is no number."""
    kinds = [kind] if isinstance(kind, str) else kind
    number = not isinstance(value, bool) and isinstance(value, int | float)
    python = {"string": str, "boolean": bool, "null": type(None), "object": dict, "array": list}
    return any(
        (k == "number" and number)
        or (k == "integer" and number and float(value).is_integer())
        or (k in python and isinstance(value, python[k]))
        for k in kinds
    )


@pytest.mark.quick
def test_the_schema_file_is_current_and_the_validator_catches_mistakes() -> None:
    assert SCHEMA_PATH.read_text(encoding="utf-8") == schema_text(), "run python -m gradcam_cli.evaluation.rank_schema"
    schema = json.loads(schema_text())
    report = _hand_report()
    rows = rank(report, seed=0)
    lines = [row.to_dict() for row in rows] + [row.to_dict() for row in meta_rows(report, rows)]
    for line in lines:
        assert validate(json.loads(json.dumps(line)), schema, schema) == [], line
    bad = dict(lines[0], better="sideways")
    assert validate(bad, schema, schema)
    assert validate({k: v for k, v in lines[0].items() if k != "mean"}, schema, schema)
    assert validate(dict(lines[-1], surprise=1), schema, schema)


@pytest.mark.slow
def test_cli_rank_meta_json_validates_against_the_schema(coloured_squares: Path) -> None:
    for extra in ("square3.png", "square4.png", "square5.png"):  # 3 images, one per colour: enough for the lines
        (coloured_squares / extra).unlink()
    common = ["--model", SQUARE_MODEL, "--layer", "features", "--steps", "4", "--sanity-layers", "1", "--input-size"]
    args = [str(coloured_squares), *common, "48", "--method", "gradcam", "--rank", "--meta"]
    result = CliRunner().invoke(app, [*args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    for line in lines:
        assert validate(line, schema, schema) == [], line
    try:
        import jsonschema  # not a dependency: a second opinion where installed
    except ImportError:
        pass
    else:
        for line in lines:
            jsonschema.validate(line, schema)
    meta = [line for line in lines if line["kind"] == "meta"]
    assert {"deletion_auc", "insertion_auc", "gini"} <= {line["metric"] for line in meta}
    assert all(line["trusted"] in (True, False, None) and line["reasons"] for line in meta)
    text = CliRunner().invoke(app, args, catch_exceptions=False)
    assert "meta-evaluation (MetaQuantus" in text.stdout and "IEC_AR" in text.stdout
    plain = CliRunner().invoke(app, [str(coloured_squares), *common, "48", "--meta"], catch_exceptions=False)
    assert plain.exit_code == 2
    assert plain.stderr.splitlines() == ["error: --meta is for --rank: add --rank (it tests the ranking's metrics)"]


def test_the_report_page_shows_the_verdicts(tmp_path: Path) -> None:
    from gradcam_cli.evaluation.rank_page import write_rank_report

    report = _hand_report()
    rows = rank(report, seed=0)
    meta = meta_rows(report, rows)
    page = write_rank_report(tmp_path, report, rows, [], meta).read_text(encoding="utf-8")
    assert "<h2>Meta-evaluation: which metrics to trust</h2>" in page
    assert "data-metric='arcc' data-trusted='trusted'" in page
    assert "data-metric='emprt' data-trusted='not trusted'" in page
    assert "reorders under noise beyond its intervals (a &gt; b)" in page


@pytest.mark.quick
def test_meta_on_a_detectors_images_is_refused_in_one_line(tmp_path: Path) -> None:
    from test_box_eval import DETECTOR

    image = tmp_path / "two.png"
    image.write_bytes((Path(__file__).resolve().parents[2] / "docs" / "examples" / "two.png").read_bytes())
    result = CliRunner().invoke(app, [str(image), "--model", DETECTOR, "--rank", "--meta", "--method", "gradcam"])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: --meta is for classifiers; a detector's maps are evaluated per detection, in its own box"]
    assert "Traceback" not in result.output
