"""Your own models (``--model path/to/file.py:factory`` or ``package.module:factory``): the factory is called with
no arguments and returns an ``nn.Module``; its task is found from one forward pass (``--task`` overrides it). The
family asked after every family that claims a prefix, for any ``something:factory`` left."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from torch import nn

from ...errors import ModelLoadError, UsageError, describe, path_error, suggest
from ...io.images import InputSpec
from ...options import TASK_NAMES, ModelOptions
from ..profile import LoadedModel, ModelProfile
from ..tasks import CLASSIFY, infer_task
from ..weights import apply_state_dict, load_state_dict_file
from .base import Family, chosen_task


class Custom(Family):
    name = "custom"
    claim_order = 1
    counts_classes = True

    def claims(self, model: str) -> bool:
        return ":" in model and not _is_windows_drive(model)

    def load(self, options: ModelOptions, architecture_only: bool) -> LoadedModel:
        name = options.model
        module = _build(name, options.weights, architecture_only)
        spec = InputSpec()
        task = chosen_task(options, CLASSIFY) if options.task in TASK_NAMES else infer_task(module, spec, name)
        profile = ModelProfile(spec, None, task, size_known=False)  # a plugin's --task: load_model says it
        return LoadedModel(module, name, options.weights, profile=profile)


def _build(spec: str, weights: str, architecture_only: bool) -> nn.Module:
    target, _, factory_name = spec.rpartition(":")
    try:
        if target.endswith(".py"):
            path = Path(target)
            if not path.is_file():
                raise UsageError(f"model file {target} does not exist")
            module_name = f"_gradcam_user_{path.stem}"
            loader_spec = importlib.util.spec_from_file_location(module_name, path)
            assert loader_spec is not None and loader_spec.loader is not None
            code = importlib.util.module_from_spec(loader_spec)
            sys.modules[module_name] = code
            loader_spec.loader.exec_module(code)
        else:
            code = importlib.import_module(target)
    except UsageError:
        raise
    except ImportError as error:
        raise UsageError(f"cannot import {target!r}: {describe(error)}") from error
    except Exception as error:
        if path_error(error) is not None:  # a path too long to name: the command says so, exit 2
            raise
        raise ModelLoadError(f"importing {target} failed: {describe(error)}") from error
    factory = getattr(code, factory_name, None)
    if not callable(factory):
        public = [n for n in dir(code) if not n.startswith("_")]
        raise UsageError(f"{target} has no callable {factory_name!r}.{suggest(factory_name, public)}")
    try:
        module = factory()
    except Exception as error:
        raise ModelLoadError(f"{spec}() failed: {describe(error)}") from error
    if not isinstance(module, nn.Module):
        raise UsageError(f"{spec}() returned {type(module).__name__}, not a torch.nn.Module")
    if weights.upper() not in ("DEFAULT", "NONE") and not architecture_only:
        apply_state_dict(module, load_state_dict_file(weights), weights)
    return module


def _is_windows_drive(value: str) -> bool:
    return len(value) > 1 and value[1] == ":" and value[0].isalpha() and value.count(":") == 1
