"""A vision-language answer run through the session like every run (issue 36): ``--skip-existing`` keeps an answer
without generating it again, ``--shard`` and ``gradcam merge``, ``gradcam diff`` of two answer runs, ``--panel``
and ``--save-heatmap``, rows with fingerprints and provenance; ``--engine ray`` refused in one line. Tiny LLaVA
(tests/vlm_models.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import numpy as np
import torch
import vlm_models
from PIL import Image

from gradcam_cli.cam.answers import Prompter
from gradcam_cli.drift.fingerprint import map_fingerprint

PROMPT = "what is the cat ?"


@pytest.fixture(scope="module")
def llava(tmp_path_factory) -> str:
    return f"hf:{vlm_models.llava(tmp_path_factory.mktemp('llava'))}"


def photos(folder: Path) -> Path:
    folder.mkdir()
    for name, left in (("a.png", (220, 30, 30)), ("b.png", (30, 200, 30)), ("c.png", (30, 30, 220))):
        image = Image.new("RGB", (96, 48), (200, 200, 200))
        image.paste(Image.new("RGB", (48, 48), left), (0, 0))
        image.save(folder / name)
    return folder


def run(*args) -> object:
    from typer.testing import CliRunner

    from gradcam_cli.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def command(app_module: str, *args) -> object:
    import importlib

    from typer.testing import CliRunner

    return CliRunner().invoke(importlib.import_module(app_module).app, [str(a) for a in args])


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture
def generations(monkeypatch) -> list[int]:
    """Counts the answers generated (one entry per call of ``Prompter.generate``)."""
    calls: list[int] = []
    original = Prompter.generate

    def counted(self, inputs):
        calls.append(1)
        return original(self, inputs)

    monkeypatch.setattr(Prompter, "generate", counted)
    return calls


def test_skip_existing_keeps_an_answer_without_generating_it_again(llava, tmp_path, generations):
    """A second run with --skip-existing generates nothing: each image's rows (answer, tokens, maps, fingerprints)
    come back as skipped ones; an image whose map is gone is answered again, and its row is new."""
    inputs, out, manifest = photos(tmp_path / "in"), tmp_path / "out", tmp_path / "out" / "rows.jsonl"
    args = (inputs, "-m", llava, "--prompt", PROMPT, "--max-new-tokens", 3, "--per-token", "-o", out)
    first = run(*args, "--manifest", manifest, "--skip-existing")
    assert first.exit_code == 0, first.output
    assert len(generations) == 3
    before = rows_of(manifest)
    assert all(row["provenance"]["task"] == "answer" for row in before)
    assert all((row["fingerprint"] is not None) == bool(row["outputs"]) for row in before)  # an empty answer: none
    assert all(row["status"] == "ok" for row in before)

    again = run(*args, "--manifest", manifest, "--skip-existing", "--json")
    assert again.exit_code == 0, again.output
    assert len(generations) == 3  # nothing generated again
    shown = [json.loads(line) for line in again.stdout.splitlines() if line.startswith("{")]
    assert [row["status"] for row in shown] == ["skipped"] * len(before)
    drop = ("status", "seconds")
    assert [{k: v for k, v in row.items() if k not in drop} for row in shown] == [
        {k: v for k, v in row.items() if k not in drop} for row in before
    ]
    shown_text = run(*args, "--manifest", manifest, "--skip-existing")
    assert "(kept: --skip-existing)" in shown_text.stdout and len(generations) == 3

    Path(before[0]["outputs"][0]).unlink()  # a.png's whole-answer map is gone: a.png is answered again
    third = run(*args, "--manifest", manifest, "--skip-existing")
    assert third.exit_code == 0, third.output
    assert len(generations) == 4
    after = rows_of(manifest)
    assert [row["input"] for row in after] == [row["input"] for row in before]  # one set per image, in order
    maps_of_a = sum(row["input"].endswith("a.png") for row in before)
    assert [row["status"] for row in after if row["input"].endswith("a.png")] == ["ok"] * maps_of_a
    assert Path(before[0]["outputs"][0]).is_file()

    result = run(*args, "--skip-existing")  # no manifest: nowhere to keep the answers
    assert result.exit_code == 2 and result.stderr.startswith("error: --skip-existing with --prompt needs --manifest")


def test_skip_existing_answers_again_with_other_methods(llava, tmp_path, generations):
    """Kept rows made with other --method are not kept: the image is answered again with this run's methods (its
    outputs are other files); the run record names the precision the model was loaded in."""
    inputs, out, manifest = photos(tmp_path / "in"), tmp_path / "out", tmp_path / "out" / "rows.jsonl"
    args = (inputs, "-m", llava, "--prompt", PROMPT, "--max-new-tokens", 2, "-o", out, "--manifest", manifest)
    first = run(*args, "--skip-existing")
    assert first.exit_code == 0, first.output
    assert json.loads((out / ".gradcam-run.json").read_text(encoding="utf-8"))["precision"] == "fp32"
    mapped = {row["input"] for row in rows_of(manifest) if row["outputs"]}  # not an empty answer's (no map: kept)
    assert mapped
    again = run(*args, "--skip-existing", "--method", "layercam")
    assert again.exit_code == 0, again.output
    assert len(generations) == 3 + len(mapped)  # every image with a map answered again
    assert {row["method"] for row in rows_of(manifest) if row["outputs"]} == {"layercam"}


def test_rows_carry_the_fingerprint_of_the_written_map(llava, tmp_path):
    inputs, out = photos(tmp_path / "in"), tmp_path / "out"
    args = ("-m", llava, "--prompt", PROMPT, "--answer", "a cat", "--save-raw", "-o", out, "--json")
    result = run(inputs / "a.png", *args)
    assert result.exit_code == 0, result.output
    (row,) = [json.loads(line) for line in result.stdout.splitlines()]
    overlay, raw = row["outputs"]
    assert raw == overlay.replace(".png", ".npy")
    assert row["fingerprint"] == map_fingerprint(torch.from_numpy(np.load(raw)))
    assert row["provenance"]["layers"] == [row["layer"]] and row["provenance"]["methods"] == ["gradcam"]


def test_shards_merge_into_one_runs_rows_and_gallery(llava, tmp_path):
    """--shard K/N with --prompt: each shard answers its share; gradcam merge joins the rows (answers kept) in input
    order and writes the gallery, which shows each image's question and answer."""
    inputs, out = photos(tmp_path / "in"), tmp_path / "out"
    args = (inputs, "-m", llava, "--prompt", PROMPT, "--answer", "a cat", "-o", out, "--report")
    for index in range(2):
        result = run(*args, "--shard", f"{index}/2")
        assert result.exit_code == 0, result.output
    merged = command("gradcam_cli.cli.merge", out)
    assert merged.exit_code == 0, merged.output
    rows = rows_of(out / "manifest.jsonl")
    assert [Path(row["input"]).name for row in rows] == ["a.png", "b.png", "c.png"]
    assert {(row["prompt"], row["answer"], row["target"]["name"]) for row in rows} == {(PROMPT, "a cat", "answer")}
    page = (out / "index.html").read_text(encoding="utf-8")
    data = re.search(r"(\[\{.*\}\])", page)
    assert data is not None
    entries = json.loads(data.group(1))
    assert [entry["predictions"][0][0] for entry in entries] == [f"{PROMPT} \N{RIGHTWARDS ARROW} a cat"] * 3


