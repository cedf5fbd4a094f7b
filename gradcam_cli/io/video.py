"""Reading video files with OpenCV: what the container says about a clip, and its frames."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import GradcamError
from .discovery import VIDEO_SUFFIXES

FOURCC = "mp4v"
DEFAULT_FPS = 25.0


def is_video(path: str | Path) -> bool:
    """Whether ``path`` names an existing file with a video suffix (.mp4, .avi, .mov, .mkv, .webm)."""
    path = Path(path)
    return path.suffix.lower() in VIDEO_SUFFIXES and path.is_file()


@dataclass(frozen=True)
class VideoInfo:
    """What the container says: frame rate, frame size, and frame count (0 where it cannot tell)."""

    fps: float
    width: int
    height: int
    frames: int


def probe(path: str | Path) -> VideoInfo:
    """Read a video's frame rate, size and frame count without decoding it; raise GradcamError if unreadable."""
    import cv2

    capture = cv2.VideoCapture(str(path))
    try:
        if not capture.isOpened():
            raise GradcamError(f"{path}: not a video OpenCV can read")
        return capture_info(capture)
    finally:
        capture.release()


def capture_info(capture: Any) -> VideoInfo:
    import cv2

    fps = capture.get(cv2.CAP_PROP_FPS)
    frames = capture.get(cv2.CAP_PROP_FRAME_COUNT)
    return VideoInfo(
        fps if fps and math.isfinite(fps) and fps > 0 else DEFAULT_FPS,
        int(capture.get(cv2.CAP_PROP_FRAME_WIDTH)),
        int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT)),
        int(frames) if frames and math.isfinite(frames) and frames > 0 else 0,
    )


def frames(capture: Any) -> Iterator[np.ndarray]:
    while True:
        ok, frame = capture.read()
        if not ok:
            return
        yield frame
