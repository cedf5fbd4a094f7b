"""timm models, ``--model timm:NAME``: any timm classifier with its own preprocessing, prefix tokens and class names;
a model without a head (``num_classes`` 0: a feature extractor's weights) is an embedding model (docs/targets.md).

``NAME`` is what ``timm.create_model`` takes, with or without a pretrained tag (``resnet50``,
``vit_base_patch16_224.augreg2_in21k_ft_in1k``). Pretrained weights come from the Hugging Face cache (or torch
hub's, for the few timm weights kept at a URL), downloaded there only when missing; they are then handed to timm as
a local file, so that timm adapts them as usual and never goes to the network itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from PIL import Image
from torch import nn

from ..errors import GradcamError, ModelLoadError, UsageError, describe, suggest
from ..io.images import InputSpec
from .hub import TIMM_PREFIX, HubModel, HubUnavailable, check_num_classes, hub_file, missing_extra, not_cached
from .weights import apply_state_dict, load_state_dict_file

if TYPE_CHECKING:
    from timm.models import PretrainedCfg

HUB_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
"""The files timm publishes its weights as on the hub, in the order timm reads them."""


def load_timm(model: str, weights: str, num_classes: int | None, architecture_only: bool = False) -> HubModel:
    """Build ``timm:NAME`` with ``weights``: DEFAULT (the tag's pretrained weights), none (random) or a file.
    ``architecture_only``: the model the name and its tag describe, with random parameters (nothing downloaded or
    read)."""
    try:
        import timm
    except ImportError as error:
        raise missing_extra(model, "timm") from error
    name = model.removeprefix(TIMM_PREFIX)
    config = _pretrained_config(name)
    check_num_classes(model, weights, num_classes)
    options: dict[str, Any] = {"num_classes": num_classes} if num_classes is not None else {}
    try:
        if weights.upper() == "DEFAULT" and not architecture_only:
            path, custom = _pretrained_file(model, config)
            overlay = {"file": str(path), "custom_load": custom}
            module = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=overlay, **options)
        else:
            module = timm.create_model(name, pretrained=False, **options)
    except GradcamError:
        raise
    except Exception as error:
        raise ModelLoadError(f"timm could not build {model}: {describe(error)}") from error
    if weights.lower() not in ("default", "none") and not architecture_only:
        apply_state_dict(module, load_state_dict_file(_weights_path(name, weights)), weights)
    tag = _config_of(module).get("tag") if weights.upper() == "DEFAULT" else None
    described = describe_timm(module, tag or weights)
    described.embeds = getattr(module, "num_classes", None) == 0  # no head: its pooled features are an embedding
    return described


def describe_timm(module: nn.Module, weights: str = "none") -> HubModel:
    """What the tool needs to know about a timm model: its preprocessing (from its pretrained config; the input
    size of a fixed-size model from its patch embedding when it has one), its ImageNet class names when its head is
    ImageNet's, and its prefix-token count (``num_prefix_tokens``)."""
    from timm.data.config import resolve_model_data_config
    from timm.data.imagenet_info import ImageNetInfo, infer_imagenet_subset

    data = resolve_model_data_config(module)
    height, width = data["input_size"][1:]
    fixed = bool(_config_of(module).get("fixed_input_size"))
    patch_embed = getattr(module, "patch_embed", None)
    own_size = getattr(patch_embed, "img_size", None)
    if fixed and isinstance(own_size, tuple | list) and len(own_size) == 2:
        height, width = (int(side) for side in own_size)
    interpolation = str(data.get("interpolation", "bicubic"))
    spec = InputSpec(
        size=min(height, width),
        fixed_size=(height, width) if fixed else None,
        mean=_triple(data["mean"]),
        std=_triple(data["std"]),
        interpolation=interpolation if interpolation.upper() in Image.Resampling.__members__ else "bicubic",
    )
    classes = int(getattr(module, "num_classes", 0) or 0)
    categories = None
    subset = infer_imagenet_subset(module)
    label_names = _config_of(module).get("label_names")
    if subset is not None:
        descriptions = ImageNetInfo(subset).label_descriptions()
        categories = [str(text).split(",")[0].strip() for text in descriptions]
    elif label_names is not None:
        categories = [str(label) for label in label_names]
    if categories is not None and len(categories) != classes:
        categories = None
    prefix = getattr(module, "num_prefix_tokens", None)
    dynamic = bool(getattr(module, "dynamic_img_size", False))  # a ViT whose position embedding follows the grid
    return HubModel(module, weights, categories, spec, prefix if isinstance(prefix, int) else None, any_shape=dynamic)


def _config_of(module: nn.Module) -> dict[str, Any]:
    """A timm model's ``pretrained_cfg`` ({} for a module that has none)."""
    config = getattr(module, "pretrained_cfg", None)
    return config if isinstance(config, dict) else {}


def _triple(values: Any) -> tuple[float, float, float]:
    first, second, third = (float(value) for value in values)
    return first, second, third


def _pretrained_config(name: str) -> PretrainedCfg | None:
    """timm's pretrained config for ``name`` (None for an architecture without one); a UsageError with close
    matches for an unknown architecture or tag."""
    import timm
    from timm.models import get_pretrained_cfg, split_model_name_tag

    architecture, tag = split_model_name_tag(name)
    if not timm.is_model(architecture):
        hint = suggest(architecture, timm.list_models())
        raise UsageError(f"unknown timm model {architecture!r}.{hint} timm.list_models() lists them all.")
    try:
        return get_pretrained_cfg(name)
    except RuntimeError:
        tags = [full.partition(".")[2] for full in timm.list_pretrained(f"{architecture}.*")]
        known = f" Use one of: {', '.join(tags)}." if tags else f" {architecture} has no pretrained weights."
        raise UsageError(f"unknown tag {tag!r} for timm model {architecture}.{suggest(tag, tags)}{known}") from None


def _pretrained_file(model: str, config: PretrainedCfg | None) -> tuple[Path, bool]:
    """The cached (or downloaded) file of ``config``'s weights, and whether timm loads it with the model's own
    loader (an .npz) rather than as a state dict."""
    if config is None or not (config.hf_hub_id or config.url):
        raise UsageError(f"{model} has no pretrained weights in timm; pass --weights PATH or --weights none")
    what = f"the pretrained weights of {model}"
    if config.hf_hub_id:
        repo_id, _, revision = config.hf_hub_id.partition("@")
        names = (config.hf_hub_filename,) if config.hf_hub_filename else HUB_WEIGHTS
        try:
            path = hub_file(repo_id, names, revision or None)
        except HubUnavailable as error:
            raise not_cached(what, repo_id, str(error)) from error
        return path, bool(config.custom_load) and config.hf_hub_filename is not None
    return _url_file(what, str(config.url)), bool(config.custom_load)


def _url_file(what: str, url: str) -> Path:
    """torch hub's cached copy of ``url`` ($TORCH_HOME/hub/checkpoints), downloaded there when missing."""
    path = Path(torch.hub.get_dir()) / "checkpoints" / Path(url).name
    if not path.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.hub.download_url_to_file(url, str(path), progress=False)
        except Exception as error:
            raise ModelLoadError(
                f"{what} could not be found in torch's cache or downloaded ({describe(error)}); to work offline, "
                f"copy {path.name} into {path.parent} (or set TORCH_HOME), or pass --weights PATH or --weights none"
            ) from error
    return path


def _weights_path(name: str, weights: str) -> str:
    """``--weights`` as a file; a pretrained tag given there instead gets pointed to the model name."""
    import timm

    tags = [full.partition(".")[2] for full in timm.list_pretrained(f"{name.partition('.')[0]}.*")]
    if weights in tags and not Path(weights).exists():
        raise UsageError(
            f"timm chooses pretrained weights by the tag in the model name: use --model timm:{name.partition('.')[0]}"
            f".{weights} (--weights takes DEFAULT, none or a file)"
        )
    return weights
