"""--target on models without a class head, built here with random weights: timm with ``num_classes=0``, tiny
CLIP configurations of transformers (a folder written by ``save_pretrained``, with a tokenizer of its own) and of
open_clip (a configuration file and a checkpoint). Each map is compared with Grad-CAM computed independently: the
layer's output captured by the test's own hook, the same score (the cosine, computed from the models' own image and
text encoders) differentiated with ``torch.autograd.grad``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from cam_reference import pearson
from square_model import square_image
from typer.testing import CliRunner

from gradcam_cli import Explainer, load_model
from gradcam_cli.cli import app
from gradcam_cli.errors import EXIT_MODEL, EXIT_OK, EXIT_USAGE
from gradcam_cli.io.images import load_image, to_input_tensor

pytestmark = pytest.mark.slow
PROMPTS = ["a red square", "a blue square", "a photo of a dog"]


def run(*args: str | Path):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("pictures")
    scene = square_image(size=(160, 120), box=(10, 10, 60, 60), colour="red")
    scene.paste((20, 20, 230), (100, 60, 150, 110))
    scene.save(folder / "scene.png")
    square_image(size=(100, 100), box=(30, 30, 70, 70), colour="red").save(folder / "ref.png")
    (folder / "prompts.txt").write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def hf_clip(tmp_path_factory) -> Path:
    """A tiny transformers CLIPModel saved with a character-level tokenizer and an image processor (32 px)."""
    from attention_models import save_tiny_clip

    folder = tmp_path_factory.mktemp("hf_clip")
    save_tiny_clip(folder)
    return folder


@pytest.fixture(scope="module")
def open_clip_model(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny open_clip configuration file (ViT, 32 px) and a checkpoint of its random weights."""
    import open_clip

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("open_clip")
    config = {
        "embed_dim": 8,
        "vision_cfg": {"image_size": 32, "layers": 2, "width": 16, "patch_size": 8, "head_width": 8},
        "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 16, "heads": 2, "layers": 1},
    }
    path = folder / "tinyclip_targets.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    open_clip.add_model_config(path)
    torch.save(open_clip.create_model("tinyclip_targets", pretrained=None).state_dict(), folder / "tiny.pt")
    return path, folder / "tiny.pt"


def token_gradcam(module, layer, inputs, score, prefix=1):
    """Grad-CAM at a transformer ``layer`` whose (N, prefix + h*w, C) tokens are laid out on their grid (the
    prefix tokens left out), computed with this test's own hook and ``torch.autograd.grad``."""
    captured = []
    handle = layer.register_forward_hook(lambda m, i, o: captured.append(o))
    try:
        with torch.enable_grad():
            value = score(module(inputs)).sum()
            (gradient,) = torch.autograd.grad(value, captured[-1])
    finally:
        handle.remove()

    def grid(tokens):
        tokens = tokens[:, prefix:]
        side = math.isqrt(tokens.shape[1])
        return tokens.reshape(tokens.shape[0], side, side, -1).permute(0, 3, 1, 2)

    activations, gradient = grid(captured[-1].detach()), grid(gradient)
    return (gradient.mean(dim=(2, 3), keepdim=True) * activations).sum(dim=1).clamp(min=0)


def test_timm_without_a_head_is_an_embedding_model(pictures, tmp_path):
    model = load_model("timm:test_resnet", "none", num_classes=0, input_size=64)
    assert model.embeds
    model.module.eval()  # batch norms with their running statistics, as the explainer runs them
    explainer = Explainer(model, "layer4", targets=[f"similar:{pictures / 'ref.png'}"])
    inputs = to_input_tensor(load_image(pictures / "scene.png"), model.input_spec)[None]
    with torch.no_grad():
        reference = F.normalize(model.module(to_input_tensor(load_image(pictures / "ref.png"), model.input_spec)[None]))
    captured = []
    handle = model.module.layer4.register_forward_hook(lambda m, i, o: captured.append(o))
    with torch.enable_grad():
        score = (F.normalize(model.module(inputs)) @ reference[0]).sum()
        (gradient,) = torch.autograd.grad(score, captured[-1])
    handle.remove()
    expected = (gradient.mean(dim=(2, 3), keepdim=True) * captured[-1].detach()).sum(dim=1).clamp(min=0)
    assert pearson(explainer.compute_targets(inputs)[1]["gradcam"][0][0], expected) >= 0.999
    args = (pictures / "scene.png", "-m", "timm:test_resnet", "--weights", "none", "--num-classes", "0")
    mistakes = {("--target", "class:3"): "has no class head", (): "give --target similar:"}
    for more, message in mistakes.items():
        result = run(*args, "--input-size", "64", *more, "-o", tmp_path / "out")
        assert result.exit_code == EXIT_USAGE and message in result.stderr, result.output


