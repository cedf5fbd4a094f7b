"""Every file name gradcam writes, in one place: per-image outputs (mirroring the input tree under the output
directory, ``InputImage.output_stem``), videos, gallery thumbnails, and the per-run files (gallery page, run record,
locks). The names are listed for users in docs/outputs.md ("File names"), which is their one description.

The heatmap's ``heatmap-`` prefix keeps it out of the ``<stem>_<method>_*`` pattern that ``--skip-existing`` counts
overlays by.
"""

from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path

from .discovery import InputImage

INDEX_NAME = "index.html"
"""The ``--report`` gallery page."""
THUMB_DIR = "_thumbs"
"""The gallery's thumbnails, mirrored under this folder of the output directory."""
RUN_RECORD_NAME = ".gradcam-run.json"
"""What made the outputs in a folder (model, layers, geometry): checked by ``--skip-existing``."""
LOCK_NAME = ".gradcam.lock"
"""Held by the run writing into a folder, so that a second run cannot write there at the same time."""
MANIFEST_NAME = "manifest.jsonl"
"""A sharded run's manifest when ``--manifest`` is not given (each shard writes its own, named by
:func:`shard_manifest_path`)."""
COMBINED_TAIL = "boxes"
"""How a detector's combined map is named (``<stem>_<method>_boxes``, also its video)."""
SHARD_FILE = re.compile(r"\.gradcam-shard-(\d+)-of-(\d+)\.json")
"""The shard record of shard K of N, ``.gradcam-shard-K-of-N.json``: what ``gradcam merge`` reads."""
TARGET_TAIL = re.compile(r"\d+-[a-z0-9+-]+")
"""The ``<class index>-<class slug>`` part that ends a per-explanation file's stem."""


def slug(text: str, limit: int = 40) -> str:
    """A file-name-safe lower-case version of a name: 'Egyptian cat' -> 'egyptian-cat', 'gradcam++' stays.

    ``+`` is kept so that method names such as ``gradcam`` and ``gradcam++`` never share a file name.
    """
    cleaned = re.sub(r"[^a-z0-9+]+", "-", text.lower()).strip("-")
    return cleaned[:limit].rstrip("-") or "class"


def output_path(
    output_dir: Path, image: InputImage, method: str, class_index: int, class_name: str, suffix: str
) -> Path:
    """``<output_dir>/<relative dir>/<stem>_<method>_<class index>-<class slug><suffix>``.

    For example ``gradcam_out/chelsea_gradcam_285-egyptian-cat.jpg`` and, with ``--save-raw``, the same name
    ending in ``.npy``.
    """
    stem = image.output_stem
    name = f"{stem.name}_{slug(method)}_{class_index}-{slug(class_name)}{suffix}"
    return output_dir / stem.parent / name


def answer_path(output_dir: Path, image: InputImage, method: str, label: str, suffix: str) -> Path:
    """A vision-language answer's map: ``<stem>_<method>_<label slug><suffix>``, the label being ``answer``,
    ``token 2: cat`` (``token2-cat``), ``answer:cat`` or a contrast's ``a cat - a dog``."""
    stem = image.output_stem
    return output_dir / stem.parent / f"{answer_name(stem.name, method, label)}{suffix}"


def answer_name(stem: str, method: str, label: str) -> str:
    """:func:`answer_path`'s file name without its suffix (``photo_gradcam_token2-cat``)."""
    return f"{stem}_{slug(method)}_{slug(label.replace('token ', 'token'))}"


def detection_path(
    output_dir: Path, image: InputImage, method: str, rank: int, class_index: int, class_name: str, suffix: str
) -> Path:
    """A detector's overlay: ``<stem>_<method>_box<rank>_<class index>-<class slug><suffix>`` for detection
    ``rank`` (1 = highest score), ``<stem>_<method>_boxes<suffix>`` for the combined map of all (``rank`` 0).

    ``street_gradcam_box1_1-person.png``, ``street_gradcam_boxes.png``; with ``--save-raw`` the same names ending
    in ``.npy``, with ``--save-heatmap`` ``heatmap-<method>`` in place of the method.
    """
    stem = image.output_stem
    if rank == 0:
        return output_dir / stem.parent / f"{stem.name}_{slug(method)}_{COMBINED_TAIL}{suffix}"
    name = f"{stem.name}_{slug(method)}_box{rank}_{class_index}-{slug(class_name)}{suffix}"
    return output_dir / stem.parent / name


