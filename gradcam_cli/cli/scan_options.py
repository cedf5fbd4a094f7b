"""The scan options of ``gradcam`` and ``gradcam eval`` (docs/volumes.md): ``--channels`` and ``--target
region:MASK``, parsed before torch is imported."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..targets import TargetSpec


class ChannelFiles(tuple[Path, ...]):
    """The ``--channels`` value: one scan's channel files, in channel order."""


def parse_channels(text: str | ChannelFiles) -> ChannelFiles:
    """``t1.nii.gz,t2.nii.gz`` -> the two paths; an empty name or a file named twice is refused."""
    if isinstance(text, ChannelFiles):
        return text
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise typer.BadParameter(f"{text!r}: an empty file name; use a.nii.gz,b.nii.gz (one file per channel)")
    if len(set(names)) != len(names):
        raise typer.BadParameter(f"{text!r}: a file named twice; name each channel's file once")
    return ChannelFiles(Path(name) for name in names)


ChannelsOpt = Annotated[
    ChannelFiles | None,
    typer.Option(
        parser=parse_channels,
        metavar="A,B,...",
        help="Scans: one scan's channel files (modalities on one grid, e.g. t1.nii.gz,t2.nii.gz), in the order the "
        "model takes them; its outputs are named after the first (without a _0000 channel number).",
        show_default=False,
    ),
]


def region_of(specs: list[TargetSpec]) -> tuple[list[TargetSpec], Path | None, str | None]:
    """``specs`` without their ``region:MASK`` (docs/volumes.md), the mask's path (``None``: not given), and the
    one-line message where the region cannot be taken: given twice, or beside another ``--target``."""
    regions = [spec for spec in specs if spec.kind == "region"]
    others = [spec for spec in specs if spec.kind != "region"]
    if not regions:
        return specs, None, None
    if len(regions) > 1:
        return others, None, "--target region: takes one mask; give it once"
    if others:
        return others, None, f"--target region: is scored for a class (--target-class), not for --target {others[0]}"
    return [], Path(regions[0].value), None
