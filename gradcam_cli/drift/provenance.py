"""How a run's maps were made: the ``provenance`` object of every row it writes, and ``--deterministic``.

The object names the versions (gradcam-cli, torch, torchvision, and each installed plugin's distribution), the model
and its weights (a file's sha256 too, computed once per file and run), the layers and methods, the task and what it
differentiates (a classifier's ``--score``; a detector's ``--score-threshold`` and ``--max-detections``; as the run
record has them), which classes were explained, the input size, the device, dtype and precision, the options that
change the maps, and whether PyTorch ran deterministically (and with which seed). docs/ci.md lists the fields.
"""

from __future__ import annotations

import functools
import hashlib
import os
import warnings
from importlib import metadata
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ..cam.explainer import Explainer
    from ..options import RunOptions

SEED = 0
"""The seed ``--deterministic`` sets (torch, Python's ``random``, NumPy)."""
_CHUNK = 1 << 20


def use_deterministic(seed: int = SEED) -> None:
    """``--deterministic``: seed every generator and make PyTorch choose deterministic algorithms. Call it before
    the model is built (a model with random weights then gets the same ones on every run). Operations that have no
    deterministic implementation (a few CUDA backward passes) still run, without a warning each time."""
    import random

    import numpy as np

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it to be deterministic
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)
    warnings.filterwarnings("ignore", message=".*does not have a deterministic implementation")


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 of a file, read once per version of the file (its path, size and modification time)."""
    stat = os.stat(path)
    return _sha256(os.path.realpath(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _sha256(path: str, _size: int, _mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def run_provenance(explainer: Explainer, run: RunOptions | None = None) -> dict[str, Any]:
    """The provenance of the maps ``explainer`` makes under ``run`` (its ``max_side``), as every row carries it."""
    from ..options import RunOptions

    model = explainer.model
    weights = model.weights
    sha256 = file_sha256(weights) if os.path.isfile(weights) else None
    spec = model.input_spec
    parameter = next(model.module.parameters(), None)
    return {
        **versions(),
        "model": model.name,
        "weights": weights,
        "weights_sha256": sha256,
        "layers": list(explainer.chosen.layers),
        "methods": list(explainer.chosen.methods),
        **explainer.settings,  # the task and its score's settings, as the run record has them
        "target_class": explainer.chosen.target,
        "top_k": explainer.chosen.top_k if explainer.chosen.target is None else 1,
        "input_size": list(spec.fixed_size) if spec.fixed_size else spec.size,
        "device": str(explainer.device),
        "dtype": str(parameter.dtype).removeprefix("torch.") if parameter is not None else None,
        "precision": explainer.chosen.precision,
        "aug_smooth": explainer.options.aug_smooth,
        "eigen_smooth": explainer.options.eigen_smooth,
        "max_side": (run or RunOptions()).max_side,
        **determinism(),
    }


def versions() -> dict[str, Any]:
    """The provenance's versions: gradcam-cli's, torch's, torchvision's and each plugin's."""
    from .. import __version__
    from ..registry import plugin_versions

    return {
        "gradcam_cli": __version__,
        "torch": torch.__version__,
        "torchvision": _version("torchvision"),
        "plugins": plugin_versions(),
    }


def determinism() -> dict[str, Any]:
    """The provenance's last fields: whether PyTorch ran deterministically, and with which seed."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    return {"deterministic": deterministic, "seed": torch.initial_seed() if deterministic else None}
