"""``--input-size``: ``N`` (the network input's shorter side) or ``H,W`` (its exact height and width), parsed once
into :attr:`gradcam_cli.options.ModelOptions.input_size` (docs/cli.md)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

MIN_INPUT_SIDE = 16
"""The smallest side ``--input-size`` takes."""


def parse_input_size(text: str | int | tuple[int, int]) -> int | tuple[int, int]:
    """``--input-size``: ``N`` (the shorter side) or ``H,W`` (the exact height and width), each at least
    :data:`MIN_INPUT_SIDE`."""
    if not isinstance(text, str):
        return text
    parts = text.split(",")
    try:
        sides = [int(part) for part in parts]
    except ValueError:
        sides = []
    if len(sides) not in (1, 2):
        raise typer.BadParameter(f"{text!r} is not N or H,W (whole numbers of pixels)")
    if min(sides) < MIN_INPUT_SIDE:
        raise typer.BadParameter(f"{text!r}: each side must be at least {MIN_INPUT_SIDE}")
    return sides[0] if len(sides) == 1 else (sides[0], sides[1])


InputSizeOpt = Annotated[
    Any,  # int | tuple[int, int] | None: typer takes no union, parse_input_size gives the value
    typer.Option(
        parser=parse_input_size,
        metavar="N|H,W",
        help="Shorter side of the network input, in pixels (default: the model's own: 224 for torchvision "
        "classifiers, the detector's transform's, 520 for torchvision's segmenters, a timm or Hugging Face model's "
        "configured size); H,W: exactly that height and width, for a model that takes it.",
    ),
]
