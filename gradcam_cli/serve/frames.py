"""A video model's overlay video frame by frame, for the run view's frame scrubber.

A clip row (one with ``clip``: :class:`~gradcam_cli.cam.records.ClipInfo`) lists its overlay video first among its
outputs. The page asks for the video's frame count and rate (:func:`video_facts`), then for one frame at a time as
a JPEG (:func:`frame_jpeg`), decoded on the server: the overlay videos are MPEG-4 Part 2 (``mp4v``), which browsers
do not play. The video is found as every row file is (:func:`~gradcam_cli.serve.files.row_output`: inside the run
folder, symbolic links resolved), so no frame of a file outside it is ever decoded.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ImageError
from ..io.discovery import VIDEO_SUFFIXES
from ..io.video import opened_by_name, probe
from .http import HttpError

FRAME_QUALITY = 85
"""The JPEG quality of a frame sent to the page."""


def video_output(outputs: Sequence[str]) -> int:
    """Which of a row's outputs is its overlay video (the first with a video suffix); a row without one: 404."""
    for k, output in enumerate(outputs):
        if Path(output).suffix.lower() in VIDEO_SUFFIXES:
            return k
    raise HttpError(404, "this row has no overlay video")


def video_facts(path: Path) -> dict[str, Any]:
    """``{"frames", "fps", "width", "height"}`` of an overlay video (frames counted by decoding where the container
    does not say); one that cannot be read: 422."""
    try:
        info = probe(path)
    except ImageError:
        raise HttpError(422, "the overlay video cannot be read") from None
    frames = info.frames or _counted(path)
    return {"frames": frames, "fps": round(info.fps, 6), "width": info.width, "height": info.height}


def frame_jpeg(path: Path, index: int) -> bytes:
    """Frame ``index`` (0-based) of the video at ``path`` as a JPEG; a frame it does not have: 404."""
    import cv2

    with opened_by_name(path) as name:
        capture = cv2.VideoCapture(name)
    try:
        if not capture.isOpened():
            raise HttpError(422, "the overlay video cannot be read")
        if index > 0:
            capture.set(cv2.CAP_PROP_POS_FRAMES, index)
        ok, frame = capture.read()
    finally:
        capture.release()
    if not ok:
        raise HttpError(404, f"the overlay video has no frame {index}")
    ok, encoded = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, FRAME_QUALITY])
    if not ok:
        raise HttpError(500, "cannot encode the frame")
    return bytes(encoded)


def _counted(path: Path) -> int:
    import cv2

    with opened_by_name(path) as name:
        capture = cv2.VideoCapture(name)
    try:
        count = 0
        while capture.grab():
            count += 1
        return count
    finally:
        capture.release()
