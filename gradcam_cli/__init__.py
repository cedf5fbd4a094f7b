"""gradcam-cli: see what a PyTorch vision classifier looks at.

The library API (importing it loads torch; the ``gradcam`` command's ``--help`` does not)::

    from gradcam_cli import Explainer, load_model
    explainer = Explainer(load_model("resnet50"), layers="layer4")
    result = explainer.explain("cat.jpg")
    result.overlay().save("cat_gradcam.png")
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Explainer": "explain",
    "ImageExplanation": "explain",
    "Explanation": "explain",
    "Prediction": "explain",
    "LayerCapture": "engine",
    "METHODS": "methods",
    "gradcam": "methods",
    "load_model": "models",
    "LoadedModel": "models",
    "available_models": "models",
    "inspect_layers": "layers",
    "default_layer": "layers",
    "resolve_layer": "layers",
    "load_image": "images",
    "InputSpec": "images",
    "normalise": "maps",
    "to_image_maps": "maps",
    "blend": "render",
    "colormap_table": "render",
    "discover": "discovery",
    "BatchRunner": "batch",
    "RunOptions": "batch",
    "resolve_device": "devices",
    "GradcamError": "errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import library pieces on first use, so that ``import gradcam_cli.cli`` stays light."""
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'gradcam_cli' has no attribute {name!r}")
