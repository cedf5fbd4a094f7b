"""An answer's words (gradcam_cli/cam/answer_words.py): tokens grouped as the decoded answer reads, for the two
ways real tokenizers mark blanks (GPT-2's byte-level ``Ġ``, SentencePiece's ``▁``), with tokenizers trained here."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from gradcam_cli.cam.answer_words import answer_words

TEXT = ["the cat is sleeping. the dog is running.", "a cat sleeps, a dog runs!"] * 20


def trained(kind: str):
    """A small BPE tokenizer trained on :data:`TEXT`, ``kind`` "byte-level" or "metaspace", with an end token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    inner = Tokenizer(models.BPE(unk_token="<unk>"))
    if kind == "byte-level":
        inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        inner.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        inner.pre_tokenizer = pre_tokenizers.Metaspace()
        inner.decoder = decoders.Metaspace()
        alphabet = []
    trainer = trainers.BpeTrainer(vocab_size=60, special_tokens=["<unk>", "</s>"], initial_alphabet=alphabet)
    inner.train_from_iterator(TEXT, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=inner, unk_token="<unk>", eos_token="</s>")


@pytest.mark.parametrize("kind", ["byte-level", "metaspace"])
def test_words_group_the_pieces_a_word_is_made_of(kind):
    tokenizer = trained(kind)
    answer = "the cat is sleeping, a dog runs!"
    ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert len(ids) > len(answer.split()) + 1  # some words are several tokens
    words = answer_words(tokenizer, ids)
    assert [word.text for word in words] == answer.split()
    assert [i for word in words for i in word.tokens] == list(range(len(ids) - 1))  # all but the end token, once
    for word in words:
        assert tokenizer.decode([ids[i] for i in word.tokens]).strip() == word.text
