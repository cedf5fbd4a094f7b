"""A task from outside the package: keypoint heatmaps (``--task keypoints``), registered by the test that uses it.

The model (``build``, as ``--model tests/task_plugins/keypoints.py:build``) returns (N, 2, H / 4, W / 4) heatmaps of
two keypoints, ``red`` and ``blue``: each cell's excess of that colour. A keypoint's score is its heatmap's peak
value; its prediction shows the peak's place in the image's pixels (a task-owned ``details`` payload).
"""

from __future__ import annotations

from typing import Any

import torch
from task_models import colour_excess
from torch import nn

from gradcam_cli.cam.results import Prediction
from gradcam_cli.cam.scores import ChannelTargets, ClassName, MaskedProbability, chosen_channels
from gradcam_cli.cam.tasks import ScoreRequest, TaskAdapter
from gradcam_cli.errors import UsageError

KEYPOINTS = ["red", "blue"]
STRIDE = 4


class KeypointNet(nn.Module):
    """``features``: colour excess and ReLU at full resolution; ``head``: pooled to 1/4, red and blue kept."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(colour_excess(), nn.ReLU())
        self.pool = nn.AvgPool2d(STRIDE)
        self.head = nn.Conv2d(3, 2, kernel_size=1)
        with torch.no_grad():
            self.head.weight.zero_()
            self.head.weight[0, 0] = 1.0
            self.head.weight[1, 2] = 1.0
            self.head.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.features(x)))


def build() -> nn.Module:
    return KeypointNet().eval()


class KeypointTargets(ChannelTargets):
    """Each sample's chosen keypoints (N, k) in (N, K, h, w) ``heatmaps``; a keypoint's score (``scores``): its
    heatmap's peak value."""

    def __init__(self, heatmaps: torch.Tensor, chosen: torch.Tensor) -> None:
        super().__init__(heatmaps.flatten(2).amax(2), chosen)
        self.heatmaps = heatmaps

    def masked(self, k: int) -> MaskedProbability:
        def probability(output: object, samples: torch.Tensor) -> torch.Tensor:
            assert isinstance(output, torch.Tensor)
            return self.entry(output.float().flatten(2).amax(2).sigmoid(), k, samples)

        return probability

    def prediction(self, n: int, c: int, size: tuple[int, int], class_name: ClassName) -> Prediction:
        """The keypoint's peak (the sigmoid of its score) and its place in the image's pixels (``details``)."""
        (height, width), heat = size, self.heatmaps[n, c].detach().float()
        h, w = heat.shape
        cell = int(heat.flatten().argmax())
        x, y = (cell % w + 0.5) * width / w, (cell // w + 0.5) * height / h
        peak = float(self.scores[n, c].detach().sigmoid())
        return Prediction(c, class_name(c), peak, details={"peak": [round(x, 2), round(y, 2)]})


class KeypointScore:
    def targets(
        self, output: object, inputs: torch.Tensor, target: int | None, top_k: int, chosen: torch.Tensor | None = None
    ) -> KeypointTargets:
        if not isinstance(output, torch.Tensor) or output.dim() != 4:
            raise UsageError("a keypoint model returns (N, keypoints, h, w) heatmaps")
        keypoints = output.shape[1]
        picked = chosen_channels(output.flatten(2).amax(2), target, min(top_k, keypoints), "keypoint", "keypoints")
        return KeypointTargets(output.float(), picked)


class KeypointsTask(TaskAdapter):
    """Keypoint heatmaps: the adapter a plugin would ship."""

    name = "keypoints"
    noun = "keypoint model"
    methods_of = "segment"

    def score(self, model: Any, request: ScoreRequest) -> KeypointScore:
        self.check_options(request.options)
        return KeypointScore()

    def where(self, prediction: Prediction) -> str:
        x, y = (prediction.details or {}).get("peak", ("?", "?"))
        return f"(keypoint {prediction.index}) peaks at ({x}, {y})"

    def how_much(self, prediction: Prediction) -> str:
        return f"peak {prediction.probability:.3f}"


ADAPTER = KeypointsTask()
"""What the plugin registers (as an entry point in group ``gradcam_cli.tasks`` would name it)."""
