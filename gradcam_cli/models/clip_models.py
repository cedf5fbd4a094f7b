"""CLIP-style models: an image tower that embeds images, and a text tower that embeds prompts in the same space.

- ``--model open_clip:ARCH`` (extra ``[clip]``): an open_clip architecture by name (``ViT-B-32``) or a model
  configuration file of open_clip's form (``tiny.json``: ``embed_dim``, ``vision_cfg``, ``text_cfg``), with
  ``--weights`` a checkpoint file (the whole model's state dict), ``none``, or one of open_clip's pretrained tags
  (``laion2b_s34b_b79k``, read from the Hugging Face cache, else downloaded into it).
- ``--model hf:FOLDER`` whose configuration is a Hugging Face ``CLIPModel`` or ``SiglipModel`` (see
  :mod:`gradcam_cli.models.hf_models`).

What is explained is the image tower, ``clip.visual`` (open_clip) or :class:`ImageEmbedder` (transformers): images
in, (N, D) image embeddings out. The text tower stays beside it as a :class:`TextTower`, which embeds the prompts
of ``text:`` targets (and of ``--labels``, a CLIP model's "classes") once per run. Both towers take the model's
whole preprocessing at a fixed size, as their position embeddings need.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import GradcamError, ModelLoadError, UsageError, describe, suggest
from ..io.images import InputSpec
from .hub import OPEN_CLIP_PREFIX, HubModel, HubUnavailable, hub_file, missing_extra, not_cached
from .text_tower import TextTower
from .weights import apply_state_dict, load_state_dict_file

OPEN_CLIP_WEIGHTS = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
"""The files open_clip publishes a pretrained tag's weights as on the Hugging Face hub, in the order it reads them."""
HF_CLIP_TYPES = ("clip", "siglip")
"""The Hugging Face ``model_type``s loaded as CLIP-style models (their ``CLIPModel``, ``SiglipModel``)."""


class ImageEmbedder(nn.Module):
    """A transformers CLIP or SigLIP model's image side as one module: pixels -> (N, D) image embeddings, the
    vision model's pooled output, projected where the model has a projection (CLIP's ``visual_projection``)."""

    def __init__(self, vision_model: nn.Module, visual_projection: nn.Module | None = None) -> None:
        super().__init__()
        self.vision_model = vision_model
        self.visual_projection = visual_projection

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        pooled: torch.Tensor = self.vision_model(pixel_values=pixel_values).pooler_output
        return self.visual_projection(pooled) if self.visual_projection is not None else pooled


def hf_clip(model: Any, folder: str, spec: InputSpec, weights: str) -> HubModel:
    """A loaded transformers ``CLIPModel`` or ``SiglipModel`` as an image tower and a :class:`TextTower`, with the
    folder's tokenizer (SigLIP's prompts are padded to its full length, as it was trained). A folder without
    tokenizer files still explains images (``similar:``); prompts are refused with a ModelLoadError."""
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder)
    except Exception as error:
        raise ModelLoadError(f"the tokenizer in {folder} could not be loaded: {describe(error)}") from error
    siglip = model.config.model_type != "clip"
    padding: bool | str = "max_length" if siglip else True
    length = getattr(model.config.text_config, "max_position_embeddings", None)

    keys = ("input_ids",) if siglip else ("input_ids", "attention_mask")

    words = set(tokenizer.get_vocab()) - set(tokenizer.all_special_tokens)

    def tokenize(prompts: list[str]) -> Mapping[str, torch.Tensor]:
        if not words:  # no tokenizer files: transformers builds one that reads every word as the same unknown id
            raise ModelLoadError(
                f"{folder} has no tokenizer (vocab.json and merges.txt, or tokenizer.json): its text tower cannot "
                "read prompts; save the model's tokenizer into the folder (tokenizer.save_pretrained)"
            )
        tokens = tokenizer(prompts, padding=padding, truncation=True, max_length=length, return_tensors="pt")
        return {key: tokens[key] for key in keys if key in tokens}

    bias = getattr(model, "logit_bias", None)
    text = TextTower(
        model,
        tokenize,
        model.get_text_features,
        float(model.logit_scale.detach().exp()),
        float(bias.detach().reshape(-1)[0]) if isinstance(bias, torch.Tensor) else None,
    )
    embedder = ImageEmbedder(model.vision_model, getattr(model, "visual_projection", None))
    height, width = (int(model.config.vision_config.image_size),) * 2
    spec = InputSpec(
        size=height, fixed_size=(height, width), mean=spec.mean, std=spec.std, interpolation=spec.interpolation
    )
    return HubModel(embedder, weights, None, spec, _prefix(embedder), embeds=True, text=text)


