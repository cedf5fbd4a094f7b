"""Colour-mapping saliency maps, blending overlays, and writing files atomically."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from .errors import UsageError, suggest


@functools.lru_cache(maxsize=16)
def _colormap_table(name: str) -> np.ndarray:
    import matplotlib

    try:
        cmap = matplotlib.colormaps[name]
    except KeyError:
        raise UsageError(f"unknown colormap {name!r}.{suggest(name, list(matplotlib.colormaps))}") from None
    return cmap(np.linspace(0.0, 1.0, 256))[:, :3].astype(np.float32)


def colormap_table(name: str, device: torch.device | str = "cpu") -> torch.Tensor:
    """A (256, 3) float lookup table in [0, 1] for a matplotlib colormap."""
    return torch.from_numpy(_colormap_table(name)).to(device)


def colorize(saliency: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Map an (H, W) float map in [0, 1] through a colour table: (H, W, 3) float in [0, 1].

    Indices come from the float map (clamped, then rounded), so 1.0 is the table's top colour: no uint8 wrap.
    """
    index = (saliency.clamp(0.0, 1.0) * (table.shape[0] - 1)).round().long()
    return table[index]


def heatmap_image(saliency: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """The colour-mapped map alone (no photo under it), as an (H, W, 3) uint8 tensor."""
    return (colorize(saliency, table) * 255.0).round().clamp(0, 255).to(torch.uint8)


def blend(pixels: torch.Tensor, saliency: torch.Tensor, table: torch.Tensor, alpha: float) -> torch.Tensor:
    """Overlay: (1 - alpha) * image + alpha * colour(map), as an (H, W, 3) uint8 tensor."""
    heat = colorize(saliency, table)
    image = pixels.to(heat.device, torch.float32) / 255.0
    mixed = (1.0 - alpha) * image + alpha * heat
    return (mixed * 255.0).round().clamp(0, 255).to(torch.uint8)


TEMP_MARKER = ".gradcam-tmp-"


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` so that ``path`` only ever names the complete file, whenever the process is killed.

    On Linux a new file is written unnamed (``O_TMPFILE``) in its directory and then linked in under ``path``:
    a kill at any moment leaves no partial or temporary file at all. Elsewhere, or to replace an existing file,
    the bytes (encoded beforehand) go out in one write to a temporary name beside ``path`` (containing
    ``TEMP_MARKER``) that is then renamed over ``path``; only a kill inside that short write-and-rename leaves
    the temporary file, and :func:`remove_stale_temporaries` clears such leftovers on the next run.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if _write_unnamed(path, data):
        return
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}{TEMP_MARKER}", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp_name, 0o666 & ~_umask())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


_unnamed_files = [sys.platform.startswith("linux") and hasattr(os, "O_TMPFILE")]


def _write_unnamed(path: Path, data: bytes) -> bool:
    """Write ``data`` to an unnamed file in ``path``'s directory and link it in as ``path``, if ``path`` does not
    exist yet and the system supports it; False (nothing written) otherwise."""
    if not _unnamed_files[0] or os.path.lexists(path):
        return False
    try:
        fd = os.open(path.parent, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o666)
    except OSError:  # a file system without O_TMPFILE
        return False
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        return _link_unnamed(fd, path)
    finally:
        os.close(fd)


def _link_unnamed(fd: int, path: Path) -> bool:
    """Link an ``O_TMPFILE`` file in as ``path``: through /proc, or by ``linkat(AT_EMPTY_PATH)`` where that fails."""
    for method in list(_LINKERS):
        try:
            method(fd, path)
            return True
        except FileExistsError:
            return False
        except OSError:
            with contextlib.suppress(ValueError):  # another writer thread may have dropped it already
                _LINKERS.remove(method)  # not possible here: do not try it again
    _unnamed_files[0] = False  # neither works here: use temporary names from now on
    return False


def _link_via_proc(fd: int, path: Path) -> None:
    os.link(f"/proc/self/fd/{fd}", path, follow_symlinks=True)


def _link_empty_path(fd: int, path: Path) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.linkat(fd, b"", -100, os.fsencode(path), 0x1000) != 0:  # AT_FDCWD, AT_EMPTY_PATH
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(path))


_LINKERS = [_link_via_proc, _link_empty_path]


def remove_stale_temporaries(folder: Path) -> int:
    """Delete temporary files a killed run left under ``folder``; return how many."""
    removed = 0
    if folder.is_dir():
        for stale in folder.rglob(f".*{TEMP_MARKER}*"):
            stale.unlink(missing_ok=True)
            removed += 1
    return removed


@functools.lru_cache(maxsize=1)
def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def encode_image(pixels: torch.Tensor, suffix: str, quality: int = 90) -> bytes:
    """Encode an (H, W, 3) uint8 tensor as PNG, JPEG or WebP bytes (format from ``suffix``)."""
    from PIL import Image

    fmt = {".jpg": "JPEG", ".jpeg": "JPEG", ".webp": "WEBP"}.get(suffix.lower(), "PNG")
    array = pixels.cpu().numpy()
    if fmt == "PNG" and array.ndim == 3 and array.shape[2] == 3:
        encoded = _encode_png_fast(array)
        if encoded is not None:
            return encoded
    buffer = io.BytesIO()
    options = {"quality": quality} if fmt != "PNG" else {"compress_level": 1}
    Image.fromarray(array).save(buffer, format=fmt, **options)
    return buffer.getvalue()


def _encode_png_fast(rgb: np.ndarray) -> bytes | None:
    """Lossless RGB PNG through OpenCV with the 'sub' row filter and Huffman-only deflate: about twice as fast as
    Pillow's fastest level on photos, and no larger. None where OpenCV cannot (Pillow then encodes)."""
    try:
        import cv2
    except ImportError:
        return None
    params = [cv2.IMWRITE_PNG_COMPRESSION, 1, cv2.IMWRITE_PNG_STRATEGY, cv2.IMWRITE_PNG_STRATEGY_HUFFMAN_ONLY]
    if hasattr(cv2, "IMWRITE_PNG_FILTER"):  # OpenCV >= 4.11
        params += [cv2.IMWRITE_PNG_FILTER, cv2.IMWRITE_PNG_FILTER_SUB]
    ok, encoded = cv2.imencode(".png", np.ascontiguousarray(rgb[:, :, ::-1]), params)
    return encoded.tobytes() if ok else None


def save_image(pixels: torch.Tensor, path: Path, quality: int = 90) -> None:
    """Write an (H, W, 3) uint8 tensor as an image (format from the suffix) atomically."""
    write_atomic(path, encode_image(pixels, path.suffix, quality))


def save_array(saliency: torch.Tensor, path: Path) -> None:
    """Write a map as a float32 ``.npy`` atomically."""
    buffer = io.BytesIO()
    np.save(buffer, saliency.detach().cpu().numpy().astype(np.float32))
    write_atomic(path, buffer.getvalue())
