"""The images the explorer shows and explains: the inputs it was given, the inputs of a run's rows, and uploads.

The page names an image by an id, never by a path: ``i<n>`` is the n-th input found at start-up, ``r<n>`` the
input of the run's row n, ``u<hash>`` an upload. An upload is checked before it is decoded (its size, then the
pixel count its header declares, so that a decompression bomb is refused unread), decoded as every input is
(:func:`~gradcam_cli.io.images.load_image`: EXIF orientation applied, ``--max-side`` shrinking), and kept as a file
in the server's own temporary folder (at most :data:`MAX_UPLOADS`, the oldest forgotten first), named by its
content's hash. Decoded images are kept for the last :data:`DECODED_IMAGES` images used.
"""

from __future__ import annotations

import hashlib
import io
import re
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from PIL import Image, UnidentifiedImageError

from ..errors import ImageError, suggest
from ..io.atomic import write_atomic
from ..io.discovery import InputImage
from ..io.images import InputSpec, load_image, to_input_tensor, to_pixel_tensor
from ..options import DEFAULT_MAX_SIDE, ServeOptions
from ..render.encode import encode_image
from .http import HttpError
from .names import shown_text

DECODED_IMAGES = 8
"""Decoded images kept (pixels, network input, the PNG the page shows)."""
MAX_UPLOADS = 64
"""Uploads kept; an older upload's id is then unknown (the page says to upload it again)."""
THUMBNAIL = 96
"""The longer side of a thumbnail in the page's strip of inputs."""
IMAGE_ID = re.compile(r"^(?:i[0-9]{1,9}|r[0-9]{1,12}|u[0-9a-f]{16})$")


@dataclass
class Source:
    """An image the explorer knows: its id, the name the page shows, and its file."""

    id: str
    name: str
    path: Path

    @property
    def stem(self) -> str:
        """The file name without its suffix, as output names start (``chelsea`` for ``photos/chelsea.jpg``)."""
        return Path(self.name).stem or "image"


@dataclass
class DecodedImage:
    """An image decoded once: its PIL image, (H, W, 3) uint8 pixels, and the network inputs made from it."""

    image: Image.Image
    pixels: torch.Tensor = field(repr=False)
    _inputs: dict[InputSpec, torch.Tensor] = field(default_factory=dict, repr=False)
    _display: bytes | None = field(default=None, repr=False)

    @property
    def size(self) -> tuple[int, int]:
        """(height, width)."""
        return self.image.height, self.image.width

    def batch(self, spec: InputSpec) -> torch.Tensor:
        """The (1, 3, h, w) network input for ``spec``; the same tensor every time, so passes can be replayed."""
        if spec not in self._inputs:
            self._inputs[spec] = to_input_tensor(self.image, spec).unsqueeze(0)
        return self._inputs[spec]

    def thumbnail_png(self, side: int = THUMBNAIL) -> bytes:
        """The decoded image shrunk to at most ``side`` pixels a side, as PNG (the page's strip of inputs)."""
        small = self.image.copy()
        small.thumbnail((side, side))
        return encode_image(to_pixel_tensor(small), ".png")

    def display_png(self) -> bytes:
        """The decoded image as PNG: what the maps line up with (orientation applied), for the page."""
        if self._display is None:
            self._display = encode_image(self.pixels, ".png")
        return self._display


