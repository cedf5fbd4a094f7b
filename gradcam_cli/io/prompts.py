"""``--prompts FILE.csv``: each image's own question for a vision-language model (docs/vlm.md).

One ``image,prompt`` pair a line (an optional header line ``image,prompt``); an image's path is relative to the
CSV's folder unless absolute; a prompt with commas is quoted as CSV quotes it. Each image once."""

from __future__ import annotations

import csv
from pathlib import Path

from ..errors import UsageError, describe

HEADER = ["image", "prompt"]


def read_prompts(path: Path) -> list[tuple[Path, str]]:
    """The (image, prompt) pairs of ``path``, in its order; a one-line UsageError naming the line that is wrong."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            lines = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"--prompts {path}: cannot read it ({describe(error, path)})") from error
    pairs: list[tuple[Path, str]] = []
    seen: dict[Path, int] = {}
    for number, fields in enumerate(lines, 1):
        if not fields or (number == 1 and [f.strip().lower() for f in fields] == HEADER):
            continue
        if len(fields) == 2 and fields[0].strip() and not fields[1].strip():
            raise UsageError(f"--prompts {path}, line {number}: the prompt for {fields[0].strip()} is empty")
        if len(fields) != 2 or not fields[0].strip():
            raise UsageError(f"--prompts {path}, line {number}: expected image,prompt (quote a prompt with commas)")
        image = Path(fields[0].strip())
        image = image if image.is_absolute() else path.parent / image
        key = image.resolve()
        if key in seen:
            raise UsageError(f"--prompts {path}, line {number}: {fields[0].strip()} is on line {seen[key]} already")
        seen[key] = number
        pairs.append((image, fields[1].strip()))
    if not pairs:
        raise UsageError(f"--prompts {path}: no image,prompt line in it")
    return pairs
