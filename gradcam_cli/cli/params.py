"""Options shared by ``gradcam`` and ``gradcam eval``, declared once, and the parsers that validate their values.

Each alias is a complete declaration (flags, placeholder, help); a command lists it with its default. The
parsers turn text into the typed values of :mod:`gradcam_cli.options` and reject bad values with click's own
one-line errors (exit 2), before anything is loaded. Nothing here imports torch.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ..errors import UsageError, suggest
from ..options import (
    ALL_METHODS,
    DEVICE_PATTERN,
    ENGINE_NAMES,
    METHOD_NAMES,
    PRECISION_NAMES,
    SCORE_NAMES,
    TASK_NAMES,
    ImageFormat,
    Shard,
    WindowLevel,
)
from ..registry import METHODS_GROUP, plugin_entry_points
from ..targets import TargetSpec


class MethodList(tuple[str, ...]):
    """The ``--method`` value: method names, in the order given, each once."""


def parse_methods(text: str | MethodList) -> MethodList:
    """``gradcam,layercam`` -> ('gradcam', 'layercam'); an unknown name is refused with close matches."""
    if isinstance(text, MethodList):
        return text
    names = list(dict.fromkeys(name.strip().lower() for name in text.split(",") if name.strip()))
    if not names:
        raise typer.BadParameter("needs at least one method name")
    known = method_names()
    for name in names:
        if name not in known and name != ALL_METHODS:
            raise typer.BadParameter(unknown_method(name, known))
    return MethodList(names)


def method_names() -> tuple[str, ...]:
    """The names ``--method`` takes: the method registry's once it is loaded (a notebook's, a test's and the plugins'
    methods with the package's own), else, read without importing torch, the package's own
    (:data:`~gradcam_cli.options.METHOD_NAMES`) and the names of the installed ``gradcam_cli.methods`` entry points
    (a plugin names each entry point after the method it adds: docs/internals.md)."""
    loaded = sys.modules.get("gradcam_cli.cam.methods")
    registry = getattr(loaded, "METHODS", None)
    if registry is not None:
        return tuple(registry.names())
    plugins = (point.name for point in plugin_entry_points(METHODS_GROUP) if point.name not in METHOD_NAMES)
    return (*METHOD_NAMES, *plugins)


def plugin_method_names() -> tuple[str, ...]:
    """The methods ``--method`` takes besides the package's own (:func:`method_names`): plugins' and a notebook's."""
    return tuple(name for name in method_names() if name not in METHOD_NAMES)


def method_help(plugins: tuple[str, ...] = ()) -> str:
    """``--method``'s help: the package's methods, and ``plugins`` (:func:`plugin_method_names`, which ``--help``
    reads as it is shown: :class:`~gradcam_cli.cli.help.PanelledCommand`)."""
    others = f"; and the plugins' {', '.join(plugins)}" if plugins else ", or a plugin's"
    return (
        f"Method(s), comma-separated: {', '.join(METHOD_NAMES)}{others}; all: every method the model's task takes. "
        "Costs (docs/methods.md): the gradient methods share one backward pass per target; scorecam and "
        "ablationcam need one extra forward pass per channel of the layer (e.g. 2048 for resnet50 layer4, batched 32 "
        "at a time), rise and occlusion one per mask or window; fullgrad and the guided methods a pass through the "
        "whole network (pixel-level maps, classifiers only); shapleycam and finercam a second backward pass; rollout "
        "and attention (a transformer's attention) about one forward pass, attn-grad and legrad a backward pass "
        "through the whole network (legrad one more forward pass); all leaves them out for other models."
    )


def unknown_method(name: str, known: tuple[str, ...]) -> str:
    """The message for a ``--method`` name that is none of ``known``: close matches, or else every name."""
    hint = suggest(name, known) or f" Use {', '.join(known)}."
    return f"unknown method {name!r}.{hint}"


def parse_format(text: str | ImageFormat) -> ImageFormat:
    """``auto``, ``png``, ``jpg`` (or ``jpeg``) or ``webp``, in any case."""
    try:
        return ImageFormat.parse(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r}: use auto, png, jpg or webp") from None


def parse_task(text: str) -> str:
    """``classify``, ``detect`` or ``segment`` (any case), or a task a plugin registered
    (:data:`gradcam_cli.cam.tasks.TASKS`, looked up only for a name that is none of those: it imports torch)."""
    task = text.strip().lower()
    if task in TASK_NAMES:
        return task
    from ..cam.tasks import task_names

    names = task_names()
    if task not in names:
        raise typer.BadParameter(f"{text!r}: use {', '.join(names)}")
    return task


