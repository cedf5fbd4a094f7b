"""Loading models: names, weights (cache, offline, files, weights_only), labels, custom factories, class targets."""

from __future__ import annotations

import re
import urllib.error
from pathlib import Path

import pytest
import torch
import torchvision
from conftest import ROOT, SAMPLE_DIR
from torch import nn

from gradcam_cli.cam.explainer import Explainer
from gradcam_cli.errors import ModelLoadError, UsageError
from gradcam_cli.io.images import InputSpec
from gradcam_cli.models.labels import resolve_target
from gradcam_cli.models.loading import LoadedModel, imagenet_categories, load_model

CAT_CLASSES = range(281, 286)  # tabby, tiger cat, Persian cat, Siamese cat, Egyptian cat


def one_sentence(message: str) -> bool:
    """One line, and no sentence break (a full stop followed by a capital) inside it."""
    return "\n" not in message and re.search(r"[.!?]\s+[A-Z]", message) is None


def assert_same_tensors(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    loaded = module.state_dict()
    assert loaded.keys() == state.keys()
    for key, value in state.items():
        assert torch.equal(loaded[key], value), key


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """TORCH_HOME in tmp_path, and any download attempt fails as it does without network."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    attempts = []

    def no_network(url, *args, **kwargs):
        attempts.append(url)
        raise urllib.error.URLError("no network in this test")

    monkeypatch.setattr(torch.hub, "download_url_to_file", no_network)
    return attempts


# --- model names ------------------------------------------------------------------------------------------------


@pytest.mark.quick
@pytest.mark.parametrize(("typo", "suggestion"), [("resnt18", "resnet18"), ("efficientnet_lite", "efficientnet_lite0")])
def test_unknown_model_gets_close_matches(typo, suggestion):
    with pytest.raises(UsageError, match="unknown model") as caught:
        load_model(typo, "none")
    assert suggestion in str(caught.value)
    assert one_sentence(str(caught.value).split(" Did you mean")[0])


# --- torchvision weights: cache, offline, enum names ------------------------------------------------------------


def test_default_weights_load_from_the_torch_hub_cache(offline, tmp_path):
    weights = torchvision.models.ResNet18_Weights.DEFAULT
    torch.manual_seed(123)
    state = torchvision.models.resnet18().state_dict()
    cache = tmp_path / "torch" / "hub" / "checkpoints" / Path(weights.url).name
    cache.parent.mkdir(parents=True)
    torch.save(state, cache)

    loaded = load_model("resnet18", "DEFAULT")
    assert_same_tensors(loaded.module, state)
    assert offline == []  # nothing was downloaded
    assert loaded.weights == "IMAGENET1K_V1"
    assert loaded.categories == list(weights.meta["categories"])
    assert loaded.class_name(281) == "tabby"
    assert_same_tensors(load_model("resnet18", "IMAGENET1K_V1").module, state)  # the enum name works too


def test_failed_download_says_in_one_sentence_how_to_supply_weights(offline, tmp_path, capsys):
    with pytest.raises(ModelLoadError) as caught:
        load_model("resnet18", "DEFAULT")
    message = str(caught.value)
    assert offline, "the download was attempted"
    assert one_sentence(message), message
    file_name = Path(torchvision.models.ResNet18_Weights.DEFAULT.url).name
    assert file_name in message
    assert str(tmp_path / "torch" / "hub" / "checkpoints") in message
    assert "--weights PATH" in message and "--weights none" in message
    assert caught.value.exit_code == 3
    assert capsys.readouterr().out == ""  # torch.hub's "Downloading: ..." must not pollute stdout (--json)


def test_unknown_weights_name_lists_the_choices():
    with pytest.raises(UsageError) as caught:
        load_model("resnet18", "IMAGENET1K_V3")
    message = str(caught.value)
    assert "Did you mean: IMAGENET1K_V1?" in message and "none" in message and "\n" not in message


def test_pretrained_weights_cannot_take_num_classes():
    with pytest.raises(UsageError, match="--num-classes needs --weights PATH"):
        load_model("resnet18", "DEFAULT", num_classes=3)


# --- --list-layers: the architecture without its weights --------------------------------------------------------


def test_list_layers_needs_neither_cached_weights_nor_the_network(offline):
    """DeepLabV3's DEFAULT weights add an auxiliary head: the architecture the weights describe is listed, while
    nothing is downloaded or read."""
    from typer.testing import CliRunner

    from gradcam_cli.cli import app

    model = "deeplabv3_mobilenet_v3_large"
    small = ["--input-size", "96"]  # a quick dry pass: 6 x 6 at the backbone's stride 16
    result = CliRunner().invoke(app, ["--list-layers", "--model", model, *small])
    assert result.exit_code == 0, result.output
    assert offline == []  # no download was even attempted
    rows = {line[2:].split()[0]: line for line in result.stdout.split("\n\n")[0].splitlines()}
    assert rows["backbone.16"].startswith("* ") and "1x960x6x6" in rows["backbone.16"]
    # the auxiliary head (built for the weights only: none without them) and the weights' 21 classes
    assert "aux_classifier.4" in rows and "1x21x6x6" in rows["classifier.4"]


ARCHITECTURES = [
    ("googlenet", "DEFAULT"),  # built with auxiliary heads for the weights, which then drops them
    ("inception_v3", "DEFAULT"),
    ("densenet121", "DEFAULT"),  # renames the checkpoint's keys
    ("fcn_resnet50", "DEFAULT"),  # an auxiliary head
    ("ssdlite320_mobilenet_v3_large", "DEFAULT"),  # 91 classes, no backbone weights
    ("vit_b_16", "IMAGENET1K_SWAG_E2E_V1"),  # a 384 x 384 input: a larger position embedding
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "weights"), ARCHITECTURES, ids=[name for name, _ in ARCHITECTURES])
def test_the_architecture_alone_is_the_model_its_weights_describe(offline, monkeypatch, name, weights):
    """Against torchvision's own record of each weights' model (its parameter count), and against the model built
    with the weights (served in place of a download): the same layers, types and output shapes."""
    from gradcam_cli.cam.layers import layer_table

    chosen = torchvision.models.get_model_weights(name)[weights]
    alone = load_model(name, weights, architecture_only=True)
    assert offline == []
    assert sum(p.numel() for p in alone.module.parameters()) == chosen.meta["num_params"]
    if name == "googlenet":  # its builder drops the heads the checkpoint holds: no state dict to serve it
        return
    state = {key: value.clone() for key, value in alone.module.state_dict().items()}
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", lambda *args, **kwargs: state)
    loaded = load_model(name, weights)
    assert loaded.input_spec == alone.input_spec
    cpu = torch.device("cpu")

    def table(model: LoadedModel) -> tuple[list[tuple[object, ...]], str]:
        infos, default = layer_table(model, cpu)
        return [(i.name, i.kind, i.output_shape, i.calls, i.is_candidate) for i in infos], default

    assert table(alone) == table(loaded)


# --- --input-size: fixed sizes and the bound ---------------------------------------------------------------------


SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    ("model", "size", "expected"),
    [
        ("timm:test_vit", 224, "--input-size 224 does not apply to timm:test_vit: it takes a fixed 160x160 input"),
        pytest.param("vit_b_16", 384, "does not apply to vit_b_16: it takes a fixed 224x224 input", marks=SLOW),
        pytest.param("ssd300_vgg16", 600, "does not apply to ssd300_vgg16: it takes a fixed 300x300 input", marks=SLOW),
        ("resnet18", 4000, "--input-size 4000 is too large for resnet18: at most 896 (4 times its own 224;"),
        pytest.param("fcn_resnet50", 2081, "at most 2080 (4 times its own 520;", marks=SLOW),
        ("fasterrcnn_mobilenet_v3_large_320_fpn", 1281, "at most 1280 (4 times its own 320;"),
        (f"{ROOT / 'tests' / 'square_model.py'}:build", 2049, "at most 2048 (memory grows with the square"),
    ],
)
def test_an_input_size_that_would_be_ignored_or_exhaust_memory_is_refused(model, size, expected):
    with pytest.raises(UsageError) as caught:
        load_model(model, "none", input_size=size)
    assert expected in str(caught.value) and one_sentence(str(caught.value)), caught.value


def test_the_largest_input_sizes_allowed_and_a_fixed_size_given_as_is():
    assert load_model("resnet18", "none", input_size=896).input_spec.size == 896
    assert load_model("timm:test_vit", "none", input_size=160).input_spec.fixed_size == (160, 160)
    detector = load_model("fasterrcnn_mobilenet_v3_large_320_fpn", "none", input_size=1280)
    assert detector.input_spec.size == 1280 and detector.module.transform.min_size == (1280,)
    custom = load_model(f"{ROOT / 'tests' / 'square_model.py'}:build", "none", input_size=2048)
    assert custom.input_spec.size == 2048


# --- weights from a file ----------------------------------------------------------------------------------------


@pytest.fixture
def three_class_state(tmp_path) -> tuple[Path, dict[str, torch.Tensor]]:
    torch.manual_seed(7)
    state = torchvision.models.resnet18(num_classes=3).state_dict()
    path = tmp_path / "finetuned.pth"
    torch.save(state, path)
    return path, state


def test_weights_file_with_num_classes_and_labels(three_class_state, tmp_path):
    path, state = three_class_state
    loaded = load_model("resnet18", str(path), num_classes=3)
    assert_same_tensors(loaded.module, state)
    assert loaded.module.fc.out_features == 3
    assert loaded.categories is None and loaded.class_name(2) == "2"  # no names known: indices

    labels = tmp_path / "labels.txt"
    labels.write_text("cat\ndog\n hot dog \n\n\n", encoding="utf-8")
    named = load_model("resnet18", str(path), num_classes=3, labels=labels)
    assert named.categories == ["cat", "dog", "hot dog"]
    assert named.class_name(2) == "hot dog"
    assert resolve_target(named, "Hot Dog") == 2


@pytest.mark.parametrize("wrap", ["state_dict", "module_prefix"])
def test_wrapped_and_data_parallel_state_dicts_load(three_class_state, tmp_path, wrap):
    _, state = three_class_state
    saved = {"state_dict": state} if wrap == "state_dict" else {f"module.{k}": v for k, v in state.items()}
    path = tmp_path / "wrapped.pth"
    torch.save(saved, path)
    assert_same_tensors(load_model("resnet18", str(path), num_classes=3).module, state)


@pytest.mark.parametrize("name", ["finetuned.safetensors", "finetuned.bin", "finetuned.pth"])
def test_safetensors_weights_load_whatever_the_file_is_called(three_class_state, tmp_path, name):
    """A safetensors file is known by its content (a JSON header, then raw tensors: nothing to unpickle)."""
    from safetensors.torch import save_file

    _, state = three_class_state
    path = tmp_path / name
    save_file(state, path)
    assert_same_tensors(load_model("resnet18", str(path), num_classes=3).module, state)
    save_file({f"module.{k}": v for k, v in state.items()}, path)  # DataParallel's prefix is dropped here too
    assert_same_tensors(load_model("resnet18", str(path), num_classes=3).module, state)


def test_weights_for_another_head_size_are_explained(three_class_state):
    path, _ = three_class_state
    with pytest.raises(ModelLoadError, match="--num-classes") as caught:
        load_model("resnet18", str(path), num_classes=5)
    assert "\n" not in str(caught.value)


def test_missing_weights_file_and_empty_labels_are_usage_errors(three_class_state, tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_model("resnet18", str(tmp_path / "missing.pth"), num_classes=3)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n", encoding="utf-8")
    with pytest.raises(UsageError, match="empty"):
        load_model("resnet18", str(three_class_state[0]), num_classes=3, labels=empty)


class Payload:
    """Unpickling this creates a file: proof that pickled code would have run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_weights_files_are_loaded_with_weights_only(tmp_path):
    marker = tmp_path / "code-ran"
    path = tmp_path / "evil.pth"
    torch.save({"fc.weight": torch.zeros(3, 512), "extra": Payload(marker)}, path)
    with pytest.raises(ModelLoadError) as caught:
        load_model("resnet18", str(path), num_classes=3)
    assert not marker.exists()
    message = str(caught.value)
    assert "weights_only" in message and "\n" not in message and "\x1b" not in message
    torch.load(path, weights_only=False)  # the same file with weights_only=False does run the payload
    assert marker.exists()


# --- custom factories -------------------------------------------------------------------------------------------


@pytest.mark.quick
def test_factory_from_a_file_path(monkeypatch):
    monkeypatch.chdir(ROOT)
    loaded = load_model("tests/square_model.py:build")
    assert type(loaded.module).__name__ == "ColourDetector"
    assert loaded.categories is None and loaded.name == "tests/square_model.py:build"


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    package = tmp_path / "userpkg"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "nets.py").write_text(
        "import torch\n"
        "def make():\n"
        "    return torch.nn.Sequential(torch.nn.Conv2d(3, 2, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())\n"
        "def not_a_model():\n"
        "    return 42\n"
        "def broken():\n"
        "    raise RuntimeError('factory exploded')\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "userpkg.nets"


def test_factory_from_a_package_module(user_package, tmp_path):
    loaded = load_model(f"{user_package}:make")
    assert isinstance(loaded.module, nn.Sequential)
    torch.manual_seed(3)
    state = {k: torch.randn_like(v) for k, v in loaded.module.state_dict().items()}
    torch.save(state, tmp_path / "user.pth")
    assert_same_tensors(load_model(f"{user_package}:make", str(tmp_path / "user.pth")).module, state)


@pytest.mark.quick
def test_factory_mistakes(user_package):
    with pytest.raises(UsageError, match="Did you mean: make"):
        load_model(f"{user_package}:mkae")
    with pytest.raises(UsageError, match=r"returned int, not a torch\.nn\.Module"):
        load_model(f"{user_package}:not_a_model")
    with pytest.raises(ModelLoadError, match="factory exploded"):
        load_model(f"{user_package}:broken")
    with pytest.raises(UsageError, match="cannot import"):
        load_model("no_such_package_xyz.nets:make")
    with pytest.raises(UsageError, match="does not exist"):
        load_model("no/such/file.py:make")


# --- class targets ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def imagenet_model() -> LoadedModel:
    return LoadedModel(nn.Identity(), "m", "none", imagenet_categories(), InputSpec())


@pytest.mark.quick
@pytest.mark.parametrize(
    ("text", "index"), [("281", 281), ("tabby", 281), ("Egyptian Cat", 285), ("  EGYPTIAN CAT ", 285), (None, None)]
)
def test_target_by_index_or_case_insensitive_name(imagenet_model, text, index):
    assert resolve_target(imagenet_model, text) == index


def test_target_name_typo_gets_a_suggestion(imagenet_model):
    with pytest.raises(UsageError, match=r"unknown class 'egyptain cat'\. Did you mean: Egyptian cat"):
        resolve_target(imagenet_model, "egyptain cat")


@pytest.mark.quick
def test_ambiguous_target_name_asks_for_the_index():
    model = LoadedModel(nn.Identity(), "m", "none", ["crane", "dog", "Crane"], InputSpec())
    with pytest.raises(UsageError, match=r"ambiguous \(indices \[0, 2\]\)"):
        resolve_target(model, "crane")


def test_target_name_without_class_names_needs_labels():
    model = LoadedModel(nn.Identity(), "m", "none", None, InputSpec())
    assert resolve_target(model, "4") == 4
    with pytest.raises(UsageError, match="--labels"):
        resolve_target(model, "cat")


@pytest.mark.quick
def test_out_of_range_target_index_is_a_usage_error(square_model):
    with pytest.raises(UsageError, match="out of range: the model has 3 classes"):
        Explainer(square_model, layers="features").explain_batch(torch.zeros(1, 3, 8, 8), target=3)


# --- the pretrained model shipped on PyPI -----------------------------------------------------------------------


def test_efficientnet_lite0_is_pretrained_and_sees_the_cat(lite0):
    assert lite0.name == "efficientnet_lite0" and len(lite0.categories) == 1000
    result = Explainer(lite0).explain(SAMPLE_DIR / "chelsea.jpg")
    assert result.predictions[0].index in CAT_CLASSES, result.predictions[0]
    assert result.predictions[0].probability > 0.3
    assert result.explanations[0].target == result.predictions[0]
    assert tuple(result.explanations[0].saliency.shape) == (300, 451)


def test_lite0_default_weights_are_named_not_located(lite0) -> None:
    # the packaged file's path depends on the environment; the run record (--skip-existing) must not
    assert lite0.weights == "DEFAULT"
