"""A toy task for the ``gradcam_cli.tasks`` entry point.

TODO(reg-tasks): register a task adapter here once the task registry (``gradcam_cli.cam.tasks``) lands on main;
until then importing this module registers nothing, whatever gradcam version imports it.
"""

from __future__ import annotations
