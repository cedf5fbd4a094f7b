"""A vision-language model's layers and questions on the command line (issue 41, items 6, 7 and 9): LLaVA's vision
encoder layers explained after generation as with a given answer, usage mistakes refused once at start-up, and
``gradcam eval --prompt``'s ``--max-new-tokens`` and ``--prompts``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")

import vlm_models
from PIL import Image

LAST_VISION_LAYER = "model.vision_tower.encoder.layers.1"
"""The tiny LLaVA's last vision encoder layer: the projector reads its output through the hidden states transformers
records with its own hooks (``vision_feature_layer`` -1)."""


@pytest.fixture()
def images(tmp_path) -> Path:
    folder = tmp_path / "photos"
    folder.mkdir()
    Image.new("RGB", (48, 32), (200, 40, 40)).save(folder / "a.png")
    Image.new("RGB", (40, 40), (20, 140, 240)).save(folder / "b.png")
    return folder


def run(*args):
    from typer.testing import CliRunner

    from gradcam_cli.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def test_vision_encoder_layer_explains_the_generated_answer_as_a_given_one(llava, images, tmp_path):
    """Item 6: after ``generate`` (which installs transformers' hidden-state recorders for good) the last vision
    encoder layer is explained, and its map is the one ``--answer`` with the same text gives; a second image with
    ``--answer`` (the recorders installed by the first) too."""
    model, photo = f"hf:{llava}", images / "a.png"
    common = ("--model", model, "--prompt", "what is it", "--layer", LAST_VISION_LAYER, "--save-raw")
    generated = run(photo, *common, "--max-new-tokens", 2, "-o", tmp_path / "generated")
    assert generated.exit_code == 0, generated.output
    answer = generated.stdout.split("answer: ")[1].split("  (log p")[0]
    assert answer == "dog two"  # two plain words: the given answer's tokens are the generated ones
    given = run(images, *common, "--answer", answer, "-o", tmp_path / "given")
    assert given.exit_code == 0, given.output
    ours = np.load(tmp_path / "generated" / "a_gradcam_answer.npy")
    assert ours.max() > 0
    np.testing.assert_allclose(ours, np.load(tmp_path / "given" / "a_gradcam_answer.npy"), atol=1e-6)
    assert np.load(tmp_path / "given" / "b_gradcam_answer.npy").max() > 0


@pytest.fixture(scope="module")
def qwen(tmp_path_factory) -> Path:
    return vlm_models.qwen2_vl(tmp_path_factory.mktemp("qwen"))


def refused(result) -> str:
    """The one line a run refused at start-up printed (exit 2, nothing per image)."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "a.png" not in lines[0] and "b.png" not in lines[0]
    return lines[0]


@pytest.mark.quick
@pytest.mark.parametrize(
    ("family", "layer", "says"),
    [
        ("qwen", "model.visual.blocks.0", "error: --layer model.visual.blocks.0 outputs 64 tokens, not the 16 of the "),
        ("llava", "model.vision_tower.post_layernorm", "error: the answer does not depend on --layer model.vision_to"),
    ],
)
def test_a_layer_no_answer_is_explained_at_is_refused_at_start_up(request, images, tmp_path, family, layer, says):
    """Item 7: a Qwen2-VL block before the merge and CLIP's ``post_layernorm``: one line, exit 2, before any image."""
    folder = request.getfixturevalue(family)
    result = run(images, "--model", f"hf:{folder}", "--prompt", "what is it", "--layer", layer, "-o", tmp_path / "o")
    assert refused(result).startswith(says)
    assert not (tmp_path / "o").exists() or not list((tmp_path / "o").glob("*.png"))


def test_a_folder_without_a_chat_template_is_refused_at_start_up(llava, images, tmp_path):
    """Item 7: no chat template: one line naming it, exit 2 (not transformers' message per image)."""
    folder = tmp_path / "bare"
    shutil.copytree(llava, folder)
    (folder / "chat_template.jinja").unlink()
    result = run(images, "--model", f"hf:{folder}", "--prompt", "what is it", "-o", tmp_path / "o")
    assert refused(result) == (
        f"error: hf:{folder} has no chat template (chat_template.jinja or the processor's chat_template): --prompt "
        f"puts the question and the image through it; add the model's own"
    )


@pytest.mark.quick
def test_the_image_placeholder_in_a_prompt_or_answer_is_refused(llava, qwen, images, tmp_path):
    """Item 7: ``<image>`` in a prompt, ``<|image_pad|>`` in an answer: one line at start-up, exit 2; in a
    --prompts file, the image's line names it (exit 1), the others are answered."""
    result = run(images, "--model", f"hf:{llava}", "--prompt", "what <image> is it", "-o", tmp_path / "o")
    assert refused(result) == (
        f"error: --prompt 'what <image> is it' contains <image>, hf:{llava}'s image placeholder: the image is put in "
        f"by the chat template; leave it out"
    )
    result = run(images, "-m", f"hf:{qwen}", "--prompt", "what is it", "--answer", "a <|image_pad|>", "-o", tmp_path)
    assert refused(result).startswith("error: --answer 'a <|image_pad|>' contains <|image_pad|>, hf:")
    prompts = tmp_path / "prompts.csv"
    prompts.write_text(f"{images / 'a.png'},what is it\n{images / 'b.png'},what <image>\n")
    result = run("--prompts", prompts, "--model", f"hf:{llava}", "--max-new-tokens", 2, "-o", tmp_path / "each")
    assert result.exit_code == 1, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: {images / 'b.png'}: --prompt 'what <image>' contains <image>, hf:{llava}'s image "
        "placeholder: the image is put in by the chat template; leave it out"
    ]
    assert (tmp_path / "each" / "a_gradcam_answer.png").exists()


