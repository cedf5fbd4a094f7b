"""A vision-language model's layers and questions on the command line (issue 41, items 6, 7 and 9): LLaVA's vision
encoder layers explained after generation as with a given answer, usage mistakes refused once at start-up, and
``gradcam eval --prompt``'s ``--max-new-tokens`` and ``--prompts``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")

import vlm_models
from PIL import Image

LAST_VISION_LAYER = "model.vision_tower.encoder.layers.1"
"""The tiny LLaVA's last vision encoder layer: the projector reads its output through the hidden states transformers
records with its own hooks (``vision_feature_layer`` -1)."""


@pytest.fixture(scope="module")
def llava(tmp_path_factory) -> Path:
    return vlm_models.llava(tmp_path_factory.mktemp("llava"))


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
