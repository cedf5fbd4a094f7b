"""timm and Hugging Face models: building them, their weights (files, the local cache, offline), their preprocessing
and class names, the optional extras, and the command line end to end.

No network: random weights and tiny configurations only. Pretrained weights are put into a Hugging Face cache laid
out in a temporary folder, the way the hub leaves it; "offline" is made deterministic with ``HF_HUB_OFFLINE`` and
hub look-ups that fail at once (and record that they were tried).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
from attention_models import HF_TINY
from conftest import SAMPLE_DIR
from PIL import Image
from torch import nn
from typer.testing import CliRunner

from gradcam_cli.cam.explainer import Explainer
from gradcam_cli.errors import EXIT_MODEL, EXIT_USAGE, ModelLoadError, UsageError
from gradcam_cli.io.naming import RUN_RECORD_NAME
from gradcam_cli.models.hf_models import input_spec
from gradcam_cli.models.loading import load_model

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")
huggingface_hub = pytest.importorskip("huggingface_hub")
from safetensors.torch import save_file  # noqa: E402  (after the skips: safetensors comes with timm)

COMMIT = "0123456789abcdef0123456789abcdef01234567"
CAT = SAMPLE_DIR / "chelsea.jpg"


def one_sentence(message: str) -> bool:
    """One line, and no sentence break (a full stop followed by a capital) inside it."""
    return "\n" not in message and re.search(r"[.!?]\s+[A-Z]", message) is None


def same_tensors(module: nn.Module, state: dict[str, torch.Tensor]) -> bool:
    own = module.state_dict()
    return own.keys() == state.keys() and all(torch.equal(own[key], value) for key, value in state.items())


def cache_repo(cache: Path, repo_id: str, files: dict[str, Path | bytes]) -> Path:
    """Lay ``files`` out in ``cache`` as the hub does: refs/main names a snapshot folder holding them."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT, encoding="utf-8")
    for name, content in files.items():
        (snapshot / name).write_bytes(content.read_bytes() if isinstance(content, Path) else content)
    return snapshot


@pytest.fixture
def hub_cache(monkeypatch, tmp_path):
    """An empty Hugging Face cache in tmp_path; a hub look-up (the one probe before a download) fails at once as it
    does without network, and is recorded; downloads are refused outright."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    attempts: list[str] = []
    real_download = huggingface_hub.hf_hub_download

    def no_network(url, *args, **kwargs):
        attempts.append(url)
        raise ConnectionError("no network in this test")

    def cache_only(*args, **kwargs):
        if not kwargs.get("local_files_only"):
            raise AssertionError("a download was started after the look-up failed")
        return real_download(*args, **kwargs)

    def no_snapshot_download(*args, **kwargs):
        if not kwargs.get("local_files_only"):
            raise AssertionError("a download was started after the look-up failed")
        return real_snapshot(*args, **kwargs)

    real_snapshot = huggingface_hub.snapshot_download
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", no_network)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", cache_only)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_snapshot_download)
    return cache, attempts


# --- timm ---------------------------------------------------------------------------------------------------------


def test_a_timm_model_gets_its_own_preprocessing_prefix_tokens_and_imagenet_names():
    vit = load_model("timm:test_vit", "none")
    data = timm.data.resolve_model_data_config(vit.module)
    assert vit.name == "timm:test_vit" and vit.weights == "none"
    assert vit.input_spec.fixed_size == (160, 160)  # a ViT's size is fixed: its pretrained config says so
    assert vit.input_spec.mean == data["mean"] and vit.input_spec.std == data["std"]
    assert vit.input_spec.interpolation == data["interpolation"] == "bicubic"
    assert vit.prefix_tokens == vit.module.num_prefix_tokens == 1
    assert vit.class_name(281) == "tabby" and len(vit.categories) == 1000
    resnet = load_model("timm:test_resnet", "none")
    assert resnet.input_spec.size == 160 and resnet.input_spec.fixed_size is None  # its config's size, no crop
    assert resnet.input_spec.interpolation == "bilinear" and resnet.prefix_tokens is None
    assert load_model("timm:test_resnet", "none", input_size=96).input_spec.size == 96  # --input-size still rules


def test_timm_weights_files_and_a_new_head(tmp_path):
    torch.manual_seed(5)
    state = timm.create_model("test_resnet", num_classes=3).state_dict()
    save_file(state, tmp_path / "ft.safetensors")
    torch.save({"state_dict": state}, tmp_path / "ft.pth")
    labels = tmp_path / "labels.txt"
    labels.write_text("red\ngreen\nblue\n", encoding="utf-8")
    for name in ("ft.safetensors", "ft.pth"):
        loaded = load_model("timm:test_resnet", str(tmp_path / name), num_classes=3, labels=labels)
        assert same_tensors(loaded.module, state)
        assert loaded.categories == ["red", "green", "blue"] and loaded.weights == str(tmp_path / name)
    assert load_model("timm:test_resnet", "none", num_classes=3).categories is None  # not ImageNet's head
    with pytest.raises(UsageError, match="has 3 names but the model has 1000 classes"):
        load_model("timm:test_resnet", "none", labels=labels)


def test_timm_pretrained_weights_are_read_from_the_hub_cache(hub_cache, tmp_path):
    cache, attempts = hub_cache
    torch.manual_seed(3)
    state = timm.create_model("test_resnet").state_dict()
    save_file(state, tmp_path / "model.safetensors")
    cache_repo(cache, "timm/test_resnet.r160_in1k", {"model.safetensors": tmp_path / "model.safetensors"})
    loaded = load_model("timm:test_resnet")
    assert same_tensors(loaded.module, state)
    assert attempts == []  # nothing was looked up on the network
    assert loaded.weights == "r160_in1k" and loaded.class_name(285) == "Egyptian cat"


def _model_load_error(monkeypatch, offline: bool, model: str) -> str:
    """The one-sentence message (exit code 3) of loading ``model`` whose weights are neither cached nor
    downloadable, offline as ``HF_HUB_OFFLINE`` says or with no network."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    with pytest.raises(ModelLoadError) as caught:
        load_model(model)
    message = str(caught.value)
    assert caught.value.exit_code == EXIT_MODEL and one_sentence(message), message
    return message


