"""Vision-language models (``--model hf:DIR`` whose configuration is an image-text-to-text model's): asked a
``--prompt``, their answer is explained (docs/vlm.md, :mod:`gradcam_cli.vlm`). The family claims such folders
before the ``hf`` family (:attr:`claim_order` -1) and loads them for the ``answer`` task
(``ModelOptions(task="answer")``) into a :class:`~gradcam_cli.models.profile.LoadedModel` whose profile carries the
processor and the family's token layout (:data:`LAYOUTS`); without ``--prompt`` there is nothing to explain, and
loading one as an image model says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ...errors import GradcamError, ModelLoadError, UsageError, describe
from ...options import ModelOptions
from .. import token_layouts as layouts
from ..hf_models import HUB_ID, config_type, hf_folder, quiet_transformers
from ..profile import LoadedModel, ModelProfile
from ..token_layouts import TokenLayout
from .base import Family

HF_PREFIX = "hf:"
ANSWER_TASK = "answer"
"""The task adapter (:mod:`gradcam_cli.cam.tasks.answer`) its models are loaded for."""

_PROJECTOR = "the multi-modal projector: "
_MERGER = "the vision merger: 2 x 2 merged patch tokens as the language model receives them"
LLAVA = TokenLayout(
    "llava",
    "model.multi_modal_projector",
    _PROJECTOR + "the vision tower's patch tokens as the language model receives them",
    layouts.llava_tiles,
)
LLAVA_NEXT = TokenLayout(
    "llava-next",
    "model.multi_modal_projector",
    _PROJECTOR + "each frame's patch tokens (the whole photo, then its tiles) as the language model receives them",
    layouts.llava_next_tiles,
)
QWEN2_VL = TokenLayout(
    "qwen2-vl", "model.visual.merger", _MERGER, layouts.qwen2_vl_tiles, video=layouts.qwen2_vl_video_grid
)
QWEN2_5_VL = TokenLayout(
    "qwen2.5-vl",
    "model.visual.merger",
    _MERGER + ", in window order",
    layouts.qwen2_vl_tiles,
    layouts.qwen2_5_vl_order,
    layouts.qwen2_vl_video_grid,
)
IDEFICS3 = TokenLayout(
    "idefics3",
    "model.connector",
    "the connector: each tile's pixel-shuffled patch tokens as the language model receives them",
    layouts.idefics3_tiles,
)
LAYOUTS = {
    "llava": LLAVA,
    "llava_next": LLAVA_NEXT,
    "qwen2_vl": QWEN2_VL,
    "qwen2_5_vl": QWEN2_5_VL,
    "idefics3": IDEFICS3,
    "smolvlm": IDEFICS3,
}
"""Each supported ``model_type`` and its token layout."""
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
"""The files a saved processor keeps its image processor in (transformers 5, earlier versions)."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model", "tekken.json")
"""The files a saved tokenizer keeps its vocabulary in, one of which a processor needs."""


def vlm_model_type(model: str) -> str | None:
    """The ``model_type`` of ``hf:DIR`` (or of a hub id in the local cache) when its configuration is a
    vision-language model's (a ``text_config`` and a ``vision_config`` and no CLIP-style ``projection_dim``), else
    ``None``; read from ``config.json`` alone, never downloaded."""
    found = config_file(model)
    if found is None:
        return None
    try:
        config = json.loads(found.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or "text_config" not in config or "vision_config" not in config:
        return None
    if "projection_dim" in config or str(config.get("model_type", "")) in ("clip", "siglip", "siglip2"):
        return None
    return str(config.get("model_type", "unknown"))


def config_file(model: str) -> Path | None:
    """``hf:DIR``'s ``config.json``, or a hub id's in the local cache (no look-up on the network); else ``None``."""
    if not model.startswith(HF_PREFIX):
        return None
    target = model[len(HF_PREFIX) :]
    path = Path(target).expanduser()
    if path.is_dir():
        return path / "config.json"
    if path.exists() or not HUB_ID.fullmatch(target):
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    cached = try_to_load_from_cache(target, "config.json")
    return Path(cached) if isinstance(cached, str) else None


def not_answering(model: str, family: str, asked: str = "--prompt") -> GradcamError:
    """Why ``asked`` (``--prompt`` or ``--prompts``) cannot ask ``model`` (of the family named ``family``): for
    ``hf:PATH``, what loading it without ``--prompt`` would say is wrong with it (no such folder, no
    ``config.json``...), else its model type."""
    kind = f"a {family}"
    if model.startswith(HF_PREFIX):
        kind = f"a {config_type(model)}"  # raises the folder's or the hub id's own problem first
    return UsageError(f"{asked} asks a vision-language model (hf:DIR: docs/vlm.md); {model} is {kind} model")


def check_processor(model: str, folder: str) -> None:
    """A :class:`ModelLoadError` in one sentence when ``folder`` lacks the processor's image processor or tokenizer
    files (transformers would answer with its hub advice)."""
    path = Path(folder)
    missing = [
        what
        for what, names in (
            ("image processor (processor_config.json or preprocessor_config.json)", PROCESSOR_FILES),
            ("tokenizer files (tokenizer.json, tokenizer.model or vocab.json)", TOKENIZER_FILES),
        )
        if not any((path / name).is_file() for name in names)
    ]
    if missing:
        raise ModelLoadError(
            f"{model} has no {' and no '.join(missing)}; save the model's processor there too, with "
            "processor.save_pretrained(FOLDER)"
        )


def layout_of(model_type: str, name: str) -> TokenLayout:
    """The layout of a configuration's ``model_type``; a :class:`UsageError` naming the supported ones."""
    if model_type in LAYOUTS:
        return LAYOUTS[model_type]
    raise UsageError(f"{name} is a {model_type} vision-language model; supported families: {', '.join(LAYOUTS)}")


class VisionLanguage(Family):
    name = "vision-language"
    claim_order = -1
    answers = True

    def claims(self, model: str) -> bool:
        return vlm_model_type(model) is not None

    def load(self, options: ModelOptions, architecture_only: bool) -> LoadedModel:
        """``hf:DIR`` (a folder written by ``save_pretrained``, with its processor) for the ``answer`` task, on the
        CPU; ``--precision bf16``/``fp16`` load the weights in that type (the score and maps are float32)."""
        model_type = vlm_model_type(options.model) or "unknown"
        layout = layout_of(model_type, options.model)  # an unsupported family is refused first, naming the others
        if options.task != ANSWER_TASK:
            raise UsageError(
                f"{options.model} is a {model_type} vision-language model; ask it about the image with --prompt TEXT"
            )
        try:
            import transformers
        except ImportError as error:
            raise ModelLoadError(f"{options.model} needs transformers (pip install -e '.[hf]')") from error
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(options.precision, torch.float32)
        auto: Any = transformers
        folder = hf_folder(options.model)  # a hub id: its cached snapshot
        check_processor(options.model, folder)
        try:
            with quiet_transformers():  # no "Loading weights" bar: the command shows its own progress
                module: Any = auto.AutoModelForImageTextToText.from_pretrained(folder, dtype=dtype)
                processor = auto.AutoProcessor.from_pretrained(folder)
        except Exception as error:  # transformers raises many kinds for a broken folder
            raise ModelLoadError(f"cannot load {options.model}: {describe(error)}") from None
        profile = ModelProfile(
            task=ANSWER_TASK,
            default_layers=(layout.default_layer,),
            size_known=False,
            processor=processor,
            layout=layout,
        )
        return LoadedModel(module, options.model, options.model, profile=profile)
