"""``python -m gradcam_cli`` runs the command-line tool."""

from .cli import entry_point

entry_point()
