"""The typed options every entry point parses into: what to load, what to explain, what to write, how to run, and
what ``gradcam eval`` and ``gradcam diff`` measure.

The command line builds these frozen dataclasses at its boundary and the library takes them, so a notebook can
build the same objects by hand. Nothing here imports torch.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from pathlib import Path

from .targets import TargetSpec

DEFAULT_MAX_SIDE = 4096
"""Images whose longer side is larger are shrunk by a whole factor to fit first (``--max-side``; 0: never)."""
DEVICE_PATTERN = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
"""The devices ``--device`` accepts: auto, cpu, mps, cuda or cuda:N."""
# fmt: off
METHOD_NAMES = (
    "gradcam", "gradcam++", "xgradcam", "hirescam", "layercam", "scorecam", "eigencam", "eigengradcam",
    "ablationcam", "fullgrad", "guided-backprop", "guided-gradcam", "finercam", "gradcam-elementwise", "kpcacam",
    "shapleycam", "fem", "refinecam", "segeigencam", "randomcam", "rise", "drise", "occlusion", "rollout",
    "attn-grad", "attention", "legrad",
)
# fmt: on
"""The package's own CAM methods, as :data:`gradcam_cli.cam.methods.BUILTIN_METHODS` registers them
(tests/methods/test_methods.py holds them equal): what ``--method`` accepts and ``--help`` lists before torch is
imported.
Once the method registry is loaded, ``--method`` takes its names, a notebook's and the plugins' methods too
(:func:`gradcam_cli.cli.params.method_names`)."""
DEFAULT_METHOD = "gradcam"
"""The method ``--method`` and :class:`ExplainOptions` default to."""
RANDOM_BASELINE = "randomcam"
"""The noise baseline ``gradcam eval --rank`` adds and ranks every method against (docs/evaluation.md)."""
ALL_METHODS = "all"
"""``--method all``: every method that serves the model's task (:class:`gradcam_cli.cam.explainer.Explainer`)."""
POINTING_TOLERANCE = 15.0
"""Pixels a map's maximum may lie outside a box and still count as a hit (Zhang et al. 2016)."""
MIN_SIMILARITY = 0.95
"""Default ``--min-similarity`` of ``gradcam diff``: the least Spearman and Pearson correlation of two maps that is
no drift (docs/ci.md, "The tolerance", says how it was chosen)."""
MAX_PEAK_SHIFT = 0.1
"""Default ``--max-peak-shift`` of ``gradcam diff``: the farthest a map's peak may move, as a fraction of the
image's diagonal."""
TASK_NAMES = ("classify", "detect", "segment")
"""The tasks ``--task`` accepts, each the name of its task adapter (:mod:`gradcam_cli.cam.tasks`)."""
TOP_K = 1
"""Classes (a segmenter's largest classes) explained per image when ``--top-k`` is not given."""
SCORE_THRESHOLD = 0.5
"""A detector's least explained score when ``--score-threshold`` is not given (a YOLO model: its own ``conf``)."""
MAX_DETECTIONS = 10
"""Detections explained per image at most when ``--max-detections`` is not given."""
CLASS_SCORE_NAMES = ("logit", "softmax", "sigmoid", "rest")
"""What ``--score`` differentiates for a class (see :mod:`gradcam_cli.cam.scores`); ``rest``: ShapleyCAM's ReST."""
SCORE_NAMES = (*CLASS_SCORE_NAMES, "cosine", "box")
"""Every ``--score``: a class's, a text prompt's ``cosine``, a YOLO box's ``box``."""
PRECISION_NAMES = ("fp32", "bf16", "fp16")
"""What ``--precision`` accepts: the forward pass in float32, or autocast to bfloat16 or float16 (see
:mod:`gradcam_cli.cam.precision`); maps are always computed in float32."""
JPEG_SUFFIXES = frozenset({".jpg", ".jpeg"})
"""Input suffixes (lower case) whose outputs are JPEG under ``--format auto``."""
SCORE_BATCH_SIZE = 32
"""Masked inputs (Score-CAM) or ablated copies (AblationCAM) per forward pass when not given."""
ENGINE_NAMES = ("local", "ray")
"""What ``--engine`` accepts: this machine (:mod:`gradcam_cli.pipeline.batch`) or a Ray cluster
(:mod:`gradcam_cli.pipeline.ray_engine`)."""


