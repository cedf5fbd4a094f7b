"""A vision-language model on the command line as a user meets it (issue 41): what is wrong with an ``hf:`` folder
named as it is without ``--prompt``, ``--list-layers`` of such a model, an answer of special tokens alone shown as
tokens, and no progress bar of transformers' on stderr."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import vlm_models
from PIL import Image

from gradcam_cli.models.families.vision_language import LLAVA, QWEN2_VL


@pytest.fixture()
def image(tmp_path) -> Path:
    path = tmp_path / "photo.png"
    Image.new("RGB", (48, 32), (200, 40, 40)).save(path)
    return path


def run(*args, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``gradcam ARGS`` in a subprocess, as a user runs it (its stderr is the real one: progress bars show)."""
    return subprocess.run(
        [sys.executable, "-m", "gradcam_cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
        check=False,
    )


def cache_hub_id(cache: Path, repo: str, folder: Path) -> None:
    """``folder`` as hub id ``repo`` in a Hugging Face cache at ``cache`` (its refs and one snapshot)."""
    entry = cache / f"models--{repo.replace('/', '--')}"
    commit = "0" * 40
    (entry / "refs").mkdir(parents=True)
    (entry / "refs" / "main").write_text(commit)
    shutil.copytree(folder, entry / "snapshots" / commit)


def test_every_problem_of_an_hf_folder_is_named_with_prompt_as_without(image, tmp_path):
    """Issue 41, item 10: a missing folder, an empty one, an unreadable config.json, a text-only model and a cached hub
    id of an image classifier each get their own cause with --prompt, the same as without (or, for a model that
    loads, its model type), never "is a hf model"."""
    empty, broken = tmp_path / "empty", tmp_path / "broken"
    empty.mkdir()
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    text = vlm_models.text_model(tmp_path / "text")
    cache = tmp_path / "hub"
    cache_hub_id(cache, "someone/text-model", text)
    offline = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    cases = [
        (tmp_path / "missing", 2, None),
        (empty, 2, None),
        (broken, 3, None),
        (text, 2, "is a llama model"),
        ("someone/text-model", 2, "is a llama model"),
    ]
    # Two runs at a time (the test only waits on them), each with an output folder of its own (a run holds its
    # folder's lock). Without --prompt only the folders refused whatever is asked: the two that load answer.
    asked_args = [[image, "--model", f"hf:{folder}", "--prompt", "what is it?"] for folder, *_ in cases]
    plain_args = [[image, "--model", f"hf:{folder}"] for folder, _, p in cases if p is None]
    every = [[*args, "-o", tmp_path / f"out{i}"] for i, args in enumerate(asked_args + plain_args)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda args: run(*args, env=offline), every))
    plains = iter(results[len(cases) :])
    for (folder, code, prompted), asked in zip(cases, results, strict=False):
        assert asked.returncode == code, asked.stderr
        assert "is a hf model" not in asked.stderr and len(asked.stderr.splitlines()) == 1
        if prompted is None:
            plain = next(plains)
            assert (plain.returncode, asked.stderr) == (code, plain.stderr)
        else:
            assert asked.stderr == (
                f"error: --prompt asks a vision-language model (hf:DIR: docs/vlm.md); hf:{folder} {prompted}\n"
            )


@pytest.mark.quick
def test_a_folder_without_processor_or_tokenizer_files_says_so_in_one_sentence(llava, image, tmp_path):
    """Issue 41, item 10: no image processor, no tokenizer files: one sentence naming the folder once and what to
    save, not transformers' hub advice cut off."""
    no_processor, no_tokenizer = tmp_path / "no-processor", tmp_path / "no-tokenizer"
    shutil.copytree(llava, no_processor)
    shutil.copytree(llava, no_tokenizer)
    (no_processor / "processor_config.json").unlink()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (no_tokenizer / name).unlink()
    for folder, missing in (
        (no_processor, "image processor (processor_config.json or preprocessor_config.json)"),
        (no_tokenizer, "tokenizer files (tokenizer.json, tokenizer.model or vocab.json)"),
    ):
        result = run(image, "--model", f"hf:{folder}", "--prompt", "what is it?", "-o", tmp_path / "out")
        assert result.returncode == 3
        assert result.stderr == (
            f"error: hf:{folder} has no {missing}; save the model's processor there too, with "
            "processor.save_pretrained(FOLDER)\n"
        )