def test_hf_clip_text_and_similarity_maps_match_autograd(hf_clip, pictures):
    from transformers import CLIPModel, CLIPTokenizer

    model = load_model(f"hf:{hf_clip}", "DEFAULT")
    layer = "vision_model.encoder.layers.1.layer_norm1"
    explainer = Explainer(model, layer, targets=[f"text:{PROMPTS[1]}", f"similar:{pictures / 'ref.png'}"])
    inputs = to_input_tensor(load_image(pictures / "scene.png"), model.input_spec)[None]
    clip, tokenizer = CLIPModel.from_pretrained(hf_clip).eval(), CLIPTokenizer.from_pretrained(hf_clip)
    with torch.no_grad():
        text = clip.get_text_features(**tokenizer([PROMPTS[1]], return_tensors="pt", padding=True))
        text = F.normalize(getattr(text, "pooler_output", text))  # transformers 5 returns an output object
        ref_pixels = to_input_tensor(load_image(pictures / "ref.png"), model.input_spec)[None]
        ref = F.normalize(clip.visual_projection(clip.vision_model(pixel_values=ref_pixels).pooler_output))

    def image(pixels):
        return F.normalize(clip.visual_projection(clip.vision_model(pixel_values=pixels).pooler_output))

    cams = explainer.compute_targets(inputs)[1]["gradcam"]
    where = clip.vision_model.encoder.layers[1].layer_norm1
    for k, embedding in enumerate((text, ref)):
        expected = token_gradcam(image, where, inputs, lambda out, e=embedding: out @ e[0])
        assert pearson(cams[k][0], expected) >= 0.999


def test_hf_clip_command_line_ranks_prompts_and_refuses_classes(hf_clip, pictures, tmp_path):
    args = (pictures / "scene.png", "-m", f"hf:{hf_clip}", "-o", tmp_path / "out")
    result = run(*args, "--labels", pictures / "prompts.txt", "--top-k", "2")
    assert result.exit_code == EXIT_OK, result.output
    ranked = [
        line.split(".", 1)[1].rsplit("%", 1)[0] for line in result.stdout.splitlines() if line[:4].strip()[:1].isdigit()
    ]
    assert len(ranked) == 3 and {name.rsplit(None, 1)[0].strip() for name in ranked} == set(PROMPTS)
    assert result.stdout.count("gradcam for ") == 2
    result = run(*args, "--target", "class:1")
    assert result.exit_code == EXIT_USAGE and "has no class head" in result.stderr, result.output
    result = run(*args, "--target", "text:a dog", "--score", "logit", "--json")
    assert result.exit_code == EXIT_OK, result.output
    assert json.loads(result.stdout.splitlines()[0])["target"]["score"] == "logit"


def test_open_clip_text_maps_match_autograd_and_run_from_the_command_line(open_clip_model, pictures, tmp_path):
    import open_clip

    config, checkpoint = open_clip_model
    model = load_model(f"open_clip:{config}", str(checkpoint))
    layer = "transformer.resblocks.1.ln_1"
    explainer = Explainer(model, layer, targets=[f"text:{PROMPTS[0]}", f"contrast:{PROMPTS[0]},{PROMPTS[1]}"])
    inputs = to_input_tensor(load_image(pictures / "scene.png"), model.input_spec)[None]
    clip = open_clip.create_model(config.stem, pretrained=None)
    clip.load_state_dict(torch.load(checkpoint, weights_only=True))
    clip.eval()
    with torch.no_grad():
        text = F.normalize(clip.encode_text(open_clip.get_tokenizer(config.stem)(PROMPTS[:2])))

    def image(pixels):
        return F.normalize(clip.encode_image(pixels))

    cams = explainer.compute_targets(inputs)[1]["gradcam"]
    where = clip.visual.transformer.resblocks[1].ln_1
    expected = token_gradcam(image, where, inputs, lambda out: out @ text[0])
    assert pearson(cams[0][0], expected) >= 0.999
    expected = token_gradcam(image, where, inputs, lambda out: out @ text[0] - out @ text[1])
    assert pearson(cams[1][0], expected) >= 0.999
    result = run(
        pictures / "scene.png",
        "-m",
        f"open_clip:{config}",
        "--weights",
        checkpoint,
        "--target",
        "text:a photo of a dog",
        "--labels",  # rivals for Finer-CAM: a prompt alone has none
        pictures / "prompts.txt",
        "--method",
        "gradcam,scorecam,ablationcam,finercam",
        "-o",
        tmp_path / "out",
    )
    assert result.exit_code == EXIT_OK, result.output
    assert len(list((tmp_path / "out").glob("scene_*_0-text-a-photo-of-a-dog.png"))) == 4
    result = run(pictures / "scene.png", "-m", "resnet18", "--weights", "none", "--target", "text:a dog")
    assert result.exit_code == EXIT_USAGE and "has no text tower" in result.stderr