def test_diff_reports_a_changed_answer_beside_the_maps(llava, tmp_path):
    """gradcam diff of two answer runs: the same answer is no drift (the maps compared by fingerprint); another
    answer is reported as such."""
    inputs = photos(tmp_path / "in")
    for name, answer in (("cat", "a cat"), ("cat2", "a cat"), ("dog", "a dog")):
        manifest = tmp_path / f"{name}.jsonl"
        result = run(
            inputs, "-m", llava, "--prompt", PROMPT, "--answer", answer, "-o", tmp_path / name, "--manifest", manifest
        )
        assert result.exit_code == 0, result.output
    same = command("gradcam_cli.cli.diff", tmp_path / "cat.jsonl", tmp_path / "cat2.jsonl", "--json")
    assert same.exit_code == 0, same.output
    report = json.loads(same.stdout)
    assert not report["drift"], report
    changed = command("gradcam_cli.cli.diff", tmp_path / "cat.jsonl", tmp_path / "dog.jsonl")
    assert changed.exit_code == 1, changed.output
    assert "answer 'a cat' -> 'a dog'" in changed.stdout


def test_panel_and_heatmap_of_an_answer(llava, tmp_path):
    """--panel and --save-heatmap with --prompt: a heatmap per map (the map's colours alone) and one panel per
    image, listed in its rows."""
    from gradcam_cli.render.colour import colormap_table, heatmap_image

    inputs, out = photos(tmp_path / "in"), tmp_path / "out"
    args = ("-m", llava, "--prompt", PROMPT, "--answer", "a cat", "--per-token", "--save-raw", "--save-heatmap")
    result = run(inputs / "a.png", *args, "--panel", "-o", out, "--json")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == 3
    for row in rows:
        _, raw, heatmap, panel = row["outputs"]
        assert Path(heatmap).name.startswith("a_heatmap-gradcam_") and panel == str(out / "a_panel.png")
        saliency = torch.from_numpy(np.load(raw))
        expected = heatmap_image(saliency, colormap_table("jet")).numpy()
        assert np.array_equal(np.asarray(Image.open(heatmap).convert("RGB")), expected)
    assert Image.open(out / "a_panel.png").size[0] > 96


@pytest.mark.quick
def test_engine_ray_is_refused_in_one_line(llava, tmp_path):
    inputs = photos(tmp_path / "in")
    result = run(inputs, "-m", llava, "--prompt", PROMPT, "--engine", "ray", "-o", tmp_path / "out")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --engine ray explains images with an image model on a Ray cluster")
    assert len(result.stderr.strip().splitlines()) == 1


