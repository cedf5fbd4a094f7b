"""A CI gate for explanations: fingerprints and provenance in every row, ``--deterministic``, and ``gradcam diff``
(pairing, measures, thresholds, exit codes, one-line errors, the JSON, the table and the HTML report)."""

from __future__ import annotations

import codecs
import csv
import hashlib
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from square_model import CLASSES, build, square_image
from typer.testing import CliRunner

from gradcam_cli import Explainer
from gradcam_cli.cli import app as explain_app
from gradcam_cli.cli.diff import app as diff_app
from gradcam_cli.drift import provenance as provenance_module
from gradcam_cli.drift.compare import diff_runs
from gradcam_cli.drift.fingerprint import GRID, decode_fingerprint, map_fingerprint
from gradcam_cli.drift.measures import peak_shift, pearson, ranks, spearman, top_iou
from gradcam_cli.drift.page import write_report
from gradcam_cli.errors import EXIT_IMAGE_FAILED, EXIT_OK, EXIT_USAGE, UsageError
from gradcam_cli.io.discovery import discover
from gradcam_cli.io.images import InputSpec
from gradcam_cli.io.manifest import read_manifest
from gradcam_cli.models.loading import LoadedModel
from gradcam_cli.options import MAX_PEAK_SHIFT, MIN_SIMILARITY, DiffOptions, OutputOptions, RunOptions
from gradcam_cli.pipeline.session import Session

ROOT = Path(__file__).resolve().parents[2]
SQUARE = f"{ROOT / 'tests' / 'square_model.py'}:build"
SIZE = (160, 120)
PROVENANCE_KEYS = {
    "gradcam_cli", "torch", "torchvision", "model", "weights", "weights_sha256", "layers", "methods", "task", "score",
    "target_class", "top_k", "input_size", "device", "dtype", "aug_smooth", "eigen_smooth", "max_side",
    "deterministic", "seed", "precision", "plugins",
}  # fmt: skip


# ----------------------------------------------------------------------------------------------------- helpers


def moved_detector() -> torch.nn.Module:
    """The colour detector after a 'retraining' that moved class red's detector to green (and made it a little
    stronger, so that an image with both colours still says red; grey still excites nothing)."""
    model = build()
    with torch.no_grad():
        model.features[0].weight[0, :, 1, 1] = torch.tensor([-0.75, 1.5, -0.75])
    return model


def renamed_classes() -> torch.nn.Module:
    """The colour detector with the red and green outputs swapped: other classes, the very same maps."""
    model = build()
    with torch.no_grad():
        model.fc.weight.copy_(model.fc.weight[[1, 0, 2]])
    return model


def two_squares(first: str, second: str | None = None) -> object:
    """A small grey image with a larger square of ``first`` on the left and a smaller one of ``second`` right."""
    image = square_image(size=SIZE, box=(10, 30, 60, 80), colour=first)
    if second is not None:
        image.paste(square_image(size=SIZE, box=(120, 40, 150, 70), colour=second).crop((120, 40, 150, 70)), (120, 40))
    return image


@pytest.fixture
def images(tmp_path: Path) -> Path:
    """a: red (affected when red's detector moves); b: blue (not); c: red and green (the red map moves to the
    green square); d: blue elsewhere (not)."""
    folder = tmp_path / "in"
    folder.mkdir()
    two_squares("red").save(folder / "a.png")
    two_squares("blue").save(folder / "b.png")
    two_squares("red", "green").save(folder / "c.png")
    square_image(size=SIZE, box=(90, 10, 140, 60), colour="blue").save(folder / "d.png")
    return folder


