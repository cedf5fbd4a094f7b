"""Vision-language answers (gradcam_cli/vlm): maps against an independent autograd reference, per-token gradients
summing to the answer's, the generated answer against ``model.generate``, and each family's geometry with a photo
whose halves differ. Tiny random models of each family (tests/vlm_models.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import torch
import vlm_models
from PIL import Image
from vlm_models import answerer, load_vlm

from gradcam_cli.cam.answer_model import placeholder_ids
from gradcam_cli.cam.answers import Prompter
from gradcam_cli.cam.prompted import answer_gradients, explain_prompt, token_map
from gradcam_cli.evaluation.answers import answer_curves
from gradcam_cli.targets import TargetSpec

BUILDERS = vlm_models.BUILDERS
PROMPT = "what is the cat ?"


@pytest.fixture(scope="module", params=list(BUILDERS))
def folder(request, tmp_path_factory):
    return BUILDERS[request.param](tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module", params=list(BUILDERS))
def local_folder(request, tmp_path_factory):
    """A family's model without vision-encoder layers: each image token depends on its own patches only."""
    return BUILDERS[request.param](tmp_path_factory.mktemp(request.param + "-local"), vision_layers=0)


def photo(width: int = 96, height: int = 48, left=(220, 30, 30), right=(30, 30, 220)) -> Image.Image:
    image = Image.new("RGB", (width, height), right)
    image.paste(Image.new("RGB", (width // 2, height), left), (0, 0))
    return image


def processed(vlm, image: Image.Image, prompt: str = PROMPT) -> dict[str, torch.Tensor]:
    """The processor's inputs, made here as a user of transformers would."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    text = vlm.processor.apply_chat_template(messages, add_generation_prompt=True)
    return dict(vlm.processor(images=[image], text=[text], return_tensors="pt"))


def layer_tokens(vlm, layer: str, inputs: dict[str, torch.Tensor], answer: list[int] | None = None):
    """The layer's output (a leaf requiring gradients, handed on to the model) and the logits of prompt + answer."""
    module = dict(vlm.module.named_modules())[layer]
    seen = {}

    def hook(_module, _inputs, output):
        seen["leaf"] = output.detach().requires_grad_(True)
        return seen["leaf"]

    ids = inputs["input_ids"]
    extra = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
    if answer:
        ids = torch.cat((ids, torch.tensor([answer])), dim=1)
        if "mm_token_type_ids" in extra:
            marks = extra["mm_token_type_ids"]
            extra["mm_token_type_ids"] = torch.cat((marks, marks.new_zeros(1, len(answer))), dim=1)
    handle = module.register_forward_hook(hook)
    try:
        with torch.enable_grad():
            logits = vlm.module(input_ids=ids, attention_mask=torch.ones_like(ids), **extra).logits
    finally:
        handle.remove()
    return seen["leaf"], logits


def test_map_equals_autograd_of_the_answer_logprob(folder):
    vlm = load_vlm(f"hf:{folder}", torch.device("cpu"))
    explainer = answerer(vlm, methods=("gradcam",), max_new_tokens=3)
    image = photo()
    result = explain_prompt(explainer, image, PROMPT, answer="a big cat")
    answer = [token.id for token in result.tokens]
    leaf, logits = layer_tokens(vlm, vlm.layout.default_layer, processed(vlm, image), answer)
    start = logits.shape[1] - len(answer)
    logprob = logits[0, start - 1 : -1].log_softmax(-1).gather(1, torch.tensor(answer)[:, None]).sum()
    (gradient,) = torch.autograd.grad(logprob, leaf)
    acts, grads = leaf.detach().flatten(0, -2), gradient.flatten(0, -2)
    _, [(score, ours_grad)], _ = answer_gradients(
        explainer, explainer.score.inputs(image, PROMPT), answer, [result.maps[0].target]
    )
    assert score == pytest.approx(float(logprob.detach()), abs=1e-4)
    assert torch.corrcoef(torch.stack((ours_grad.flatten(), grads.flatten())))[0, 1] >= 0.999
    for sign in (1, -1):  # the map is ReLU(sum_k w_k A^k): compare it where it is not all zero, either sign
        reference = torch.relu(sign * (acts * grads.mean(0)).sum(-1))
        ours = token_map(explainer, "gradcam", activations=acts, gradient=sign * ours_grad)
        assert torch.allclose(ours, reference, atol=1e-6 * float(reference.abs().max() + 1))
        if reference.std() > 0:
            assert torch.corrcoef(torch.stack((ours, reference)))[0, 1] >= 0.999
    assert torch.allclose(token_map(explainer, "gradcam", acts, ours_grad), result.maps[0].values, atol=1e-6)
    assert not any(p.requires_grad or p.grad is not None for p in vlm.module.parameters())


def test_per_token_gradients_sum_to_the_answer(folder):
    vlm = load_vlm(f"hf:{folder}", torch.device("cpu"))
    explainer = answerer(vlm, max_new_tokens=3)
    inputs = explainer.score.inputs(photo(), PROMPT)
    ids = explainer.score.encode("a cat sits")
    targets = explainer.score.answer_targets(ids, per_token=True)
    _, gradients, logprobs = answer_gradients(explainer, inputs, ids, targets)
    whole, tokens = gradients[0], gradients[1:]
    assert len(tokens) == 3 and whole[0] == pytest.approx(sum(logprobs), abs=1e-5)
    summed = torch.stack([gradient for _, gradient in tokens]).sum(0)
    assert torch.allclose(summed, whole[1], atol=1e-6, rtol=1e-4)
    assert whole[1].abs().max() > 0


def test_generated_answer_equals_generate(folder):
    vlm = load_vlm(f"hf:{folder}", torch.device("cpu"))
    result = explain_prompt(answerer(vlm, max_new_tokens=4), photo(), PROMPT, per_token=True)
    inputs = processed(vlm, photo())
    suppressed = placeholder_ids(vlm.module.config)  # an image token cannot be fed back as an answer
    assert suppressed and all(isinstance(i, int) for i in suppressed)
    output = vlm.module.generate(**inputs, max_new_tokens=4, do_sample=False, suppress_tokens=suppressed)
    new = output[0, inputs["input_ids"].shape[1] :].tolist()
    while new and new[-1] in (0, 3):
        new.pop()
    assert [token.id for token in result.tokens] == new
    assert result.generated and result.answer == vlm.processor.tokenizer.decode(new, skip_special_tokens=True).strip()
    assert [m.target.label for m in result.maps][: len(new) + 1][0] == "answer"
    assert len(result.maps) == 1 + len(new)


def test_word_and_contrast_targets(folder):
    vlm = load_vlm(f"hf:{folder}", torch.device("cpu"))
    explainer = answerer(vlm)
    specs = [TargetSpec.parse("answer:cat"), TargetSpec.parse("contrast:answer:a cat,answer:a dog")]
    result = explain_prompt(explainer, photo(), PROMPT, answer="a big cat", specs=specs)
    word, contrast = result.maps
    assert word.score == pytest.approx(result.tokens[2].logprob, abs=1e-5)
    other = explain_prompt(explainer, photo(), PROMPT, answer="a dog")
    cat = explain_prompt(explainer, photo(), PROMPT, answer="a cat")
    assert contrast.score == pytest.approx(cat.logprob - other.logprob, abs=1e-4)


def test_halves_land_on_their_half(local_folder):
    """Changing the photo's left half changes only the tokens the geometry puts on the left half."""
    vlm = load_vlm(f"hf:{local_folder}", torch.device("cpu"))
    explainer = answerer(vlm)
    first, second = photo(112, 56), photo(112, 56, left=(30, 200, 30))  # the halves on token edges
    layer = vlm.layout.default_layer
    with torch.no_grad():
        a = layer_tokens(vlm, layer, processed(vlm, first))[0].flatten(0, -2)
        b = layer_tokens(vlm, layer, processed(vlm, second))[0].flatten(0, -2)
    changed = (a - b).norm(dim=-1)
    inputs = explainer.score.inputs(first, PROMPT)
    tiles = explainer.score.tiles(inputs, first, changed.shape[0])
    placed = explainer.score.place(changed, inputs, first, layer)
    middle = first.width // 2
    # bilinear sampling blends a token with its neighbour up to half a token past its centre
    blur = max(round((tile.box[2] - tile.box[0]) / tile.cols / 2) for tile in tiles)
    covered = placed[:, :middle]
    assert covered[covered > 0].numel() > 0.3 * covered.numel()
    assert placed[:, middle + blur :].abs().max() <= 0.02 * placed.max()  # resampling blurs the edge a little
    assert placed[:, middle - 4 : middle].min() > 0.2 * placed.max()
    left = min(tile.box[0] for tile in tiles)  # LLaVA's centre crop leaves the photo's sides out
    assert left == (28.0 if vlm.layout.name == "llava" else 0.0) and not placed[:, : int(left)].any()


def run(*args) -> object:
    from typer.testing import CliRunner

    from gradcam_cli.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def test_command_line_answers_and_writes_maps(folder, tmp_path):
    """gradcam photo --model hf:DIR --prompt: the generated answer printed, a map per token, JSON and manifest rows."""
    import json

    image = tmp_path / "halves.png"
    photo().save(image)
    out, manifest = tmp_path / "out", tmp_path / "rows.jsonl"
    model = f"hf:{folder}"
    result = run(image, "--model", model, "--prompt", PROMPT, "--per-token", "--max-new-tokens", 3, "-o", out)
    assert result.exit_code == 0, result.output
    vlm = load_vlm(model, torch.device("cpu"))
    inputs = processed(vlm, photo())
    suppressed = placeholder_ids(vlm.module.config)
    generated = vlm.module.generate(**inputs, max_new_tokens=3, do_sample=False, suppress_tokens=suppressed)
    generated = generated[0, inputs["input_ids"].shape[1] :]
    text = vlm.processor.tokenizer.decode(generated.tolist(), skip_special_tokens=True).strip()
    assert f"  answer: {text}  (log p " in result.stdout
    assert "using layer " + vlm.layout.default_layer in result.stderr
    written = sorted(path.name for path in out.iterdir() if not path.name.startswith("."))  # not the run record
    assert "halves_gradcam_answer.png" in written and len(written) == 1 + len(generated[generated != 3])

    result = run(
        image,
        "-m",
        model,
        "--prompt",
        PROMPT,
        "--answer",
        "a cat",
        "--per-token",
        "--json",
        "--manifest",
        manifest,
        "-o",
        out,
        "--method",
        "gradcam,layercam",
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert rows == [json.loads(line) for line in manifest.read_text().splitlines()]
    assert [(row["target"]["name"], row["method"]) for row in rows] == [
        (name, method) for name in ("answer", "token 0: a", "token 1: cat") for method in ("gradcam", "layercam")
    ]
    assert {(row["prompt"], row["answer"], row["generated"]) for row in rows} == {(PROMPT, "a cat", False)}
    tokens = rows[0]["tokens"]
    assert [t["text"] for t in tokens] == ["a", "cat"]
    assert rows[0]["target"]["logprob"] == pytest.approx(sum(t["logprob"] for t in tokens), abs=1e-5)
    assert rows[2]["target"] == {
        "name": "token 0: a",
        "token": 0,
        "logprob": tokens[0]["logprob"],
        "probability": pytest.approx(2.718281828 ** tokens[0]["logprob"], abs=1e-6),
    }

    result = run(image, "-m", model, "--prompt", PROMPT, "--target", "contrast:answer:a cat,answer:a dog", "-o", out)
    assert result.exit_code == 0, result.output
    assert "gradcam for a cat - a dog (" in result.stdout and (out / "halves_gradcam_a-cat-a-dog.png").is_file()


def test_the_vision_language_family_claims_such_folders_before_the_hf_family(folder, tmp_path):
    from gradcam_cli.models.families import family_of

    assert family_of(f"hf:{folder}").name == "vision-language"
    assert family_of(f"hf:{tmp_path}").name == "hf"  # no config.json: not one
    image = tmp_path / "photo.png"
    photo().save(image)
    result = run(image, "--model", f"hf:{folder}")
    assert result.exit_code == 2 and result.stderr.endswith(
        "vision-language model; ask it about the image with --prompt TEXT\n"
    )
    result = run(image, "--model", f"hf:{folder}", "--list-layers")  # its layers need no prompt (issue 41)
    assert result.exit_code == 0 and "* model." in result.stdout


def test_command_line_refusals(tmp_path):
    import json

    image = tmp_path / "photo.png"
    photo().save(image)
    other = tmp_path / "paligemma"
    other.mkdir()
    config = {"model_type": "paligemma", "text_config": {}, "vision_config": {}}
    (other / "config.json").write_text(json.dumps(config))
    result = run(image, "--model", f"hf:{other}", "--prompt", "what is it?")
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"error: hf:{other} is a paligemma vision-language model; supported families: llava, llava_next, qwen2_vl, "
        "qwen2_5_vl, idefics3, smolvlm"
    )
    result = run(image, "--model", f"hf:{other}")
    assert result.exit_code == 2 and "is a paligemma vision-language model; supported families: " in result.stderr
    result = run(image, "--answer", "a cat")
    assert result.exit_code == 2 and result.stderr.strip() == "error: --answer is for a --prompt; add --prompt TEXT"
    result = run(image, "--model", f"hf:{other}", "--prompt", "x", "--manifest", tmp_path / "m.csv")
    assert result.exit_code == 2 and "with --prompt use a .jsonl file" in result.stderr
    result = run(image, "--model", f"hf:{other}", "--prompt", "x", "--top-k", 2)
    assert result.exit_code == 2 and result.stderr.strip() == (
        "error: --top-k does not apply to a --prompt's answer (docs/vlm.md lists what does)"
    )
    result = run(image, "--model", "resnet18", "--weights", "none", "--prompt", "what is it?")
    assert result.exit_code == 2 and result.stderr.strip() == (
        "error: --prompt asks a vision-language model (hf:DIR: docs/vlm.md); resnet18 is a torchvision model"
    )
    result = run(image, "--target", "answer:cat", "--model", "resnet18", "--weights", "none")
    assert result.exit_code == 2 and "answer: targets are for a vision-language model" in result.stderr


@pytest.mark.slow
def test_known_answer_map_peaks_on_the_region_it_depends_on(tmp_path):
    """A LLaVA trained to name the colour of the photo's top-left quarter: the map of its answer peaks there."""
    import random

    folder = vlm_models.trained_llava(tmp_path / "trained")
    explainer = answerer(load_vlm(f"hf:{folder}", torch.device("cpu")), methods=("layercam",), max_new_tokens=1)
    for seed in range(3):
        photo_ = vlm_models.known_answer_photo(random.Random(100 + seed), "red")
        result = explain_prompt(explainer, photo_, vlm_models.KNOWN_PROMPT)
        assert result.answer == "red"
        saliency = result.maps[0].saliency
        quarter = saliency[:16, :16].mean()
        assert quarter > 3 * saliency[16:, :].mean() and quarter > 3 * saliency[:16, 16:].mean()
        peak = int(saliency.argmax())
        assert peak // 32 < 16 and peak % 32 < 16
        # faithfulness: deleting the map's pixels first takes the answer away faster than deleting the others first
        ids = [token.id for token in result.tokens]
        ours = answer_curves(explainer.score, photo_, vlm_models.KNOWN_PROMPT, ids, saliency, steps=4)
        inverse = answer_curves(explainer.score, photo_, vlm_models.KNOWN_PROMPT, ids, 1 - saliency, steps=4)
        assert ours.deletion[0] == pytest.approx(math.exp(result.logprob), rel=1e-4)
        assert ours.deletion_auc < 0.5 * inverse.deletion_auc
        # (the blurred photo's quarter stays red: insertion is flat here, and ends at the answer's probability)
        assert ours.insertion[-1] == pytest.approx(math.exp(result.logprob), rel=1e-4)


def test_bf16_weights_give_the_float32_map(folder):
    """--precision bf16 loads the weights in bfloat16; the score and the map stay close to float32's."""
    cpu = torch.device("cpu")
    maps = []
    for precision in ("fp32", "bf16"):
        explainer = answerer(load_vlm(f"hf:{folder}", cpu, precision), methods=("layercam",))
        result = explain_prompt(explainer, photo(), PROMPT, answer="a big cat")
        assert result.maps[0].values.dtype == torch.float32
        maps.append((result.logprob, result.maps[0].values))
    (full, full_map), (half, half_map) = maps
    assert half == pytest.approx(full, rel=0.05)
    assert torch.corrcoef(torch.stack((full_map, half_map)))[0, 1] > 0.95


@pytest.mark.parametrize(
    ("builder", "layer", "tokens"),
    [
        (vlm_models.llava_next, "model.multi_modal_projector.linear_1", 3 * 16),  # 3 frames of 4 x 4 patches
        (vlm_models.idefics3, "model.vision_model.encoder.layers.0", 3 * 16),  # 3 frames of 4 x 4 patches
    ],
)
def test_another_layer_is_explained_and_placed(builder, layer, tokens, tmp_path):
    vlm = load_vlm(f"hf:{builder(tmp_path / 'model')}", torch.device("cpu"))
    explainer = answerer(vlm, layer=layer)
    image = photo()
    result = explain_prompt(explainer, image, PROMPT, answer="a cat")
    leaf, logits = layer_tokens(vlm, layer, processed(vlm, image), [token.id for token in result.tokens])
    assert leaf.flatten(0, -2).shape[0] == tokens == result.maps[0].values.shape[0]
    logprob = logits[0, -3:-1].log_softmax(-1).gather(1, torch.tensor([[6], [7]])).sum()
    (gradient,) = torch.autograd.grad(logprob, leaf)
    _, [(_, ours)], _ = answer_gradients(
        explainer, explainer.score.inputs(image, PROMPT), [6, 7], [result.maps[0].target]
    )
    assert torch.corrcoef(torch.stack((ours.flatten(), gradient.flatten())))[0, 1] >= 0.999
    assert result.maps[0].saliency.shape == (image.height, image.width)


def test_a_layer_the_answer_does_not_reach_through_the_hook_is_refused(tmp_path):
    """CLIP's post-layernorm makes the pooled output, which LLaVA never reads: no gradient reaches it."""
    vlm = load_vlm(f"hf:{vlm_models.llava(tmp_path / 'llava')}", torch.device("cpu"))
    explainer = answerer(vlm, layer="model.vision_tower.post_layernorm")
    with pytest.raises(Exception, match=r"does not depend on --layer model.vision_tower.post_layernorm's output"):
        explain_prompt(explainer, photo(), PROMPT, answer="a cat")


def test_a_vision_tower_layer_read_as_recorded_hidden_states(tmp_path):
    """LLaVA reads its vision tower's last layer through transformers' recorded hidden states: the gradient at that
    layer's patch tokens is the gradient at the projector's input (taken here by a pre-hook), its class token's 0."""
    vlm = load_vlm(f"hf:{vlm_models.llava(tmp_path / 'llava')}", torch.device("cpu"))
    explainer = answerer(vlm, layer="model.vision_tower.encoder.layers.1")
    inputs = explainer.score.inputs(photo(), PROMPT)
    _, [(_, ours)], _ = answer_gradients(explainer, inputs, [6, 7], explainer.score.answer_targets([6, 7], False))
    seen = {}

    def pre_hook(_module, args):
        seen["leaf"] = args[0].detach().requires_grad_(True)
        return (seen["leaf"],)

    handle = vlm.module.model.multi_modal_projector.register_forward_pre_hook(pre_hook)
    try:
        ids = torch.cat((processed(vlm, photo())["input_ids"], torch.tensor([[6, 7]])), dim=1)
        with torch.enable_grad():
            logits = vlm.module(input_ids=ids, pixel_values=processed(vlm, photo())["pixel_values"]).logits
    finally:
        handle.remove()
    logprob = logits[0, -3:-1].log_softmax(-1).gather(1, torch.tensor([[6], [7]])).sum()
    (reference,) = torch.autograd.grad(logprob, seen["leaf"])
    assert not ours[0].any()  # the class token, dropped before the projector
    assert torch.corrcoef(torch.stack((ours[1:].flatten(), reference.flatten())))[0, 1] >= 0.999


def test_a_layer_of_another_layout_is_refused(tmp_path):
    vlm = load_vlm(f"hf:{vlm_models.qwen2_vl(tmp_path / 'qwen')}", torch.device("cpu"))
    explainer = answerer(vlm, layer="model.visual.blocks.0")  # patches before the 2 x 2 merge
    with pytest.raises(Exception, match=r"outputs 24 tokens, not the 6 of the image's token grid \(qwen2-vl\)"):
        explain_prompt(explainer, photo(), PROMPT, answer="a cat")


def test_every_answer_method_gives_a_map_of_the_photo(folder):
    """Each method that reads the layer alone (the method registry's, plugins' included) maps the answer."""
    from gradcam_cli.cam.answers import answer_methods

    methods = answer_methods()
    assert {"gradcam", "gradcam++", "layercam", "eigencam"} <= set(methods) and "scorecam" not in methods
    explainer = answerer(load_vlm(f"hf:{folder}", torch.device("cpu")), methods=methods)
    image = photo()
    result = explain_prompt(explainer, image, PROMPT, answer="a cat")
    assert [m.method for m in result.maps] == list(methods)
    for explained in result.maps:
        assert explained.saliency.shape == (image.height, image.width)
        assert torch.isfinite(explained.saliency).all()
        assert explained.saliency.min() >= 0 and explained.saliency.max() <= 1


def test_an_empty_answer_says_so_in_its_row_and_on_the_console(tmp_path, monkeypatch):
    """A model that ends its answer at once: the answer task's adapter says why there is no map (exit 0)."""
    import json

    from gradcam_cli.cam.tasks.answer import EMPTY_ANSWER

    folder = vlm_models.llava(tmp_path / "llava")
    image = tmp_path / "photo.png"
    photo().save(image)
    monkeypatch.setattr(Prompter, "generate", lambda self, inputs: [])
    out = tmp_path / "out"
    result = run(image, "-m", f"hf:{folder}", "--prompt", PROMPT, "-o", out, "--manifest", tmp_path / "m.jsonl")
    assert result.exit_code == 0, result.output
    assert f"  answer: (empty)  {EMPTY_ANSWER}" in result.stdout
    (row,) = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert (row["status"], row["outputs"], row["note"], row["answer"]) == ("ok", [], EMPTY_ANSWER, "")
    assert not out.exists() or not any(not path.name.startswith(".") for path in out.iterdir())  # a run record


def evaluate(*args) -> object:
    """``gradcam eval ARGS`` in-process."""
    from typer.testing import CliRunner

    from gradcam_cli.cli.eval import app

    return CliRunner().invoke(app, [str(a) for a in args])


def test_eval_measures_the_answers_deletion_and_insertion_on_the_command_line(tmp_path):
    """gradcam eval --prompt: per image and method, the curves of evaluation/answers.py's answer_curves (the same
    numbers), their means; options of a class's protocol refused in one line."""
    import json

    folder = vlm_models.llava(tmp_path / "llava")
    image = tmp_path / "photo.png"
    photo().save(image)
    model = f"hf:{folder}"
    result = evaluate(image, "-m", model, "--prompt", PROMPT, "--answer", "a cat", "--steps", 4, "--json")
    assert result.exit_code == 0, result.output
    (row,) = [json.loads(line) for line in result.stdout.splitlines()]
    explainer = answerer(load_vlm(model, torch.device("cpu")))
    explained = explain_prompt(explainer, photo(), PROMPT, "a cat")
    ids = [token.id for token in explained.tokens]
    curves = answer_curves(explainer.score, photo(), PROMPT, ids, explained.maps[0].saliency, 4)
    assert (row["method"], row["answer"], len(row["deletion"])) == ("gradcam", "a cat", 5)
    assert row["deletion"] == pytest.approx(curves.deletion, abs=1e-5)
    assert row["insertion_auc"] == pytest.approx(curves.insertion_auc, abs=1e-5)
    result = evaluate(image, "-m", model, "--prompt", PROMPT, "--answer", "a cat", "--steps", 4)
    assert result.exit_code == 0, result.output
    assert "gradcam (mean of 1): deletion AUC " in result.stdout
    result = evaluate(image, "-m", model, "--prompt", PROMPT, "--sanity")
    assert result.exit_code == 2 and result.stderr.startswith("error: --sanity does not apply to a --prompt's answer")
    result = evaluate(image, "--answer", "a cat")
    assert result.exit_code == 2 and result.stderr.strip() == "error: --answer is for a --prompt; add --prompt TEXT"


def test_a_folder_with_one_prompt_and_a_csv_of_image_prompt_pairs(tmp_path):
    """A folder asks every image the one --prompt; --prompts FILE.csv asks each image its own (paths relative to
    the file, a quoted prompt with a comma); its mistakes refused in one line naming the line."""
    import json

    folder = vlm_models.llava(tmp_path / "llava")
    photos = tmp_path / "photos"
    (photos / "sub").mkdir(parents=True)
    photo().save(photos / "a.png")
    photo(left=(30, 200, 30)).save(photos / "sub" / "b.png")
    model, out = f"hf:{folder}", tmp_path / "out"
    result = run(photos, "-m", model, "--prompt", PROMPT, "--answer", "a cat", "-o", out, "--json")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(Path(row["input"]).name, row["prompt"]) for row in rows] == [("a.png", PROMPT), ("b.png", PROMPT)]
    assert (out / "a_gradcam_answer.png").is_file() and (out / "sub" / "b_gradcam_answer.png").is_file()

    pairs = photos / "pairs.csv"
    pairs.write_text('image,prompt\na.png,what is the cat ?\nsub/b.png,"what, is the dog ?"\n', encoding="utf-8")
    result = run("-m", model, "--prompts", pairs, "--answer", "a dog", "-o", tmp_path / "out2", "--json")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(Path(row["input"]).name, row["prompt"]) for row in rows] == [
        ("a.png", "what is the cat ?"),
        ("b.png", "what, is the dog ?"),
    ]
    explainer = answerer(load_vlm(model, torch.device("cpu")))
    expected = explain_prompt(explainer, photo(left=(30, 200, 30)), "what, is the dog ?", "a dog").logprob
    assert rows[1]["target"]["logprob"] == pytest.approx(expected, abs=1e-5)

    for text, message in (
        ("a.png\n", f"error: --prompts {pairs}, line 1: expected image,prompt (quote a prompt with commas)"),
        ("a.png,x\n./a.png,y\n", f"error: --prompts {pairs}, line 2: ./a.png is on line 1 already"),
        ("image,prompt\n", f"error: --prompts {pairs}: no image,prompt line in it"),
    ):
        pairs.write_text(text, encoding="utf-8")
        result = run("-m", model, "--prompts", pairs)
        assert result.exit_code == 2 and result.stderr.strip() == message
    result = run(photos, "-m", model, "--prompts", pairs)
    assert result.exit_code == 2 and "names the images; give no INPUT" in result.stderr


def test_the_gallery_shows_each_images_prompt_and_answer(tmp_path):
    """--report: the page's entry of each image shows its question, its answer and the answer's probability, and
    links each map with its target."""
    import json
    import re

    folder = vlm_models.llava(tmp_path / "llava")
    photos = tmp_path / "photos"
    photos.mkdir()
    photo().save(photos / "a.png")
    (photos / "b.png").write_bytes(b"not an image")
    out = tmp_path / "out"
    model = f"hf:{folder}"
    args = ("--prompt", PROMPT, "--answer", "a cat", "--per-token", "--report", "-o", out, "--json")
    result = run(photos, "-m", model, *args)
    assert result.exit_code == 1, result.output  # b.png fails, a.png is explained
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    page = (out / "index.html").read_text(encoding="utf-8")
    data = re.search(r"(\[\{.*\}\])", page)
    assert data is not None
    entries = {entry["name"].rsplit("/", 1)[-1]: entry for entry in json.loads(data.group(1))}
    first = next(row for row in rows if row["status"] == "ok")
    probability = math.exp(sum(token["logprob"] for token in first["tokens"]))
    ((question, shown, _),) = entries["a.png"]["predictions"]
    assert question == f"{PROMPT} \N{RIGHTWARDS ARROW} a cat" and shown == pytest.approx(probability, abs=1e-4)
    assert [view["target"][0] for view in entries["a.png"]["views"]] == ["answer", "token 0: a", "token 1: cat"]
    assert all((out / view["href"]).is_file() for view in entries["a.png"]["views"])
    assert entries["b.png"]["status"] == "error"
