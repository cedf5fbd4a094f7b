"""The DETR family of Hugging Face detectors (``--model hf:DIR`` whose configuration's ``model_type`` is DETR's,
Conditional DETR's, Deformable DETR's or RT-DETR's, v1 or v2): claimed before the ``hf`` family (:attr:`claim_order`
-1), loaded with ``AutoModelForObjectDetection`` and wrapped as a detector (:class:`~gradcam_cli.models.detr_net.
DetrNet`), explained by the ``detr`` task adapter (:mod:`gradcam_cli.cam.tasks.detr`). The image processor
(``preprocessor_config.json``) gives the input: DETR's shorter side and longest side (``shortest_edge``,
``longest_edge``: the aspect kept), RT-DETR's fixed size, and the normalisation; the default layer is the backbone's
last stage (:func:`~gradcam_cli.models.detr_net.last_stage`); ``id2label`` names the classes."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from ...errors import UsageError
from ...io.images import InputSpec
from ...options import ModelOptions
from ..detr_net import DETR_TASK, DETR_TYPES, DetrNet, last_stage
from ..hf_models import GENERIC_LABEL, hf_folder, input_spec, quiet_transformers
from ..hub import HF_PREFIX, missing_extra
from ..profile import LoadedModel, ModelProfile
from ..weights import apply_state_dict, load_state_dict_file
from .base import Family
from .vision_language import config_file

DETR_SIZE = (800, 1333)
"""DETR's image processor's default shorter and longest side, for a folder saved without one."""


def detr_model_type(model: str) -> str | None:
    """The ``model_type`` of ``hf:DIR`` (or of a hub id in the local cache) when it is a DETR-family detector's
    (:data:`~gradcam_cli.models.detr_net.DETR_TYPES`), else ``None``; read from ``config.json`` alone."""
    found = config_file(model)
    if found is None or not found.is_file():
        return None
    try:
        config = json.loads(found.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    kind = str(config.get("model_type", "")) if isinstance(config, dict) else ""
    return kind if kind in DETR_TYPES else None


def detr_spec(processor: Any, config: Any) -> InputSpec:
    """The image processor's input (:func:`~gradcam_cli.models.hf_models.input_spec`), its ``longest_edge`` kept
    as the longest side with the aspect (DETR's rule); without a processor, DETR's defaults."""
    if processor is None:
        return InputSpec(size=DETR_SIZE[0], max_side=DETR_SIZE[1], keep_aspect=True)
    spec = input_spec(processor, config)
    size = getattr(processor, "size", None)
    longest = size.get("longest_edge") if isinstance(size, dict) else getattr(size, "longest_edge", None)
    if spec.fixed_size is None and longest:
        return replace(spec, max_side=int(longest), keep_aspect=True)
    return spec


class HuggingFaceDetector(Family):
    name = "hf-detr"
    claim_order = -1

    def claims(self, model: str) -> bool:
        return model.startswith(HF_PREFIX) and detr_model_type(model) is not None

    def load(self, options: ModelOptions, architecture_only: bool) -> LoadedModel:
        """``hf:DIR`` with ``--weights`` DEFAULT (the folder's), none (random) or a state-dict file of the
        transformers model; ``--num-classes`` is refused (the head is the folder's) and ``--task`` may only say
        ``detect``."""
        model_type = detr_model_type(options.model) or "detr"
        if options.num_classes:
            raise UsageError(f"--num-classes does not apply to {options.model}: its class head is the folder's")
        if options.task not in (None, "detect", DETR_TASK):
            raise UsageError(f"{options.model} is a {model_type} detector; --task {options.task} does not apply")
        try:
            import transformers
        except ImportError as error:
            raise missing_extra(options.model, "hf") from error
        auto: Any = transformers  # its Auto classes are untyped
        own = options.weights.upper() == "DEFAULT" and not architecture_only
        folder = hf_folder(options.model, own)
        with quiet_transformers():
            config = _loaded(options.model, lambda: auto.AutoConfig.from_pretrained(folder))
            build = auto.AutoModelForObjectDetection
            detr = _loaded(options.model, lambda: build.from_pretrained(folder) if own else build.from_config(config))
            try:
                processor = auto.AutoImageProcessor.from_pretrained(folder)
            except Exception:  # no preprocessor_config.json: DETR's defaults (docs/tasks.md)
                processor = None
        if options.weights.lower() not in ("default", "none") and not architecture_only:
            apply_state_dict(detr, load_state_dict_file(options.weights), options.weights)
        labels = [str(config.id2label[i]) for i in range(config.num_labels)] if config.id2label else []
        categories = labels if labels and not all(GENERIC_LABEL.fullmatch(label) for label in labels) else None
        module = DetrNet(detr, model_type)
        profile = ModelProfile(
            detr_spec(processor, config),
            categories,
            DETR_TASK,
            detector=True,
            default_layers=(last_stage(detr),),
        )
        return LoadedModel(module, options.model, options.weights, profile=profile)


def _loaded(model: str, load: Any) -> Any:
    from ...errors import ModelLoadError, describe

    try:
        return load()
    except Exception as error:  # transformers raises many kinds for a broken folder
        raise ModelLoadError(f"transformers could not load {model}: {describe(error)}") from error
