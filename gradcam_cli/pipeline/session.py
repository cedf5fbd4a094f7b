"""A whole run into one output folder: images through the :class:`BatchRunner`, videos through the
:class:`VideoRunner`, every record into the ``--manifest`` and, at the end, the ``--report`` gallery.

>>> with Session(OutputOptions("explained", manifest=Path("explained/manifest.jsonl"))) as session:
...     for record in session.explain(explainer, images):
...         print(record.input, record.status)

Entering the session claims the output folder before anything is computed: it is created if missing, checked to
be a writable folder, and locked (so is the manifest, wherever it lies: another run may name it from another output
folder); every problem there is one :class:`~gradcam_cli.errors.UsageError`. With ``--skip-existing`` the manifest
keeps its rows: this run's rows are appended as they come, and when the session ends it is rewritten with one set
of rows per input, in input order; an image whose outputs exist but whose rows that manifest lacks (a killed run's)
is explained again (:class:`~gradcam_cli.pipeline.resume.EarlierRows`).

With ``RunOptions(shard=...)`` the session explains only its shard's inputs (:mod:`~gradcam_cli.pipeline.shards`):
it shares the output folder with the other shards (each holds the folder's lock shared and its own exclusively),
writes its own manifest and shard record, leaves the gallery to ``gradcam merge``, and removes no temporaries
(another shard's may be in flight). With ``RunOptions(engine="ray")`` the images are explained on a Ray cluster
(:mod:`~gradcam_cli.pipeline.ray_engine`); everything else is the same.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from ..cam.explainer import Explainer
from ..cam.records import Record
from ..drift.provenance import run_provenance, use_deterministic
from ..errors import GradcamError, UsageError, describe
from ..io.atomic import remove_stale_temporaries
from ..io.discovery import InputImage, InputKind
from ..io.lock import FolderLock, ensure_folder
from ..io.manifest import (
    ManifestWriter,
    check_manifest_path,
    manifest_lock,
    read_manifest,
    rewrite_manifest,
    row_key,
)
from ..io.naming import INDEX_NAME, LOCK_NAME, MANIFEST_NAME, shard_lock_name, shard_manifest_path
from ..io.video import frame_count
from ..options import OutputOptions, RunOptions
from ..render.colour import colormap_table
from .batch import BatchRunner
from .clips import ClipRunner
from .resume import EarlierRows, check_run_record, run_record, write_run_record
from .shards import ShardRecord, inputs_digest, select_shard, stored_path
from .video import VideoRunner, check_video_model, video_runner


class Tick(Protocol):
    """Called once per image (or video frame) done: with ``skipped=True`` for an image skipped because its outputs
    exist, which a progress bar counts but leaves out of its rate."""

    def __call__(self, skipped: bool = False) -> object: ...


ProgressFactory = Callable[[str, int], AbstractContextManager[Tick]]
"""``progress(label, total)`` gives a context whose value is the :class:`Tick` of that many images or frames."""
Inputs = Sequence[InputImage]


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
    """One run's outputs: the output folder claimed on entry, the manifest kept while it runs, the manifest put in
    order and the gallery written on exit (also after an error or Ctrl-C), so that everything finished is
    recorded. ``notify`` receives the lines a run says on the way (a shard's share of the inputs, batches halved
    after running out of GPU memory)."""

    def __init__(
        self, output: OutputOptions, run: RunOptions | None = None, notify: Callable[[str], object] | None = None
    ) -> None:
        self.output = output
        self.run = run or RunOptions()
        self.notify = notify
        self.shard = self.run.shard
        self.manifest = output.manifest
        if self.shard is not None:  # each shard its own manifest, always: gradcam merge reads them
            self.manifest = shard_manifest_path(shard_manifest_base(output), self.shard.label)
        self.shard_record: ShardRecord | None = None
        self.counts = Counts()
        self.records: list[Record] = []  # kept for --report's gallery
        self.gallery: Path | None = None
        self.earlier = EarlierRows()
        self._earlier_rows = 0  # rows the manifest held before this run (with --skip-existing)
        self._order: list[str] = []  # this run's inputs, for the manifest's final order
        self._manifest: ManifestWriter | None = None
        self._locks = ExitStack()
        self._started = False
        self.provenance: dict[str, Any] | None = None  # how this run's maps are made, in each of its rows
        self.record: dict[str, Any] = {}  # the run record

    def __enter__(self) -> Session:
        output_dir = self.output.output_dir
        colormap_table(self.output.colormap)  # an unknown --colormap is a usage error before anything is loaded
        if self.run.deterministic:
            use_deterministic()  # before the command builds the model: random weights come out the same too
        try:
            ensure_folder(output_dir, "--output-dir")
            shared = self.shard is not None
            self._locks.enter_context(FolderLock(output_dir / LOCK_NAME, output_dir, "--output-dir", shared))
            if self.shard is not None:
                shown = f"shard {self.shard.index}/{self.shard.count} of {output_dir}"
                self._locks.enter_context(FolderLock(output_dir / shard_lock_name(self.shard.label), shown, "--shard"))
            manifest = self.manifest
            if manifest is not None:
                check_manifest_path(manifest)
                self._locks.enter_context(manifest_lock(manifest))  # another run may name it, from another folder
                if self.output.skip_existing:  # a manifest resumed must end with every finished input's rows
                    rows = read_manifest(manifest)
                    self.earlier, self._earlier_rows = EarlierRows(rows, manifest.exists()), len(rows)
                self._manifest = ManifestWriter(manifest, append=self.output.skip_existing)
            if not shared:
                remove_stale_temporaries(output_dir)  # only now: another run's temporaries are not stale
        except BaseException:
            if self._manifest is not None:
                self._manifest.__exit__(None, None, None)
            self._locks.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with self._locks:  # released last, once the manifest and the gallery are written
            try:
                self._finish_manifest()
                if self.shard_record is not None:
                    counts = {"ok": self.counts.ok, "error": self.counts.error, "skipped": self.counts.skipped}
                    self.shard_record.finished, self.shard_record.counts = exc is None, counts
                    self.shard_record.write(self.output.output_dir)
                if self.output.report and self.records:
                    from ..render.gallery import write_gallery

                    self.gallery = write_gallery(self.records, self.output.output_dir)
            except OSError as error:
                if exc is None:  # an error already on its way is the one to report
                    gallery = self.output.output_dir / INDEX_NAME
                    raise GradcamError(f"--report: cannot write {gallery}: {describe(error, gallery)}") from None
            except GradcamError:
                if exc is None:
                    raise

    def _finish_manifest(self) -> None:
        if self._manifest is None:
            return
        manifest, self._manifest = self._manifest, None
        manifest.__exit__(None, None, None)
        if self.output.skip_existing:
            rewrite_manifest(manifest.path, self._earlier_rows, self._order)

    def explain(
        self,
        explainer: Explainer,
        images: Sequence[InputImage],
        videos: Sequence[InputImage] = (),
        progress: ProgressFactory = no_progress,
        scans: Sequence[InputImage] = (),
    ) -> Iterator[Record]:
        """Explain every image, then every video, or every scan (a volume model's, alone), yielding each record once
        it is written and recorded: the run of the first input's :class:`~gradcam_cli.io.discovery.InputKind`
        (:data:`KIND_RUNS`; prompted images all prompted, for a vision-language model), or :meth:`_volumes`.
        :meth:`start` comes first, unless it was called already."""
        if scans:
            yield from self._volumes(explainer, [*images, *videos], scans, progress)
            return
        kind = images[0].kind if images else InputKind.IMAGE
        yield from KIND_RUNS.get(kind, Session._images)(self, explainer, images, videos, progress)

    def _images(
        self, explainer: Explainer, images: Inputs, videos: Inputs, progress: ProgressFactory
    ) -> Iterator[Record]:
        """Every image through the :class:`BatchRunner` (or the Ray engine's), then every video through its
        :class:`VideoRunner` (or :class:`ClipRunner`)."""
        check_video_model(explainer, self.output, self.run, videos, images)
        self.start(explainer)
        if self.shard is not None:
            images, videos = self._select_shard(images, videos)
        self._order += [row_key({"input": str(item.path)}) for item in [*images, *videos]]
        if images:
            runner = self._runner(explainer)
            with progress("explaining", len(images)) as tick:
                for record in runner.run(images, on_image=tick, on_skipped=lambda: tick(skipped=True)):
                    yield self._keep(record)
        if videos:
            runner_of_videos = video_runner(explainer, self.output, self.run)
            for video in videos:
                with progress(f"{video.path.name}: frames", frame_count(video)) as tick:
                    records = runner_of_videos.run(video, on_frame=tick)
                    if self._rows_lost(runner_of_videos, video, records):  # explained again, as images are
                        again = replace(self.output, skip_existing=False)
                        records = video_runner(explainer, again, self.run).run(video, on_frame=tick)
                    for record in records:
                        for row in self._resumed_video(runner_of_videos, video, record):
                            yield self._keep(row)

    def _prompted(
        self, explainer: Explainer, inputs: Inputs, _videos: Inputs, progress: ProgressFactory
    ) -> Iterator[Record]:
        """Every prompted image's answer and maps, through the :class:`~gradcam_cli.pipeline.answers.AnswerRunner`,
        then every prompted video's, through the :class:`~gradcam_cli.pipeline.clips.AnswerClipRunner` (refused
        first, in one line, for a model that answers no video)."""
        from .answer_clips import AnswerClipRunner
        from .answers import RAY_ANSWERS, AnswerRunner

        if self.run.engine == "ray":
            raise UsageError(RAY_ANSWERS)
        images = [item for item in inputs if not item.video]
        videos = [item for item in inputs if item.video]
        runner = AnswerRunner(explainer, self.output, self.run, self.earlier)
        clips = AnswerClipRunner(explainer, self.output, self.run, self.earlier) if videos else None
        if not self._started:
            self._begin(runner.run_record(), runner.provenance())
        if self.shard is not None:
            images, videos = self._select_shard(images, videos)
        self._order += [row_key({"input": str(item.path)}) for item in [*images, *videos]]
        with progress("answering", len(images)) as tick:
            for record in runner.run_images(images, on_image=tick, on_skipped=lambda: tick(skipped=True)):
                yield self._keep(record)
        for video in videos:
            assert clips is not None
            with progress(f"{video.path.name}: frames", frame_count(video)) as tick:
                for record in clips.run(video, on_frame=tick):
                    yield self._keep(record)

    def _volumes(
        self, explainer: Explainer, others: Sequence[InputImage], scans: Sequence[InputImage], progress: ProgressFactory
    ) -> Iterator[Record]:
        """Every scan's maps and rows (this shard's, as images are split), through the
        :class:`~gradcam_cli.pipeline.volumes.VolumeRunner`."""
        from .volumes import VolumeRunner, check_scans

        check_scans(explainer, others, scans, self.output, self.run)
        runner = VolumeRunner(explainer, self.output, self.run, self.earlier, self.notify)
        self.start(explainer)
        if self.shard is not None:
            scans, _ = self._select_shard(scans, ())
        self._order += [row_key({"input": str(item.path)}) for item in scans]
        for record in runner.run_volumes(scans, progress):  # a bar of windows per scan
            yield self._keep(record)

    def _runner(self, explainer: Explainer) -> BatchRunner:
        """The local :class:`BatchRunner`, or with ``engine="ray"`` the Ray engine's."""
        if self.run.engine != "ray":
            return BatchRunner(explainer, self.output, self.run, self.earlier, self.notify)
        from .ray_engine import RayRunner

        return RayRunner(explainer, self.output, self.run, self.earlier, self.notify)

    def _select_shard(
        self, images: Sequence[InputImage], videos: Sequence[InputImage]
    ) -> tuple[list[InputImage], list[InputImage]]:
        """This shard's images and videos; its shard record, written now, and again when the session ends."""
        assert self.shard is not None and self.manifest is not None
        every = [*images, *videos]
        mine = select_shard(every, self.shard)
        output_dir = self.output.output_dir
        self.shard_record = ShardRecord(
            self.shard.index,
            self.shard.count,
            stored_path(shard_manifest_base(self.output), output_dir),
            stored_path(self.manifest, output_dir),
            self.output.report,
            self.record,
            len(every),
            inputs_digest(every),
            [(str(image.path), place) for place, image in mine],
        )
        self.shard_record.write(output_dir)
        if self.notify is not None:
            self.notify(f"shard {self.shard.index}/{self.shard.count}: {len(mine)} of {len(every)} inputs")
        chosen = {place for place, _ in mine}
        return [i for p, i in enumerate(images) if p in chosen], [
            v for p, v in enumerate(videos, len(images)) if p in chosen
        ]

    def start(self, explainer: Explainer) -> None:
        """Check the run record (what made the outputs: see :data:`~gradcam_cli.pipeline.resume.RECORD_LABELS`)
        against the folder's, with ``--skip-existing``, and write it; note the provenance every row of this run
        carries; once per session."""
        if self._started:
            return
        explainer.adapter.check_outputs(self.output)
        spec = explainer.model.input_spec
        record = run_record(
            explainer.model.name,
            explainer.model.weights,
            explainer.layer_label,
            spec.fixed_size or spec.size,
            (explainer.options.aug_smooth, explainer.options.eigen_smooth),
            self.output,
            self.run.max_side,
        )
        record.update(explainer.settings)
        if self.output.skip_existing and explainer.options.targets and self.output.manifest is None:
            # file names carry a class, not a target
            raise UsageError("--skip-existing with --target needs --manifest: skipped images' rows come from it")
        methods = list(explainer.chosen.methods)  # a resumed run keeps every earlier method's rows (check_run_record)
        record |= {"precision": explainer.chosen.precision, "methods": methods}
        if explainer.model.profile.clips is not None:  # a video model's clips (docs/video.md)
            record |= {"clip_stride": self.run.clip_stride, "fps": self.run.fps}
        self._begin(record, run_provenance(explainer, self.run))

    def _begin(self, record: dict[str, Any], provenance: dict[str, Any]) -> None:
        """Check ``record`` against the folder's, write it and note the ``provenance`` every row carries."""
        self._record(record)
        self.provenance = provenance
        self._started = True

    def _record(self, record: dict[str, Any]) -> None:
        """Check ``record`` against the folder's with ``--skip-existing``; write it and keep it."""
        record["cwd"] = os.getcwd()  # what the manifest's relative paths start from (gradcam serve reads it)
        if self.output.skip_existing:
            check_run_record(self.output.output_dir, record)
        write_run_record(self.output.output_dir, record)
        self.record = record

    def _rows_lost(self, runner: VideoRunner | ClipRunner, video: InputImage, records: Sequence[Record]) -> bool:
        """Whether ``records`` is a skipped video whose rows the manifest being resumed lacks, some or all
        (:attr:`~gradcam_cli.pipeline.resume.EarlierRows.required`)."""
        if not self.earlier.required or [record.status for record in records] != ["skipped"]:
            return False
        earlier = self.earlier.get(str(video.path))
        listed = {os.path.abspath(row["outputs"][0]) for row in earlier if row["status"] != "error" and row["outputs"]}
        return any(os.path.abspath(path) not in listed for _, path in runner.outputs(video))

    def _resumed_video(self, runner: VideoRunner | ClipRunner, video: InputImage, record: Record) -> list[Record]:
        """A skipped video's rows: its earlier ones from the manifest, or one per output video found."""
        if record.status != "skipped" or record.outputs:
            return [record]
        earlier = [Record.from_dict(row) for row in self.earlier.get(record.input) if row["outputs"]]
        if earlier:
            for row in earlier:
                row.status, row.model, row.layer, row.error = "skipped", record.model, record.layer, None
            return earlier
        return [
            Record(record.input, "skipped", record.model, record.layer, method, outputs=[str(path)])
            for method, path in runner.outputs(video)
        ]

    def _keep(self, record: Record) -> Record:
        if record.provenance is None and record.status != "skipped":  # skipped rows keep their earlier run's
            record.provenance = self.provenance
        if self._manifest is not None:
            self._manifest.write(record.to_dict())
        if self.output.report and self.shard is None:  # a shard's gallery is gradcam merge's
            self.records.append(record)
        self.counts.add(record)
        return record


KindRun = Callable[[Session, Explainer, Inputs, Inputs, ProgressFactory], Iterator[Record]]
"""A session's run of one input kind: ``(session, explainer, inputs, videos, progress)`` to the rows written."""

KIND_RUNS: dict[InputKind, KindRun] = {
    InputKind.IMAGE: Session._images,
    InputKind.VIDEO: Session._images,
    InputKind.PROMPTED: Session._prompted,
}
"""Each input kind's run (:meth:`Session.explain`); a kind without an entry is decoded as an image. A new input kind
is one entry here and its runner (docs/internals.md, "How to add an input kind")."""


def shard_manifest_base(output: OutputOptions) -> Path:
    """The manifest a sharded run's shards are merged into: ``--manifest``, else ``<output_dir>/manifest.jsonl``."""
    return output.manifest or output.output_dir / MANIFEST_NAME