def output_kind(path: str) -> str:
    """What a file a row lists is, by the name this module gave it, as the gallery links it: ``raw map``,
    ``video``, ``panel``, ``heatmap``, ``all detections`` (a detector's combined map, :func:`detection_path`'s
    rank 0), ``importance over time`` (a video model's plot, :func:`clip_curve_path`), ``NIfTI map`` and
    ``montage`` (a scan's, :func:`volume_paths`) or ``file``."""
    name = os.path.basename(path).lower()
    suffix = os.path.splitext(name)[1]
    if suffix == ".npy":
        return "raw map"
    if suffix in (".mp4", ".avi", ".mov", ".mkv", ".webm"):
        return "video"
    if "_panel." in name:
        return "panel"
    if "_heatmap-" in name:
        return "heatmap"
    if name.endswith(f"_{COMBINED_TAIL}{suffix}"):
        return "all detections"
    if name.endswith(CURVE_TAIL):
        return "importance over time"
    if name.endswith((".nii", ".nii.gz")):
        return "NIfTI map"
    if name.endswith(MONTAGE_TAIL):
        return "montage"
    return "file"


def heatmap_path(
    output_dir: Path, image: InputImage, method: str, class_index: int, class_name: str, suffix: str
) -> Path:
    """``<stem>_heatmap-<method>_<class index>-<class slug><suffix>``: the ``--save-heatmap`` file."""
    return output_path(output_dir, image, f"heatmap-{method}", class_index, class_name, suffix)


def panel_path(output_dir: Path, image: InputImage, suffix: str) -> Path:
    """``<output_dir>/<relative dir>/<stem>_panel<suffix>``, beside the image's overlays."""
    stem = image.output_stem
    return output_dir / stem.parent / f"{stem.name}_panel{suffix}"


def video_output_path(output_dir: Path, video: InputImage, method: str, label: str) -> Path:
    """``<output_dir>/<relative dir>/<stem>_<method>_<label>.mp4``; label is ``top1`` or ``<index>-<class slug>``."""
    stem = video.output_stem
    return output_dir / stem.parent / f"{stem.name}_{slug(method)}_{label}.mp4"


def answer_video_path(output_dir: Path, video: InputImage, method: str, label: str) -> Path:
    """A vision-language answer's overlay video about ``video``: ``<stem>_<method>_<label slug>.mp4``, labelled as
    :func:`answer_path` labels an image's (``answer``, ``token2-cat``...)."""
    stem = video.output_stem
    return output_dir / stem.parent / f"{answer_name(stem.name, method, label)}.mp4"


CURVE_TAIL = "_curve.png"
"""How a video model's temporal importance plot's name ends."""


def clip_curve_path(video_output: Path) -> Path:
    """A video model's temporal importance plot beside its overlay video: ``<stem>_<method>_<label>_curve.png``."""
    return video_output.with_name(f"{video_output.stem}{CURVE_TAIL}")


def clip_raw_path(video_output: Path, clip: int) -> Path:
    """A video model's raw map of one clip beside its overlay video: ``<stem>_<method>_<label>_clip<NNN>.npy``
    (clips numbered from 0)."""
    return video_output.with_name(f"{video_output.stem}_clip{clip:03d}.npy")


NIFTI_SUFFIX = ".nii.gz"
"""A scan's map: ``<stem>_<method>_<class index>-<class slug>.nii.gz``."""
MONTAGE_TAIL = "_montage.png"
"""How a scan's montage of three planes is named: its map's name ending in this instead of ``.nii.gz``."""


def volume_paths(
    output_dir: Path, scan: InputImage, method: str, class_index: int, class_name: str
) -> tuple[Path, Path, Path]:
    """A scan's outputs for one method and class: its map as NIfTI, its montage and (``--save-raw``) its ``.npy``,
    ``<stem>_<method>_<class index>-<class slug>.nii.gz``, ``..._montage.png``, ``....npy``."""
    nifti = output_path(output_dir, scan, method, class_index, class_name, NIFTI_SUFFIX)
    stem = nifti.name[: -len(NIFTI_SUFFIX)]
    return nifti, nifti.with_name(stem + MONTAGE_TAIL), nifti.with_name(stem + ".npy")


