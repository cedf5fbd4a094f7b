"""``gradcam serve``: the explorer in the browser (:func:`create_app`, an ASGI app; docs/serve.md)."""

from .app import create_app
from .model import ModelService

__all__ = ["ModelService", "create_app"]
