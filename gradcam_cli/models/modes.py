"""A model's modes and parameter flags: the one module that sets them (eval mode, ``requires_grad``) and saves and
restores them. It lies below :mod:`gradcam_cli.cam`, so that loading (the class count, the task, the batch-norm
folding's trace) runs its blank passes under it too; the hooks are :mod:`gradcam_cli.cam.engine`'s alone."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


def settle_loaded(module: nn.Module, device: torch.device | None = None) -> None:
    """A model the tool has just loaded for itself, once in the state every pass wants (eval, no parameter gradients,
    on ``device``; ``None``: where it is); a model passed in is left as found (:func:`model_state_preserved`)."""
    module.eval().requires_grad_(False).to(device)


@contextmanager
def model_state_preserved(model: nn.Module) -> Iterator[None]:
    """Put ``model`` in eval mode with frozen parameters; restore every module's mode and every flag on exit.

    Only what differs is changed, in and out: a model already in eval mode with frozen parameters, as
    :func:`settle_loaded` leaves it, costs one read of each flag per pass. A mode is restored as
    ``Module.__setattr__`` would store it, without its checks (a tenth of the time). The one place that saves and
    restores them: every pass of the engine, the dry pass, task and class-count inference and batch-norm folding's
    trace use it.
    """
    modules = list(model.modules())
    modes = [(module, module.training) for module in modules]
    # every module's own parameters: model.parameters() without its de-duplication, at half the cost (a shared
    # parameter is listed twice, with the same flag, and restored twice to it)
    flags = [(param, param.requires_grad) for m in modules for param in m._parameters.values() if param is not None]
    try:
        if any(training for _, training in modes):
            model.eval()
        for param, requires_grad in flags:
            if requires_grad:
                param.requires_grad_(False)
        yield
    finally:
        for module, training in modes:
            if module.training is not training:
                object.__setattr__(module, "training", training)
        for param, requires_grad in flags:
            if param.requires_grad is not requires_grad:
                param.requires_grad_(requires_grad)
