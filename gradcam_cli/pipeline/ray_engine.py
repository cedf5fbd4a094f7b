"""``--engine ray``: the batch pipeline on a Ray cluster, with Ray Data doing the scheduling.

The driver (the ``gradcam`` process) does what a local run does around the explaining: it finds the inputs,
claims the output folder, checks ``--skip-existing``, writes the manifest in input order and the gallery, and
counts outcomes for the exit code. In between, a Ray Data pipeline replaces the ``DataLoader`` and the model:

1. the images to explain become a dataset of ``(index, path, output stem)`` rows, in blocks of one actor batch;
2. :func:`decode_row` decodes and resizes each image in a Ray *task* (CPU), exactly as a local decoding process
   does (:class:`~gradcam_cli.pipeline.decode.ImageDataset`: a bad file becomes an error, never an exception);
3. :class:`ExplainActor` explains the decoded batches in an actor pool: each actor loads the model once, from the
   same options (a GPU per actor where the cluster has them), and runs the local
   :meth:`~gradcam_cli.pipeline.batch.BatchRunner.explain_samples` on each batch (shape buckets, the model, the
   writer threads), writing the files into the output folder, which must be shared storage on a real cluster;
4. the actors hand back each image's rows as JSON, and the driver puts them in input order.

So the outputs are the ones a local run writes: the same code makes them, only somewhere else. Ray is imported
only here, and only when the engine runs (``pip install 'gradcam-cli[ray]'``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import math
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import __version__
from ..cam.explainer import Explainer
from ..cam.masked_scores import ProgressCallback
from ..cam.records import Record
from ..drift.provenance import run_provenance, use_deterministic
from ..errors import EXIT_IMAGE_FAILED, GradcamError, ImageError, ModelLoadError, UsageError, describe
from ..io.discovery import InputImage
from ..io.images import InputSpec
from ..options import ExplainOptions, ModelOptions, OutputOptions, RunOptions
from .batch import BatchRunner
from .decode import ImageDataset, Sample, default_batch_size

BATCHES_PER_CALL = 4
"""An actor gets this many model batches of images per call: enough for shape buckets to fill."""


class ClusterError(GradcamError):
    """The Ray job itself failed (not one image): the images it did not finish are missing, exit code 1."""

    exit_code = EXIT_IMAGE_FAILED


def driver_explainer(
    model: ModelOptions, explain: ExplainOptions, progress: ProgressCallback | None = None
) -> Explainer:
    """The explainer the driver keeps for the run record, ``--skip-existing`` and class names: the model on the
    driver's CPU (a cluster's head node often has no GPU). The actors build their own from the same options, on
    their own device. Without Ray installed, a :class:`UsageError` before the model loads."""
    import_ray()
    return Explainer.from_options(model, explain, progress=progress, device="cpu")


class RayRunner(BatchRunner):
    """A :class:`BatchRunner` whose images are decoded and explained on a Ray cluster (see the module docstring).

    ``run.ray_address``: the cluster (``None``: ``RAY_ADDRESS``, else a local instance started for the run); when
    Ray is already initialised in this process (a notebook, a test), that connection is used and left open.
    """

    def explain_images(
        self,
        todo: list[InputImage],
        inputs: set[str],
        on_image: Callable[[], Any] | None,
        interrupted: Callable[[], bool],
    ) -> Iterator[tuple[int, list[Record]]]:
        if self.explainer.model_options is None:
            raise UsageError("--engine ray needs an explainer built by Explainer.from_options (its actors rebuild it)")
        ray = import_ray()
        started = connect(ray, self.run_options.ray_address)
        said: set[str] = set()
        try:
            for batch in self._dataset(ray, todo, inputs).iter_batches(batch_size=None, batch_format="numpy"):
                self._said(batch, said)
                for index, rows in zip(batch["index"], batch["rows"], strict=True):
                    if on_image:
                        on_image()
                    yield int(index), [Record.from_dict(row) for row in json.loads(rows)]
                if interrupted():
                    break
        except (GradcamError, KeyboardInterrupt, GeneratorExit):
            raise
        except Exception as error:
            raise cluster_error(error) from None
        finally:
            if started:
                ray.shutdown()
                _cluster_messages(True)
        if interrupted():
            raise KeyboardInterrupt

    def _said(self, batch: Any, said: set[str]) -> None:
        """Raise a batch's fatal error (as the error it was), and pass on its notes not yet said."""
        for kind, _, message in (str(fatal).partition("\t") for fatal in batch["fatal"] if fatal):
            raise _KINDS.get(kind, GradcamError)(message)
        for note in dict.fromkeys(str(note) for note in batch["note"] if note and note not in said):
            said.add(note)
            if self.notify is not None:
                self.notify(note)

    def _dataset(self, ray: Any, todo: list[InputImage], inputs: set[str]) -> Any:
        """The pipeline: rows of images, decoding tasks, the actor pool."""
        model, explain = self.explainer.model_options, self.explainer.options
        assert model is not None
        run = self.run_options
        actors, per_actor, per_call = actor_pool(ray.cluster_resources(), run, model.device, len(todo))
        items = [
            {"index": i, "path": os.fsencode(str(image.path)), "stem": os.fsencode(str(image.output_stem))}
            for i, image in enumerate(todo)
        ]
        output_dir = os.path.realpath(self.output.output_dir)
        protected = {path for path in inputs if path.startswith(output_dir.rstrip(os.sep) + os.sep)}
        cwd = os.getcwd()
        with _quiet_datasets(ray):
            dataset = ray.data.from_items(items, override_num_blocks=max(1, math.ceil(len(items) / per_call)))
            decoded = dataset.map(
                decode_row,
                fn_kwargs={"spec": self.explainer.model.input_spec, "max_side": self.max_side, "cwd": cwd},
                num_cpus=1,
            )
            return decoded.map_batches(
                ExplainActor,
                batch_size=per_call,
                batch_format="numpy",
                fn_constructor_kwargs={
                    "model": model,
                    "explain": explain,
                    "output": self.output,
                    "run": replace(run, workers=0, engine="local", shard=None),
                    "protected": protected,
                    "cwd": cwd,
                    "version": __version__,
                },
                compute=ray.data.ActorPoolStrategy(size=actors),
                num_cpus=1,
                num_gpus=per_actor or None,
                # Waiting OpenMP threads sleep, as in a local run (the writer threads share the cores). Options the
                # decoding tasks lack also keep Ray Data from fusing decoding into the actors (one image at a time).
                runtime_env={"env_vars": {"OMP_WAIT_POLICY": "PASSIVE"}},
            )


