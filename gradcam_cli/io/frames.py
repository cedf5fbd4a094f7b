"""A video as the clip readers take it: a video file through OpenCV, or a folder of frame images read as one video
(:class:`FrameFolder`, for a video model: docs/video.md, "A folder of frames")."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from ..errors import ImageError
from .discovery import frame_files
from .images import InputSpec, load_image, to_input_tensor
from .video import DEFAULT_FPS, UNREADABLE, capture_info, opened_by_name


class FrameFolder:
    """A folder of frame images read as a video, with the calls of a ``cv2.VideoCapture`` that the video readers
    use (``isOpened``, ``read``, ``release``): each frame read by Pillow (EXIF orientation applied) as BGR pixels. A
    frame that cannot be read raises its :class:`~gradcam_cli.errors.ImageError` (the video fails with it)."""

    def __init__(self, folder: Path) -> None:
        self.files = frame_files(folder)
        self.next = 0

    def isOpened(self) -> bool:
        return True

    def read(self) -> tuple[bool, np.ndarray | None]:
        if self.next >= len(self.files):
            return False, None
        image = load_image(self.files[self.next])
        self.next += 1
        return True, np.ascontiguousarray(np.asarray(image)[:, :, ::-1])

    def release(self) -> None:
        self.next = len(self.files)


@contextmanager
def opened_video(path: Path, fps: float | None = None) -> Iterator[tuple[Any, float]]:
    """An open video and its frame rate, released on exit: a video file through OpenCV (its container's rate; an
    :class:`~gradcam_cli.errors.ImageError` if OpenCV cannot open it), or a folder of frames (:class:`FrameFolder`)
    at ``fps`` (``None``: :data:`DEFAULT_FPS`)."""
    if path.is_dir():
        yield FrameFolder(path), fps or DEFAULT_FPS
        return
    import cv2

    with opened_by_name(path) as name:
        capture = cv2.VideoCapture(name)
    try:
        if not capture.isOpened():
            raise ImageError(f"{path}: {UNREADABLE}")
        yield capture, capture_info(capture).fps
    finally:
        capture.release()


def network_frame(frame: np.ndarray, size: tuple[int, int], spec: InputSpec) -> tuple[np.ndarray, torch.Tensor]:
    """A decoded BGR frame's RGB pixels at ``size`` (width, height: the video's first frame's; a frame of another
    size is resized to it) and its network input, as ``spec`` says (resized whole and normalised)."""
    rgb = rgb_frame(frame, size)
    return rgb, network_input(rgb, spec)


def network_input(rgb: np.ndarray, spec: InputSpec) -> torch.Tensor:
    """A frame's (H, W, 3) RGB pixels as the network's input, as ``spec`` says (resized whole and normalised)."""
    return to_input_tensor(Image.fromarray(rgb), spec)


def rgb_frame(frame: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """A decoded BGR frame's RGB pixels at ``size`` (width, height; a frame of another size is resized to it)."""
    import cv2

    if (frame.shape[1], frame.shape[0]) != size:
        frame = cv2.resize(frame, size, interpolation=cv2.INTER_AREA)
    return np.ascontiguousarray(frame[:, :, ::-1])
