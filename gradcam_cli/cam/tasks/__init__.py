"""Task adapters (:mod:`.base`): one module per task, registered in :data:`TASKS` in this order (the first adapter
that claims a model explains it)."""

from . import answer, classify, detect, detr, segment, yolo  # noqa: F401  (each registers its adapter)
from .base import (
    TASKS,
    Explained,
    Pair,
    ScoreRequest,
    TaskAdapter,
    adapter_for,
    label_box_pairs,
    nothing_of,
    register_task,
    task_names,
)

__all__ = [
    "TASKS",
    "Explained",
    "Pair",
    "ScoreRequest",
    "TaskAdapter",
    "adapter_for",
    "label_box_pairs",
    "nothing_of",
    "register_task",
    "task_names",
]
