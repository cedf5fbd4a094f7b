"""What timm and Hugging Face models share: the optional extras they need, the Hugging Face Hub's local cache (read
first, so that cached weights never need the network), and what a loader hands back.

Offline, the hub itself retries a failed look-up for about 20 seconds, printing a warning each time; here a single
look-up (:func:`check_reachable`) decides first whether a download can work at all, and with ``HF_HUB_OFFLINE=1``
nothing is looked up.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from torch import nn

from ..errors import ModelLoadError, UsageError, describe
from ..io.images import InputSpec

if TYPE_CHECKING:
    from .clip_spec import ClipSpec
    from .text_tower import TextTower

TIMM_PREFIX = "timm:"
HF_PREFIX = "hf:"
OPEN_CLIP_PREFIX = "open_clip:"
PASS_INSTEAD = "or pass --weights PATH or --weights none"


@dataclass
class HubModel:
    """A model built by timm or transformers, with what the tool needs to know about it."""

    module: nn.Module
    weights: str
    categories: list[str] | None
    input_spec: InputSpec
    prefix_tokens: int | None
    """Leading non-spatial tokens of its token sequences (class, distillation, register), as the model declares."""
    embeds: bool = False
    """Its output is an embedding, not class scores (timm's ``num_classes=0``, a transformers base model, a CLIP
    image tower)."""
    text: TextTower | None = None
    """A CLIP-style model's text tower (:mod:`gradcam_cli.models.clip_models`)."""
    any_shape: bool = False
    """It takes any height and width besides its fixed size
    (:attr:`~gradcam_cli.models.profile.ModelProfile.any_shape`)."""
    clip: ClipSpec | None = None
    """A video model's clips (:mod:`gradcam_cli.models.hf_video`)."""


class HubUnavailable(Exception):
    """A file is neither in the local cache nor downloadable; the message says why, in a few words."""


def missing_extra(model: str, extra: str) -> UsageError:
    """The one-line error for a model whose library, the optional ``extra`` (``timm``, ``hf``, ``clip``), is not
    installed."""
    return UsageError(f"--model {model} needs the optional extra: pip install 'gradcam-cli[{extra}]'")


def cache_dir() -> Path:
    """Where the hub keeps its downloads: ``$HF_HOME/hub`` (``~/.cache/huggingface/hub``) or ``$HF_HUB_CACHE``."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def hub_file(repo_id: str, filenames: Sequence[str], revision: str | None = None) -> Path:
    """The first of ``filenames`` found in ``repo_id``'s local cache, else the first that can be downloaded into it.

    Raises :class:`HubUnavailable` when none is cached and none can be downloaded (offline, no such repository).
    """
    import huggingface_hub
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    for filename in filenames:
        try:
            return Path(huggingface_hub.hf_hub_download(repo_id, filename, revision=revision, local_files_only=True))
        except LocalEntryNotFoundError:
            continue
    check_reachable(repo_id, filenames[0], revision)
    for filename in filenames:
        try:
            return Path(huggingface_hub.hf_hub_download(repo_id, filename, revision=revision))
        except EntryNotFoundError as error:
            if isinstance(error, LocalEntryNotFoundError):
                raise HubUnavailable(describe(error)) from error
            continue  # not in the repository: try the next name
        except Exception as error:
            raise HubUnavailable(describe(error)) from error
    raise HubUnavailable(f"{repo_id} has none of {', '.join(filenames)}")


def hub_snapshot(repo_id: str) -> Path:
    """The local folder of ``repo_id``'s configuration files and weights (safetensors, else PyTorch's .bin files),
    from the cache, else downloaded into it. Raises :class:`HubUnavailable` as :func:`hub_file` does."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(huggingface_hub.snapshot_download(repo_id, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    check_reachable(repo_id, "config.json")
    try:
        folder = Path(huggingface_hub.snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors"]))
        if not any(folder.glob("*.safetensors")):
            folder = Path(huggingface_hub.snapshot_download(repo_id, allow_patterns=["*.json", "pytorch_model*.bin"]))
    except Exception as error:
        raise HubUnavailable(describe(error)) from error
    return folder


def hub_configuration(repo_id: str) -> Path:
    """The local folder of ``repo_id``'s configuration files alone, no weights: ``config.json`` and, when the
    repository has one, ``preprocessor_config.json``; from the cache, else downloaded into it. Raises
    :class:`HubUnavailable` as :func:`hub_file` does when ``config.json`` cannot be had."""
    folder = hub_file(repo_id, ("config.json",)).parent
    with suppress(HubUnavailable):  # none, or not to be had: the defaults apply, as for a folder without one
        hub_file(repo_id, ("preprocessor_config.json",))
    return folder


def check_reachable(repo_id: str, filename: str, revision: str | None = None) -> None:
    """:class:`HubUnavailable` unless one look-up of ``filename`` in ``repo_id`` reaches the hub (a file missing
    from the repository still counts: the hub answered). Never retries; nothing at all with ``HF_HUB_OFFLINE=1``."""
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError, RepositoryNotFoundError

    if constants.HF_HUB_OFFLINE:
        raise HubUnavailable("HF_HUB_OFFLINE is set")
    try:
        huggingface_hub.get_hf_file_metadata(huggingface_hub.hf_hub_url(repo_id, filename, revision=revision))
    except EntryNotFoundError as error:
        if isinstance(error, LocalEntryNotFoundError):
            raise HubUnavailable(describe(error)) from error
    except RepositoryNotFoundError as error:
        raise HubUnavailable(f"the hub has no model {repo_id}, or it is private or gated") from error
    except Exception as error:
        raise HubUnavailable(describe(error)) from error


def not_cached(what: str, repo_id: str, reason: str, instead: str = PASS_INSTEAD) -> ModelLoadError:
    """One sentence: ``what`` is neither cached nor downloadable, and how to supply it offline (``instead``: what
    else to pass that needs no download)."""
    return ModelLoadError(
        f"{what} could not be found in the Hugging Face cache or downloaded ({reason}); to work offline, copy the "
        f"cached {repo_id} from a machine where it ran into {cache_dir()} (or set HF_HOME), {instead}"
    )


def check_num_classes(model: str, weights: str, num_classes: int | None) -> None:
    """``--num-classes`` replaces the head, so it goes with ``--weights PATH`` or ``none``, not the model's own."""
    if num_classes and weights.upper() == "DEFAULT":
        raise UsageError(f"--num-classes needs --weights PATH or none ({model}'s own weights fix the class count)")
