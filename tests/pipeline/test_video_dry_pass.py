"""A video model's dry pass (:func:`gradcam_cli.cam.layers.dry_pass`, docs/video.md's costs) on a shape-only copy
of the model: the layers a real pass on the CPU finds, without running the model; a real pass where a model reads a
value (no shape-only pass can)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gradcam_cli import Explainer, load_model
from gradcam_cli.cam import layers
from gradcam_cli.cam.layers import blank_input, dry_pass, reads_tokens


def devices(model: nn.Module) -> list[str]:
    """The device of each pass of ``model`` (a hook on it, which its copies keep)."""
    seen: list[str] = []
    model.register_forward_hook(lambda _m, inputs, _o: seen.append(inputs[0].device.type))
    return seen


@pytest.mark.parametrize("name", ["r3d_18", "r2plus1d_18"])
def test_a_video_models_dry_pass_finds_every_layer_a_cpu_pass_finds_without_a_clips_forward_pass(name: str):
    loaded = load_model(name, "none")
    assert loaded.profile.clips is not None
    on_cpu = layers._inspect(loaded.module, blank_input(loaded.input_spec), loaded.prefix_tokens, reads_tokens(loaded))
    seen = devices(loaded.module)
    found = dry_pass(loaded, torch.device("cpu"))
    assert seen == ["meta"]  # shapes only
    assert found == on_cpu  # names, kinds, shapes, calls, order, layouts
    assert any(info.name == "layer4" and info.is_candidate for info in found)
    assert {tensor.device.type for tensor in [*loaded.module.parameters(), *loaded.module.buffers()]} == {"cpu"}


class _ReadsAValue(nn.Module):
    """A 3-D CNN whose forward pass reads a value (no shape-only pass can)."""

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
def test_a_video_model_that_reads_a_value_makes_its_pass_on_the_cpu():
    torch.manual_seed(0)
    model = _ReadsAValue().eval()
    seen = devices(model)
    explainer = Explainer(model)
    assert explainer.model.profile.clips is not None
    assert seen == ["cpu"]  # the shape-only pass stopped at the value read; the real one made
    assert explainer.chosen.layers == ("conv",)