def eval_rows(*args) -> list[dict]:
    """``gradcam eval ARGS --steps 2 --json``'s rows."""
    from typer.testing import CliRunner

    from gradcam_cli.cli.eval import app

    result = CliRunner().invoke(app, [str(a) for a in (*args, "--steps", 2, "--json")])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return [row for row in rows if "input" in row]  # an image's rows (an empty answer's too), not the means'


def same(row: dict, other: dict) -> bool:
    """Two rows of one image, named alike or not, with the same figures."""
    return {**row, "input": Path(row["input"]).name} == {**other, "input": Path(other["input"]).name}


def test_eval_takes_max_new_tokens_and_prompts(llava, images, tmp_path):
    """Item 9: ``gradcam eval --prompt`` with ``--max-new-tokens`` measures the answer ``gradcam`` gives with it;
    ``--prompts`` asks each image its own question, measured as ``--prompt`` with that question measures it."""
    model = ("--model", f"hf:{llava}")
    explained = run(images / "a.png", *model, "--prompt", "what is it", "--max-new-tokens", 2, "-o", tmp_path / "o")
    assert explained.exit_code == 0, explained.output
    answer = explained.stdout.split("answer: ")[1].split("  (log p")[0]
    rows = eval_rows(images, *model, "--prompt", "what is it", "--max-new-tokens", 2)
    assert [row["input"] for row in rows] == [str(images / "a.png"), str(images / "b.png")]
    assert rows[0]["answer"] == answer == "dog two"  # two tokens, as asked (32 without: a longer answer)
    alone = eval_rows(images / "b.png", *model, "--prompt", "is it red", "--max-new-tokens", 2)
    prompts = tmp_path / "prompts.csv"
    prompts.write_text("image,prompt\nphotos/a.png,what is it\nphotos/b.png,is it red\n")
    assert images.parent == tmp_path
    each = eval_rows("--prompts", prompts, *model, "--max-new-tokens", 2)
    assert [row["prompt"] for row in each] == ["what is it", "is it red"]
    assert same(each[0], rows[0]) and same(each[1], alone[0]) and len(each) == 2
