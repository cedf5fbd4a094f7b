"""Ultralytics YOLO models, ``--model yolo:PATH.pt`` or ``yolo:NAME.yaml``: detect, segment, pose and classify.

Needs the optional extra ``[yolo]`` (ultralytics, which is AGPL-3.0 licensed; gradcam-cli itself is MIT and only
imports it). Before ultralytics is first imported, :func:`offline_ultralytics` sets its environment so that it
never reaches the network: ``YOLO_OFFLINE`` (no online check, no analytics, no update check), ``YOLO_AUTOINSTALL``
off (no pip installs) and ``YOLO_VERBOSE`` off (nothing on stdout, which ``--json`` keeps for its rows).

- ``yolo:best.pt``: an ultralytics checkpoint, loaded with ``torch.load(weights_only=True)`` through ultralytics'
  own allow-list of its model classes (``torch_safe_load(safe_only=True)``; refused where torch cannot load that
  way, rather than ultralytics' silent fall-back to a full unpickling). The allow-list is large: a checkpoint from
  an untrusted source is still code to be trusted (docs/yolo.md). A bare
  name (``yolo:yolo11n.pt``) is looked for in the current folder and then in ultralytics' weights folder, as
  ultralytics itself looks; it is never downloaded.
- ``yolo:yolo11n.yaml`` (ultralytics' own model files, by name) or ``yolo:path/to/model.yaml``: the architecture,
  with ``--weights none`` (random weights) or ``--weights FILE`` (a state dict).
- An RT-DETR (a checkpoint whose model is an ``RTDETRDetectionModel``, or a model file whose head is an
  ``RTDETRDecoder``, such as ``yolo:rtdetr-l.yaml``): told by its head, loaded the same ways, and run as a DETR-family
  detector (:mod:`gradcam_cli.models.rtdetr_net`; its kind :data:`~gradcam_cli.models.rtdetr_net.RTDETR_KIND`).

Models are fused as ``model.predict`` fuses them (batch norms into convolutions). The task comes from the model; the
input is the model's own letterbox at its training size (``--input-size``: another multiple of its stride), see
:mod:`gradcam_cli.models.yolo_net`; a classifier's input is the whole image with its shorter side at that size
(ultralytics also crops the centre square; gradcam never crops).
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from PIL import Image
from torch import nn

from ..errors import ModelLoadError, UsageError, describe, suggest
from ..io.images import OPENCV_LINEAR, InputSpec
from .rtdetr_net import RTDETR_KIND, is_rtdetr, rtdetr_spec
from .tasks import NOUNS
from .weights import apply_state_dict, load_state_dict_file
from .yolo_net import model_stride

YOLO_PREFIX = "yolo:"
YOLO_TASK = "yolo"
"""The task adapter that explains a YOLO detector, instance segmenter or pose model (:mod:`gradcam_cli.cam.tasks.yolo`),
as its profile names it (:attr:`~gradcam_cli.models.profile.ModelProfile.task`)."""
TASKS = {"detect": "detect", "segment": "detect", "pose": "detect", "classify": "classify", RTDETR_KIND: "detect"}
"""The ultralytics tasks gradcam explains, and how it explains each (instances and poses are detections)."""
ENVIRONMENT = {"YOLO_OFFLINE": "1", "YOLO_AUTOINSTALL": "false", "YOLO_VERBOSE": "false"}
"""What :func:`offline_ultralytics` sets before ultralytics is imported."""
UNIT = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
"""Mean and std: YOLO models take pixels in [0, 1]."""
DEFAULT_SIZE = 640


@dataclass
class YoloModel:
    """A YOLO model as :func:`load_yolo` builds it: the module to explain, its class names, its input and its task
    (``kind``: ultralytics' own name of it, ``detect``, ``segment``, ``pose`` or ``classify``, or ``rtdetr``: an
    RT-DETR; ``detector``: its output is detections, as for every kind but ``classify``)."""

    module: nn.Module
    categories: list[str] | None
    input_spec: InputSpec
    detector: bool
    kind: str


def offline_ultralytics() -> Any:
    """Set ultralytics' environment (:data:`ENVIRONMENT`) and import it; a UsageError when it is not installed.

    The variables are read when ultralytics is first imported, so a notebook that imported it earlier keeps its own
    settings. PIL's ``Image.open``, which ultralytics patches on import, is put back."""
    os.environ.update(ENVIRONMENT)
    from ..io import video  # noqa: F401  (quiets OpenCV's logging before ultralytics imports cv2)

    try:
        import ultralytics
        from ultralytics.utils import patches
    except ImportError as error:
        raise UsageError(
            "--model yolo:... needs the optional extra: pip install 'gradcam-cli[yolo]' (ultralytics, AGPL-3.0)"
        ) from error
    # ultralytics replaces PIL.Image.open with a version that, on any file Pillow cannot identify, checks for (and
    # where allowed pip-installs) pi-heif: a non-image would then fail with an import error instead of Pillow's own.
    Image.open = patches._image_open
    return ultralytics


