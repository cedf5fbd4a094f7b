"""Reading images and turning them into network inputs without cropping anything away."""

from __future__ import annotations

import math
import os
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from ..errors import ImageError, describe

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
MAX_IMAGE_PIXELS = 64_000_000
"""Images with more pixels are refused before decoding (a 48 MP photo passes; decompression bombs do not)."""
MAX_ASPECT = 4
"""The network input's longer side is at most this many times its shorter side (see ``InputSpec.resized_shape``)."""
OPENCV_LINEAR = "opencv-linear"
"""``InputSpec.interpolation`` for OpenCV's ``INTER_LINEAR`` resize, as ultralytics' letterbox resizes."""
SIXTEEN_BIT_MAX = 65535
"""Largest value of a 16-bit channel: wider integer pixels than this cannot be scaled to 8 bits meaningfully."""


@dataclass(frozen=True)
class InputSpec:
    """How a model wants its input: the shorter side's length (or an exact size) and the normalisation."""

    size: int = 224
    fixed_size: tuple[int, int] | None = None
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    max_side: int | None = None
    """Longest side of the network input; ``None``: ``MAX_ASPECT * size`` (896 for 224); never below ``size``."""
    interpolation: str = "bilinear"
    """How images are resized to the network input: a Pillow filter name (bilinear, bicubic, nearest, lanczos...),
    or :data:`OPENCV_LINEAR` (OpenCV's bilinear filter, which does not smooth when shrinking: YOLO's letterbox)."""
    keep_aspect: bool = False
    """Scale the image as a whole instead of squeezing it: the shorter side becomes ``size`` unless the longer side
    would pass ``max_side``, which it then meets (torchvision's detection transform's rule)."""
    multiple: tuple[int, int] | None = None
    """(height, width) that the network input's sides are rounded to multiples of (the nearest multiple, at least
    one): a patch model that takes any shape (a timm ViT built with ``dynamic_img_size``) needs whole patches."""
    shape: tuple[int, ...] | None = None
    """A model that takes no RGB image: one input's (C, ...) shape, (C, T, H, W) of a clip model, (C, D, H, W) of a
    volume model, (C, L) of a sequence model, which its dry pass (:func:`gradcam_cli.cam.layers.blank_input`) is made
    at; ``None``: an image, 3 x H x W as above."""

    def resized_shape(self, height: int, width: int) -> tuple[int, int]:
        """(H, W) of the network input for an image of ``height`` x ``width``: shorter side = size, aspect kept.

        The shorter side is always ``size``, so the dry pass at size x size made when an explainer is built proves
        that every image can run. Extreme aspect ratios are clamped instead: the longer side never exceeds
        ``max_side`` (4 x size), so a 4000 x 40 strip is squeezed to 896 x 224, not enlarged to 22400 x 224. The
        map is stretched back over the whole image, so it still lines up with the pixels. With ``multiple``, each
        side is then rounded to the nearest multiple of it (a 64 x 48 image at size 32 and 8-pixel patches: 32 x 40,
        not 32 x 43).
        """
        if self.fixed_size is not None:
            return self.fixed_size
        longest = max(self.size, self.max_side or MAX_ASPECT * self.size)
        if self.keep_aspect:
            scale = min(self.size / min(height, width), longest / max(height, width))
            shape = max(1, round(height * scale)), max(1, round(width * scale))
        else:
            long_side = min(longest, round(max(height, width) * self.size / min(height, width)))
            shape = (self.size, long_side) if height <= width else (long_side, self.size)
        if self.multiple is None:
            return shape
        (rows, columns), (patch_height, patch_width) = shape, self.multiple
        return max(1, round(rows / patch_height)) * patch_height, max(1, round(columns / patch_width)) * patch_width


def load_image(path: str | Path, max_side: int | None = None) -> Image.Image:
    """Open an image as RGB with its EXIF orientation applied; raise ImageError with a one-line reason.

    ``max_side``: shrink images whose longer side is larger by the smallest whole factor that brings it within
    ``max_side`` (8000 x 6000 becomes 4000 x 3000 at 4096), averaging each factor x factor block. A JPEG is
    decoded at 1/2, 1/4 or 1/8 scale directly where that fits (``Image.draft``), so a 48 MP photo costs a
    fraction of its full decode.
    """
    return load_sized_image(path, max_side)[0]


