"""A video model's run outputs made without a model, for the gallery's and ``gradcam serve``'s tests: an overlay
video whose frames are each one solid colour, its importance plot, and the run's clip rows (as
:class:`~gradcam_cli.pipeline.clips.ClipRunner` writes them)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from gradcam_cli.cam.records import ClipInfo, Record
from gradcam_cli.cam.results import Prediction

FRAMES = 6
FPS = 10.0
SIZE = (48, 32)  # width, height


def frame_colour(index: int) -> tuple[int, int, int]:
    """Frame ``index``'s RGB colour: each frame far from the others (after lossy video compression)."""
    return (min(255, 50 * index), 255 - min(255, 50 * index), 128)


def write_video(path: Path, frames: int = FRAMES) -> Path:
    """An ``mp4v`` video of ``frames`` solid frames, as the overlay videos are written."""
    import cv2

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"mp4v"), FPS, SIZE)
    assert writer.isOpened()
    for index in range(frames):
        rgb = np.zeros((SIZE[1], SIZE[0], 3), np.uint8)
        rgb[:] = frame_colour(index)
        writer.write(np.ascontiguousarray(rgb[:, :, ::-1]))
    writer.release()
    return path


def clip_records(out: Path, stem: str = "walk") -> list[Record]:
    """Two clips' rows of the video ``<stem>.mp4``: its overlay video and plot written under ``out``."""
    video = write_video(out / f"{stem}_gradcam_top1.mp4")
    curve = out / f"{stem}_gradcam_top1_curve.png"
    Image.new("RGB", (40, 20), (255, 255, 255)).save(curve)
    target = Prediction(2, "waving", 0.75)
    rows = []
    for number, (start, end) in enumerate(((0, 3), (3, FRAMES))):
        shares = [1 / (end - start)] * (end - start)
        clip = ClipInfo(number, start, end, (start / FPS, end / FPS), shares, 0.75)
        outputs = [str(video), str(curve)]
        rows.append(Record(f"{stem}.mp4", "ok", "m", "layer4", "gradcam", target, [target], outputs, clip=clip))
    return rows


def write_manifest(path: Path, records: list[Record]) -> Path:
    path.write_text("".join(json.dumps(record.to_dict()) + "\n" for record in records))
    return path
