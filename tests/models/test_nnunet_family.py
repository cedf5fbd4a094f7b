"""nnU-Net v2 trained model folders (models/families/nnunet.py): a tiny folder written here as nnU-Net writes one
(its network built and initialised by nnU-Net's own ``get_network_from_plans``) loads into the same network with the
same weights, its normalisation is nnU-Net's own, and its volume is explained through the sliding windows against the
autograd reference."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from cam_reference import pearson
from volume_models import CT_PROPERTIES, nnunet_network, nnunet_plans, reference_stitched, save_nnunet_folder

from gradcam_cli import Explainer, load_model
from gradcam_cli.cam.windows import Windows, explain_volume
from gradcam_cli.errors import ModelLoadError, UsageError
from gradcam_cli.models.families import family_of
from gradcam_cli.models.families.nnunet import resolved_configuration
from gradcam_cli.models.volume_spec import Intensity, VolumeSpec

pytest.importorskip("nnunetv2")
pytest.importorskip("dynamic_network_architectures")


@pytest.fixture
def folder(tmp_path):
    return save_nnunet_folder(tmp_path)


@pytest.mark.quick
def test_a_trained_folder_loads_its_network_weights_labels_and_profile(folder):
    path, network = folder
    model = load_model(f"nnunet:{path}")
    assert type(model.module).__name__ == "PlainConvUNet" and not model.module.decoder.deep_supervision
    x = torch.randn(1, 1, 16, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model.module.eval()(x), network(x))
    assert model.categories == ["background", "liver", "tumour"] and model.task == "segment"
    assert model.input_spec.shape == (1, 16, 16, 16) and model.default_layers == ("encoder.stages.2",)
    assert model.weights == str(path / "fold_0" / "checkpoint_final.pth")
    spec = model.profile.volume
    assert spec is not None and spec.patch == (16, 16, 16) and spec.spacing == (2.5, 0.8, 0.8)
    assert spec.channel_names == ("CT",) and spec.transpose == (0, 1, 2)
    assert spec.intensities == (Intensity("ct", 80.0, 150.0, -900.0, 1200.0),)
    inherited = resolved_configuration(nnunet_plans(), "3d_fullres_bs4")  # nnU-Net's inheritance of configurations
    assert inherited["batch_size"] == 4 and inherited["patch_size"] == [16, 16, 16] and "inherits_from" not in inherited


@pytest.mark.quick
def test_a_model_folder_or_a_fold_folder_is_claimed_without_the_prefix(folder):
    path, _ = folder
    assert family_of(str(path)).name == "nnunet" and family_of(str(path / "fold_0")).name == "nnunet"
    assert load_model(str(path / "fold_0")).weights == str(path / "fold_0" / "checkpoint_final.pth")
    assert family_of(str(path.parent)).name != "nnunet"


def test_the_normalisation_is_nnunets_own():
    from nnunetv2.preprocessing.normalization.default_normalization_schemes import (
        CTNormalization,
        ZScoreNormalization,
    )

    raw = torch.randn(1, 6, 7, 8, generator=torch.Generator().manual_seed(1)).double() * 600 + 100
    raw[0, :2] = 0  # a zero border, outside the non-zero mask
    ct = CTNormalization(False, CT_PROPERTIES).run(raw[0].numpy().copy())
    ours = VolumeSpec((4, 4, 4), (Intensity("ct", 80.0, 150.0, -900.0, 1200.0),)).normalise(raw)
    np.testing.assert_allclose(ours[0].numpy(), ct, rtol=1e-5, atol=1e-5)
    seg = np.where(raw[0].numpy() != 0, 0, -1)
    zscore = ZScoreNormalization(True, {}).run(raw[0].numpy().copy(), seg)
    ours = VolumeSpec((4, 4, 4), (Intensity("zscore", nonzero=True),)).normalise(raw)
    np.testing.assert_allclose(ours[0].numpy(), zscore, rtol=1e-5, atol=1e-5)
    plain = ZScoreNormalization(False, {}).run(raw[0].numpy().copy())
    np.testing.assert_allclose(VolumeSpec((4, 4, 4)).normalise(raw)[0].numpy(), raw[0].numpy())  # none
    ours = VolumeSpec((4, 4, 4), (Intensity("zscore"),)).normalise(raw)
    np.testing.assert_allclose(ours[0].numpy(), plain, rtol=1e-5, atol=1e-5)
    with pytest.raises(UsageError, match="2-channel"):
        VolumeSpec((4, 4, 4), (Intensity(), Intensity())).normalise(raw)


def test_a_scan_is_explained_through_the_windows_at_the_bottleneck(folder):
    path, network = folder
    model = load_model(f"nnunet:{path}")
    explainer = Explainer(model, methods=["gradcam"])
    assert explainer.chosen.layers == ("encoder.stages.2",)
    spec = model.profile.volume
    raw = torch.randn(1, 24, 20, 28, generator=torch.Generator().manual_seed(2)) * 300
    x = spec.normalise(raw)
    result = explain_volume(explainer, x, Windows(spec.patch, spec.step, batch_size=2), classes=[1, 2])
    assert result.maps["gradcam"].shape == (2, 24, 20, 28) and result.windows == 2 * 2 * 3
    for k, c in enumerate([1, 2]):
        reference = reference_stitched(network, network.encoder.stages[2], x, c, patch=spec.patch)
        assert pearson(result.maps["gradcam"][k], reference) >= 0.999


def test_what_a_folder_may_not_do_is_refused_in_one_line(folder, tmp_path):
    path, _ = folder
    plans = nnunet_plans()
    plans["configurations"]["3d_fullres"]["architecture"]["network_class_name"] = "os.system"
    (path / "plans.json").write_text(json.dumps(plans))
    with pytest.raises(UsageError, match=r"only dynamic_network_architectures\. names are imported"):
        load_model(f"nnunet:{path}")
    (path / "plans.json").write_text(json.dumps(nnunet_plans()))
    torch.save({"network_weights": {}, "trainer": torch.nn.Linear(1, 1)}, path / "fold_0" / "checkpoint_final.pth")
    with pytest.raises(ModelLoadError, match="cannot read nnU-Net checkpoint") as refused:
        load_model(f"nnunet:{path}")
    assert "\n" not in str(refused.value)
    with pytest.raises(UsageError, match="not an nnU-Net trained model folder"):
        load_model(f"nnunet:{tmp_path}")
    torch.save({"network_weights": nnunet_network(nnunet_plans()).state_dict()}, tmp_path / "other.pth")
    assert load_model(f"nnunet:{path}", weights=str(tmp_path / "other.pth")).weights == str(tmp_path / "other.pth")
