"""Model families: which family claims each ``--model`` value, what ``load_model`` adds after a family's loader, and
a loaded model that nothing changes after loading (the explainer keeps its own copy)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gradcam_cli import Explainer
from gradcam_cli.errors import UsageError
from gradcam_cli.io.images import InputSpec
from gradcam_cli.models.families import FAMILIES, family_of
from gradcam_cli.models.loading import load_model
from gradcam_cli.models.profile import LoadedModel, ModelProfile
from gradcam_cli.models.tasks import CLASSIFY, SEGMENT

pytestmark = pytest.mark.quick


@pytest.mark.parametrize(
    ("model", "family"),
    [
        ("yolo:best.pt", "yolo"),
        ("timm:convnext_tiny", "timm"),
        ("hf:org/name", "hf"),
        ("hf:path/to/folder", "hf"),
        ("open_clip:ViT-B-32", "open_clip"),
        ("efficientnet_lite0", "lite0"),
        ("tests/square_model.py:build", "custom"),
        ("my_package.nets:build", "custom"),
        ("monai:UNet?in_channels=1&out_channels=3", "monai"),  # before module:factory specs
        ("resnet50", "torchvision"),
        ("C:model", "torchvision"),  # a Windows drive, not a module:factory spec
        ("resnet5O", "torchvision"),  # refused by torchvision's loader, with close matches
    ],
)
def test_each_model_spec_is_claimed_by_one_family(model: str, family: str) -> None:
    assert family_of(model).name == family


def test_the_package_families_come_first_in_the_registry() -> None:
    own = ("yolo", "timm", "hf", "open_clip", "lite0", "custom", "torchvision")
    assert FAMILIES.names()[: len(own)] == own


def test_a_family_refuses_what_does_not_apply_to_it() -> None:
    with pytest.raises(UsageError, match=r"^--num-classes 0 \(no head: an embedding model\) is for timm: models$"):
        load_model("resnet18", "none", num_classes=0)
    with pytest.raises(UsageError, match=r"unknown model 'resnet5O'\. Did you mean: resnet50"):
        load_model("resnet5O", "none")


def test_a_loaded_model_is_frozen_and_its_profile_answers_for_it(square_model: LoadedModel) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        square_model.name = "other"  # type: ignore[misc]
    wider = square_model.with_profile(input_spec=InputSpec(size=96))
    assert (wider.input_spec.size, square_model.input_spec.size) == (96, 224)
    assert wider.module is square_model.module and wider.categories == square_model.categories
    with pytest.raises(TypeError, match="a profile or the profile's facts"):
        LoadedModel(square_model.module, "m", "none", ["a"], profile=ModelProfile())


def test_the_explainer_leaves_the_callers_model_as_it_was(square_model: LoadedModel) -> None:
    segmenter = square_model.with_profile(task=SEGMENT)
    explainer = Explainer(segmenter, "features", task="classify")
    assert explainer.model.task == CLASSIFY and segmenter.task == SEGMENT
    probabilities, _, _ = explainer.compute(torch.rand(1, 3, 32, 32))
    assert probabilities.shape == (1, 3)


def test_load_model_applies_input_size_and_labels_after_the_family(tmp_path) -> None:
    labels = tmp_path / "classes.txt"
    labels.write_text("".join(f"c{i}\n" for i in range(1000)), encoding="utf-8")
    loaded = load_model("resnet18", "none", labels=labels, input_size=160)
    assert (loaded.input_spec.size, loaded.categories[:2], loaded.task) == (160, ["c0", "c1"], CLASSIFY)
    labels.write_text("a\nb\n", encoding="utf-8")
    with pytest.raises(UsageError, match="has 2 names but the model has 1000 classes"):
        load_model("resnet18", "none", labels=labels)