@pytest.mark.parametrize("offline", [True, False], ids=["HF_HUB_OFFLINE", "no-network"])
def test_timm_weights_neither_cached_nor_downloadable_are_one_sentence(hub_cache, monkeypatch, offline):
    cache, attempts = hub_cache
    message = _model_load_error(monkeypatch, offline, "timm:test_resnet")
    assert "timm/test_resnet.r160_in1k" in message and str(cache) in message
    assert "--weights PATH" in message and "--weights none" in message
    assert ("HF_HUB_OFFLINE is set" in message) == offline
    assert len(attempts) == (0 if offline else 1)  # at most one look-up, never the hub's retries


def test_timm_mistakes_are_usage_errors():
    cases = {
        "timm:resnt18": "unknown timm model 'resnt18'. Did you mean: resnet18",
        "timm:test_resnet.r999": "unknown tag 'r999' for timm model test_resnet.",
    }
    for model, expected in cases.items():
        with pytest.raises(UsageError) as caught:
            load_model(model, "none")
        assert str(caught.value).startswith(expected), caught.value
    with pytest.raises(UsageError, match=r"use --model timm:test_resnet\.r160_in1k"):
        load_model("timm:test_resnet", "r160_in1k")  # a tag given as --weights
    with pytest.raises(UsageError, match="--num-classes needs --weights PATH or none"):
        load_model("timm:test_resnet", num_classes=3)
    # its only weights are a feature extractor's: an embedding model, for --target similar: (test_target_models.py)
    assert load_model("timm:eva02_tiny_patch14_224", "none", architecture_only=True).embeds


@pytest.mark.parametrize(("model", "extra"), [("timm:test_resnet", "timm"), ("hf:google/vit-base", "hf")])
def test_without_the_extra_one_line_names_the_install_command(monkeypatch, model, extra):
    monkeypatch.setitem(sys.modules, extra if extra == "timm" else "transformers", None)  # import fails
    with pytest.raises(UsageError) as caught:
        load_model(model, "none")
    assert caught.value.exit_code == EXIT_USAGE
    assert str(caught.value) == f"--model {model} needs the optional extra: pip install 'gradcam-cli[{extra}]'"


# --- Hugging Face -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_vit(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    """A tiny ViT classifier saved with save_pretrained, with its image processor and class names."""
    folder = tmp_path_factory.mktemp("hf-vit")
    torch.manual_seed(0)
    config = transformers.ViTConfig(**HF_TINY, image_size=32, patch_size=8, id2label={0: "cat", 1: "dog", 2: "bird"})
    model = transformers.ViTForImageClassification(config)
    model.save_pretrained(folder)
    processor = transformers.ViTImageProcessor(
        size={"height": 32, "width": 32},
        image_mean=[0.4, 0.5, 0.6],
        image_std=[0.2, 0.25, 0.3],
        resample=Image.Resampling.BICUBIC,
    )
    processor.save_pretrained(folder)
    return folder, {key: value.clone() for key, value in model.state_dict().items()}


