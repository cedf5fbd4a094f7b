"""gradcam-cli: see what a PyTorch vision classifier looks at.

The library API (importing it loads torch; the ``gradcam`` command's ``--help`` does not)::

    from gradcam_cli import Explainer, load_model, overlay
    explainer = Explainer(load_model("resnet50"), layers="layer4")
    result = explainer.explain("cat.jpg")
    overlay(result).save("cat_gradcam.png")

Where things live: ``cam/`` (hooks, methods, maps, layers, the Explainer), ``models/`` (loading models, weights,
labels, devices), ``io/`` (finding inputs, reading images and videos, file names, atomic writes, the manifest),
``render/`` (colours, encoding, panels, the gallery), ``pipeline/`` (batches, videos, resuming, whole runs),
``evaluation/`` (``gradcam eval``), ``cli/`` (the commands), and ``options.py`` (the typed options they share).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Explainer": "cam.explainer",
    "ImageExplanation": "cam.results",
    "Explanation": "cam.results",
    "Prediction": "cam.results",
    "LayerCapture": "cam.engine",
    "METHODS": "cam.methods",
    "CamMethod": "cam.methods",
    "register_method": "cam.methods",
    "gradcam": "cam.methods",
    "inspect_layers": "cam.layers",
    "default_layer": "cam.layers",
    "resolve_layer": "cam.layers",
    "normalise": "cam.maps",
    "to_image_maps": "cam.maps",
    "load_model": "models.loading",
    "LoadedModel": "models.profile",
    "ModelProfile": "models.profile",
    "available_models": "models.loading",
    "resolve_device": "models.devices",
    "load_image": "io.images",
    "InputSpec": "io.images",
    "discover": "io.discovery",
    "blend": "render.colour",
    "colormap_table": "render.colour",
    "overlay": "render.overlay",
    "BatchRunner": "pipeline.batch",
    "VideoRunner": "pipeline.video",
    "Session": "pipeline.session",
    "Record": "cam.records",
    "Evaluator": "evaluation.evaluate",
    "evaluate": "evaluation.choose",
    "EvalReport": "evaluation.report",
    "ModelOptions": "options",
    "ExplainOptions": "options",
    "OutputOptions": "options",
    "RunOptions": "options",
    "EvalOptions": "options",
    "DiffOptions": "options",
    "ImageFormat": "options",
    "GradcamError": "errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import library pieces on first use, so that ``import gradcam_cli.cli`` stays light."""
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'gradcam_cli' has no attribute {name!r}")
