"""An answer's words: its tokens grouped as a reader sees them (``gradcam serve`` shows them to click), and the
target of each, the one ``--target answer:WORD`` (or ``--per-token``) explains on the command line."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from ..targets import TargetSpec
from .answers import AnswerTarget
from .tasks.answer import AnswerScore


@dataclass(frozen=True)
class AnswerWord:
    """One word of an answer: its text and the indices of the answer tokens that spell it."""

    text: str
    tokens: tuple[int, ...]


def answer_words(tokenizer: Any, ids: Sequence[int]) -> list[AnswerWord]:
    """The words of the answer ``ids``: a token whose text starts with a blank starts a word, any other (a word's
    second piece, punctuation) continues the one before; a special token (no text) is in none. Each token's text is
    what it adds to the decoded answer, so tokenizers that mark blanks their own way (``▁``, ``Ġ``) group as they
    decode."""
    ids = [int(token) for token in ids]
    texts = [tokenizer.decode(ids[:end], skip_special_tokens=True) for end in range(len(ids) + 1)]
    groups: list[tuple[str, list[int]]] = []
    for index in range(len(ids)):
        before, after = texts[index], texts[index + 1]
        piece = after[len(before) :] if after.startswith(before) else tokenizer.decode([ids[index]])
        if not piece:  # a special token: no text, no word
            continue
        if not groups or (piece[:1].isspace() and groups[-1][0].strip()):
            groups.append((piece, [index]))
        else:
            groups[-1] = (groups[-1][0] + piece, [*groups[-1][1], index])
    return [AnswerWord(text.strip(), tuple(tokens)) for text, tokens in groups if text.strip()]


def word_target(score: AnswerScore, ids: Sequence[int], word: AnswerWord) -> AnswerTarget:
    """The target of ``word`` of the answer ``ids``: ``--target answer:WORD``'s where that names this occurrence
    (its first), else ``--per-token``'s for a one-token word, else the sum over its tokens (``tokens 3-4: ...``)."""
    try:
        named = score.answer_targets(ids, False, [TargetSpec("answer", word.text)])[0]
    except UsageError:
        named = None
    if named is not None and named.terms[0][1] == word.tokens:
        return named
    if len(word.tokens) == 1:
        return score.answer_targets(ids, True)[1 + word.tokens[0]]
    first, last = word.tokens[0], word.tokens[-1]
    return AnswerTarget(f"tokens {first}-{last}: {word.text}", ((tuple(ids), word.tokens, 1.0),))