def explain(
    tmp_path: Path, name: str, module: torch.nn.Module, images: Path, suffix: str = ".jsonl", **options: object
) -> Path:
    """One run of ``module`` over ``images`` into ``tmp_path/name``; returns its manifest."""
    loaded = LoadedModel(module, "colour-detector", "none", list(CLASSES), InputSpec(mean=(0, 0, 0), std=(1, 1, 1)))
    explainer = Explainer(loaded, "features", options.pop("methods", "gradcam"), top_k=options.pop("top_k", 1))
    out = tmp_path / name
    manifest = out / f"manifest{suffix}"
    run = RunOptions(workers=0, batch_size=options.pop("batch_size", 4))
    with Session(OutputOptions(out, manifest=manifest, **options), run) as session:  # type: ignore[arg-type]
        for _ in session.explain(explainer, discover([images])):
            pass
    return manifest


def diff(*args: str | Path):
    return CliRunner().invoke(diff_app, [str(a) for a in args])


def one_line_error(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in result.output
    return lines[0]


def names(inputs: list[str]) -> list[str]:
    return [Path(name).name for name in inputs]


# ------------------------------------------------------------------------------------------------ fingerprints


@pytest.mark.quick
def test_a_fingerprint_is_the_map_on_a_16_by_16_grid_in_hex():
    saliency = torch.zeros(64, 96)
    saliency[:16, :24] = 1.0  # the top-left quarter of the height and width: 4 x 4 cells
    saliency[32:, 48:] = 0.5
    printed = map_fingerprint(saliency)
    assert printed["size"] == [64, 96]
    assert len(printed["grid"]) == GRID and all(re.fullmatch(r"[0-9a-f]{32}", row) for row in printed["grid"])
    assert printed["grid"][0] == "ff" * 4 + "00" * 12
    assert printed["grid"][15] == "00" * 8 + "80" * 8  # round(0.5 x 255) = 128
    grid, size = decode_fingerprint(json.loads(json.dumps(printed)))
    assert size == (64, 96) and grid.shape == (GRID, GRID)
    assert grid[0, 0] == 1.0 and grid[15, 15] == pytest.approx(128 / 255) and grid[8, 0] == 0.0


@pytest.mark.parametrize(
    "value",
    [
        "not an object",
        {"size": [64], "grid": ["00" * 16] * 16},
        {"size": [64, 0], "grid": ["00" * 16] * 16},
        {"size": [64, 96], "grid": ["00" * 16] * 15},
        {"size": [64, 96], "grid": ["0g" * 16] * 16},
    ],
)
def test_a_malformed_fingerprint_is_refused(value):
    with pytest.raises(ValueError):
        decode_fingerprint(value)


# ---------------------------------------------------------------------------------------------------- measures


def test_correlations_ranks_and_overlap():
    a = torch.tensor([[0.0, 0.1, 0.2], [0.3, 0.4, 1.0]])
    assert pearson(a, a) == pytest.approx(1.0) and spearman(a, a) == pytest.approx(1.0)
    assert pearson(a, 1 - a) == pytest.approx(-1.0) and spearman(a, 1 - a) == pytest.approx(-1.0)
    assert spearman(a, a**3) == pytest.approx(1.0) and pearson(a, a**3) < 0.95  # ranks kept, values not
    assert ranks(torch.tensor([3.0, 1.0, 1.0, 2.0])).tolist() == [3.0, 0.5, 0.5, 2.0]  # ties share their mean
    zeros = torch.zeros(2, 3)
    assert pearson(zeros, zeros) == 1.0 and spearman(zeros, zeros) == 1.0 and pearson(zeros, a) == 0.0
    grid = torch.zeros(10, 10)
    grid[0, :] = 1.0  # the top 10 %: the first row
    other = torch.zeros(10, 10)
    other[0, :5] = 1.0
    other[9, :5] = 1.0
    assert top_iou(grid, grid) == 1.0
    assert top_iou(grid, other) == pytest.approx(5 / 15)
    assert top_iou(zeros, zeros) == 1.0  # no evidence on either side


def test_peak_shift_is_a_fraction_of_the_image_diagonal():
    first, second = torch.zeros(16, 16), torch.zeros(16, 16)
    first[4, 2] = 1.0
    second[4, 13] = 1.0  # 11 cells to the right
    shift = peak_shift(first, second, (300, 400))
    assert shift == pytest.approx(11 / 16 * 400 / 500)
    assert peak_shift(first, first, (300, 400)) == 0.0
    assert peak_shift(first, torch.zeros(16, 16), (300, 400)) == 1.0  # the evidence vanished
    twin = first.clone()
    twin[12, 12] = 1.0 - 1e-6  # a second, nearly equal peak: the centre moves a little, it does not jump
    assert peak_shift(first, twin, (300, 400)) < 0.5
    nudged = twin.clone()
    nudged[12, 12] = 1.0 + 1e-6
    assert peak_shift(twin, nudged, (300, 400)) < 1e-3


# ----------------------------------------------------------------------------------- rows: fingerprint, provenance


def test_every_row_carries_its_fingerprint_and_the_runs_provenance(tmp_path, images):
    manifest = explain(tmp_path, "run", build(), images, methods=["gradcam", "layercam"], save_raw=True)
    rows = read_manifest(manifest)
    assert len(rows) == 8
    for row in rows:
        assert set(row["provenance"]) == PROVENANCE_KEYS
        npy = next(path for path in row["outputs"] if path.endswith(".npy"))
        import numpy as np

        assert row["fingerprint"] == map_fingerprint(torch.from_numpy(np.load(npy)))  # the very map written
    provenance = rows[0]["provenance"]
    assert all(row["provenance"] == provenance for row in rows)  # one run, one provenance
    assert provenance["torch"] == torch.__version__ and provenance["layers"] == ["features"]
    assert provenance["methods"] == ["gradcam", "layercam"]
    assert provenance["task"] == "classify" and provenance["score"] == "logit"
    assert provenance["device"] == "cpu" and provenance["dtype"] == "float32"
    assert provenance["deterministic"] is False and provenance["seed"] is None


def test_a_csv_manifest_carries_them_as_json_cells(tmp_path, images):
    manifest = explain(tmp_path, "run", build(), images, suffix=".csv")
    header = manifest.read_text().splitlines()[0]
    assert header.endswith(",seconds,fingerprint,provenance")
    rows = read_manifest(manifest)
    assert rows[0]["fingerprint"]["size"] == [SIZE[1], SIZE[0]] and rows[0]["provenance"]["model"] == "colour-detector"


def test_a_weights_file_is_recorded_with_its_sha256_computed_once(tmp_path, images, monkeypatch):
    weights = tmp_path / "square.pth"
    torch.save(build().state_dict(), weights)
    digests = []
    sha256 = hashlib.sha256

    def counting_sha256(*args: object) -> object:
        if sys._getframe(1).f_globals["__name__"] == provenance_module.__name__:  # not torch's or anyone else's
            digests.append(1)
        return sha256(*args)

    monkeypatch.setattr(provenance_module.hashlib, "sha256", counting_sha256)
    labels = tmp_path / "labels.txt"
    labels.write_text("red\ngreen\nblue\n")
    out = tmp_path / "out"
    args = [images, "-m", SQUARE, "-w", weights, "--labels", labels, "-o", out, "--workers", "0", "--json"]
    result = CliRunner().invoke(explain_app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == 4
    expected = hashlib.sha256(weights.read_bytes()).hexdigest()
    assert {row["provenance"]["weights_sha256"] for row in rows} == {expected}
    assert {row["provenance"]["weights"] for row in rows} == {str(weights)}
    assert len(digests) == 1


def test_deterministic_seeds_random_weights_and_is_recorded(tmp_path, images, restore_determinism):
    """resnet18 with random weights: the same maps twice with --deterministic, other maps without it."""

    def fingerprints(name: str, *more: str) -> list[dict]:
        args = [images / "a.png", "-m", "resnet18", "-w", "none", "--input-size", "64", "-o", tmp_path / name]
        result = CliRunner().invoke(explain_app, [*map(str, args), "--workers", "0", "--json", *more])
        assert result.exit_code == 0, result.output
        return [json.loads(line) for line in result.stdout.splitlines()]

    first, second = fingerprints("one", "--deterministic"), fingerprints("two", "--deterministic")
    assert first[0]["fingerprint"] == second[0]["fingerprint"]
    assert first[0]["provenance"]["deterministic"] is True and first[0]["provenance"]["seed"] == 0
    torch.use_deterministic_algorithms(False)
    third, fourth = fingerprints("three"), fingerprints("four")
    assert third[0]["fingerprint"] != fourth[0]["fingerprint"]  # random weights: other maps each time
    assert third[0]["provenance"]["deterministic"] is False


# ----------------------------------------------------------------------------------------------- gradcam diff


@pytest.mark.quick
def test_the_same_model_twice_is_no_drift(tmp_path, images):
    first = explain(tmp_path, "one", build(), images, methods=["gradcam", "layercam"], top_k=2)
    second = explain(tmp_path, "two", build(), images, methods=["gradcam", "layercam"], top_k=2, batch_size=1)
    result = diff(first, second.parent)  # a manifest and an output folder
    assert result.exit_code == EXIT_OK, result.output
    assert result.stderr.strip() == (
        f"no drift: 4 image(s) within --min-similarity {MIN_SIMILARITY:g} and --max-peak-shift {MAX_PEAK_SHIFT:g}"
    )
    assert "compared: 16 pairs, 16 from fingerprints" in result.stdout
    assert "DRIFT" not in result.stdout and "made differently" not in result.stdout


@pytest.mark.quick
def test_a_moved_detector_drifts_for_exactly_the_affected_images(tmp_path, images):
    before = explain(tmp_path, "before", build(), images)
    after = explain(tmp_path, "after", moved_detector(), images)
    report = diff_runs(before, after)
    assert report.drift and names(report.drifting_inputs()) == ["a.png", "c.png"]
    by_name = {Path(result.input).name: result for result in report.results}
    assert not by_name["b.png"].drift and not by_name["d.png"].drift
    assert by_name["b.png"].spearman == 1.0 and by_name["b.png"].peak_shift == 0.0
    moved = by_name["c.png"]  # red still wins; its evidence now lies on the green square, on the right
    assert not any("class" in reason for reason in moved.reasons)
    assert moved.pearson is not None and moved.pearson < MIN_SIMILARITY
    assert moved.peak_shift is not None and moved.peak_shift > 0.4
    result = diff(before, after)
    assert result.exit_code == EXIT_IMAGE_FAILED
    assert result.stderr.strip() == f"drift in 2 image(s): {images / 'a.png'}, {images / 'c.png'}"
    drift_lines = [line for line in result.stdout.splitlines() if line.startswith("drift: ")]
    assert len(drift_lines) == 2 and "peak moved" in drift_lines[1]


@pytest.mark.quick
def test_the_thresholds_decide(tmp_path, images):
    before = explain(tmp_path, "before", build(), images)
    after = explain(tmp_path, "after", moved_detector(), images)
    lenient = diff(before, after, "--min-similarity", "-1", "--max-peak-shift", "1", "--allow-class-change")
    assert lenient.exit_code == EXIT_OK, lenient.output
    picky = diff(before, before, "--min-similarity", "1")
    assert picky.exit_code == EXIT_OK  # identical maps correlate 1 exactly


def test_a_class_change_is_drift_unless_allowed(tmp_path, images):
    before = explain(tmp_path, "before", build(), images)
    after = explain(tmp_path, "after", renamed_classes(), images)
    report = diff_runs(before, after)
    assert names(report.drifting_inputs()) == ["a.png", "c.png"]  # the red images; blue stays blue
    reasons = {Path(r.input).name: r.reasons for r in report.results}
    assert reasons["a.png"] == ["class 0 red -> 1 green"]  # the same map, another class
    assert report.results[0].spearman == pytest.approx(1.0)
    assert diff(before, after, "--allow-class-change").exit_code == EXIT_OK
    rows = json.loads(diff(before, after, "--json").stdout)["pairs"]
    assert rows[0]["target"] == [{"index": 0, "name": "red"}, {"index": 1, "name": "green"}]
    assert rows[0]["top1"] == rows[0]["target"]


def test_missing_rows_are_listed_and_drift_unless_allowed(tmp_path, images):
    before = explain(tmp_path, "before", build(), images)
    (images / "b.png").unlink()
    after = explain(tmp_path, "after", build(), images)
    result = diff(before, after)
    assert result.exit_code == EXIT_IMAGE_FAILED
    assert f"missing in the current run: {images / 'b.png'} (gradcam, class 2 blue)" in result.stdout
    assert result.stderr.strip() == f"drift in 1 image(s): {images / 'b.png'}"
    allowed = diff(before, after, "--allow-missing")
    assert allowed.exit_code == EXIT_OK and "1 unpaired row(s) allowed" in allowed.stderr
    backwards = json.loads(diff(after, before, "--json", "--allow-missing").stdout)
    assert backwards["missing"]["current_only"][0]["input"] == str(images / "b.png")


def test_a_failed_image_on_one_side_is_drift(tmp_path, images):
    before = explain(tmp_path, "before", build(), images)
    (images / "b.png").write_bytes(b"not an image any more")
    after = explain(tmp_path, "after", build(), images)
    report = diff_runs(before, after)
    assert names(report.drifting_inputs()) == ["b.png"]
    assert report.drifting[0].reasons == ["failed in the current run"]


def test_full_maps_are_compared_where_both_runs_saved_them(tmp_path, images):
    before = explain(tmp_path, "before", build(), images, save_raw=True)
    after = explain(tmp_path, "after", moved_detector(), images, save_raw=True)
    fingerprints_only = explain(tmp_path, "plain", build(), images)
    data = json.loads(diff(before, after, "--json").stdout)
    assert data["compared"] == {"maps": 4}
    assert {pair["compared"] for pair in data["pairs"]} == {"maps"}
    assert names(data["drifting"]) == ["a.png", "c.png"]  # the same verdict as from the fingerprints
    assert json.loads(diff(before, fingerprints_only, "--json").stdout)["compared"] == {"fingerprints": 4}


def test_runs_from_other_folders_pair_by_the_end_of_their_paths(tmp_path, images):
    first = explain(tmp_path, "one", build(), images)
    rows = [json.loads(line) for line in first.read_text().splitlines()]
    relative = tmp_path / "relative.jsonl"
    relative.write_text("".join(json.dumps({**row, "input": f"in/{Path(row['input']).name}"}) + "\n" for row in rows))
    report = diff_runs(first, relative)
    assert len(report.results) == 4 and not report.missing and not report.drift


def test_json_and_provenance_changes(tmp_path, images):
    before = explain(tmp_path, "before", build(), images)
    after = explain(tmp_path, "after", build(), images, save_raw=True)
    rows = [json.loads(line) for line in after.read_text().splitlines()]
    rows = [{**row, "provenance": {**row["provenance"], "torch": "9.9.9"}} for row in rows]
    after.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = diff(before, after, "--json")
    assert result.exit_code == EXIT_OK
    data = json.loads(result.stdout)  # one object, nothing else on stdout
    assert data["drift"] is False and data["drifting"] == []
    assert data["provenance_changed"] == {"torch": [torch.__version__, "9.9.9"]}
    pair = data["pairs"][0]
    assert set(pair) == {
        "input", "method", "status", "target", "top1", "probability", "probability_change", "spearman", "pearson",
        "iou_top10", "peak_shift", "compared", "drift", "reasons",
    }  # fmt: skip
    assert pair["spearman"] == 1.0 and pair["peak_shift"] == 0.0 and pair["probability_change"] == 0.0
    assert f"made differently: torch {torch.__version__} -> 9.9.9" in diff(before, after).stdout


# ------------------------------------------------------------------------------------- malformed or mismatched


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.quick
def test_malformed_and_mismatched_manifests_are_one_line_errors(tmp_path, images):
    good = explain(tmp_path, "good", build(), images)
    lines = good.read_text().splitlines()
    row = json.loads(lines[0])

    def rewritten(**fields: object) -> str:
        return "".join(json.dumps({**json.loads(line), **fields}) + "\n" for line in lines)

    no_maps = {"fingerprint": None, "provenance": None}  # before fingerprints and provenance
    cases = {
        tmp_path / "absent.jsonl": "no such file or folder",
        _write(tmp_path / "notes.txt", "x"): "not a manifest; give a .jsonl or .csv file, or an output folder",
        _write(tmp_path / "empty.jsonl", ""): "no rows",
        _write(tmp_path / "other.jsonl", '{"name": "x"}\n'): "not a manifest (line 1 is not a manifest row)",
        _write(tmp_path / "plain.csv", "a,b\n1,2\n"): "not a manifest (its first line names no input and status",
        _write(
            tmp_path / "print.jsonl", json.dumps({**row, "fingerprint": {"size": [1, 1], "grid": ["zz"]}}) + "\n"
        ): "line 1: the fingerprint is malformed (its grid is not 16 rows of 32 hex digits)",
        _write(tmp_path / "target.jsonl", json.dumps({**row, "target": "red"}) + "\n"): "line 1: its target",
        (tmp_path / "no-manifest").resolve(): "no manifest in this folder",
        _write(tmp_path / "old.jsonl", rewritten(**no_maps)): (
            "no row has a fingerprint or a .npy map: it was written by a gradcam-cli older than fingerprints; run it "
            "again to compare it"
        ),
        _write(tmp_path / "rebuilt.jsonl", rewritten(**no_maps, status="skipped")): (
            "its rows were rebuilt from file names by --skip-existing, without the earlier manifest; run it again "
            "without --skip-existing to compare it"
        ),
        _write(tmp_path / "nothing.jsonl", rewritten(fingerprint=None, target=None)): (
            "its rows have no target (nothing detected, or only the background) and were written by a gradcam-cli "
            "that gave such rows no fingerprint; run it again to compare it"
        ),
        _write(tmp_path / "video.jsonl", rewritten(input="clip.mp4", fingerprint=None)): (
            "its rows are of videos, which have none (gradcam diff compares images)"
        ),
    }
    (tmp_path / "no-manifest").mkdir()
    for path, expected in cases.items():
        for args in ([path, good], [good, path]):
            result = diff(*args)
            assert result.exit_code == EXIT_USAGE, (path, result.output)
            line = one_line_error(result)
            side = "baseline" if args[0] == path else "current"
            assert line.startswith(f"error: {side} {path}") and expected in line, line
            assert line.count(str(path)) == 1
    two = tmp_path / "two"
    _write(two / "a.jsonl", lines[0] + "\n")
    _write(two / "b.csv", "input,status\n")
    assert "several manifests in this folder (a.jsonl, b.csv)" in one_line_error(diff(two, good))
    other_images = tmp_path / "elsewhere"
    other_images.mkdir()
    square_image(size=SIZE, colour="green").save(other_images / "z.png")
    unrelated = explain(tmp_path, "unrelated", build(), other_images)
    line = one_line_error(diff(good, unrelated))
    assert line.endswith("have no image and method in common; are they runs over the same images?")
    layercam = explain(tmp_path, "layercam", build(), images, methods="layercam")
    assert "no image and method in common" in one_line_error(diff(good, layercam))
    with pytest.raises(UsageError):
        diff_runs(good, layercam)


def test_a_torn_last_row_is_left_out_as_resuming_leaves_it_out(tmp_path, images):
    """What a killed run leaves: its last row cut short. gradcam diff reads the manifest as --skip-existing does,
    says which line it left out, and the row's image is missing (drift unless allowed)."""
    good = explain(tmp_path, "good", build(), images)
    lines = good.read_text().splitlines(keepends=True)
    killed = _write(tmp_path / "killed.jsonl", "".join(lines[:3]) + lines[3][:60])  # d.png's row torn
    assert read_manifest(killed) == read_manifest(good)[:3]  # what resuming reads
    result = diff(good, killed)
    assert result.exit_code == EXIT_IMAGE_FAILED, result.output
    assert f"current:  {killed} (3 rows; line 4 is not a row (torn by a killed run?), left out)" in result.stdout
    assert f"missing in the current run: {images / 'd.png'} (gradcam, class 2 blue)" in result.stdout
    assert diff(good, killed, "--allow-missing").exit_code == EXIT_OK
    resumed = _write(tmp_path / "resumed.jsonl", "".join(lines) + lines[1][:60])  # a later run killed mid-row
    data = json.loads(diff(good, resumed, "--json").stdout)
    assert data["drift"] is False and data["ignored_lines"] == {"baseline": [], "current": [5]}


def test_a_byte_order_mark_is_accepted_in_jsonl_and_csv(tmp_path, images):
    """A manifest saved by a spreadsheet starts with a UTF-8 byte order mark: read as without it, by gradcam diff
    and by resuming alike."""
    for suffix in (".jsonl", ".csv"):
        plain = explain(tmp_path, f"plain{suffix}", build(), images, suffix=suffix)
        marked = tmp_path / f"marked{suffix}"
        marked.write_bytes(codecs.BOM_UTF8 + plain.read_bytes())
        assert read_manifest(marked) == read_manifest(plain) and len(read_manifest(plain)) == 4
        for args in ((plain, marked), (marked, plain)):
            result = diff(*args)
            assert result.exit_code == EXIT_OK, result.output
            assert f"{marked} (4 rows)" in result.stdout and "compared: 4 pairs, 4 from fingerprints" in result.stdout


def test_diff_help_names_the_exit_codes_and_gradcam_help_names_diff():
    assert "Exit codes: 0 no drift; 1 drift" in diff("--help").stdout
    result = CliRunner().invoke(explain_app, ["--help"])
    assert "gradcam diff BASELINE CURRENT" in result.stdout


# ----------------------------------------------------------------------------------------------- the HTML page


@pytest.mark.quick
def test_the_report_shows_baseline_current_and_difference_for_the_drifting_images(tmp_path, images):
    before = explain(tmp_path, "before", build(), images)
    after = explain(tmp_path, "after", moved_detector(), images)
    folder = tmp_path / "report"
    result = diff(before, after, "--report", folder)
    assert result.exit_code == EXIT_IMAGE_FAILED
    page = (folder / "index.html").read_text()
    assert f"report written to {folder / 'index.html'}" in result.stderr
    pictures = re.findall(r'<img src="([^"]+)"', page)
    assert pictures == [f"maps/{n:04d}-{which}.png" for n in (1, 2) for which in ("baseline", "current", "difference")]
    assert all((folder / picture).is_file() for picture in pictures)
    assert "data:" not in page and not re.search(r'(src|href)="(https?:)?//', page)  # self-contained, relative
    assert page.count('<article class="pair">') == 2 and '<p class="verdict drift">drift in 2 image(s)' in page
    assert page.count('<tr class="drift">') == 2 and page.count('<tr class="ok">') == 2
    again = diff(before, before, "--report", folder)  # no drift: the old pictures go
    assert again.exit_code == EXIT_OK and not list((folder / "maps").glob("*.png"))


def test_the_report_folder_must_be_a_folder(tmp_path, images):
    before = explain(tmp_path, "before", build(), images)
    blocker = _write(tmp_path / "taken", "a file")
    assert (
        one_line_error(diff(before, before, "--report", blocker))
        == f"error: --report {blocker} is a file, not a folder"
    )


@pytest.mark.slow
def test_the_report_in_headless_chromium(tmp_path, images):
    """Chromium shows one card per drifting image, three pictures each, loaded by their relative links."""
    import numpy as np
    from headless_browser import browse
    from PIL import Image

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("headless Chromium is not installed: see tests/render/test_gallery.py")
    before = explain(tmp_path, "before", build(), images)
    after = explain(tmp_path, "after", moved_detector(), images)
    index = write_report(diff_runs(before, after, DiffOptions()), tmp_path / "report")
    dom = browse(browser, tmp_path, index.as_uri(), "--dump-dom")
    assert 'id="drifting" data-count="2"' in dom
    assert dom.count("<figure>") == 6 and dom.count("<figcaption>difference (red: more evidence now") == 2
    shot = tmp_path / "shot.png"
    browse(browser, tmp_path, index.as_uri(), f"--screenshot={shot}", "--window-size=1000,900")
    with Image.open(shot) as image:
        pixels = np.asarray(image.convert("RGB"), dtype=np.float32)
    assert pixels.std() > 20  # not a blank page
    saturated = (pixels.max(axis=2) - pixels.min(axis=2)) > 100
    assert saturated.mean() > 0.01  # the colour-mapped maps are drawn: the pictures loaded


def test_nan_free_json_for_rebuilt_rows(tmp_path, images):
    """Rows rebuilt by --skip-existing from file names have no probability: the diff's JSON says null."""
    before = explain(tmp_path, "before", build(), images)
    rows = [json.loads(line) for line in before.read_text().splitlines()]
    rows[0]["target"]["probability"] = None
    after = _write(tmp_path / "after.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    data = json.loads(diff(before, after, "--json").stdout)
    assert data["pairs"][0]["probability"][1] is None and data["pairs"][0]["probability_change"] is None
    assert not any(isinstance(v, float) and math.isnan(v) for pair in data["pairs"] for v in pair.values())


def test_resuming_into_an_older_versions_csv_manifest_keeps_every_row(tmp_path, images):
    """A CSV written before fingerprints existed has 10 columns; the 12-column rows a resumed run appends to it
    are kept when the manifest is read back and rewritten (with the full header)."""
    labels = _write(tmp_path / "labels.txt", "red\ngreen\nblue\n")
    out = tmp_path / "out"
    manifest = out / "m.csv"
    args = [images, "-m", SQUARE, "--labels", labels, "-o", out, "--workers", "0", "--manifest", manifest]
    assert CliRunner().invoke(explain_app, [str(a) for a in args]).exit_code == 0
    old_columns = 10
    lines = manifest.read_text().splitlines()
    old = io.StringIO()
    writer = csv.writer(old, lineterminator="\n")
    for cells in csv.reader(lines):
        writer.writerow(cells[:old_columns])
    manifest.write_text(old.getvalue())  # as an older version wrote it
    for path in out.glob("c_gradcam_*.png"):
        path.unlink()  # c.png is explained again and its row appended
    again = CliRunner().invoke(explain_app, [*map(str, args), "--skip-existing"])
    assert again.exit_code == 0, again.output
    rows = read_manifest(manifest)
    assert names([row["input"] for row in rows]) == ["a.png", "b.png", "c.png", "d.png"]
    fresh = next(row for row in rows if row["input"].endswith("c.png"))
    assert fresh["status"] == "ok" and fresh["fingerprint"] and fresh["provenance"]
    assert manifest.read_text().splitlines()[0].endswith(",fingerprint,provenance")


def test_diff_help_does_not_import_torch():
    code = (
        "import sys; sys.argv = ['gradcam', 'diff', '--help']\n"
        "import gradcam_cli.cli as c\n"
        "try:\n    c.main()\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--min-similarity" in done.stdout and done.stdout.strip().splitlines()[-1] == "False"
