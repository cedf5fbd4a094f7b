"""Write walk.mp4 (or the path given): 60 frames at 30 fps, 160 x 120, a red square walking across a grey field;
the video docs/video.md's example explains."""

from __future__ import annotations

import sys

import cv2
import numpy as np


def main(path: str = "walk.mp4") -> None:
    writer = cv2.VideoWriter(path, cv2.VideoWriter.fourcc(*"mp4v"), 30.0, (160, 120))
    for number in range(60):
        frame = np.full((120, 160, 3), 128, np.uint8)
        x = 10 + 2 * number
        frame[40:80, x : x + 30] = (30, 40, 220)  # BGR: red
        writer.write(frame)
    writer.release()


if __name__ == "__main__":
    main(*sys.argv[1:2])