def test_each_failure_names_its_image(llava, tmp_path):
    """Issue 41, item 8: a per-image failure (a word the answer does not hold) starts with the image's path
    (docs/cli.md), and the batch goes on to the next image."""
    folder = photos(tmp_path / "photos")
    given = ["--model", llava, "--prompt", PROMPT, "--answer", "a cat", "--target", "answer:zebra"]
    result = run(folder, *given, "-o", tmp_path / "out")
    assert result.exit_code == 1
    failures = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(failures) == 3, result.output
    for line, name in zip(failures, ("a.png", "b.png", "c.png"), strict=True):
        assert line.startswith(f"error: {folder / name}: answer:zebra"), line


@pytest.mark.quick
@pytest.mark.parametrize(
    ("given", "said"),
    [
        (["--prompt", "  "], "error: --prompt is blank"),
        (["--prompt", PROMPT, "--answer", ""], "error: --answer is blank"),
        (["--prompt", PROMPT, "--target", "class:cat"], "error: --target class:cat: a vision-language answer takes"),
        (["--prompt", PROMPT, "--target", "text:hi"], "error: --target text:hi: a vision-language answer takes"),
    ],
)
def test_a_question_no_image_can_be_asked_is_refused_once_at_start(tmp_path, given, said):
    """Issue 41, item 7: a blank question or answer, or a target that is not the answer's, is a usage mistake: one
    line and exit code 2 before any model loads (the folder named need not even exist), not exit 1 per image."""
    folder = photos(tmp_path / "photos")
    result = run(folder, "--model", f"hf:{tmp_path / 'no-such-model'}", *given, "-o", tmp_path / "out")
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(said), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.quick
@pytest.mark.parametrize(
    ("app_module", "given", "said"),
    [
        ("gradcam_cli.cli", ["--attention-heads", "max"], "error: --attention-heads does not apply to a --prompt's"),
        ("gradcam_cli.cli", ["--input-size", "64"], "error: --input-size does not apply to a --prompt's answer"),
        ("gradcam_cli.cli.eval", ["--target", "class:foo"], "error: --target does not apply to a --prompt's answer"),
        ("gradcam_cli.cli.eval", ["--target", "answer:cat"], "error: --target does not apply to a --prompt's answer"),
        ("gradcam_cli.cli.eval", ["--rank"], "error: --rank does not apply to a --prompt's answer"),  # not --sanity
    ],
)
def test_an_option_a_question_does_not_take_is_refused(tmp_path, app_module, given, said):
    """Issue 41, item 9: options that were silently ignored with ``--prompt`` (``--attention-heads``,
    ``--input-size``; ``gradcam eval --prompt``'s ``--target``, which measures the whole answer's map) are refused in
    one line, exit code 2, before the model loads."""
    folder = photos(tmp_path / "photos")
    result = command(app_module, folder, "--model", f"hf:{tmp_path / 'none'}", "--prompt", PROMPT, *given)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(said), result.stderr


@pytest.mark.quick
def test_prompts_messages_name_what_was_given(tmp_path):
    """Issue 41, item 17: an empty prompt in ``--prompts`` says so (not "quote a prompt with commas"), and
    ``--prompts`` with a model that is no vision-language model names ``--prompts``, not ``--prompt``."""
    folder = photos(tmp_path / "photos")
    pairs = folder / "pairs.csv"
    pairs.write_text("a.png,\n", encoding="utf-8")
    result = run("--model", f"hf:{tmp_path / 'none'}", "--prompts", pairs)
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: --prompts {pairs}, line 1: the prompt for a.png is empty"
    pairs.write_text("a.png,what is it?\n", encoding="utf-8")
    result = run("--model", "resnet18", "--weights", "none", "--prompts", pairs, "-o", tmp_path / "out")
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: --prompts asks a vision-language model (hf:DIR: docs/vlm.md); resnet18 is a torchvision model"
    )


@pytest.mark.parametrize(
    ("family", "layer"),
    [
        ("llava", "lm_head"),
        ("llava", "model.language_model.layers.0"),
        ("llava", "model.language_model.embed_tokens"),
        ("idefics3", "model.text_model.layers.1"),
        ("qwen2_vl", "model.language_model.layers.0"),
    ],
)
def test_a_language_model_layer_is_refused_at_start(tmp_path, family, layer):
    """Issue 41, item 5: a layer of the language model (its tokens are the prompt's and the answer's, not the
    photo's) is refused in one line, exit code 2, for every family alike, instead of drawing text tokens on the
    photo as if they were patches."""
    folder = getattr(vlm_models, family)(tmp_path / family)
    image = photos(tmp_path / "photos") / "a.png"
    result = run(image, "--model", f"hf:{folder}", "--prompt", PROMPT, "--layer", layer, "-o", tmp_path / "out")
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: --layer {layer} is part of the language model")
    assert not list((tmp_path / "out").glob("*.png"))