class ImageFormat(str, enum.Enum):
    """File format of overlays, heatmaps and panels.

    ``auto`` (the default) follows each input: a JPEG input (``.jpg``/``.jpeg``, any case) gets JPEG outputs at
    ``quality``, every other input (PNG, BMP, TIFF, GIF, WebP) lossless PNG (docs/outputs.md says why).
    """

    AUTO = "auto"
    PNG = "png"
    JPG = "jpg"
    WEBP = "webp"

    def suffix_for(self, source: Path) -> str:
        """The file-name suffix, with its dot, of an output made from the input image ``source``."""
        if self is ImageFormat.AUTO:
            return ".jpg" if source.suffix.lower() in JPEG_SUFFIXES else ".png"
        return f".{self.value}"

    @classmethod
    def parse(cls, text: str | ImageFormat) -> ImageFormat:
        """``auto``, ``png``, ``jpg`` (or ``jpeg``), ``webp``, in any case and with or without a dot."""
        if isinstance(text, ImageFormat):
            return text
        value = text.strip().lower().lstrip(".")
        return cls("jpg" if value == "jpeg" else value)


@dataclass(frozen=True)
class ModelOptions:
    """What to load: the model, its weights and class names, the input geometry, the device and the task.

    ``input_size`` ``None``: the model's own (224 for classifiers, the detector's transform's size, 520 for
    torchvision's segmenters). ``task`` ``None``: taken from the model (see :mod:`gradcam_cli.models.tasks`).
    """

    model: str = "resnet50"
    weights: str = "DEFAULT"
    num_classes: int | None = None
    labels: Path | None = None
    input_size: int | tuple[int, int] | None = None
    """The network input's shorter side, or its exact (height, width) (``--input-size H,W``, for a model that takes
    any shape or exactly that one); ``None``: the model's own (224 for torchvision classifiers, the detector's
    transform's size, 520 for torchvision's segmenters, or a timm or Hugging Face model's size)."""
    device: str = "auto"
    task: str | None = None
    precision: str = "fp32"
    """The forward pass's precision: ``fp32``, or ``bf16``/``fp16`` under autocast (maps stay float32)."""


@dataclass(frozen=True)
class PerturbationOptions:
    """The black-box methods' settings (:mod:`gradcam_cli.cam.perturbation`): RISE's ``rise_masks`` random masks,
    each a ``rise_grid`` x ``rise_grid`` grid of cells kept with probability ``rise_probability``; occlusion's
    square ``occlusion_window`` slid by ``occlusion_stride`` (pixels of the network input); ``seed`` for RISE's masks
    and ``randomcam``'s noise."""

    rise_masks: int = 4000
    rise_grid: int = 7
    rise_probability: float = 0.5
    occlusion_window: int = 32
    occlusion_stride: int = 16
    seed: int = 0


@dataclass(frozen=True)
class AnswerOptions:
    """A question for a vision-language model (docs/vlm.md): ``prompt`` (``None``: not asked), the ``answer`` to
    explain (``None``: the generated one), one map per answer token (``per_token``), and how long the greedy answer
    may grow (``max_new_tokens``; ``None``: 32); ``prompts``: a CSV of image,prompt pairs instead of ``prompt``."""

    prompt: str | None = None
    answer: str | None = None
    per_token: bool = False
    max_new_tokens: int | None = None
    prompts: Path | None = None
    """``--prompts FILE.csv``: each image's own prompt (``None``: not given)."""

    @property
    def asked(self) -> bool:
        """A question was given: ``--prompt`` or ``--prompts``."""
        return self.prompt is not None or self.prompts is not None

    def given(self) -> list[str]:
        """The options besides ``--prompt`` that were given (they need it, or ``--prompts``)."""
        named = {"--answer": self.answer, "--max-new-tokens": self.max_new_tokens}
        return [name for name, value in named.items() if value is not None] + (
            ["--per-token"] if self.per_token else []
        )