def test_a_hugging_face_folder_brings_its_processor_labels_and_weights(hf_vit):
    folder, state = hf_vit
    loaded = load_model(f"hf:{folder}")
    assert same_tensors(loaded.module, state)
    spec = loaded.input_spec
    assert spec.fixed_size == (32, 32) and spec.interpolation == "bicubic"
    torch.testing.assert_close(torch.tensor(spec.mean), torch.tensor([0.4, 0.5, 0.6]))
    torch.testing.assert_close(torch.tensor(spec.std), torch.tensor([0.2, 0.25, 0.3]))
    assert loaded.categories == ["cat", "dog", "bird"] and loaded.prefix_tokens == 1
    result = Explainer(loaded).explain(CAT)  # the logits are taken from the output object
    assert result.predictions[0].name in ("cat", "dog", "bird")
    assert result.explanations[0].saliency.shape == (300, 451)


def test_hugging_face_weights_none_a_new_head_and_a_weights_file(hf_vit, tmp_path):
    folder, state = hf_vit
    fresh = load_model(f"hf:{folder}", "none", num_classes=5)
    assert fresh.categories is None and fresh.module.config.num_labels == 5
    assert not same_tensors(load_model(f"hf:{folder}", "none").module, state)
    save_file(state, tmp_path / "ft.safetensors")
    assert same_tensors(load_model(f"hf:{folder}", str(tmp_path / "ft.safetensors")).module, state)
    with pytest.raises(UsageError, match="--num-classes needs --weights PATH or none"):
        load_model(f"hf:{folder}", num_classes=5)


def test_a_distilled_deit_loads_with_both_heads_and_explains_their_mean(tmp_path):
    """A DeiT saved as DeiTForImageClassificationWithTeacher (the distilled checkpoints) is a classifier whose logits
    are the mean of its class and distillation heads, not an embedding model nor a classifier with a new head."""
    torch.manual_seed(0)
    config = transformers.DeiTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32, patch_size=8
    )
    config.num_labels = 3
    model = transformers.DeiTForImageClassificationWithTeacher(config).eval()
    model.save_pretrained(tmp_path / "deit")
    loaded = load_model(f"hf:{tmp_path / 'deit'}")
    assert type(loaded.module).__name__ == "DeiTForImageClassificationWithTeacher" and not loaded.embeds
    assert same_tensors(loaded.module, model.state_dict())
    assert loaded.prefix_tokens == 2  # the class and distillation tokens
    pixels = torch.rand(1, 3, 32, 32)
    with torch.no_grad():
        expected = (model(pixel_values=pixels).logits).softmax(dim=1)[0]
    result = Explainer(loaded).explain_batch(pixels)[0]
    top = result.predictions[0]
    assert top.index == int(expected.argmax()) and abs(top.probability - float(expected.max())) < 1e-5
    fresh = load_model(f"hf:{tmp_path / 'deit'}", "none")
    assert type(fresh.module).__name__ == "DeiTForImageClassificationWithTeacher"