def actor_pool(resources: dict[str, float], run: RunOptions, device: str, images: int) -> tuple[int, float, int]:
    """The actor pool for ``images`` images on a cluster with ``resources``: its size (never more actors than calls
    to make), the GPUs of each actor and the images of each call. Each actor takes a CPU and the decoding tasks need
    one more; without it the run would wait for ever, so it is a usage error."""
    gpus = float(resources.get("GPU", 0))
    per_actor = run.gpus_per_worker
    if per_actor is None:
        per_actor = 1.0 if gpus and device != "cpu" else 0.0
    if per_actor > gpus:
        raise UsageError(f"--gpus-per-worker {per_actor:g}: the Ray cluster has {gpus:g} GPUs")
    if device.startswith("cuda") and not per_actor:
        raise UsageError(f"--device {device}: the actors have no GPU; give --gpus-per-worker 1 (or more)")
    cpus = int(resources.get("CPU", 0))
    per_call = BATCHES_PER_CALL * (run.batch_size or default_batch_size(torch.device("cuda" if per_actor else "cpu")))
    wanted = run.actors or (int(gpus // per_actor) if per_actor else cpus // 2)
    actors = max(1, min(wanted, math.ceil(images / per_call)))
    if cpus < 2:
        raise UsageError(f"the Ray cluster has {cpus} of the 2 CPUs it needs (one for an actor, one for decoding)")
    if actors >= cpus:
        raise UsageError(
            f"the Ray cluster has {cpus} CPUs: {actors} actors would take them all and leave none to decode the "
            f"images; give --actors {cpus - 1} or fewer"
        )
    return actors, per_actor, per_call


@contextlib.contextmanager
def _quiet_datasets(ray: Any) -> Iterator[None]:
    """Datasets made in the block show no progress bars and print nothing as they start (each takes a copy of the
    context as it is made; the process's own settings are restored after)."""
    context = ray.data.DataContext.get_current()
    saved = context.enable_progress_bars, context.print_on_execution_start
    context.enable_progress_bars, context.print_on_execution_start = False, False
    try:
        yield
    finally:
        context.enable_progress_bars, context.print_on_execution_start = saved


def decode_row(row: dict[str, Any], spec: InputSpec, max_side: int | None, cwd: str) -> dict[str, Any]:
    """A Ray task: one image decoded and resized as a local decoding process does it (a failure is the ``error``
    column, with empty arrays)."""
    enter(cwd)
    image = InputImage(Path(os.fsdecode(row["path"])), Path(os.fsdecode(row["stem"])))
    sample = ImageDataset([image], spec, max_side)[0]
    tensor = sample.tensor.numpy() if sample.tensor is not None else np.zeros((3, 0, 0), np.float32)
    pixels = sample.pixels.numpy() if sample.pixels is not None else np.zeros((0, 0, 3), np.uint8)
    original = np.array(sample.original or (0, 0), np.int64)
    return {**row, "tensor": tensor, "pixels": pixels, "error": sample.error or "", "original": original}


class ExplainActor:
    """One Ray actor: the model loaded once (on the actor's GPU where it has one), then each batch of decoded
    images explained and written by the local pipeline; returns each image's rows (with this actor's provenance)
    as JSON, any line to say (batches halved after running out of GPU memory), and the gradcam error that stops
    the run, if any (``fatal``: its kind and message, which the driver raises again; a failed actor start would
    reach the driver only as a Ray traceback)."""

    def __init__(
        self,
        model: ModelOptions,
        explain: ExplainOptions,
        output: OutputOptions,
        run: RunOptions,
        protected: set[str],
        cwd: str,
        version: str,
    ) -> None:
        self.notes: list[str] = []
        self.protected = protected
        self.failed: GradcamError | None = None
        try:
            if version != __version__:
                raise UsageError(f"the Ray workers run gradcam-cli {__version__}, this command {version}; install one")
            enter(cwd)
            if run.deterministic:
                use_deterministic()
            else:  # a worker process Ray reuses may have run a deterministic job before
                torch.use_deterministic_algorithms(False)
            self.explainer = Explainer.from_options(model, explain)
            self.runner = BatchRunner(self.explainer, output, run, notify=self.notes.append)
            self.provenance = run_provenance(self.explainer, run)
        except GradcamError as error:
            self.failed = error

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        count = len(batch["index"])
        rows = [""] * count
        try:
            if self.failed is not None:
                raise self.failed
            for place, records in self._explain(batch):
                rows[place] = json.dumps([record.to_dict() for record in records])
            fatal = ""
        except GradcamError as error:
            fatal = f"{type(error).__name__}\t{error}"
        notes, self.notes = self.notes, []

        def column(first: str) -> np.ndarray:  # a value for the batch, in its first row
            return np.array([first] + [""] * (count - 1), dtype=object)

        return {
            "index": batch["index"],
            "rows": np.array(rows, dtype=object),
            "note": column("\n".join(notes)),
            "fatal": column(fatal),
        }

    def _explain(self, batch: dict[str, np.ndarray]) -> Iterator[tuple[int, list[Record]]]:
        paths, stems = batch["path"], batch["stem"]
        images = [InputImage(Path(os.fsdecode(p)), Path(os.fsdecode(s))) for p, s in zip(paths, stems, strict=True)]
        decoded = zip(batch["tensor"], batch["pixels"], batch["error"], batch["original"], strict=True)
        samples = [
            Sample(
                place,
                torch.tensor(tensor) if tensor.size else None,
                torch.tensor(pixels) if pixels.size else None,
                str(error) or None,
                (int(original[0]), int(original[1])) if original[0] else None,
            )
            for place, (tensor, pixels, error, original) in enumerate(decoded)
        ]
        for place, records in self.runner.explain_samples(iter(samples), images, self.protected):
            for record in records:
                record.provenance = self.provenance
            yield place, records


def enter(cwd: str) -> None:
    """Work in the driver's directory, so that relative paths (inputs, ``--output-dir``, a model file) mean what
    they mean to the driver, where that directory exists (shared storage at the same path); absolute paths work
    everywhere."""
    if os.getcwd() != cwd and os.path.isdir(cwd):
        os.chdir(cwd)


SINGLE_MACHINE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch for instances that stay on one machine, read as Ray is imported: at ``0`` Ray takes the loopback for
this machine's address, so an instance started here listens on 127.0.0.1 only (whoever reaches Ray's services runs
code on the machine, unless token authentication is on). A driver on a real cluster is unaffected (it finds its
node by the processes running there); Ray only refuses to ``ray start`` a second node with it."""


def import_ray() -> Any:
    """Ray and Ray Data, or a one-line :class:`UsageError` saying how to install them. Imported here first, Ray is
    told that an instance started by this process stays on the loopback (:data:`SINGLE_MACHINE`)."""
    if "ray" not in sys.modules:
        os.environ[SINGLE_MACHINE] = "0"
    try:
        import ray
        import ray.data
    except ImportError:
        raise UsageError("--engine ray needs Ray: pip install 'gradcam-cli[ray]'") from None
    return ray


def connect(ray: Any, address: str | None) -> bool:
    """Connect to the cluster at ``address`` (``None``: ``RAY_ADDRESS``, else a new local instance, which listens on
    the loopback only or is not started), quietly; returns whether this call did it (and the run should disconnect),
    ``False`` when Ray was initialised already."""
    quiet()
    if ray.is_initialized():
        return False
    if (address or os.environ.get("RAY_ADDRESS") or "local") == "local":
        here = ray.util.get_node_ip_address()  # where a new instance would listen (Ray's own choice)
        if not ipaddress.ip_address(here).is_loopback:
            raise UsageError(
                f"a local Ray instance would listen on {here}, reachable from the network: Ray was imported before "
                f"gradcam; set {SINGLE_MACHINE}=0 before importing it, or start Ray yourself"
            )
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")  # Ray's C++ core: no warnings on stderr
    try:
        with _stderr_silenced():  # the line saying that it is set, and the new cluster's start-up messages
            ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    except Exception as error:
        where = f"--ray-address {address}" if address else "Ray"
        raise UsageError(f"{where}: cannot connect or start a cluster ({describe(error)})") from None
    _cluster_messages(False)
    return True


def _cluster_messages(shown: bool) -> None:
    """Ray's driver prints the cluster's error messages (a node lost, a task retried) on stdout, which carries
    gradcam's results (``--json``): off while gradcam is connected, as the rest of Ray's output is. Ray has no option
    for it but its module's switch (the tests check that stdout stays clean through a node's loss)."""
    worker = sys.modules.get("ray._private.worker")
    if worker is not None and hasattr(worker, "_worker_logs_enabled"):
        setattr(worker, "_worker_logs_enabled", shown)  # noqa: B010


@contextlib.contextmanager
def _stderr_silenced() -> Iterator[None]:
    """File descriptor 2 to the null device while the block runs (Ray's C++ code writes there directly)."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def quiet() -> None:
    """Keep Ray's and Ray Data's log lines (and their tracebacks) and warnings off stderr, which carries gradcam's
    own one-line messages; a failed job is reported as one of them (:func:`cluster_error`)."""
    for name in ("ray", "ray.data", "ray.util"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    warnings.filterwarnings("ignore", module=r"ray(\.|$)")


def cluster_error(error: BaseException) -> GradcamError:
    """The one-line error for a failed Ray job: a gradcam error raised in an actor as it is (a model that does not
    load there keeps its message and exit code), anything else as a :class:`ClusterError`. Ray hands a task's error
    on as its ``cause``, but an actor that failed to start only as the text of its traceback, whose last
    ``gradcam_cli.errors.<Kind>: <message>`` line is taken back."""
    cause: BaseException | None = error
    seen: set[int] = set()
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, GradcamError):
            return cause
        seen.add(id(cause))
        cause = getattr(cause, "cause", None) or cause.__cause__
    text = _ANSI.sub("", str(error))
    raised = _RAISED.findall(text)
    if raised:
        kind, message = raised[-1]
        return _KINDS.get(kind, GradcamError)(message.strip())
    return ClusterError(f"the Ray job failed: {describe(RuntimeError(text))}")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RAISED = re.compile(r"gradcam_cli\.errors\.(\w+): ([^\n]+)")
_KINDS: dict[str, type[GradcamError]] = {
    kind.__name__: kind for kind in (GradcamError, UsageError, ModelLoadError, ImageError, ClusterError)
}
