"""A loaded model and its profile: the module, its name and weights, and the facts its family knows about it.

Every model family (:mod:`gradcam_cli.models.families`) describes what it loads in one :class:`ModelProfile`; the
rest of the tool asks the profile (its input, class names, task, token layout, default layers, text tower) instead
of checking which family a model came from. Both are frozen: a model is not changed after loading; what changes
(the explainer working out a bare module's task) is a new :class:`LoadedModel` (:meth:`LoadedModel.with_profile`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from torch import nn

from ..io.images import InputSpec
from .clip_spec import ClipSpec, bare_clip
from .tasks import CLASSIFY, DETECT, detection_spec, detection_transform, infer_task, task_facts, task_of_shape

if TYPE_CHECKING:
    from .text_tower import TextTower
    from .token_layouts import TokenLayout
    from .volume_spec import VolumeSpec


BARE_CLIP = (16, 112, 112)
"""The (T, H, W) a bare module whose first convolution is 3-D is first run at (a clip's, as torchvision's video
models take them; a volume model's alike)."""


def bare_input(module: nn.Module) -> InputSpec:
    """How a bare module takes its input, from its convolutions: one whose first is 3-D takes (C, T, H, W) clips or
    volumes (:data:`BARE_CLIP`), one with 1-D convolutions only (C, L) sequences of the usual size, any other module
    RGB images."""
    convolutions = [m for m in module.modules() if isinstance(m, nn.Conv1d | nn.Conv2d | nn.Conv3d)]
    first = convolutions[0] if convolutions else None
    if isinstance(first, nn.Conv3d):
        return InputSpec(size=BARE_CLIP[-1], shape=(first.in_channels, *BARE_CLIP))
    if isinstance(first, nn.Conv1d) and all(isinstance(m, nn.Conv1d) for m in convolutions):
        return InputSpec(shape=(first.in_channels, InputSpec.size))
    return InputSpec()


@dataclass(frozen=True)
class ModelProfile:
    """What the tool needs to know about a loaded model besides its module, as its family describes it."""

    input_spec: InputSpec = field(default_factory=InputSpec)
    """How the model wants its input: size and normalisation."""
    categories: list[str] | None = None
    """Its class names (``--labels`` replaces them; a CLIP-style model's are prompts); ``None``: none known."""
    task: str = CLASSIFY
    """The name of the task adapter that explains it (:mod:`gradcam_cli.cam.tasks`): a built-in task found from the
    model or named by ``--task`` (``classify``, ``detect``, ``segment``), the YOLO family's ``yolo`` for its
    detectors, or a plugin's, named by ``--task`` or by the model's family (``toy:counter``'s ``count``)."""
    detector: bool = False
    """Its output is detections: a torchvision-style detector (its input spec then its detection transform's), a
    YOLO detector, instance segmenter or pose model; ``--input-size H,W`` is refused and its sides are not rounded
    to whole patches. Always so for the ``detect`` task."""
    prefix_tokens: int | None = None
    """Leading non-spatial tokens (class, distillation, register) of the model's token sequences, as the model
    declares them (timm, Hugging Face); ``None``: found from each layer's shape (:mod:`gradcam_cli.cam.reshape`)."""
    tokens: bool = False
    """Its family makes token sequences (timm, Hugging Face): a classifier's 3-D layer outputs are read as tokens
    on a patch grid even where no attention module or patch embedding shows it
    (:func:`gradcam_cli.cam.layers.reads_tokens`)."""
    default_layers: tuple[str, ...] = ()
    """The layers explained when none is chosen, as the model declares them (a YOLO detector's head inputs); empty:
    the default layer rule of :mod:`gradcam_cli.cam.layers`."""
    embeds: bool = False
    """Its output is an embedding, not class scores: explained with ``similar:`` targets (docs/targets.md)."""
    text: TextTower | None = None
    """A CLIP-style model's text tower, for ``text:`` targets; its ``categories`` are then prompts (``--labels``)."""
    size_known: bool = True
    """The model says its own input size (``--input-size`` is then at most 4 times it); ``False`` for your own
    ``file.py:factory`` models."""
    any_shape: bool = False
    """It takes any height and width (``--input-size H,W``: a multiple of its patch size) though its ``input_spec``
    names a fixed size: a timm ViT built with ``dynamic_img_size``. A detector's: it takes any square (``--input-size
    N``, an ultralytics RT-DETR's: a multiple of its stride)."""
    processor: Any = None
    """A vision-language model's processor (image processor, tokenizer, chat template): task ``answer``."""
    layout: TokenLayout | None = None
    """A vision-language model's token layout: its default layer and where that layer's image tokens lie on the
    photo (:mod:`gradcam_cli.models.token_layouts`)."""

    volume: VolumeSpec | None = None
    """A volume model's windows, intensity normalisation and training spacing (:mod:`gradcam_cli.models.volume_spec`:
    an nnU-Net folder's, a MONAI bundle's); ``None``: not a volume model, or none known."""
    clip: ClipSpec | None = None
    """A video model's clips: frames per clip and their sampling rate (:mod:`gradcam_cli.models.clip_spec`);
    ``None``: not a video model, or a bare 3-D CNN's (T frames of its input ``shape``, every frame)."""

    def __post_init__(self) -> None:
        if task_facts(self.task)["detector"]:  # the task's own facts (models/tasks.py), as with_task_shown sets them
            object.__setattr__(self, "detector", True)

    @property
    def clips(self) -> ClipSpec | None:
        """How the model takes a video: its :attr:`clip`, or a bare 3-D CNN's (an RGB (3, T, H, W) input ``shape``
        and no volume spec: T frames, every frame); ``None``: it takes images (a video is explained frame by
        frame) or volumes."""
        if self.clip is not None or self.volume is not None:
            return self.clip
        return bare_clip(self.input_spec)


@dataclass(frozen=True, init=False)
class LoadedModel:
    """A model ready to explain: the module, its name and weights, and its :class:`ModelProfile`.

    Built by :func:`~gradcam_cli.models.loading.load_model`, or by hand around your own module: either with a
    ``profile``, or with the profile's facts one by one, as ``LoadedModel(module, "mine", "none", ["cat", "dog"],
    InputSpec(size=128))``. The profile's facts read as attributes (``model.categories``, ``model.input_spec``).
    """

    module: nn.Module
    name: str
    weights: str
    profile: ModelProfile

    def __init__(
        self,
        module: nn.Module,
        name: str,
        weights: str,
        categories: list[str] | None = None,
        input_spec: InputSpec | None = None,
        task: str = CLASSIFY,
        *,
        profile: ModelProfile | None = None,
        **facts: Any,
    ) -> None:
        if profile is None:
            profile = ModelProfile(input_spec or InputSpec(), categories, task, **facts)
        elif categories is not None or input_spec is not None or facts:
            raise TypeError("LoadedModel takes a profile or the profile's facts, not both")
        object.__setattr__(self, "module", module)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "profile", profile)

    @classmethod
    def of_module(cls, module: nn.Module) -> LoadedModel:
        """A bare module as a model: named by its class, a detector where it has a detection transform, else a
        classifier until its output says otherwise (:meth:`with_task_shown`)."""
        task = DETECT if detection_transform(module) is not None else CLASSIFY
        return cls(module, type(module).__name__, "custom", None, bare_input(module), task)

    def with_detector_input(self) -> LoadedModel:
        """A bare detector with its transform's input size (any other model as it is)."""
        if not self.profile.detector:
            return self
        return self.with_profile(input_spec=detection_spec(self.module, None) or self.input_spec)

    def with_task_shown(self, output_shape: tuple[int, ...] | None) -> LoadedModel:
        """A bare module's task, from the shape of its output in a dry pass (``None``: not a tensor), else from
        :func:`~gradcam_cli.models.tasks.infer_task`."""
        shown = task_of_shape(output_shape)
        return self.with_profile(**task_facts(shown or infer_task(self.module, self.input_spec, self.name)))

    def with_profile(self, **changes: Any) -> LoadedModel:
        """This model with some of its profile's facts replaced (``model.with_profile(categories=names)``)."""
        return replace(self, profile=replace(self.profile, **changes))

    @property
    def categories(self) -> list[str] | None:
        return self.profile.categories

    @property
    def input_spec(self) -> InputSpec:
        return self.profile.input_spec

    @property
    def task(self) -> str:
        return self.profile.task

    @property
    def prefix_tokens(self) -> int | None:
        return self.profile.prefix_tokens

    @property
    def default_layers(self) -> tuple[str, ...]:
        return self.profile.default_layers

    @property
    def embeds(self) -> bool:
        return self.profile.embeds

    @property
    def text(self) -> TextTower | None:
        return self.profile.text

    @property
    def processor(self) -> Any:
        return self.profile.processor

    @property
    def layout(self) -> TokenLayout | None:
        return self.profile.layout

    def class_name(self, index: int) -> str:
        """Human name of class ``index`` (the index itself when the model has no names)."""
        if self.categories is not None and 0 <= index < len(self.categories):
            return self.categories[index]
        return str(index)