def parse_score(text: str) -> str:
    """``logit``, ``softmax`` or ``sigmoid`` (any case)."""
    score = text.strip().lower()
    if score not in SCORE_NAMES:
        raise typer.BadParameter(f"{text!r}: use {', '.join(SCORE_NAMES)}")
    return score


def parse_precision(text: str) -> str:
    """``fp32``, ``bf16`` or ``fp16`` (any case)."""
    precision = text.strip().lower()
    if precision not in PRECISION_NAMES:
        raise typer.BadParameter(f"{text!r}: use {', '.join(PRECISION_NAMES)}")
    return precision


def parse_engine(text: str) -> str:
    """``local`` or ``ray`` (any case)."""
    engine = text.strip().lower()
    if engine not in ENGINE_NAMES:
        raise typer.BadParameter(f"{text!r}: use {', '.join(ENGINE_NAMES)}")
    return engine


def parse_shard(text: str | Shard) -> Shard:
    """``K/N``: shard K (0 to N-1) of N."""
    try:
        return Shard.parse(text)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


def parse_window_level(text: str | WindowLevel) -> WindowLevel:
    """``LEVEL,WIDTH``: a scan's montage's intensity window."""
    try:
        return WindowLevel.parse(text)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


WindowLevelOpt = Annotated[
    WindowLevel | None,
    typer.Option(
        parser=parse_window_level,
        metavar="L,W",
        help="Scans: the montage's intensity window, level and width (default: the model's own clipping range, "
        "else the scan's 0.5-99.5th percentiles).",
        show_default=False,
    ),
]


EMPTY_PATH = "an empty path (is a shell variable unset?)"


def parse_attention_heads(text: str) -> str:
    """``--attention-heads``: one of :data:`~gradcam_cli.cam.attention.tokens.HEAD_FUSIONS`."""
    from ..cam.attention.tokens import HEAD_FUSIONS

    if text not in HEAD_FUSIONS:
        raise typer.BadParameter(f"{text!r} is not one of {', '.join(HEAD_FUSIONS)}.{suggest(text, HEAD_FUSIONS)}")
    return text


def parse_path(text: str | Path) -> Path:
    """A path option's value; an empty one (an unset shell variable) is refused, not taken for the current folder
    as ``Path("")`` would be."""
    if isinstance(text, Path):  # a default
        return text
    if not text:
        raise typer.BadParameter(EMPTY_PATH)
    return Path(text)


def parse_folder(text: str | Path) -> Path:
    """A folder option's value, as :func:`parse_path`; the refusal says how to name the current folder."""
    if not text:
        raise typer.BadParameter(f"{EMPTY_PATH}; use . for the current folder")
    return parse_path(text)


def parse_weights(text: str) -> str:
    """``--weights``: a name or a file; empty is refused as :func:`parse_path` refuses it."""
    if not text:
        raise typer.BadParameter("an empty value (is a shell variable unset?); use DEFAULT, none, a name or a file")
    return text


def parse_device(text: str) -> str:
    """``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps`` (whether it exists is checked when the model loads)."""
    device = text.strip().lower()
    if not DEVICE_PATTERN.match(device):
        raise typer.BadParameter(f"{text!r}: use auto, cpu, cuda, cuda:N or mps")
    return device