@dataclass(frozen=True)
class ExplainOptions:
    """What to explain: layers (empty: the default layer), methods, which classes, smoothing, and the score.

    ``score``: what is differentiated for a classifier (logit, softmax or sigmoid). Detectors explain every
    detection scoring at least ``score_threshold``, at most ``max_detections`` of them. ``top_k``,
    ``score_threshold`` and ``max_detections`` of ``None`` were not given: the task's own (1; 0.5, a YOLO model's
    own ``conf``; 10); any value given is one, and refused for a task it does not apply to.
    """

    layers: tuple[str, ...] = ()
    methods: tuple[str, ...] = (DEFAULT_METHOD,)
    target_class: int | str | None = None
    """The class explained in every image, an index or a name; ``None``: each image's own top ``top_k``."""
    top_k: int | None = None
    aug_smooth: bool = False
    eigen_smooth: bool = False
    score: str | None = None
    """``None``: a class's logit, a text prompt's cosine (docs/targets.md)."""
    score_threshold: float | None = None
    max_detections: int | None = None
    targets: tuple[TargetSpec, ...] = ()
    """What each map explains (:mod:`gradcam_cli.targets`, docs/targets.md); empty: ``target_class`` or the top
    ``top_k`` classes."""
    embedding: str | None = None
    """Which of a model's outputs is its embedding (``similar:`` targets); ``None``: the output itself."""
    perturbation: PerturbationOptions = PerturbationOptions()
    question: AnswerOptions = AnswerOptions()
    """A question for a vision-language model (``--prompt``); its ``prompt`` ``None``: none asked."""
    score_batch_size: int = SCORE_BATCH_SIZE
    """Masked inputs (Score-CAM) or ablated copies (AblationCAM) per forward pass."""
    attention_heads: str | None = None
    """How rollout and the ``attention`` method fuse a layer's heads: ``mean``, ``max`` or ``min``
    (``--attention-heads``); ``None``: not given, the mean."""
    region: Path | None = None
    """A segmenter's region mask on the scans' grid (``--target region:MASK.nii.gz``, docs/volumes.md): each class's
    score sums its logits over the mask's voxels; ``None``: not given, over the voxels predicted as the class."""

    def task_for(self, task: str | None) -> str | None:
        """``--task`` as given, else ``classify`` where ``--target`` specs or ``--embedding`` say the model is
        explained as a classifier (an embedding model's output gives no task to find); ``None``: the model's own."""
        return task or ("classify" if self.targets or self.embedding else None)


@dataclass(frozen=True)
class OutputOptions:
    """What to write, and where."""

    output_dir: Path = Path("gradcam_out")
    image_format: ImageFormat | None = None
    quality: int = 90
    alpha: float = 0.5
    colormap: str = "jet"
    save_raw: bool = False
    save_heatmap: bool = False
    panel: bool = False
    report: bool = False
    manifest: Path | None = None
    skip_existing: bool = False
    window_level: WindowLevel | None = None
    """A scan's montage's intensity window (docs/volumes.md); ``None``: the model's or the scan's own."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "output_dir", Path(self.output_dir))
        image_format = self.image_format and ImageFormat.parse(self.image_format)
        object.__setattr__(self, "image_format", image_format)
        if self.manifest is not None:
            object.__setattr__(self, "manifest", Path(self.manifest))

    @property
    def chosen_format(self) -> ImageFormat:
        """``image_format`` (``--format``; ``None``: not given), else ``auto``."""
        return self.image_format or ImageFormat.AUTO


@dataclass(frozen=True)
class WindowLevel:
    """A scan's intensity window for its montage (``--window-level L,W``): ``level`` its centre, ``width`` its span,
    in the scan's own units (CT: Hounsfield units; a soft-tissue window is ``40,400``)."""

    level: float
    width: float

    def __post_init__(self) -> None:
        if not self.width > 0:
            raise ValueError(f"window width {self.width:g}: it must be above 0")

    @classmethod
    def parse(cls, text: str | WindowLevel) -> WindowLevel:
        """``40,400`` -> ``WindowLevel(40.0, 400.0)``; a :class:`ValueError` for anything else."""
        if isinstance(text, WindowLevel):
            return text
        parts = text.split(",")
        try:
            level, width = (float(part) for part in parts)
        except ValueError:
            raise ValueError(f"{text!r}: use LEVEL,WIDTH, for example 40,400 (a CT soft-tissue window)") from None
        return cls(level, width)

    @property
    def bounds(self) -> tuple[float, float]:
        """(lowest, highest) intensity: black and white."""
        return self.level - self.width / 2, self.level + self.width / 2


@dataclass(frozen=True)
class Shard:
    """Part ``index`` (0 to ``count`` - 1) of inputs split into ``count`` parts (``--shard K/N``); which part an
    input falls in depends only on its path relative to its input root (:mod:`gradcam_cli.pipeline.shards`)."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(f"shard {self.index}/{self.count}: K must be 0 to N-1, and N at least 1")

    @classmethod
    def parse(cls, text: str | Shard) -> Shard:
        """``3/8`` -> ``Shard(3, 8)``; a :class:`ValueError` for anything else."""
        if isinstance(text, Shard):
            return text
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
        if match is None:
            raise ValueError(f"{text!r}: use K/N, for example 0/8 (K from 0 to N-1)")
        return cls(int(match[1]), int(match[2]))

    @property
    def label(self) -> str:
        """``3-of-8``, as the shard's file names carry it."""
        return f"{self.index}-of-{self.count}"


