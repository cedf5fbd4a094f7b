"""``gradcam --list-layers``: every layer of the model with its output shape, the default marked; for a
vision-language model, the layers before its language model (:mod:`gradcam_cli.cam.answer_layers`)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import EXIT_OK
from .lines import layer_line, layer_row

if TYPE_CHECKING:
    import torch

    from ..cam.layers import LayerInfo
    from ..options import ModelOptions
    from .reporting import Reporter

LEGEND = (
    "* default layer   + candidate (spatial output: N,C,H,W, channel-last N,H,W,C or ViT tokens N,L,C; "
    "more than one position)   xN: runs N times per forward (its last call is explained)   "
    "attention: read by rollout, attn-grad, attention and legrad"
)


def list_layers(reporter: Reporter, options: ModelOptions, inputs: list[str]) -> int:
    """The table (``--json``: a row a layer) of ``options``' model, its dry pass on the first of ``inputs``' images
    (a blank input without one)."""
    from ..cam.layers import layer_table
    from ..cam.tasks import adapter_for
    from ..io.discovery import discover
    from ..models.devices import resolve_device
    from ..models.families import family_of
    from ..models.loading import load_model

    images = discover(inputs) if inputs else []
    image = images[0].path if images else None
    device = resolve_device(options.device)
    if family_of(options.model).answers:  # a vision-language model: the layers before its language model
        return _answer_layers(reporter, options, image, device)
    loaded = load_model(options, architecture_only=True)  # the layers need no weights
    loaded.module.to(device)
    adapter = adapter_for(loaded)
    infos, chosen = layer_table(loaded, device, image, adapter.tokens, adapter.layer_scopes)
    return _emit(reporter, infos, chosen, LEGEND)


def _answer_layers(reporter: Reporter, options: ModelOptions, image: Path | None, device: torch.device) -> int:
    """A vision-language model's table: loaded for the ``answer`` task, one pass of ``image`` and a short prompt."""
    from ..cam.answer_layers import LEGEND as ANSWER_LEGEND
    from ..cam.answer_layers import answer_layer_table
    from ..cam.tasks.answer import ANSWER
    from ..io.images import load_image
    from ..models.loading import load_model
    from ..models.modes import settle_loaded

    loaded = load_model(replace(options, task=ANSWER.name))
    settle_loaded(loaded.module, device)
    infos, chosen = answer_layer_table(loaded, load_image(image) if image is not None else None)
    return _emit(reporter, infos, chosen, ANSWER_LEGEND)


def _emit(reporter: Reporter, infos: list[LayerInfo], chosen: str, legend: str) -> int:
    for info in infos:
        if reporter.as_json:
            reporter.emit(json.dumps({**layer_row(info), "default": info.name in chosen.split("+")}))
        else:
            reporter.emit(layer_line(info, chosen))
    if not reporter.as_json:
        reporter.emit("")
        reporter.emit(legend)
    return EXIT_OK