def load_yolo(name: str, weights: str, architecture_only: bool = False, task: str | None = None) -> YoloModel:
    """The model ``--model yolo:...`` names, with ``--weights`` (``DEFAULT``: the checkpoint's own; ``none``: random;
    a state dict file) and ``--task`` (``None``: the model's own; a task that does not fit it is refused)."""
    offline_ultralytics()
    target = name.removeprefix(YOLO_PREFIX)
    if re.match(r"^[a-z]+://", target, re.IGNORECASE):
        raise UsageError(f"--model {name}: gradcam never downloads models; pass a local .pt or .yaml file")
    suffix = Path(target).suffix.lower()
    net: Any
    if suffix in (".yaml", ".yml"):
        net, imgsz = _from_yaml(target, weights.upper() == "DEFAULT" and not architecture_only, task), DEFAULT_SIZE
    elif suffix == ".pt":
        net, imgsz = _from_checkpoint(_checkpoint_path(target), weights.lower() == "none")
    else:
        raise UsageError(f"--model {name}: yolo: takes a checkpoint (yolo:best.pt) or a model file (yolo:yolo11n.yaml)")
    if weights.upper() not in ("DEFAULT", "NONE") and not architecture_only:
        apply_state_dict(net, load_state_dict_file(weights), weights)
    kind = _task_of(net, name)
    _check_task(name, kind, task)
    net = net.float().eval()
    net.fuse(verbose=False)
    categories = _names(net)
    stride = model_stride(net)
    size = -(-int(imgsz) // stride) * stride
    if kind == RTDETR_KIND:
        from .rtdetr_net import RtDetrNet

        return YoloModel(RtDetrNet(net), categories, rtdetr_spec(size), True, kind)
    if kind == "classify":
        from .yolo_net import YoloClassifier

        spec = InputSpec(size=size, mean=UNIT[0], std=UNIT[1])
        return YoloModel(YoloClassifier(net), categories, spec, False, kind)
    from .yolo_net import YoloNet

    return YoloModel(YoloNet(net, kind), categories, letterbox_spec(size), True, kind)


def _check_task(name: str, kind: str, task: str | None) -> None:
    """A ``--task`` that does not fit a YOLO model of ``kind``: refused (each instance or pose of a segment or pose
    model is a detection to gradcam, so those take ``--task detect``, and a segment model ``--task segment`` too)."""
    if task is None:
        return
    fits = {"detect": ("detect",), "segment": ("detect", "segment"), "pose": ("detect",), "classify": ("classify",)}
    fits[RTDETR_KIND] = ("detect",)
    if task.lower() not in fits[kind]:
        described = "an RT-DETR" if kind == RTDETR_KIND else f"a YOLO {kind} model"
        raise UsageError(
            f"--task {task} does not fit {name}, {described} (explained as a {NOUNS[TASKS[kind]]}); use --task "
            f"{fits[kind][0]} or leave --task out"
        )


def letterbox_spec(size: int) -> InputSpec:
    """The input spec of a YOLO detector at ``size``: the longer side at ``size``, the aspect kept, OpenCV's bilinear
    resize (:func:`gradcam_cli.io.images.to_input_tensor`), pixels in [0, 1]."""
    return InputSpec(size=size, max_side=size, keep_aspect=True, mean=UNIT[0], std=UNIT[1], interpolation=OPENCV_LINEAR)


def with_input_size(module: nn.Module, spec: InputSpec, name: str, size: int) -> InputSpec:
    """``spec`` at ``--input-size size``, which must be a multiple of the model's stride (32 for most YOLO models; an
    RT-DETR's square is ``size`` on each side)."""
    net: Any = getattr(module, "net")  # noqa: B009  (YoloNet and YoloClassifier hold the ultralytics model there)
    stride = model_stride(net)
    if size % stride:
        lower, upper = max(stride, size // stride * stride), -(-size // stride) * stride
        raise UsageError(
            f"--input-size {size} does not fit {name}: YOLO inputs are multiples of its stride {stride}; use "
            f"{lower} or {upper}"
        )
    if spec.fixed_size is not None:
        return rtdetr_spec(size)
    return letterbox_spec(size) if spec.keep_aspect else replace(spec, size=size)


def _from_yaml(target: str, unweighted: bool, task: str | None) -> Any:
    """A model built from an ultralytics model file (a path, or one of ultralytics' own names), random weights;
    refused before it is built where no ``--weights`` were given (``unweighted``) or ``--task`` does not fit it."""
    from ultralytics.nn.tasks import guess_model_task, yaml_model_load

    try:
        config = yaml_model_load(target)
    except Exception as error:
        names = _known_model_files()
        hint = suggest(Path(target).name, names) or " ultralytics' own files are named like yolo11n.yaml."
        if Path(target).is_file():
            raise UsageError(f"--model yolo:{target}: not an ultralytics model file ({describe(error)})") from error
        raise UsageError(f"--model yolo:{target}: no such file, nor one of ultralytics' model files.{hint}") from error
    kind = RTDETR_KIND if is_rtdetr(config) else guess_model_task(config)
    builder = _builder(kind, f"yolo:{target}")
    _check_task(f"yolo:{target}", str(kind), task)
    if unweighted:
        raise UsageError(
            f"--model yolo:{target} is an architecture without weights: add --weights none (random weights) or "
            "--weights FILE (a state dict)"
        )
    try:
        return builder(config, verbose=False)
    except Exception as error:
        raise ModelLoadError(f"building yolo:{target} failed: {describe(error)}") from error


def _builder(task: str | None, name: str) -> Any:
    from ultralytics.nn import tasks

    builders = {
        "detect": tasks.DetectionModel,
        "segment": tasks.SegmentationModel,
        "pose": tasks.PoseModel,
        "classify": tasks.ClassificationModel,
        RTDETR_KIND: tasks.RTDETRDetectionModel,
    }
    if task not in builders:
        raise UsageError(
            f"{name} is a YOLO {task} model; gradcam explains detect, segment, pose and classify models and RT-DETR"
        )
    return builders[task]


def _checkpoint_path(target: str) -> Path:
    """The checkpoint file: the path itself, or a bare name found where ultralytics keeps its downloads."""
    path = Path(target).expanduser()
    if path.is_file():
        return path
    from ultralytics.utils import WEIGHTS_DIR
    from ultralytics.utils.downloads import GITHUB_ASSETS_NAMES

    bare = path.name == target
    if bare and (WEIGHTS_DIR / target).is_file():
        return Path(WEIGHTS_DIR / target)
    if bare and target in GITHUB_ASSETS_NAMES:
        raise ModelLoadError(
            f"{target} is not in the local cache (the current folder or {WEIGHTS_DIR}) and gradcam never downloads "
            f"it: fetch it once, e.g. python -c \"from ultralytics import YOLO; YOLO('{target}')\" (or from "
            f"https://github.com/ultralytics/assets/releases), and pass its path as --model yolo:PATH"
        )
    hint = suggest(path.name, sorted(n for n in GITHUB_ASSETS_NAMES if n.endswith(".pt"))) if bare else ""
    raise UsageError(f"model file {target} does not exist.{hint}".rstrip("."))


def _from_checkpoint(path: Path, random: bool) -> tuple[Any, int]:
    """The model of an ultralytics checkpoint (``ema`` if it has one, else ``model``) and its training size;
    ``random``: its architecture with random weights."""
    from ultralytics.nn import tasks
    from ultralytics.nn.tasks import torch_safe_load

    if not getattr(getattr(tasks, "_SafeLoad", None), "SUPPORTED", False):  # it would unpickle in full instead
        raise ModelLoadError(
            f"{path}: this torch and ultralytics cannot load a checkpoint with weights_only=True; gradcam loads "
            "no other way (update torch and ultralytics)"
        )
    try:
        with warnings.catch_warnings():  # torch's note on a pickle protocol it may not support: the error says it
            warnings.filterwarnings("ignore", "Detected pickle protocol", UserWarning)
            checkpoint, _ = torch_safe_load(str(path.resolve()), safe_only=True)
    except Exception as error:
        raise ModelLoadError(
            f"{path} is not an ultralytics checkpoint that loads with weights_only=True ({_reason(error, path)})"
        ) from error
    net = checkpoint.get("ema") or checkpoint.get("model") if isinstance(checkpoint, dict) else None
    if not isinstance(net, nn.Module):
        raise ModelLoadError(f"{path} holds no ultralytics model (no 'model' or 'ema' entry)")
    if not isinstance(net, tasks.BaseModel):
        raise ModelLoadError(f"{path} holds a {type(net).__name__} as its model, not an ultralytics model")
    args = checkpoint.get("train_args") or {}
    imgsz = args.get("imgsz", DEFAULT_SIZE) if isinstance(args, dict) else DEFAULT_SIZE
    imgsz = max(imgsz) if isinstance(imgsz, list | tuple) else imgsz
    if random:
        names = getattr(net, "names", None)
        net = _builder(_kind(net), f"yolo:{path}")(net.yaml, verbose=False)
        net.names = names
    return net, int(imgsz) if isinstance(imgsz, int | float) else DEFAULT_SIZE


def _reason(error: BaseException, path: Path) -> str:
    """Why ``path`` did not load, in plain words: a file torch never wrote, or ultralytics' message without its
    'ERROR ❌️' banner, its advice and the path (the message names it already)."""
    with open(path, "rb") as file:
        head = file.read(4)
    if not (head.startswith(b"PK") or head[:1] == b"\x80"):  # torch.save's zip archive, or a pickle
        return "not a file torch.save writes"
    text = re.sub(r"^\W*ERROR[^\w/.~]*", "", describe(error, path.resolve()))
    return text.split(". ")[0].rstrip(".")


def _task_of(net: nn.Module, name: str) -> str:
    task = _kind(net)
    _builder(task, name)  # refuses the tasks gradcam does not explain
    return str(task)


def _kind(net: nn.Module) -> str | None:
    """The model's kind: ``rtdetr`` for an RT-DETR (ultralytics guesses no task for one built from its file), else
    ultralytics' guess of its task."""
    from ultralytics.nn.tasks import guess_model_task

    return RTDETR_KIND if is_rtdetr(net) else guess_model_task(net)


def _names(net: nn.Module) -> list[str] | None:
    """The model's class names in index order (``None``: a model built from a file that names none)."""
    names = getattr(net, "names", None)
    if isinstance(names, dict) and names:
        return [str(names.get(i, i)) for i in range(max(int(k) for k in names) + 1)]
    if isinstance(names, list | tuple) and names:
        return [str(n) for n in names]
    return None


def _known_model_files() -> list[str]:
    """ultralytics' own model file names, with their scales: yolo11n.yaml, yolo11s-seg.yaml, ..."""
    import ultralytics

    root = Path(ultralytics.__file__).parent / "cfg" / "models"
    names = []
    for file in root.rglob("*.yaml"):
        match = re.match(r"^(.*?\d+)(.*)$", file.stem)
        names.append(file.name)
        if match:
            names += [f"{match[1]}{scale}{match[2]}.yaml" for scale in "nsmlx"]
    return sorted(set(names))
