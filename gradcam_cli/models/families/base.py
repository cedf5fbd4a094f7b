"""What a model family is: a kind of model that ``--model`` names, how it claims a name, how it loads one.

A family claims ``--model`` values by a prefix (``timm:``) or a rule of its own (:meth:`Family.claims`), and loads
one into a :class:`~gradcam_cli.models.profile.LoadedModel` whose :class:`~gradcam_cli.models.profile.ModelProfile`
says everything the rest of the tool needs to know about it. What every family shares (``--input-size``,
``--labels``) is applied after it by :func:`gradcam_cli.models.loading.load_model`.
"""

from __future__ import annotations

from dataclasses import replace

from ...io.images import InputSpec
from ...options import TASK_NAMES, ModelOptions
from ..hub import HubModel
from ..profile import LoadedModel, ModelProfile
from ..tasks import CLASSIFY, parse_task


class Family:
    """A model family: subclass it, set :attr:`name` and :attr:`prefix` (or override :meth:`claims`), write
    :meth:`load`, and register an instance (:data:`gradcam_cli.models.families.FAMILIES`, or an entry point of the
    ``gradcam_cli.families`` group: docs/internals.md, "Writing a plugin")."""

    name: str = ""
    """The family's name, as messages and ``FAMILIES`` name it."""
    prefix: str | None = None
    """The start of the ``--model`` values it claims (``timm:``); ``None``: :meth:`claims` decides."""
    claim_order: int = 0
    """When it is asked: families of a lower order first, in registration order. Families that claim by a prefix or
    a name are 0; the catch-alls come last: ``module:factory`` specs 1, torchvision's names 2."""
    headless: bool = False
    """``--num-classes 0`` builds its models without a head (their pooled features an embedding)."""
    answers: bool = False
    """Its models answer questions (the ``answer`` task, docs/vlm.md: loaded with ``ModelOptions(task="answer")``)
    rather than being explained as image models."""
    counts_classes: bool = False
    """A ``--labels`` file for a model without class names is checked against the class count one forward pass
    finds (otherwise against ``--num-classes``)."""

    def claims(self, model: str) -> bool:
        """Whether ``--model model`` is one of this family's."""
        return self.prefix is not None and model.startswith(self.prefix)

    def load(self, options: ModelOptions, architecture_only: bool) -> LoadedModel:
        """The model ``options.model`` names, with ``options.weights``, ``num_classes`` and ``task`` applied (the
        input size and labels are applied after it); ``architecture_only``: build it without reading or downloading
        weights (:func:`gradcam_cli.models.loading.load_model`)."""
        raise NotImplementedError

    def resize(self, model: LoadedModel, size: int) -> InputSpec:
        """Its input spec at ``--input-size size`` (already checked against its own size)."""
        spec = model.input_spec
        return spec if size == spec.size else replace(spec, size=size)

    def names(self) -> list[str]:
        """The model names ``--list-models`` shows for it (none: it takes any name after its prefix)."""
        return []


def chosen_task(options: ModelOptions, own: str) -> str:
    """``--task`` where it names a built-in task, else the model's own task (a plugin's task named by ``--task``
    replaces it after loading: :func:`~gradcam_cli.models.loading.load_model`)."""
    return parse_task(options.task) if options.task is not None and options.task in TASK_NAMES else own


def hub_model(built: HubModel, options: ModelOptions, tokens: bool) -> LoadedModel:
    """A timm, Hugging Face or open_clip model as its loader built it (``tokens``: its family makes token
    sequences)."""
    profile = ModelProfile(
        built.input_spec,
        built.categories,
        chosen_task(options, CLASSIFY),
        prefix_tokens=built.prefix_tokens,
        tokens=tokens,
        embeds=built.embeds,
        text=built.text,
        any_shape=built.any_shape,
        clip=built.clip,
    )
    return LoadedModel(built.module, options.model, built.weights, profile=profile)
