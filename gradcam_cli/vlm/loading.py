"""Loading ``hf:DIR`` image-text-to-text models: the model, its processor (image processor, tokenizer, chat
template) and its family (:mod:`gradcam_cli.vlm.families`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ModelLoadError, UsageError, describe
from ..models.modes import settle_loaded
from .families import VlmFamily, family_of

HF_PREFIX = "hf:"
VLM_ARCHITECTURE_SUFFIX = "ForConditionalGeneration"


@dataclass
class LoadedVlm:
    """A vision-language model ready to explain: the module (eval mode, frozen), its processor and its family."""

    module: nn.Module
    processor: Any
    family: VlmFamily
    name: str

    @property
    def tokenizer(self) -> Any:
        """The processor's tokenizer."""
        return self.processor.tokenizer


def vlm_model_type(model: str) -> str | None:
    """The ``model_type`` of ``hf:DIR`` when its configuration is a vision-language model's (a ``text_config`` and a
    ``vision_config`` and no CLIP-style ``projection_dim``), else ``None``; read from ``config.json`` alone."""
    if not model.startswith(HF_PREFIX):
        return None
    config_file = Path(model[len(HF_PREFIX) :]) / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or "text_config" not in config or "vision_config" not in config:
        return None
    if "projection_dim" in config or str(config.get("model_type", "")) in ("clip", "siglip", "siglip2"):
        return None
    return str(config.get("model_type", "unknown"))


def load_vlm(model: str, device: torch.device, precision: str = "fp32") -> LoadedVlm:
    """Load ``hf:DIR`` (a folder written by ``save_pretrained``, with its processor) on ``device``; bf16/fp16 load
    the weights in that type (the score and maps are computed in float32)."""
    model_type = vlm_model_type(model)
    if model_type is None:
        raise UsageError(f"--prompt needs a vision-language model folder, hf:DIR (with config.json); not {model}")
    family = family_of(model_type, model)
    folder = model[len(HF_PREFIX) :]
    try:
        import transformers
    except ImportError as error:
        raise ModelLoadError(f"{model} needs transformers (pip install -e '.[hf]')") from error
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    auto: Any = transformers
    try:
        module: Any = auto.AutoModelForImageTextToText.from_pretrained(folder, dtype=dtype)
        processor = auto.AutoProcessor.from_pretrained(folder)
    except Exception as error:  # transformers raises many kinds for a broken folder
        raise ModelLoadError(f"cannot load {model}: {describe(error)}") from None
    settle_loaded(module, device)
    return LoadedVlm(module, processor, family, model)