def test_an_image_processor_becomes_an_input_spec():
    """Sizes, normalisation, rescaling and the resampling filter, as transformers' processors describe them."""
    convnext = transformers.ConvNextImageProcessor(
        size={"shortest_edge": 48}, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    spec = input_spec(convnext, None)
    assert spec.size == 48 and spec.fixed_size is None and spec.interpolation == "bicubic"  # no crop: crop_pct unused
    raw = transformers.ViTImageProcessor(do_rescale=False, image_mean=[127.5] * 3, image_std=[127.5] * 3)
    assert input_spec(raw, None).mean == (0.5, 0.5, 0.5) and input_spec(raw, None).std == (0.5, 0.5, 0.5)
    unnormalised = transformers.ViTImageProcessor(do_normalize=False)
    assert input_spec(unnormalised, None).mean == (0, 0, 0) and input_spec(unnormalised, None).std == (1, 1, 1)
    no_processor = input_spec(None, transformers.ViTConfig(image_size=64))
    assert no_processor.fixed_size == (64, 64) and no_processor.mean == (0.485, 0.456, 0.406)


def test_a_hub_id_is_read_from_the_cache(hf_vit, hub_cache):
    folder, state = hf_vit
    cache, attempts = hub_cache
    cache_repo(cache, "someone/tiny-vit", {p.name: p for p in folder.iterdir()})
    loaded = load_model("hf:someone/tiny-vit")
    assert same_tensors(loaded.module, state) and loaded.categories == ["cat", "dog", "bird"]
    assert loaded.input_spec.fixed_size == (32, 32) and attempts == []


@pytest.mark.parametrize("offline", [True, False], ids=["HF_HUB_OFFLINE", "no-network"])
def test_a_hub_id_neither_cached_nor_downloadable_is_one_sentence(hub_cache, monkeypatch, offline):
    _, attempts = hub_cache
    message = _model_load_error(monkeypatch, offline, "hf:someone/not-cached")
    assert message.startswith("hf:someone/not-cached (not a folder here, so a hub id) could not be found")
    assert message.endswith("or pass hf:FOLDER, a folder saved with save_pretrained")
    assert "--weights" not in message  # --weights none would need the hub id's configuration just the same
    assert len(attempts) == (0 if offline else 1)


def test_list_layers_of_timm_and_hugging_face_models_needs_no_weights(hf_vit, hub_cache):
    """With an empty cache and no network, timm's architecture is in code; a hub id needs only its configuration
    files (cached here without the weights), and the listing matches the one of the folder with its weights."""
    from gradcam_cli.cli import app

    folder, _ = hf_vit
    cache, attempts = hub_cache
    configuration = {p.name: p for p in folder.iterdir() if p.suffix == ".json"}
    assert sorted(configuration) == ["config.json", "preprocessor_config.json"]
    cache_repo(cache, "someone/tiny-vit", configuration)
    with pytest.raises(ModelLoadError):  # explaining needs the weights, which are not cached
        load_model("hf:someone/tiny-vit")
    attempts.clear()
    timm_listing = CliRunner().invoke(app, ["--list-layers", "--model", "timm:test_vit"])
    assert timm_listing.exit_code == 0, timm_listing.output
    assert re.search(r"^\* blocks\.5\.norm1 +LayerNorm +1x101x64 ", timm_listing.stdout, re.MULTILINE)
    hub = CliRunner().invoke(app, ["--list-layers", "--model", "hf:someone/tiny-vit"])
    assert hub.exit_code == 0, hub.output
    assert attempts == []  # not even a look-up
    local = CliRunner().invoke(app, ["--list-layers", "--model", f"hf:{folder}"])
    assert hub.stdout == local.stdout and "* vit.layers.1.layernorm_before" in hub.stdout


def test_hugging_face_mistakes_are_usage_errors(hf_vit, tmp_path):
    (tmp_path / "empty").mkdir()
    transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2).save_pretrained(tmp_path / "b")
    cases = {
        f"hf:{tmp_path / 'missing'}": "does not exist; pass a folder saved with save_pretrained or a hub id",
        f"hf:{CAT}": "is a file; pass the folder",
        f"hf:{tmp_path / 'empty'}": "has no config.json",
        f"hf:{tmp_path / 'b'}": "is a bert model, not one of the image classifiers",
    }
    for model, expected in cases.items():
        with pytest.raises(UsageError) as caught:
            load_model(model, "none")
        assert expected in str(caught.value) and "\n" not in str(caught.value), caught.value


# --- the command line -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "layer"),
    [("timm:test_vit", "blocks.5.norm1"), ("hf", "vit.layers.1.layernorm_before")],
)
def test_cli_explains_timm_and_hugging_face_models_with_no_extra_flags(hf_vit, tmp_path, model, layer):
    from gradcam_cli.cli import app

    model = f"hf:{hf_vit[0]}" if model == "hf" else model
    out = tmp_path / "out"
    common = ["--model", model, "--weights", "none" if model.startswith("timm") else "DEFAULT"]
    result = CliRunner().invoke(app, [str(CAT), *common, "-o", str(out), "--workers", "0"])
    assert result.exit_code == 0, result.output
    assert f"using layer {layer}" in result.output
    (written,) = [p for p in out.iterdir() if p.name != RUN_RECORD_NAME]
    assert written.name.startswith("chelsea_gradcam_")
    listing = CliRunner().invoke(app, ["--list-layers", *common])
    assert listing.exit_code == 0, listing.output
    assert re.search(rf"^\* {re.escape(layer)} ", listing.output, re.MULTILINE)


def test_a_layer_without_a_map_names_the_nearest_one_that_has_one(hf_vit):
    """A timm head (no grid) and a Hugging Face attention module (a tuple, not a tensor) are refused at start-up."""
    cases = [
        (load_model("timm:test_vit", "none"), "head", "outputs 1x1000: no spatial grid", "blocks.5.norm1"),
        (load_model(f"hf:{hf_vit[0]}"), "vit.layers.1.attention", "outputs tuple, not a tensor", "vit.layers.0."),
    ]
    for model, layer, why, nearest in cases:
        with pytest.raises(UsageError) as caught:
            Explainer(model, layer)
        message = str(caught.value)
        assert message.startswith(f"layer {layer!r} {why}") and "\n" not in message, message
        assert f"choose a spatial layer such as {nearest}" in message, message
