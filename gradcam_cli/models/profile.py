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
from .tasks import Task, detection_spec, detection_transform, infer_task, task_of_shape

if TYPE_CHECKING:
    from ..vlm.layouts import TokenLayout
    from .text_tower import TextTower


@dataclass(frozen=True)
class ModelProfile:
    """What the tool needs to know about a loaded model besides its module, as its family describes it."""

    input_spec: InputSpec = field(default_factory=InputSpec)
    """How the model wants its input: size and normalisation."""
    categories: list[str] | None = None
    """Its class names (``--labels`` replaces them; a CLIP-style model's are prompts); ``None``: none known."""
    task: Task = Task.CLASSIFY
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
    task_name: str | None = None
    """The task adapter (:mod:`gradcam_cli.cam.tasks`) that explains the model, where not its :class:`Task`'s own:
    a plugin's named by ``--task`` or by the model's family (``toy:counter``'s ``count``), or the YOLO family's
    ``yolo`` (``--task detect`` or ``segment`` leave it); ``None``: the one of its :class:`Task`."""
    size_known: bool = True
    """The model says its own input size (``--input-size`` is then at most 4 times it); ``False`` for your own
    ``file.py:factory`` models."""
    any_shape: bool = False
    """It takes any height and width (``--input-size H,W``: a multiple of its patch size) though its ``input_spec``
    names a fixed size: a timm ViT built with ``dynamic_img_size``."""
    processor: Any = None
    """A vision-language model's processor (image processor, tokenizer, chat template): ``task_name`` ``answer``."""
    layout: TokenLayout | None = None
    """A vision-language model's token layout: its default layer and where that layer's image tokens lie on the
    photo (:mod:`gradcam_cli.vlm.layouts`)."""

    @property
    def may_read_tokens(self) -> bool:
        """Whether its 3-D (N, L, C) layer outputs may be token sequences: only a classifier's (a detector head's
        (N, anchors, classes) has no grid); :func:`gradcam_cli.cam.layers.reads_tokens` says whether they are."""
        return self.task is Task.CLASSIFY


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
        task: Task = Task.CLASSIFY,
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
        task = Task.DETECT if detection_transform(module) is not None else Task.CLASSIFY
        return cls(module, type(module).__name__, "custom", None, InputSpec(), task)

    def with_detector_input(self) -> LoadedModel:
        """A bare detector with its transform's input size (any other model as it is)."""
        if self.task is not Task.DETECT:
            return self
        return self.with_profile(input_spec=detection_spec(self.module, None) or self.input_spec)

    def with_task_shown(self, output_shape: tuple[int, ...] | None) -> LoadedModel:
        """A bare module's task, from the shape of its output in a dry pass (``None``: not a tensor), else from
        :func:`~gradcam_cli.models.tasks.infer_task`."""
        shown = task_of_shape(output_shape)
        return self.with_profile(task=shown or infer_task(self.module, self.input_spec, self.name))

    def with_profile(self, **changes: Any) -> LoadedModel:
        """This model with some of its profile's facts replaced (``model.with_profile(task=Task.DETECT)``)."""
        return replace(self, profile=replace(self.profile, **changes))

    @property
    def categories(self) -> list[str] | None:
        return self.profile.categories

    @property
    def input_spec(self) -> InputSpec:
        return self.profile.input_spec

    @property
    def task(self) -> Task:
        return self.profile.task

    @property
    def task_name(self) -> str | None:
        return self.profile.task_name

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