def load_sized_image(path: str | Path, max_side: int | None = None) -> tuple[Image.Image, tuple[int, int]]:
    """:func:`load_image`, and the (height, width) of the image at full size, its EXIF orientation applied: what
    rows' boxes, areas and keypoints are measured in when ``max_side`` shrank it (docs/batch.md, Large images)."""
    path = Path(path)
    check_regular_file(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as opened:
                if opened.width * opened.height > MAX_IMAGE_PIXELS:
                    raise Image.DecompressionBombError(path)
                opened.seek(0)
                width, height = oriented_size(opened)
                factor = shrink_factor(opened.size, max_side)
                if factor > 1:
                    opened.draft(None, (-(-opened.width // factor), -(-opened.height // factor)))
                image = to_rgb(ImageOps.exif_transpose(opened), path)
                factor = shrink_factor(image.size, max_side)
                return (image.reduce(factor) if factor > 1 else image), (height, width)
    except FileNotFoundError as error:
        raise ImageError(f"{path}: no such file") from error
    except IsADirectoryError as error:
        raise ImageError(f"{path}: is a directory") from error
    except PermissionError as error:
        raise ImageError(f"{path}: permission denied") from error
    except UnidentifiedImageError as error:
        raise ImageError(f"{path}: not an image Pillow can read") from error
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        raise ImageError(f"{path}: too many pixels (limit {MAX_IMAGE_PIXELS:,}); resize it first") from error
    except (OSError, SyntaxError, ValueError) as error:
        raise ImageError(f"{path}: unreadable image ({error})") from error


def check_regular_file(path: Path) -> None:
    """Refuse what is not a regular file before opening it: a FIFO or device named x.jpg would block or never end."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise ImageError(f"{path}: broken symbolic link (to {os.readlink(path)})") from None
        raise ImageError(f"{path}: no such file") from None
    except PermissionError:
        raise ImageError(f"{path}: permission denied") from None
    except OSError as error:  # e.g. a symlink loop
        raise ImageError(f"{path}: {describe(error, path)}") from None
    mode = info.st_mode
    if stat.S_ISDIR(mode):
        raise ImageError(f"{path}: is a directory")
    if not stat.S_ISREG(mode):
        raise ImageError(f"{path}: not a regular file")
    if info.st_size == 0:
        raise ImageError(f"{path}: empty file (0 bytes)")
    if not os.access(path, os.R_OK):
        raise ImageError(f"{path}: permission denied")


EXIF_ORIENTATION = 0x0112
"""The EXIF tag of an image's orientation, which :func:`ImageOps.exif_transpose` applies."""
TURNED = frozenset({5, 6, 7, 8})
"""The EXIF orientations that turn an image by 90 degrees (its width and height swap)."""


def oriented_size(opened: Image.Image) -> tuple[int, int]:
    """(width, height) of an opened image as it is shown, its EXIF orientation applied, from its header."""
    width, height = opened.size
    return (height, width) if opened.getexif().get(EXIF_ORIENTATION) in TURNED else (width, height)


def to_rgb(image: Image.Image, path: str | Path = "image") -> Image.Image:
    """``image`` as 8-bit RGB. Pixels wider than 8 bits are scaled by their bit depth, not clipped: 16-bit
    grayscale (Pillow's ``I;16`` modes, and ``I`` within 0..65535) keeps its high byte, as Pillow itself does for
    16-bit RGB; 32-bit float (``F``) must lie within 0..1. Anything else wide is refused with an ImageError."""
    if image.mode == "F":
        low, high = cast(tuple[float, float], image.getextrema())
        if not (math.isfinite(low) and math.isfinite(high) and low >= 0 and high <= 1):
            raise ImageError(
                f"{path}: floating-point pixels range {low:g}..{high:g}, not 0..1, so their scale is unknown; "
                "save the image with 8 or 16 bits per channel"
            )
        image = image.point(lambda value: value * 255 + 0.5)
    elif image.mode.startswith("I"):
        image = image.convert("I")
        low, high = cast(tuple[int, int], image.getextrema())
        if low < 0 or high > SIXTEEN_BIT_MAX:
            raise ImageError(
                f"{path}: 32-bit integer pixels range {low}..{high}, beyond 16 bits, so their scale is unknown; "
                "save the image with 8 or 16 bits per channel"
            )
        image = image.point(lambda value: value / 256)
    return image.convert("RGB")


def shrink_factor(size: tuple[int, int], max_side: int | None) -> int:
    """The smallest whole factor that brings the longer side of ``size`` within ``max_side`` (1: none needed)."""
    return max(1, -(-max(size) // max_side)) if max_side else 1


def to_input_tensor(image: Image.Image, spec: InputSpec) -> torch.Tensor:
    """Resize the whole image (no crop) as ``spec`` says and normalise it: a (3, H, W) float tensor."""
    height, width = spec.resized_shape(image.height, image.width)
    if spec.interpolation == OPENCV_LINEAR:
        from .video import opencv

        cv2 = opencv()
        array = cv2.resize(np.asarray(image, dtype=np.uint8), (width, height), interpolation=cv2.INTER_LINEAR)
    else:
        array = np.asarray(image.resize((width, height), Image.Resampling[spec.interpolation.upper()]), np.uint8)
    pixels = torch.from_numpy(array.copy()).permute(2, 0, 1).float().div_(255)
    mean = torch.tensor(spec.mean).view(3, 1, 1)
    std = torch.tensor(spec.std).view(3, 1, 1)
    return (pixels - mean) / std


def to_pixel_tensor(image: Image.Image) -> torch.Tensor:
    """The image's pixels as an (H, W, 3) uint8 tensor."""
    return torch.from_numpy(np.asarray(image, dtype=np.uint8).copy())
