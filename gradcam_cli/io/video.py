"""Reading video files with OpenCV: what the container says about a clip, and its frames.

Importing this module quiets OpenCV's FFmpeg backend and OpenCV's own log (unless the environment already sets
``OPENCV_FFMPEG_LOGLEVEL`` or ``OPENCV_LOG_LEVEL``): both print from C straight onto stderr (``moov atom not
found``...), while a clip that cannot be read already becomes one error line of ours. FFmpeg's level is read when
OpenCV first uses FFmpeg and OpenCV's when cv2 is imported, so the package imports cv2 for videos only after this
module.
"""

from __future__ import annotations

import math
import os
import queue
import sys
import tempfile
import threading
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np

from ..errors import GradcamError, ImageError
from .atomic import TEMP_MARKER
from .discovery import VIDEO_SUFFIXES, InputImage

T = TypeVar("T")

FOURCC = "mp4v"
PREVIEW_FOURCC = "VP80"
"""The codec of the gallery's previews (VP8 in WebM): OpenCV's bundled FFmpeg writes it and browsers play it, which
they do not ``mp4v``."""
PREVIEW_SIDE = 480
"""The longest side, in pixels, of a gallery preview (a larger video is scaled down to it, a smaller one kept)."""
DEFAULT_FPS = 25.0
UNREADABLE = "not a video OpenCV can read"
"""Why a clip failed when OpenCV cannot open it (a text file, an empty or truncated file, an unknown codec)."""
NO_FRAMES = "no frames could be decoded"
"""Why a clip failed when OpenCV opens it but decodes no frame."""

os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")  # AV_LOG_QUIET
os.environ.setdefault("OPENCV_LOG_LEVEL", "OFF")


def opencv() -> Any:
    """The ``cv2`` module, imported once OpenCV's logging is quieted (see the module docstring)."""
    import cv2

    return cv2


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


def opencv_name(name: str) -> str:
    """``name`` as OpenCV may be given it: UTF-8 (OpenCV crashes on a name that is not, ``clip\xff.mp4``), the
    undecodable bytes replaced. For names of files gradcam writes itself (temporary files)."""
    return name.encode("utf-8", "replace").decode("utf-8")


@contextmanager
def opened_by_name(path: str | Path) -> Iterator[str]:
    """A name of ``path`` that OpenCV can open: the path itself, or where it is not UTF-8, a symbolic link with a
    plain name to it in a temporary folder, removed on exit."""
    name = str(path)
    if opencv_name(name) == name:
        yield name
        return
    with tempfile.TemporaryDirectory(prefix="gradcam-video-") as folder:
        link = os.path.join(folder, "input" + opencv_name(Path(name).suffix))
        os.symlink(os.path.abspath(name), link)
        yield link


def probe(path: str | Path) -> VideoInfo:
    """Read a video's frame rate, size and frame count without decoding it; raise ImageError if unreadable."""
    import cv2

    with opened_by_name(path) as name:
        capture = cv2.VideoCapture(name)
    try:
        if not capture.isOpened():
            raise ImageError(f"{path}: {UNREADABLE}")
        return capture_info(capture)
    finally:
        capture.release()


def capture_info(capture: Any) -> VideoInfo:
    """The :class:`VideoInfo` of an open ``cv2.VideoCapture``."""
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
    """The BGR frames of an open ``cv2.VideoCapture``, until the first one that cannot be decoded."""
    while True:
        ok, frame = capture.read()
        if not ok:
            return
        yield frame


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Standard error (the file descriptor) sent to the null device meanwhile: OpenCV prints ``tag 'VP80' is not
    supported with codec id 139 and format 'webm / WebM'`` with C's ``fprintf`` whatever the log levels say, though it
    writes the WebM (FFmpeg's WebM muxer names no codec by a FOURCC). Only around opening a writer, a few
    milliseconds."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no standard error to quiet
        yield
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, 2)
        finally:
            os.close(null)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def preview_size(width: int, height: int, side: int = PREVIEW_SIDE) -> tuple[int, int]:
    """(width, height) of a preview of a ``width`` x ``height`` video: its longest side at most ``side``, the
    aspect kept, both even (as video encoders like them) and at least 2."""
    scale = min(1.0, side / max(width, height, 1))
    return tuple(max(2, round(length * scale / 2) * 2) for length in (width, height))  # type: ignore[return-value]