class ImageStore:
    """The explorer's images by id; ``row_input(n)`` gives the input file of a run's row n (``None``: none)."""

    def __init__(
        self,
        inputs: Sequence[InputImage],
        uploads: Path,
        options: ServeOptions,
        row_input: Callable[[int], tuple[str, Path] | None] | None = None,
    ) -> None:
        self.inputs = [Source(f"i{n}", shown_text(str(image.path)), image.path) for n, image in enumerate(inputs)]
        self.uploads_dir, self.options, self.row_input = uploads, options, row_input
        self._uploads: OrderedDict[str, Source] = OrderedDict()
        self._decoded: OrderedDict[str, DecodedImage] = OrderedDict()
        self._lock = threading.Lock()
        self.forgotten: list[Callable[[str], object]] = []
        """Called with an image's id when it is forgotten (an upload dropped), so that what was kept of it goes."""

    def listing(self, offset: int, limit: int, query: str | None) -> tuple[int, list[dict[str, str]]]:
        """The inputs, then the uploads kept (those whose name contains ``query``, any case), a page of them."""
        with self._lock:
            chosen = [*self.inputs, *self._uploads.values()]
        if query:
            lowered = query.lower()
            chosen = [source for source in chosen if lowered in source.name.lower()]
        return len(chosen), [{"id": s.id, "name": s.name} for s in chosen[offset : offset + limit]]

    def source(self, image_id: str) -> Source:
        """The image ``image_id`` names; 404 for an id that names none."""
        if not IMAGE_ID.match(image_id):
            raise HttpError(400, f"{image_id!r} is not an image id")
        kind, number = image_id[0], image_id[1:]
        if kind == "i" and int(number) < len(self.inputs):
            return self.inputs[int(number)]
        if kind == "u":
            with self._lock:
                if image_id in self._uploads:
                    return self._uploads[image_id]
            raise HttpError(404, "this upload is no longer kept; upload the image again")
        if kind == "r" and self.row_input is not None:
            found = self.row_input(int(number))
            if found is not None:
                return Source(image_id, found[0], found[1])
        raise HttpError(404, f"no image {image_id}")

    def named(self, name: str) -> Source:
        """The served input or upload ``name`` names (its id, its name as listed, or that name's last part): what a
        ``similar:`` target typed on the page may refer to. Anything else is a 400 naming the close matches."""
        name = name.strip()
        if IMAGE_ID.match(name):
            return self.source(name)
        with self._lock:
            known = [*self.inputs, *self._uploads.values()]
        for matches in ([s for s in known if s.name == name], [s for s in known if Path(s.name).name == name]):
            if len(matches) == 1:
                return matches[0]
        names = sorted({Path(s.name).name for s in known})
        raise HttpError(
            400,
            f"similar:{name}: not a served image; similar: takes a served input or an upload, by its id or name"
            f".{suggest(name, names)}",
        )

    def decoded(self, image_id: str) -> tuple[Source, DecodedImage]:
        """The image decoded (kept for the last few used); a file that cannot be read is 422."""
        source = self.source(image_id)
        with self._lock:
            kept = self._decoded.get(image_id)
            if kept is not None:
                self._decoded.move_to_end(image_id)
                return source, kept
        decoded = decode(source.path)
        with self._lock:
            self._decoded[image_id] = decoded
            while len(self._decoded) > DECODED_IMAGES:
                self._decoded.popitem(last=False)
        return source, decoded

    def upload(self, data: bytes, name: str | None) -> Source:
        """Check, decode and keep an upload; 413 when too large, 415 when no image, 422 when unreadable."""
        check_upload(data, self.options)
        digest = hashlib.sha256(data).hexdigest()[:16]
        image_id = f"u{digest}"
        shown = clean_name(name) or f"upload-{digest[:8]}.png"
        path = self.uploads_dir / f"{digest}{upload_suffix(shown)}"
        with self._lock:
            if image_id in self._uploads:  # the same bytes again: listed under the name they came with now
                kept = replace(self._uploads[image_id], name=shown)
                self._uploads[image_id] = kept
                self._uploads.move_to_end(image_id)
                return kept
        write_atomic(path, data)
        try:
            decoded = decode(path)
        except HttpError:
            path.unlink(missing_ok=True)
            raise
        source = Source(image_id, shown, path)
        dropped: list[Source] = []
        with self._lock:
            self._uploads[image_id] = source
            self._decoded[image_id] = decoded
            while len(self._uploads) > MAX_UPLOADS:
                dropped.append(self._uploads.popitem(last=False)[1])
            while len(self._decoded) > DECODED_IMAGES:
                self._decoded.popitem(last=False)
            for old in dropped:
                self._decoded.pop(old.id, None)
        for old in dropped:
            old.path.unlink(missing_ok=True)
            for forget in self.forgotten:
                forget(old.id)
        return source


def decode(path: Path) -> DecodedImage:
    """An image file decoded as ``gradcam`` decodes its inputs; one that cannot be read is a 422 answer."""
    try:
        image = load_image(path, DEFAULT_MAX_SIDE)
    except ImageError as error:
        raise HttpError(422, str(error).replace(f"{path}: ", "", 1)) from None
    return DecodedImage(image, to_pixel_tensor(image))


def check_upload(data: bytes, options: ServeOptions) -> None:
    """Refuse, before decoding, an upload that is empty, too large, no image, or declares too many pixels."""
    if not data:
        raise HttpError(400, "the upload is empty")
    if len(data) > options.max_upload_bytes:
        raise HttpError(413, f"the upload is {len(data):,} bytes; at most {options.max_upload_bytes:,} are taken")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as opened:
                width, height = opened.size
    except UnidentifiedImageError:
        raise HttpError(415, "not an image Pillow can read") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise HttpError(413, f"too many pixels (at most {options.max_pixels:,})") from None
    except (OSError, SyntaxError, ValueError) as error:
        raise HttpError(422, f"unreadable image ({error})") from None
    if width * height > options.max_pixels:
        raise HttpError(413, f"{width} x {height} is too many pixels (at most {options.max_pixels:,})")


def clean_name(name: str | None) -> str:
    """An upload's file name as the page shows it: its last part, printable, at most 200 characters."""
    if not name:
        return ""
    last = re.split(r"[\\/]", name)[-1]
    return "".join(ch for ch in last if ch.isprintable())[:200].strip()


def upload_suffix(name: str) -> str:
    """The suffix an upload's file keeps (Pillow reads by content; the suffix only helps a person), or none."""
    suffix = Path(name).suffix.lower()
    return suffix if re.fullmatch(r"\.[a-z0-9]{1,5}", suffix) else ""
