"""A video model's dry pass on the meta device (:func:`gradcam_cli.cam.layers.dry_pass`, docs/video.md's costs): the
layers the pass on the CPU finds, and the pass on the CPU where a model cannot run on the meta device."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gradcam_cli import Explainer, load_model
from gradcam_cli.cam import layers
from gradcam_cli.cam.layers import LayerInfo, blank_input, dry_pass, inspect_layers, reads_tokens


def _recording(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The ``meta`` argument of each :func:`inspect_layers` call from here on."""
    calls: list[bool] = []
    original = layers.inspect_layers

    def inspect(*args: object, **keywords: object) -> list[LayerInfo]:
        calls.append(bool(args[4]) if len(args) > 4 else bool(keywords.get("meta", False)))
        return original(*args, **keywords)  # type: ignore[arg-type]

    monkeypatch.setattr(layers, "inspect_layers", inspect)
    return calls


@pytest.mark.parametrize("name", ["r3d_18", "r2plus1d_18"])
def test_a_video_models_meta_pass_finds_every_layer_its_cpu_pass_finds(name: str, monkeypatch: pytest.MonkeyPatch):
    loaded = load_model(name, "none")
    assert loaded.profile.clips is not None
    on_cpu = inspect_layers(loaded.module, blank_input(loaded.input_spec), loaded.prefix_tokens, reads_tokens(loaded))
    calls = _recording(monkeypatch)
    found = dry_pass(loaded, torch.device("cpu"))
    assert calls == [True]  # the meta pass alone
    assert found == on_cpu  # names, kinds, shapes, calls, order, layouts
    assert any(info.name == "layer4" and info.is_candidate for info in found)
    assert {tensor.device.type for tensor in [*loaded.module.parameters(), *loaded.module.buffers()]} == {"cpu"}


class _ReadsAValue(nn.Module):
    """A 3-D CNN whose forward pass reads a value (no meta pass can)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv3d(3, 4, 3, padding=1)
        self.head = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if float(y.abs().sum()) < 0:
            y = -y
        return self.head(y.mean((2, 3, 4)))


@pytest.mark.quick
def test_a_video_model_that_cannot_run_on_the_meta_device_makes_its_pass_on_the_cpu(monkeypatch: pytest.MonkeyPatch):
    torch.manual_seed(0)
    calls = _recording(monkeypatch)
    explainer = Explainer(_ReadsAValue().eval())
    assert explainer.model.profile.clips is not None
    assert calls == [True, False]  # the meta pass failed, the CPU pass made
    assert explainer.chosen.layers == ("conv",)
