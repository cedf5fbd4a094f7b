"""Helpers of the video model tests: synthetic videos, torchvision video weights in a test's cache, a clip read as
the model takes it (written here with OpenCV, Pillow and NumPy: none of gradcam_cli's code) and the papers' formulas
on a 3-D layer's activations and gradients taken with a forward hook and ``torch.autograd.grad``."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import torchvision
from PIL import Image
from torch import nn


def write_video(path: Path, frames: int, fps: float, size: tuple[int, int], draw: Callable[[int], np.ndarray]) -> Path:
    """An mp4v video of ``frames`` frames, ``size`` = (width, height), each ``draw(number)`` (BGR uint8)."""
    import cv2

    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"mp4v"), fps, size)
    assert writer.isOpened()
    for number in range(frames):
        writer.write(draw(number))
    writer.release()
    return path


def read_frames(path: Path) -> list[np.ndarray]:
    """Every frame of a video, RGB, as OpenCV decodes it."""
    import cv2

    capture = cv2.VideoCapture(str(path))
    frames = []
    while True:
        ok, frame = capture.read()
        if not ok:
            break
        frames.append(np.ascontiguousarray(frame[:, :, ::-1]))
    capture.release()
    return frames


def cached_weights(torch_home: Path, name: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights for torchvision's video model ``name`` written where torchvision's cache under ``torch_home``
    expects its DEFAULT weights (so that ``--weights DEFAULT`` loads them without a download); its state dict."""
    weights = torchvision.models.get_model_weights(name).DEFAULT
    torch.manual_seed(seed)
    state = torchvision.models.get_model(name).state_dict()
    path = torch_home / "hub" / "checkpoints" / Path(weights.url).name
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return state


def model_with(name: str, state: dict[str, torch.Tensor]) -> nn.Module:
    model = torchvision.models.get_model(name)
    model.load_state_dict(state)
    return model.eval()


def clip_input(
    frames: list[np.ndarray], numbers: list[int], shorter: int, mean: tuple[float, ...], std: tuple[float, ...]
) -> torch.Tensor:
    """The (1, 3, T, h, w) input of the frames ``numbers``: each resized whole (bilinear, its shorter side
    ``shorter``, the aspect kept) and normalised."""
    height, width = frames[0].shape[:2]
    wide = height <= width
    size = (round(width * shorter / height), shorter) if wide else (shorter, round(height * shorter / width))
    planes = []
    for number in numbers:
        pixels = np.asarray(Image.fromarray(frames[number]).resize(size, Image.Resampling.BILINEAR), np.float32)
        planes.append((pixels / 255.0 - np.array(mean, np.float32)) / np.array(std, np.float32))
    return torch.from_numpy(np.stack(planes)).permute(3, 0, 1, 2)[None].float()


def centre_frames(start: int, frames: int, span: int) -> list[int]:
    """The video frames a clip of ``frames`` samples over ``span`` frames from ``start`` reads: the centre of each
    of ``frames`` equal parts."""
    return [start + math.floor((i + 0.5) * span / frames) for i in range(frames)]


def captured(model: nn.Module, layer: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(the layer's output A, dS/dA with S the top logit, the top class): a forward hook and autograd.grad."""
    kept: list[torch.Tensor] = []

    def keep(_module: nn.Module, _inputs: object, output: torch.Tensor) -> torch.Tensor:
        leaf = output.detach().requires_grad_(True)
        kept.append(leaf)
        return leaf

    handle = layer.register_forward_hook(keep)
    try:
        with torch.enable_grad():
            logits = model(x)
            top = int(logits[0].argmax())
            (gradient,) = torch.autograd.grad(logits[0, top], kept[-1])
    finally:
        handle.remove()
    return kept[-1].detach().double(), gradient.double(), top


def _weighted(weights: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    return torch.relu((weights * a).sum(dim=1))


def _principal(weighted: torch.Tensor) -> torch.Tensor:
    """Positions x channels, centred, on the first right singular vector, signed to correlate with the channel
    sum."""
    sample = weighted[0]
    matrix = sample.flatten(1).T
    centred = matrix - matrix.mean(dim=0)
    _, _, vh = torch.linalg.svd(centred, full_matrices=False)
    projection = centred @ vh[0]
    if float(projection @ centred.sum(dim=1)) < 0:
        projection = -projection
    return projection.view(sample.shape[1:])[None]


def _grad_cam_plus_plus(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    totals = a.sum(dim=(2, 3, 4), keepdim=True)
    denominator = 2 * g**2 + totals * g**3
    alpha = torch.where(denominator != 0, g**2 / torch.where(denominator != 0, denominator, 1.0), 0.0)
    return _weighted((alpha * torch.relu(g)).sum(dim=(2, 3, 4), keepdim=True), a)


def _xgradcam(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    totals = a.sum(dim=(2, 3, 4), keepdim=True)
    weights = (a * g).sum(dim=(2, 3, 4), keepdim=True) / torch.where(totals != 0, totals, 1.0)
    return _weighted(torch.where(totals != 0, weights, 0.0), a)


REFERENCES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "gradcam": lambda a, g: _weighted(g.mean(dim=(2, 3, 4), keepdim=True), a),  # weights: means over T, H and W
    "gradcam++": _grad_cam_plus_plus,
    "xgradcam": _xgradcam,
    "hirescam": lambda a, g: torch.relu((g * a).sum(dim=1)),
    "layercam": lambda a, g: torch.relu((torch.relu(g) * a).sum(dim=1)),
    "eigencam": lambda a, g: torch.relu(_principal(a)),
    "eigengradcam": lambda a, g: torch.relu(_principal(g * a)),
}
"""The papers' formulas on (1, C, t, h, w) activations and gradients: (1, t, h, w) maps."""


def resized(coarse: torch.Tensor, size: tuple[int, int, int]) -> torch.Tensor:
    """A (1, t, h, w) map stretched trilinearly (align_corners=False) over ``size`` and min-max scaled to [0, 1]."""
    up = F.interpolate(coarse[:, None].double(), size=size, mode="trilinear", align_corners=False)[0, 0]
    return (up - up.min()) / (up.max() - up.min())