@dataclass(frozen=True)
class RunOptions:
    """How to run: batching, decoding processes, writer threads, the size limit, video frame sampling, and whether
    PyTorch runs deterministically (``deterministic``: entering a ``Session`` seeds and switches it on).

    ``batch_size`` and ``workers`` of ``None`` pick the defaults for the device and the machine. ``shard``: run
    only that part of the inputs (docs/scale.md). ``engine``: ``local``, or ``ray`` to run on a Ray cluster
    (``ray_address``; ``None``: the ``RAY_ADDRESS`` environment variable, else a local instance) with ``actors``
    explaining actors (``None``: one per GPU, else one per two CPUs), each with ``gpus_per_worker`` GPUs
    (``None``: 1 where the cluster has GPUs, else 0). ``every``: explain every Nth frame of a video given to an image
    model (``None``: not given, every frame). ``clip_stride``: video frames between the starts of a video
    model's clips (``None``: a clip's span, clips side by side; docs/video.md); ``fps``: the frame rate of a folder
    of frames given to a video model (``None``: 25).
    """

    batch_size: int | None = None
    workers: int | None = None
    writers: int = 2
    max_side: int | None = DEFAULT_MAX_SIDE
    every: int | None = None
    clip_stride: int | None = None
    fps: float | None = None
    deterministic: bool = False
    shard: Shard | None = None
    engine: str = "local"
    ray_address: str | None = None
    actors: int | None = None
    gpus_per_worker: float | None = None


@dataclass(frozen=True)
class EvalOptions:
    """How ``gradcam eval`` measures: curve resolution, batching, pointing tolerance, the sanity check, ROAD
    (``road``; its noise is drawn from ``seed`` too), stability (``stability``: ``stability_samples`` noisy copies
    of each image) and faithfulness correlation (``correlation``: ``correlation_runs`` random subsets of
    ``correlation_subset`` pixels each, drawn from ``seed``), ARCC (``arcc``, with ROAD), the random-logit test
    (``random_logit``) and sMPRT/eMPRT (``mprt``: sMPRT with ``mprt_samples`` copies); ``fps``: the frame rate of a
    folder of frames given to a video model (``None``: 25); ``masks``: a folder of scans' label masks (nnU-Net's
    ``labelsTr``: pointing, energy and Dice on scans); ``meta``: the ranking's meta-evaluation (MetaQuantus'
    input and model perturbation tests, :mod:`gradcam_cli.evaluation.meta`; with the sanity cascade)."""

    steps: int = 50
    batch_size: int = 16
    tolerance: float = POINTING_TOLERANCE
    sanity: bool = False
    sanity_layers: int = 3
    seed: int = 0
    boxes: Path | None = None
    plot: Path | None = None
    road: bool = False
    stability: bool = False
    stability_samples: int = 3
    correlation: bool = False
    correlation_runs: int = 100
    correlation_subset: int = 224
    arcc: bool = False
    random_logit: bool = False
    mprt: bool = False
    mprt_samples: int = 50
    fps: float | None = None
    masks: Path | None = None
    meta: bool = False


@dataclass(frozen=True)
class DiffOptions:
    """What ``gradcam diff`` counts as drift: either correlation below ``min_similarity``, a peak moved more than
    ``max_peak_shift`` of the diagonal, a class change (unless allowed), rows on one side only (unless allowed)."""

    min_similarity: float = MIN_SIMILARITY
    max_peak_shift: float = MAX_PEAK_SHIFT
    allow_class_change: bool = False
    allow_missing: bool = False


@dataclass(frozen=True)
class ServeOptions:
    """How ``gradcam serve`` listens and what it takes: ``host`` and ``port`` (0: a free port), the colormap and
    opacity its page starts with, the largest upload it decodes (``max_upload_bytes`` of file, ``max_pixels``), and
    how long one request's passes may run (``request_seconds``)."""

    host: str = "127.0.0.1"
    port: int = 8765
    colormap: str = "jet"
    alpha: float = 0.5
    max_upload_bytes: int = 20 * 2**20
    max_pixels: int = 40_000_000
    request_seconds: float | None = 120.0
    """How long one request's passes may run (Score-CAM's masked inputs, RISE's masks, ...; ``None``: no limit)."""
