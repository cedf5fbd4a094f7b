"""The ``--target`` grammar: what a map explains, parsed into a :class:`TargetSpec` before torch is imported.

``class:NAME|INDEX`` (``--target-class`` is its alias), ``similar:IMAGE_OR_FOLDER``, ``text:PROMPT``,
``contrast:A,B`` (A and B two targets; a part without a kind is a class, or a prompt for a CLIP-style model) and
``output:I[:pos|neg]``; ``answer:WORD`` for a vision-language model's answer (docs/vlm.md); ``region:MASK`` for a
segmenter's scan (docs/volumes.md). docs/targets.md
describes each and when to use which; :mod:`gradcam_cli.cam.targets` turns a spec into the score a method
differentiates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .errors import suggest

TARGET_KINDS = ("class", "similar", "text", "contrast", "output", "answer", "region")
"""The kinds of ``--target KIND:VALUE``."""
OUTPUT_SIGNS = {"pos": 1, "positive": 1, "+": 1, "neg": -1, "negative": -1, "-": -1}
"""The signs ``output:I:SIGN`` takes: the output's positive (the default) or negative evidence."""
_EXAMPLES = {
    "class": "class:NAME or class:INDEX",
    "similar": "similar:IMAGE_OR_FOLDER",
    "text": 'text:"a photo of a dog"',
    "contrast": "contrast:A,B",
    "output": "output:I or output:I:neg",
    "answer": "answer:WORD",
    "region": "region:MASK.nii.gz",
}
_PART_START = re.compile(r",\s*(?=(?:class|similar|text|output|answer):)", re.IGNORECASE)


@dataclass(frozen=True)
class TargetSpec:
    """One ``--target``. ``kind``: one of :data:`TARGET_KINDS`, or ``""`` for a part of a contrast given without a
    kind. ``value``: the class (name or index), the reference image or folder, or the prompt. ``index`` and
    ``sign``: ``output:I[:SIGN]``. ``parts``: a contrast's A and B."""

    kind: str
    value: str = ""
    index: int = 0
    sign: int = 1
    parts: tuple[TargetSpec, ...] = field(default=())

    @classmethod
    def parse(cls, text: str | TargetSpec) -> TargetSpec:
        """``class:tiger cat``, ``similar:refs/``, ``text:a photo of a dog``, ``contrast:husky,wolf``,
        ``output:0:neg``; a :class:`ValueError` whose one-line message says what is wrong (close matches for a
        misspelt kind)."""
        if isinstance(text, TargetSpec):
            return text
        head, colon, rest = text.strip().partition(":")
        kind = head.strip().lower()
        if not colon:
            raise ValueError(
                f"{text!r}: a target begins with its kind, {', '.join(k + ':' for k in TARGET_KINDS)} "
                f"(class:{text.strip()}?)"
            )
        if kind not in TARGET_KINDS:
            hint = suggest(kind, TARGET_KINDS) or f" Use {', '.join(k + ':' for k in TARGET_KINDS)}."
            raise ValueError(f"{text!r}: unknown target kind {kind!r}.{hint}")
        rest = rest.strip()
        if not rest:
            raise ValueError(f"{text!r}: {kind}: needs a value ({_EXAMPLES[kind]})")
        if kind == "output":
            return _output_spec(text, rest)
        if kind == "contrast":
            first, second = _contrast_parts(text, rest)
            return cls(kind, parts=(_contrast_part(text, first), _contrast_part(text, second)))
        return cls(kind, rest)

    def __str__(self) -> str:
        if self.kind == "output":
            return f"output:{self.index}" + (":neg" if self.sign < 0 else "")
        if self.kind == "contrast":
            return "contrast:" + ",".join(str(part) for part in self.parts)
        return f"{self.kind}:{self.value}" if self.kind else self.value

    def kinds(self) -> set[str]:
        """The kinds this target reads (a contrast's parts' kinds; ``""``: a part without a kind)."""
        return set().union(*(part.kinds() for part in self.parts)) if self.parts else {self.kind}


def parse_targets(texts: list[str] | tuple[str, ...] | None) -> tuple[TargetSpec, ...]:
    """Every ``--target``, parsed (a ValueError for the first that does not parse)."""
    return tuple(TargetSpec.parse(text) for text in texts or ())


def _output_spec(text: str, rest: str) -> TargetSpec:
    index, _, sign = (part.strip() for part in rest.partition(":"))
    if not index.isdigit():
        raise ValueError(f"{text!r}: output:I takes the output's index I, 0 or more (output:0, output:3:neg)")
    if sign.lower() not in (*OUTPUT_SIGNS, ""):
        raise ValueError(f"{text!r}: the sign is pos or neg (output:{index}:neg).{suggest(sign, OUTPUT_SIGNS)}")
    return TargetSpec("output", index=int(index), sign=OUTPUT_SIGNS.get(sign.lower(), 1))


def _contrast_parts(text: str, rest: str) -> tuple[str, str]:
    """A and B of ``contrast:A,B``: split at the one comma, or at the comma before a part that names its kind."""
    cuts = [match.start() for match in _PART_START.finditer(rest)] or [i for i, ch in enumerate(rest) if ch == ","]
    if len(cuts) != 1:
        raise ValueError(
            f"{text!r}: contrast: takes two targets separated by one comma, contrast:A,B (with a comma inside a "
            "prompt, name the kinds: contrast:text:A,text:B)"
        )
    first, second = rest[: cuts[0]].strip(), rest[cuts[0] + 1 :].strip()
    if not first or not second:
        raise ValueError(f"{text!r}: contrast:A,B needs both A and B")
    return first, second


def _contrast_part(text: str, part: str) -> TargetSpec:
    head = part.partition(":")[0].strip().lower()
    if head in ("contrast", "region"):
        raise ValueError(
            f"{text!r}: a contrast's parts are targets of another kind (class:, text:, similar:, output:, answer:)"
        )
    return TargetSpec.parse(part) if head in TARGET_KINDS else TargetSpec("", part)