ModelOpt = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        metavar="NAME",
        help="torchvision classification, detection or segmentation model name (see --list-models), "
        "efficientnet_lite0, timm:NAME, hf:FOLDER_OR_HUB_ID, package.module:factory or file.py:factory.",
    ),
]
WeightsOpt = Annotated[
    str,
    typer.Option(
        "--weights",
        "-w",
        parser=parse_weights,
        metavar="WEIGHTS",
        help="DEFAULT, a torchvision weights name (IMAGENET1K_V1), none (random; nothing is downloaded), or a "
        "state-dict or .safetensors file.",
    ),
]
NumClassesOpt = Annotated[
    int | None,
    typer.Option(
        min=0,
        metavar="N",
        help="Classes of a replaced head (with --weights PATH); 0 for timm: no head, its pooled features (an "
        "embedding, for --target similar:).",
    ),
]
LabelsOpt = Annotated[
    Path | None, typer.Option(parser=parse_path, metavar="PATH", help="Text file with one class name per line.")
]
TaskOpt = Annotated[
    str | None,
    typer.Option(
        parser=parse_task,
        metavar="classify|detect|segment",
        help="What the model does (default: taken from the model).",
    ),
]
ScoreOpt = Annotated[
    str | None,
    typer.Option(
        parser=parse_score,
        metavar="logit|softmax|sigmoid|rest|cosine",
        help="Classifiers: what is differentiated, the class's logit (default), softmax probability, sigmoid "
        "(multi-label heads) or rest (logit + log softmax: ShapleyCAM's recommended target); text: targets: the "
        "image-text cosine (default) or the logit, softmax, sigmoid.",
        show_default=False,
    ),
]
TargetsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--target",
        metavar="KIND:VALUE",
        help="What to explain (repeatable, one map each): class:NAME|INDEX, similar:IMAGE_OR_FOLDER, "
        'text:"a photo of a dog", contrast:A,B, output:I[:neg] (docs/targets.md); a segmenter\'s scans: '
        "region:MASK.nii.gz (docs/volumes.md).",
        show_default=False,
    ),
]
EmbeddingOpt = Annotated[
    str | None,
    typer.Option(
        metavar="NAME",
        help="Which of the model's outputs is its embedding (similar: targets): a key, attribute or index.",
    ),
]
ScoreThresholdOpt = Annotated[
    float | None,
    typer.Option(
        min=0.0,
        max=1.0,
        metavar="S",
        help="Detectors: explain the detections scoring at least S (default 0.5; YOLO: the model's own conf).",
        show_default=False,
    ),
]
MaxDetectionsOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        metavar="N",
        help="Detectors: explain at most N detections per image, best first (default 10).",
        show_default=False,
    ),
]
DeviceOpt = Annotated[str, typer.Option(parser=parse_device, metavar="DEVICE", help="auto, cpu, cuda, cuda:N or mps.")]
PrecisionOpt = Annotated[
    str,
    typer.Option(
        parser=parse_precision,
        metavar="fp32|bf16|fp16",
        help="The forward pass in float32, or under autocast in bfloat16 or float16 (maps stay float32).",
    ),
]
LayerOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--layer",
        "-l",
        metavar="NAME",
        help="Dotted module name (repeatable: several layers are fused). Default: the last spatial layer.",
    ),
]
MethodOpt = Annotated[
    MethodList,
    typer.Option(
        parser=parse_methods,
        metavar="NAME[,NAME...]",
        help=method_help(),
    ),
]
RiseMasksOpt = Annotated[
    int,
    typer.Option(min=1, metavar="N", help="RISE and D-RISE: random masks per image (7x7 cells, each kept with p 0.5)."),
]
OcclusionWindowOpt = Annotated[int, typer.Option(min=1, metavar="PIXELS", help="Occlusion: the square window's side.")]
OcclusionStrideOpt = Annotated[int, typer.Option(min=1, metavar="PIXELS", help="Occlusion: the window's step.")]
FormatOpt = Annotated[
    ImageFormat | None,
    typer.Option(
        "--format",
        parser=parse_format,
        metavar="auto|png|jpg|webp",
        help="Overlay, heatmap and panel format; auto (the default): JPEG for JPEG inputs, PNG for the others.",
    ),
]
EveryOpt = Annotated[
    int | None,
    typer.Option(min=1, metavar="N", help="Videos: explain every Nth frame and hold its map in between (default 1)."),
]
FpsOpt = Annotated[
    float | None,
    typer.Option(min=0.0, metavar="FPS", help="Video models: the frame rate of a folder of frames (default 25)."),
]
SeedOpt = Annotated[
    int,
    typer.Option(
        metavar="N", help="Seed of RISE's and D-RISE's masks and randomcam's noise (and of eval's random draws)."
    ),
]
TargetOpt = Annotated[
    str | None,
    typer.Option(
        "--target-class",
        "-t",
        metavar="CLASS",
        help="Class to explain: index or name. Default: the top prediction.",
    ),
]
AugSmoothOpt = Annotated[
    bool,
    typer.Option(
        "--aug-smooth",
        help="Average each map over flipped and rescaled inputs (x0.75, x1, x1.25; 6 passes; flips only for "
        "fixed-size models such as ViT), each mapped back to the image first.",
    ),
]
EigenSmoothOpt = Annotated[
    bool,
    typer.Option(
        "--eigen-smooth",
        help="Use the first principal component of the weighted activations instead of their sum (less noise).",
    ),
]
AttentionHeadsOpt = Annotated[
    str | None,
    typer.Option(
        parser=parse_attention_heads,
        metavar="mean|max|min",
        help="How --method rollout and attention fuse each layer's heads (default: mean, as their papers).",
    ),
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Print errors only.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="More detail, and tracebacks for failures.")]


def target_specs(texts: list[str] | None) -> tuple[list[TargetSpec], str | None]:
    """The ``--target`` values parsed, and the one-line message of the first that does not parse (``None``: all
    did), for the command to report as every other usage error."""
    try:
        return [TargetSpec.parse(text) for text in texts or ()], None
    except ValueError as error:
        return [], f"--target {error}"


def refuse(message: str) -> int:
    """Raise a usage error found while parsing (a ``--target`` that does not parse), for
    :func:`~gradcam_cli.cli.reporting.run_reported` to report as every other."""
    raise UsageError(message)