def write_preview(source: Path, target: Path, side: int = PREVIEW_SIDE) -> int:
    """Write ``target``, a VP8 WebM of the video ``source`` at its frame rate, scaled down to ``side`` pixels on its
    longest side, atomically (a temporary file beside it, renamed when done); return its number of frames."""
    import cv2

    temporary = target.with_name(opencv_name(f".{target.name}{TEMP_MARKER}{os.getpid()}.webm"))
    with opened_by_name(source) as name:
        capture = cv2.VideoCapture(name)
    writer: Any = None
    count = 0
    try:
        if not capture.isOpened():
            raise ImageError(f"{source}: {UNREADABLE}")
        info = capture_info(capture)
        size = preview_size(info.width, info.height, side)
        target.parent.mkdir(parents=True, exist_ok=True)
        with _quiet_stderr():
            writer = cv2.VideoWriter(str(temporary), cv2.VideoWriter.fourcc(*PREVIEW_FOURCC), info.fps, size)
        if not writer.isOpened():
            raise OSError(f"OpenCV cannot write {PREVIEW_FOURCC} video to {temporary}")
        for frame in frames(capture):
            writer.write(cv2.resize(frame, size, interpolation=cv2.INTER_AREA))
            count += 1
        writer.release()
        os.replace(temporary, target)
    finally:
        if writer is not None:
            writer.release()
        capture.release()
        temporary.unlink(missing_ok=True)
    return count


READ_AHEAD = 8
"""Frames :func:`read_ahead` decodes (and prepares) before the consumer asks for them."""
_DONE = object()


def read_ahead(capture: Any, prepare: Callable[[np.ndarray], T], ahead: int = READ_AHEAD) -> Generator[T, None, None]:
    """``prepare(frame)`` of each BGR frame of an open ``cv2.VideoCapture``, decoded and prepared in a background
    thread up to ``ahead`` frames before they are asked for (OpenCV and most of ``prepare``'s NumPy and PyTorch work
    release the GIL, so decoding overlaps the model). An error in the thread is raised here; closing the generator
    stops the thread before it returns: close it before releasing ``capture``."""
    buffer: queue.Queue[Any] = queue.Queue(maxsize=max(1, ahead))
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                buffer.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for frame in frames(capture):
                if not put((prepare(frame), None)):
                    return
        except BaseException as error:  # handed to the consumer, which raises it
            put((None, error))
            return
        put((_DONE, None))

    worker = threading.Thread(target=work, name="gradcam-video-decode", daemon=True)
    worker.start()
    try:
        while True:
            item, error = buffer.get()
            if error is not None:
                raise error
            if item is _DONE:
                return
            yield item
    finally:
        stop.set()
        worker.join()


WRITE_BEHIND = 64
"""Items :class:`WriteBehind` holds before its producer waits for its thread."""


class WriteBehind(Generic[T]):
    """``work(item)`` of each item :meth:`put`, in order, in a background thread, at most ``behind`` items behind
    the producer: a video's overlay frames blended and encoded while its next clip is explained. ``first`` runs in
    the thread before any item (what the end of the video needs imported, while its first clip is explained). An
    error in the thread is raised by the next :meth:`put` or by :meth:`close`; use it as a context manager, whose
    exit waits for every item (or, leaving on an error, only for the item in hand)."""

    def __init__(
        self, work: Callable[[T], object], behind: int = WRITE_BEHIND, first: Callable[[], object] | None = None
    ):
        self._work, self._first = work, first
        self._items: queue.Queue[Any] = queue.Queue(maxsize=max(1, behind))
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="gradcam-video-write", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            if self._first is not None:
                self._first()
            while (item := self._items.get()) is not _DONE:
                if not self._stop.is_set():
                    self._work(item)
        except BaseException as error:  # raised in the producer; what is still queued is dropped
            self._error = error
            self._stop.set()
            while self._items.get() is not _DONE:
                pass

    def put(self, item: T) -> None:
        """Hand ``item`` to the thread (waiting while it is ``behind`` items behind); raise its error, if any."""
        if self._error is not None:
            raise self._error
        self._items.put(item)

    def close(self) -> None:
        """Wait for every item put to be done; raise the thread's error, if any."""
        if self._thread.is_alive():
            self._items.put(_DONE)
            self._thread.join()
        if self._error is not None:
            raise self._error

    def __enter__(self) -> WriteBehind[T]:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:
            self.close()
            return
        self._stop.set()  # leaving on an error: the items in the queue are dropped, the thread ends
        if self._thread.is_alive():
            self._items.put(_DONE)
            self._thread.join()


def frame_count(video: InputImage) -> int:
    """A video's frames as its progress bar counts them (0: unknown)."""
    from .discovery import frame_files

    try:
        return len(frame_files(video.path)) if video.frames else probe(video.path).frames
    except GradcamError:
        return 0
