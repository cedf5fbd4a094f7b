"""``python -m gradcam_cli`` runs the command-line tool."""

from .cli import main

main()