def test_a_cached_hub_id_of_a_vision_language_model_is_asked(llava, image, tmp_path):
    """A hub id whose configuration is in the local cache is claimed by the vision-language family offline."""
    cache = tmp_path / "hub"
    cache_hub_id(cache, "someone/tiny-llava", llava)
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    result = run(image, "--model", "hf:someone/tiny-llava", "--prompt", "what is the cat ?", "-o", tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert "  answer: " in result.stdout and (tmp_path / "photo_gradcam_answer.png").is_file()


def test_list_layers_of_a_vision_language_model(llava, image, tmp_path):
    """Issue 41, item 11: the layers before the language model, the family's default marked, every layer whose output
    is the image's tokens and reaches the answer a candidate; none of the language model's. The candidates
    tried are explained on the command line."""
    result = run(image, "--model", f"hf:{llava}", "--list-layers", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in map(json.loads, result.stdout.splitlines())}
    assert [name for name, row in rows.items() if row["default"]] == [LLAVA.default_layer]
    assert rows[LLAVA.default_layer]["output_shape"] == [1, 16, 32]  # 4 x 4 patches, width 32
    assert not any(name.startswith(("model.language_model", "lm_head")) for name in rows)
    candidates = {name for name, row in rows.items() if row["candidate"]}
    assert {"model.vision_tower.encoder.layers.1", "model.multi_modal_projector.linear_1"} <= candidates
    assert "model.vision_tower.embeddings.patch_embedding" not in candidates  # a convolution's map, not tokens
    assert "model.vision_tower.embeddings.position_embedding" not in candidates  # not computed from the photo
    for layer in ("model.vision_tower.encoder.layers.1", "model.multi_modal_projector.linear_1"):
        asked = run(
            image, "-m", f"hf:{llava}", "--prompt", "what ?", "--answer", "a cat", "--layer", layer, "-o", tmp_path
        )
        assert asked.returncode == 0, asked.stderr
        assert f"layer {layer})" in asked.stdout
    table = run("--model", f"hf:{llava}", "--list-layers")
    assert table.returncode == 0, table.stderr
    assert f"* {LLAVA.default_layer} " in table.stdout and "language model's layers are not listed" in table.stdout


def test_list_layers_of_qwen2_vl_marks_only_the_merged_tokens(tmp_path, image):
    """Qwen2-VL's blocks (before the 2 x 2 merge) are listed but not candidates; the merger's layers are."""
    folder = vlm_models.qwen2_vl(tmp_path / "qwen")
    result = run(image, "--model", f"hf:{folder}", "--list-layers", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in map(json.loads, result.stdout.splitlines())}
    assert rows[QWEN2_VL.default_layer]["default"] and rows[QWEN2_VL.default_layer]["candidate"]
    assert "model.visual.blocks.0" in rows and not rows["model.visual.blocks.0"]["candidate"]


@pytest.mark.quick
def test_an_answer_of_special_tokens_is_shown_and_no_progress_bar(llava, image, tmp_path):
    """Issue 41, item 12: an answer of special tokens alone is shown as its tokens (as errors quote them), not
    blank; transformers' "Loading weights" bar is never printed, -q or not."""
    for quiet in (["-q"], []):
        result = run(image, "--model", f"hf:{llava}", "--prompt", "what ?", "--answer", "<unk>", "-o", tmp_path, *quiet)
        assert result.returncode == 0, result.stderr
        assert "Loading weights" not in result.stderr and "it/s" not in result.stderr
    assert "  answer (given): <unk>  (log p " in result.stdout
    row = run(image, "--model", f"hf:{llava}", "--prompt", "what ?", "--answer", "<unk>", "--json", "-o", tmp_path)
    assert json.loads(row.stdout.splitlines()[0])["answer"] == "<unk>"
