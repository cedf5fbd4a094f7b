"""A whole run into one output folder: images through the :class:`BatchRunner`, videos through the
:class:`VideoRunner`, every record into the ``--manifest`` and, at the end, the ``--report`` gallery.

>>> with Session(OutputOptions("explained", manifest=Path("explained/manifest.jsonl"))) as session:
...     for record in session.explain(explainer, images):
...         print(record.input, record.status)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Protocol

from ..cam.explainer import Explainer
from ..errors import GradcamError
from ..io.atomic import remove_stale_temporaries
from ..io.discovery import InputImage
from ..io.manifest import ManifestWriter
from ..options import OutputOptions, RunOptions
from .batch import BatchRunner
from .records import Record
from .video import VideoRunner


class Tick(Protocol):
    """Called once per image (or video frame) done: with ``skipped=True`` for an image skipped because its outputs
    exist, which a progress bar counts but leaves out of its rate."""

    def __call__(self, skipped: bool = False) -> object: ...


ProgressFactory = Callable[[str, int], AbstractContextManager[Tick]]
"""``progress(label, total)`` gives a context whose value is the :class:`Tick` of that many images or frames."""


def no_progress(_label: str, _total: int) -> AbstractContextManager[Tick]:
    """The silent :data:`ProgressFactory`."""
    return nullcontext(_ignore)


def _ignore(skipped: bool = False) -> None:
    """The silent :class:`Tick`."""


@dataclass
class Counts:
    """Inputs by outcome (an input with several rows counts once, by its first row)."""

    ok: int = 0
    error: int = 0
    skipped: int = 0
    seen: set[str] = field(default_factory=set, repr=False)

    def add(self, record: Record) -> bool:
        """Count ``record`` if it is its input's first row; return whether it was."""
        if record.input in self.seen:
            return False
        self.seen.add(record.input)
        setattr(self, record.status, getattr(self, record.status) + 1)
        return True


class Session:
    """One run's outputs: the output folder prepared on entry, the manifest kept while it runs, the gallery written
    on exit (also after an error or Ctrl-C), so that everything finished is recorded."""

    def __init__(self, output: OutputOptions, run: RunOptions | None = None) -> None:
        self.output = output
        self.run = run or RunOptions()
        self.counts = Counts()
        self.records: list[Record] = []  # kept for --report's gallery
        self.gallery: Path | None = None
        self._manifest: ManifestWriter | None = None
        self._stack = ExitStack()

    def __enter__(self) -> Session:
        remove_stale_temporaries(self.output.output_dir)
        if self.output.manifest is not None:
            self._manifest = self._stack.enter_context(ManifestWriter(self.output.manifest))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stack.close()
        if self.output.report and self.records:
            from ..render.gallery import write_gallery

            self.gallery = write_gallery(self.records, self.output.output_dir)

    def explain(
        self,
        explainer: Explainer,
        images: Sequence[InputImage],
        videos: Sequence[InputImage] = (),
        progress: ProgressFactory = no_progress,
    ) -> Iterator[Record]:
        """Explain every image, then every video, yielding each record once it is written and recorded."""
        if images:
            runner = BatchRunner(explainer, self.output, self.run)
            with progress("explaining", len(images)) as tick:
                for record in runner.run(images, on_image=tick, on_skipped=lambda: tick(skipped=True)):
                    yield self._keep(record)
        if videos:
            from ..io.video import probe

            video_runner = VideoRunner(explainer, self.output, self.run)
            for video in videos:
                try:
                    frames = probe(video.path).frames
                except GradcamError:
                    frames = 0
                with progress(f"{video.path.name}: frames", frames) as tick:
                    for record in video_runner.run(video, on_frame=tick):
                        yield self._keep(record)

    def _keep(self, record: Record) -> Record:
        if self._manifest is not None:
            self._manifest.write(record.to_dict())
        if self.output.report:
            self.records.append(record)
        self.counts.add(record)
        return record
