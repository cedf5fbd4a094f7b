"""A video model's temporal importance plot: each clip's frames' shares of its map over the video's time, and each
clip's score, as one PNG per overlay video (docs/video.md)."""

from __future__ import annotations

import io
from collections.abc import Sequence

from ..cam.records import ClipInfo


def preload() -> None:
    """Import what :func:`draw_curve` draws with (matplotlib's figure and Agg canvas: a few tenths of a second),
    ahead of it: :class:`~gradcam_cli.pipeline.clips.ClipRunner` does it in its writing thread during a video's first
    clip."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
    from matplotlib.figure import Figure  # noqa: F401


def draw_curve(clips: Sequence[ClipInfo], fps: float, title: str) -> bytes:
    """The clips' temporal importance plotted (Agg canvas, no pyplot), as PNG bytes: the share of each frame in its
    clip's map (left axis, one line per clip, overlapping clips overlapping) and each clip's score (right axis, a
    step over the clip's frames), against the video's time in seconds."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 3.2), layout="constrained")
    FigureCanvasAgg(figure)
    shares = figure.subplots()
    scores = shares.twinx()
    for clip in clips:
        times = [(clip.start + offset) / fps for offset in range(len(clip.shares))]
        shares.plot(times, clip.shares, color="tab:blue", linewidth=1.2)
        scores.hlines(clip.score, clip.seconds[0], clip.seconds[1], color="tab:orange", linewidth=2)
    shares.set_xlabel("time in the video (s)")
    shares.set_ylabel("frame's share of its clip's map", color="tab:blue")
    scores.set_ylabel("clip's score (probability)", color="tab:orange")
    scores.set_ylim(0, 1.02)
    shares.set_ylim(bottom=0)
    shares.grid(alpha=0.3)
    figure.suptitle(title)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()