def _prefix(module: nn.Module) -> int:
    """The class token before the patch tokens of a CLIP ViT (SigLIP has none: it pools with attention)."""
    return int(
        any(name.rpartition(".")[2] in ("class_embedding", "cls_token") for name, _ in module.named_parameters())
    )


def load_open_clip(model: str, weights: str, architecture_only: bool = False) -> HubModel:
    """Build ``open_clip:ARCH`` (a name or a configuration file) with ``weights``: a checkpoint file, ``none``
    (random), or a pretrained tag of the architecture. ``architecture_only``: random parameters, nothing read."""
    try:
        import open_clip
    except ImportError as error:
        raise missing_extra(model, "clip") from error
    name = _architecture(open_clip, model)
    tags = [str(tag) for tag in open_clip.list_pretrained_tags_by_model(name)]
    tag = weights if weights in tags else None
    if weights.upper() == "DEFAULT":
        known = f" or a pretrained tag: {', '.join(tags)}" if tags else ""
        raise UsageError(f"{model} takes --weights FILE (a checkpoint of the whole model), none{known}")
    if tag is None and weights.lower() != "none" and not Path(weights).exists():
        hint = suggest(weights, tags)
        raise UsageError(f"--weights {weights} is neither a file nor a pretrained tag of {name}.{hint}")
    config = open_clip.get_pretrained_cfg(name, tag) if tag else {}
    with _quiet_open_clip():
        try:
            clip = open_clip.create_model(name, pretrained=None, force_quick_gelu=bool(config.get("quick_gelu")))
            tokenizer = open_clip.get_tokenizer(name)
        except Exception as error:
            raise ModelLoadError(f"open_clip could not build {model}: {describe(error)}") from error
    if not architecture_only and weights.lower() != "none":
        path = _tag_file(model, config) if tag else Path(weights)
        apply_state_dict(clip, load_state_dict_file(path), path)
    clip.eval()
    preprocess = {**open_clip.get_model_preprocess_cfg(clip), **{k: config[k] for k in ("mean", "std") if k in config}}
    size = preprocess.get("size", 224)
    height, width = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
    spec = InputSpec(
        size=min(height, width),
        fixed_size=(height, width),
        mean=_triple(preprocess.get("mean", InputSpec.mean)),
        std=_triple(preprocess.get("std", InputSpec.std)),
        interpolation=str(preprocess.get("interpolation", "bicubic")),
    )
    bias = getattr(clip, "logit_bias", None)
    text = TextTower(
        clip,
        lambda prompts: {"text": tokenizer(prompts)},
        clip.encode_text,
        float(clip.logit_scale.detach().exp()),
        float(bias.detach().reshape(-1)[0]) if isinstance(bias, torch.Tensor) else None,
    )
    visual: nn.Module = clip.visual
    return HubModel(visual, tag or weights, None, spec, _prefix(visual) or None, embeds=True, text=text)


def _architecture(open_clip: Any, model: str) -> str:
    """The open_clip architecture ``open_clip:ARCH`` names: one of ``open_clip.list_models()``, or a configuration
    file registered under its stem."""
    arch = model.removeprefix(OPEN_CLIP_PREFIX)
    path = Path(arch)
    if path.suffix.lower() == ".json":
        if not path.is_file():
            raise UsageError(f"open_clip model configuration {arch} does not exist")
        open_clip.add_model_config(path)
        if path.stem not in open_clip.list_models():
            raise UsageError(f"{arch} is not an open_clip model configuration (embed_dim, vision_cfg, text_cfg)")
        return path.stem
    names = open_clip.list_models()
    if arch not in names:
        raise UsageError(
            f"unknown open_clip architecture {arch!r}.{suggest(arch, names)} open_clip.list_models() lists them."
        )
    return arch


def _tag_file(model: str, config: Mapping[str, Any]) -> Path:
    """The cached (else downloaded) weights of a pretrained tag, from the Hugging Face hub."""
    repo = str(config.get("hf_hub", "")).strip("/")
    if not repo:
        raise ModelLoadError(
            f"the weights of {model} are not on the Hugging Face hub; download them and pass --weights FILE"
        )
    names = (config["hf_hub_filename"],) if config.get("hf_hub_filename") else OPEN_CLIP_WEIGHTS
    try:
        return hub_file(repo, names)
    except HubUnavailable as error:
        raise not_cached(f"the pretrained weights of {model}", repo, str(error), "or pass --weights FILE") from error
    except GradcamError:
        raise


def _triple(values: Any) -> tuple[float, float, float]:
    first, second, third = (float(value) for value in values)
    return first, second, third


@contextmanager
def _quiet_open_clip() -> Iterator[None]:
    """No log lines from open_clip while it builds ("No pretrained weights loaded"): stderr is the tool's."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)
