"""What a vision-language model's own parts say about its tokens: the image placeholders it must never generate,
the ids that end an answer, and which modules are its language side (no layer there lies on the photo)."""

from __future__ import annotations

from typing import Any

from torch import nn


def language_modules(module: nn.Module) -> set[int]:
    """The ids of a vision-language model's language side: its decoder (transformers' ``get_decoder``, every module
    in it) and its input and output embeddings (``embed_tokens``, ``lm_head``): no layer there lies on the photo."""
    found: set[int] = set()
    for getter in ("get_decoder", "get_input_embeddings", "get_output_embeddings"):
        get = getattr(module, getter, None)
        part = get() if callable(get) else None
        if isinstance(part, nn.Module):
            found |= {id(inner) for inner in part.modules()}
    return found


def placeholder_ids(config: Any) -> list[int]:
    """The ids of the image (and video) placeholder tokens a model's configuration names."""
    names = ("image_token_index", "image_token_id", "video_token_id")
    return [int(value) for value in (getattr(config, name, None) for name in names) if isinstance(value, int)]


def stop_ids(module: Any, tokenizer: Any) -> set[int]:
    """The ids that end a generated answer: the generation config's end-of-sequence ids, the tokenizer's, padding."""
    ids: set[int] = set()
    for value in (
        getattr(module.generation_config, "eos_token_id", None),
        getattr(module.generation_config, "pad_token_id", None),
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
    ):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(int(v) for v in value)
    return ids
