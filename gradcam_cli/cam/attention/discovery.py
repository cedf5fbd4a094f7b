"""Which modules of a model are its self-attention, how the engine reads their probabilities, and which tokens come
before the patches: the one place that knows the transformer families.

A site's ``kind`` says how its probabilities (N, heads, L, L) are read as the model runs
(:meth:`gradcam_cli.cam.engine.LayerCapture.watch_attention` does the reading):

- :data:`TIMM`: timm's ``Attention`` and its relatives (``EvaAttention``): a module with a ``fused_attn`` switch and an
  ``attn_drop`` dropout. The fused path (``F.scaled_dot_product_attention``) never materialises the probabilities,
  so for the explained pass ``fused_attn`` is switched off and back after; the plain path's ``attn_drop`` gets the
  softmax output, which its forward hook records.
- :data:`HF`: a Hugging Face attention module (its class name ends in ``Attention``, it has a ``config``): for the
  pass its config's ``_attn_implementation`` is ``eager`` (it is ``sdpa`` by default), whose attention function
  returns the probabilities it multiplies the values with as the module's second output.
- :data:`MHA`: ``nn.MultiheadAttention`` (torchvision's ViT, open_clip's ViTs), which those models call with
  ``need_weights=False`` (the fused kernel). For the pass a pre-hook asks for ``need_weights=True,
  average_attn_weights=False``, the explicit softmax path; the weights it returns are a view of the probabilities
  the values were multiplied with, whose base is what is differentiated.

Windowed attention (Swin: timm's ``WindowAttention``, torchvision's ``ShiftedWindowAttention``, Hugging Face's
``SwinAttention``) attends within windows, never over the one token sequence the methods need: such a model is
refused with one line. So is a model with no attention module at all (a CNN), and TimeSformer's divided space-time
attention (a config's ``attention_type`` ``divided_space_time``): each block attends over time, then over space, and
rollout's product of one L x L matrix per layer, the formula for joint attention, does not hold for it.

Prefix tokens (class, distillation, register tokens) come from the model, never a guess: the loaded model's own
count (timm's ``num_prefix_tokens``, a Hugging Face model's token parameters, a CLIP tower's class embedding:
:mod:`gradcam_cli.models`), a bare module's ``num_prefix_tokens``, or torchvision's ``VisionTransformer``'s one class
token. The class token, where there is one, is token 0 (a parameter named ``cls_token``, ``class_token`` or
``class_embedding``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from torch import nn

from ...errors import UsageError
from ...options import ALL_METHODS
from .tokens import HEAD_FUSIONS

TIMM, HF, MHA = "timm", "hf", "mha"
"""How a site's probabilities are read (see the module's docstring)."""
CLASS_TOKEN_PARAMETERS = ("cls_token", "class_token", "class_embedding")
"""Names of the parameter that holds a class token (timm, torchvision, Hugging Face, open_clip and CLIP)."""


class Described(Protocol):
    """What discovery reads of a loaded model (:class:`~gradcam_cli.models.loading.LoadedModel`), without importing
    it: the module, its name for messages and its own count of prefix tokens."""

    @property
    def module(self) -> nn.Module: ...
    @property
    def name(self) -> str: ...
    @property
    def prefix_tokens(self) -> int | None: ...


@dataclass(frozen=True)
class AttentionSite:
    """One self-attention module: its dotted ``name``, the ``module``, how it is read (``kind``) and its heads."""

    name: str
    module: nn.Module
    kind: str
    heads: int


@dataclass(frozen=True)
class AttentionModel:
    """What the attention methods need of a model: its attention ``sites`` in the order they run (first layer
    first), its ``prefix`` tokens before the patches, whether token 0 is a ``class_token``, each site's
    ``blocks`` (the module holding it: a transformer block, which LeGrad skips to score an earlier layer), and how
    rollout and ``attention`` fuse its ``heads`` (:func:`with_heads`)."""

    sites: tuple[AttentionSite, ...]
    prefix: int
    class_token: bool
    blocks: tuple[nn.Module, ...] = ()
    heads: str = "mean"


HEADS_METHODS = ("rollout", "attention")
"""The methods whose heads ``--attention-heads`` fuses (attn-grad and LeGrad average theirs, as their papers do)."""


def with_heads(attention: AttentionModel | None, heads: str | None, methods: Sequence[str]) -> AttentionModel | None:
    """``attention`` with its heads fused as ``--attention-heads heads`` says (``None``: not given, the mean), or a
    one-line UsageError where no method of ``methods`` fuses heads or ``heads`` is no fusion."""
    if heads is None:
        return attention
    if heads not in HEAD_FUSIONS:
        raise UsageError(f"unknown --attention-heads {heads!r}; use {', '.join(HEAD_FUSIONS)}")
    if attention is None or not set(HEADS_METHODS) & set(methods):
        raise UsageError(f"--attention-heads is for --method {' or '.join(HEADS_METHODS)} on a transformer")
    return replace(attention, heads=heads)


def _windowed(module: nn.Module) -> bool:
    return hasattr(module, "window_size") or "window" in type(module).__name__.lower()


def _site(name: str, module: nn.Module) -> AttentionSite | None:
    if isinstance(module, nn.MultiheadAttention):
        return AttentionSite(name, module, MHA, module.num_heads)
    if _windowed(module):
        return None
    heads = getattr(module, "num_heads", None)
    if hasattr(module, "fused_attn") and isinstance(getattr(module, "attn_drop", None), nn.Module):
        return AttentionSite(name, module, TIMM, int(heads)) if isinstance(heads, int) else None
    config = getattr(module, "config", None)
    if type(module).__name__.endswith("Attention") and hasattr(config, "_attn_implementation"):
        heads = getattr(module, "num_attention_heads", None) or getattr(module, "num_heads", None)
        heads = heads or getattr(config, "num_attention_heads", None)
        return AttentionSite(name, module, HF, int(heads)) if isinstance(heads, int) else None
    return None


def attention_sites(model: nn.Module) -> tuple[AttentionSite, ...]:
    """Every self-attention module of ``model`` that the engine can read, in module order (the order a ViT's blocks
    run). A site inside another is left out (the outer one is read)."""
    sites: list[AttentionSite] = []
    for name, module in model.named_modules():
        if any(name.startswith(f"{site.name}.") for site in sites):
            continue
        site = _site(name, module)
        if site is not None:
            sites.append(site)
    return tuple(sites)


def windowed(model: nn.Module) -> bool:
    """Whether ``model`` attends within windows (Swin)."""
    return any(_windowed(module) and "attention" in type(module).__name__.lower() for module in model.modules())


def prefix_tokens(model: nn.Module, known: int | None) -> int | None:
    """The tokens before the patches: ``known`` (the loaded model's count), a module's ``num_prefix_tokens``, or
    torchvision's ViT's class token; ``None`` where the model does not say."""
    if known is not None:
        return known
    own = getattr(model, "num_prefix_tokens", None)
    if isinstance(own, int):
        return own
    if type(model).__name__ == "VisionTransformer" and isinstance(getattr(model, "class_token", None), nn.Parameter):
        return 1
    return None


def has_class_token(model: nn.Module) -> bool:
    """Whether token 0 is a class token: the model holds a parameter named as :data:`CLASS_TOKEN_PARAMETERS` say."""
    return any(name.rpartition(".")[2] in CLASS_TOKEN_PARAMETERS for name, _ in model.named_parameters())


def attention_model(model: nn.Module, name: str, known_prefix: int | None, method: str) -> AttentionModel:
    """:class:`AttentionModel` of ``model`` (called ``name`` in messages), or a one-line UsageError saying why
    ``--method method`` cannot explain it."""
    if windowed(model):
        raise UsageError(
            f"--method {method} needs global self-attention over one token sequence; {name} attends within windows "
            "(Swin); use a layer method such as gradcam"
        )
    if getattr(getattr(model, "config", None), "attention_type", None) == "divided_space_time":
        raise UsageError(
            f"--method {method} needs joint attention over one token sequence; {name} divides each block's "
            "attention into time then space (TimeSformer), for which the rollout formula does not hold; "
            "use a layer method such as gradcam"
        )
    sites = attention_sites(model)
    if not sites:
        raise UsageError(f"--method {method} is for transformers; {name} has no attention module it can read")
    prefix = prefix_tokens(model, known_prefix)
    if prefix is None:
        raise UsageError(
            f"--method {method} needs the model's count of prefix tokens; {name} does not give one "
            "(set num_prefix_tokens on it)"
        )
    blocks = tuple(model.get_submodule(site.name.rpartition(".")[0]) for site in sites)
    return AttentionModel(sites, prefix, has_class_token(model), blocks)


def reads_attention(model: Described) -> bool:
    """Whether the attention methods can explain ``model`` (what ``gradcam serve`` offers: a CNN or a Swin gets
    none of them)."""
    try:
        attention_model(model.module, model.name, model.prefix_tokens, "attention")
    except UsageError:
        return False
    return True


def head_settings(attention: AttentionModel | None, methods: Sequence[str]) -> dict[str, object]:
    """What a run record notes of the head fusion: ``attention_heads`` where a method of ``methods`` fuses heads."""
    if attention is None or not set(HEADS_METHODS) & set(methods):
        return {}
    return {"attention_heads": attention.heads}


def attention_for(
    model: Described, methods: Sequence[str], wanted: Sequence[str], asked: str | Sequence[str]
) -> tuple[AttentionModel | None, list[str], list[str]]:
    """The model's :class:`AttentionModel` where ``wanted`` (the attention methods among ``methods``) read it, the
    methods kept, and those left out: every attention method where ``--method all`` (in ``asked``, the methods as
    given) meets a model without global self-attention. A method asked for by name that cannot read the model is
    refused with one line."""
    if not wanted:
        return None, list(methods), []
    try:
        return attention_model(model.module, model.name, model.prefix_tokens, wanted[0]), list(methods), []
    except UsageError:
        if ALL_METHODS not in ([asked] if isinstance(asked, str) else asked):
            raise
    return None, [name for name in methods if name not in wanted], list(wanted)
