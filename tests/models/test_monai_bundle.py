"""MONAI bundle folders (models/families/monai_bundle.py): a tiny bundle written here (a MONAI UNet, its inference
config as JSON and as YAML, its metadata) loads into the same network with the same weights, its preprocessing's
intensity scaling is MONAI's own transform's, and its volume is explained through the sliding windows of its roi size
and overlap against the autograd reference."""

from __future__ import annotations

import pytest
import torch
from cam_reference import pearson
from volume_models import BUNDLE_BOTTLENECK as BOTTLENECK
from volume_models import BUNDLE_CONFIG as CONFIG
from volume_models import reference_stitched, save_bundle

from gradcam_cli import Explainer, load_model
from gradcam_cli.cam.windows import Windows, explain_volume
from gradcam_cli.errors import UsageError
from gradcam_cli.models.families import family_of
from gradcam_cli.models.volume_spec import Intensity

pytest.importorskip("monai.networks.nets")


@pytest.fixture
def bundle(tmp_path):
    return save_bundle(tmp_path)


@pytest.mark.quick
def test_a_bundle_loads_its_network_weights_labels_and_profile(bundle):
    folder, net = bundle
    model = load_model(str(folder))
    x = torch.randn(1, 1, 16, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model.module.eval()(x), net(x))
    assert family_of(str(folder)).name == "monai-bundle" and model.weights == str(folder / "models" / "model.pt")
    assert model.categories == ["background", "spleen", "liver"] and model.task == "segment"
    spec = model.profile.volume
    assert spec is not None and spec.patch == (16, 16, 16) and spec.step == 0.75 and spec.spacing == (1.5, 1.5, 2.0)
    assert spec.intensities == (Intensity("range", low=-57.0, high=164.0, lower=0.0, upper=1.0, clip=True),)
    assert model.input_spec.shape == (1, 16, 16, 16) and spec.source.endswith("(UNet)")


def test_the_intensity_scaling_is_monais_own_transform(bundle):
    from monai.transforms import ScaleIntensityRange

    folder, _ = bundle
    spec = load_model(f"bundle:{folder}").profile.volume
    raw = torch.randn(1, 6, 7, 8, generator=torch.Generator().manual_seed(1)) * 150
    theirs = ScaleIntensityRange(-57, 164, 0.0, 1.0, clip=True)(raw)
    torch.testing.assert_close(spec.normalise(raw), torch.as_tensor(theirs).float(), rtol=1e-5, atol=1e-6)


def test_a_yaml_config_is_read_alike_and_a_folder_without_one_is_refused(bundle, tmp_path):
    yaml = pytest.importorskip("yaml")
    folder, net = bundle
    (folder / "configs" / "inference.json").unlink()
    (folder / "configs" / "inference.yaml").write_text(yaml.safe_dump(CONFIG))
    model = load_model(f"bundle:{folder}")
    assert model.profile.volume.patch == (16, 16, 16)
    torch.testing.assert_close(model.module.state_dict(), net.state_dict())
    with pytest.raises(UsageError, match="not a MONAI bundle folder"):
        load_model(f"bundle:{tmp_path}")


def test_a_scan_is_explained_through_the_bundles_windows(bundle):
    pytest.importorskip("nnunetv2", reason="the reference stitches with nnU-Net's own windows and Gaussian")
    folder, net = bundle
    model = load_model(str(folder))
    spec = model.profile.volume
    explainer = Explainer(model, BOTTLENECK, ["gradcam"])
    x = spec.normalise(torch.randn(1, 20, 24, 18, generator=torch.Generator().manual_seed(2)) * 100 + 50)
    result = explain_volume(explainer, x, Windows(spec.patch, spec.step, batch_size=4), classes=[1, 2])
    assert result.maps["gradcam"].shape == (2, 20, 24, 18)
    for k, c in enumerate([1, 2]):
        reference = reference_stitched(net, net.get_submodule(BOTTLENECK), x, c, spec.patch, spec.step)
        assert pearson(result.maps["gradcam"][k], reference) >= 0.999, c