@pytest.fixture(scope="module")
def hf_siglip_and_vit(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny SiglipModel with a word-level tokenizer of its own, and a tiny ViTModel (no head: its pooled output is
    the embedding), each saved with an image processor (32 px)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        PreTrainedTokenizerFast,
        SiglipConfig,
        SiglipImageProcessor,
        SiglipModel,
        ViTConfig,
        ViTImageProcessor,
        ViTModel,
    )

    torch.manual_seed(0)
    siglip, vit = tmp_path_factory.mktemp("siglip"), tmp_path_factory.mktemp("vit")
    words = ["<pad>", "</s>", "<unk>", "a", "photo", "of", "red", "blue", "square", "dog", "cat"]
    tokenizer = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>", eos_token="</s>")
    layers = {"hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2}
    text = {"vocab_size": len(words), "num_hidden_layers": 1, "max_position_embeddings": 8, **layers}
    vision = {"num_hidden_layers": 2, "image_size": 32, "patch_size": 8, **layers}
    config = SiglipConfig(text_config=text, vision_config=vision)
    config.text_config.bos_token_id = config.text_config.eos_token_id = 1
    SiglipModel(config).save_pretrained(siglip)
    fast.save_pretrained(siglip)
    SiglipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(siglip)
    ViTModel(ViTConfig(num_hidden_layers=2, image_size=32, patch_size=8, **layers)).save_pretrained(vit)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(vit)
    return siglip, vit


def test_siglip_prompts_and_a_vit_backbone_match_autograd(hf_siglip_and_vit, pictures):
    from transformers import AutoTokenizer, SiglipModel, ViTModel

    siglip_folder, vit_folder = hf_siglip_and_vit
    model = load_model(f"hf:{siglip_folder}", "DEFAULT")
    layer = "vision_model.encoder.layers.1.layer_norm1"
    explainer = Explainer(model, layer, targets=[f"text:{PROMPTS[0]}"], score="logit")
    inputs = to_input_tensor(load_image(pictures / "scene.png"), model.input_spec)[None]
    siglip = SiglipModel.from_pretrained(siglip_folder).eval()
    tokens = AutoTokenizer.from_pretrained(siglip_folder)([PROMPTS[0]], padding="max_length", max_length=8)
    with torch.no_grad():
        text = siglip.get_text_features(input_ids=torch.tensor(tokens["input_ids"]))
        text = F.normalize(getattr(text, "pooler_output", text))
    scale, bias = siglip.logit_scale.exp(), siglip.logit_bias

    def logit(pixels):
        return scale * F.normalize(siglip.vision_model(pixel_values=pixels).pooler_output) @ text[0] + bias

    where = siglip.vision_model.encoder.layers[1].layer_norm1
    expected = token_gradcam(logit, where, inputs, lambda out: out, prefix=0)  # SigLIP has no class token
    assert pearson(explainer.compute_targets(inputs)[1]["gradcam"][0][0], expected) >= 0.999

    model = load_model(f"hf:{vit_folder}", "DEFAULT")
    assert model.embeds
    explainer = Explainer(model, "layers.1.layernorm_before", targets=[f"similar:{pictures / 'ref.png'}"])
    vit = ViTModel.from_pretrained(vit_folder).eval()
    with torch.no_grad():
        ref_pixels = to_input_tensor(load_image(pictures / "ref.png"), model.input_spec)[None]
        reference = F.normalize(vit(pixel_values=ref_pixels).pooler_output)

    def pooled(pixels):
        return F.normalize(vit(pixel_values=pixels).pooler_output)

    inputs = to_input_tensor(load_image(pictures / "scene.png"), model.input_spec)[None]
    expected = token_gradcam(pooled, vit.layers[1].layernorm_before, inputs, lambda out: out @ reference[0])
    assert pearson(explainer.compute_targets(inputs)[1]["gradcam"][0][0], expected) >= 0.999


def test_a_hf_clip_folder_without_a_tokenizer_refuses_prompts_in_one_line(hf_clip, pictures, tmp_path):
    """transformers builds an empty tokenizer for such a folder (every word one unknown id, every prompt alike):
    prompts are refused (exit 3); its image tower still explains a similar: target."""
    import shutil

    folder = tmp_path / "no_tokenizer"
    shutil.copytree(hf_clip, folder)
    for name in ("vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    scene = pictures / "scene.png"
    result = run(scene, "-m", f"hf:{folder}", "--target", "text:a red square", "-o", tmp_path / "out")
    assert result.exit_code == EXIT_MODEL, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: {folder} has no tokenizer (vocab.json and merges.txt, or tokenizer.json)")
    similar = run(scene, "-m", f"hf:{folder}", "--target", f"similar:{pictures / 'ref.png'}", "-o", tmp_path / "ok")
    assert similar.exit_code == EXIT_OK, similar.output


def test_finercam_refuses_a_single_prompt_as_it_refuses_any_target_without_rivals(hf_clip, pictures, tmp_path):
    """A prompt that is the run's only one has no rivals (Finer-CAM would be Grad-CAM): refused in one line, as
    similar: is; with --labels prompts it has rivals and runs."""
    args = (pictures / "scene.png", "-m", f"hf:{hf_clip}", "--target", "text:a red square", "--method", "finercam")
    alone = run(*args, "-o", tmp_path / "alone")
    assert alone.exit_code == EXIT_USAGE, alone.output
    assert alone.stderr.splitlines() == [
        "error: --method finercam compares a target with its rivals; text:a red square has none (give other prompts "
        "to compare it with: more text: targets, or --labels PROMPTS)"
    ]
    rivals = run(*args, "--labels", pictures / "prompts.txt", "-o", tmp_path / "rivals")
    assert rivals.exit_code == EXIT_OK, rivals.output