def video_label(rank: int, class_index: int | None, class_name: str = "") -> str:
    """``top<rank>`` (1-based) for each frame's own classes, or ``<index>-<class slug>`` for a fixed class."""
    return f"top{rank}" if class_index is None else f"{class_index}-{slug(class_name)}"


def thumbnail_path(output_dir: Path, output: Path | str) -> Path:
    """Where the gallery thumbnail of an output file (an overlay, or a video's first frame) goes."""
    return output_dir / thumbnail_relative(str(output), os.path.abspath(output_dir))


def thumbnail_relative(output: str, root: str) -> str:
    """The thumbnail's path relative to the absolute output directory ``root``, with forward slashes."""
    relative = relative_posix(output, root)
    if relative is None or relative.startswith("../"):  # not under the output directory: flat, by name
        relative = os.path.basename(output)
    return f"{THUMB_DIR}/{posixpath.splitext(relative)[0]}.jpg"


SLICES_TAIL = "_slices.jpg"
"""How the gallery's strip of one plane's slices of a scan's map is named: its thumbnail's name, then ``_<plane>``
and this."""


def slices_path(output_dir: Path, output: Path | str, plane: str) -> Path:
    """Where the gallery's strip of ``plane``'s slices (axial, coronal, sagittal) of a scan's map
    (:func:`~gradcam_cli.render.montage.strips`) goes: beside its thumbnail,
    ``_thumbs/<map's name>_<plane>_slices.jpg``."""
    return output_dir / slices_relative(str(output), os.path.abspath(output_dir), plane)


def slices_relative(output: str, root: str, plane: str) -> str:
    """:func:`slices_path` relative to the absolute output directory ``root``, with forward slashes."""
    return thumbnail_relative(output, root).removesuffix(".jpg") + f"_{plane}" + SLICES_TAIL


PREVIEW_SUFFIX = ".webm"
"""How the gallery's browser-playable preview of an overlay video is named: its thumbnail's name with this suffix."""


def preview_path(output_dir: Path, output: Path | str) -> Path:
    """Where the gallery's WebM preview of an overlay video (:func:`~gradcam_cli.io.video.write_preview`) goes:
    beside its thumbnail, ``_thumbs/<video's name>.webm``."""
    return output_dir / preview_relative(str(output), os.path.abspath(output_dir))


def preview_relative(output: str, root: str) -> str:
    """:func:`preview_path` relative to the absolute output directory ``root``, with forward slashes."""
    return thumbnail_relative(output, root).removesuffix(".jpg") + PREVIEW_SUFFIX


def relative_posix(path: str, root: str) -> str | None:
    """``path`` relative to the absolute directory ``root``, with forward slashes; None if there is no such path.

    Plain string operations: the gallery of 10,000 images calls this for every file it links.
    """
    absolute = os.path.abspath(path)
    if absolute.startswith(root + os.sep):
        relative = absolute[len(root) + 1 :]
    else:
        try:
            relative = os.path.relpath(absolute, root)
        except ValueError:  # another drive (Windows)
            return None
    return relative.replace(os.sep, "/")


def manifest_lock_path(manifest: Path) -> Path:
    """The lock file beside a ``--manifest`` outside the output directory: ``.<manifest name>.lock``."""
    return manifest.with_name(f".{manifest.name}.lock")


def shard_file_name(label: str) -> str:
    """The record of the shard labelled ``K-of-N`` in the output directory: ``.gradcam-shard-K-of-N.json``."""
    return f".gradcam-shard-{label}.json"


def shard_lock_name(label: str) -> str:
    """The lock a shard holds in the output folder, beside the folder's shared one: ``.gradcam.shard-K-of-N.lock``."""
    return f".gradcam.shard-{label}.lock"


def shard_manifest_path(manifest: Path, label: str) -> Path:
    """The manifest one shard writes: ``manifest.jsonl`` -> ``manifest.shard-K-of-N.jsonl`` (same folder, same
    format); ``gradcam merge`` writes the merged rows under ``manifest`` itself."""
    return manifest.with_name(f"{manifest.stem}.shard-{label}{manifest.suffix}")
