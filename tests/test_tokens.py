"""Tokenizers and token streams: deterministic BPE, lossless round trips, caches refused by another
tokenizer, batches that are pure functions of (seed, step, rank) and the same for any split of the work."""

import numpy as np
import pytest
import torch

from loglin_edu.data.corpus import Document
from loglin_edu.data.lm_data import TextSpec, prepare_text
from loglin_edu.data.token_stream import build_stream, evaluation_starts, open_stream, training_batch
from loglin_edu.data.tokenizer import ByteTokenizer, load_tokenizer, train_bpe

TEXTS = [
    "In the beginning God created the heaven and the earth. And the earth was without form, and void.\n" * 30,
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer.\n" * 30,
    "It is a truth universally acknowledged, that a single man in possession of a good fortune.\n" * 30,
]


def test_bpe_training_is_deterministic_and_round_trips(tmp_path):
    a, b = train_bpe(TEXTS, vocab_size=400), train_bpe(TEXTS, vocab_size=400)
    assert a.tokenizer.get_vocab() == b.tokenizer.get_vocab() and a.fingerprint == b.fingerprint
    assert 300 < a.vocab_size <= 400 and a.eos_id == 0  # merges stop at pairs seen once
    text = "Ünïcode and 1234567, never seen: qzx!\n"
    assert a.decode(a.encode(text)) == text
    assert len(a.encode(TEXTS[0])) < len(TEXTS[0]) / 2  # merges learned
    a.save(tmp_path / "tok.json")
    loaded = load_tokenizer(tmp_path / "tok.json")
    assert loaded.fingerprint == a.fingerprint and loaded.encode(text) == a.encode(text)
    assert train_bpe(TEXTS[:2], vocab_size=400).fingerprint != a.fingerprint


def test_byte_tokenizer():
    tok = ByteTokenizer()
    assert tok.encode("aé") == [97, 195, 169] and tok.decode([97, 195, 169, 0]) == "aé"
    assert tok.encode("a\0b") == [97, 98]  # NUL is the end-of-document token
    assert tok.fingerprint == ByteTokenizer().fingerprint != train_bpe(TEXTS, 300).fingerprint


def test_bpe_vocabulary_range():
    with pytest.raises(ValueError, match="vocab_size"):
        train_bpe(TEXTS, vocab_size=100_000)


def docs():
    return [Document("t", f"d{i}", t) for i, t in enumerate(TEXTS)]


def test_stream_layout_and_refusal_of_another_tokenizer(tmp_path):
    tok = ByteTokenizer()
    stream = build_stream(docs(), tok, tmp_path / "s", batch=2)
    expected = np.concatenate([np.array(tok.encode(t) + [0]) for t in TEXTS])
    assert isinstance(stream.tokens, np.memmap) and np.array_equal(stream.tokens, expected)
    assert [d["start"] for d in stream.meta["documents"]] == [0, len(TEXTS[0]) + 1, len(TEXTS[0]) + len(TEXTS[1]) + 2]
    bpe = train_bpe(TEXTS, vocab_size=300)
    with pytest.raises(ValueError, match=r"vocabulary 256.*vocabulary 300.*delete s\.bin and s\.json"):
        open_stream(tmp_path / "s", bpe)
    with pytest.raises(ValueError, match="another corpus"):
        open_stream(tmp_path / "s", tok, corpus="0123")
    assert open_stream(tmp_path / "s", tok).meta == stream.meta


def test_batches_are_pure_and_equal_for_every_split_of_the_work(tmp_path):
    stream = build_stream(docs(), ByteTokenizer(), tmp_path / "s")
    args = dict(seed=3, step=7, batch_size=8, context=16)
    x, y = training_batch(stream, **args)
    assert x.shape == (8, 16) and torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(x, training_batch(stream, **args)[0])
    assert not torch.equal(x, training_batch(stream, **{**args, "step": 8})[0])
    for world, micro in ((2, 1), (2, 2), (4, 2), (1, 4)):
        parts = [training_batch(stream, **args, rank=r, world_size=world, micro_step=a, micro_steps=micro)[0]
                 for r in range(world) for a in range(micro)]
        assert torch.equal(torch.cat(parts), x), (world, micro)
    with pytest.raises(ValueError, match="split evenly"):
        training_batch(stream, **args, world_size=3)


def test_a_corpus_smaller_than_one_context_is_refused(tmp_path):
    stream = build_stream([Document("t", "tiny", "short text")], ByteTokenizer(), tmp_path / "s")
    with pytest.raises(ValueError, match=r"holds 11 tokens, fewer than one window of 33.*shorter context"):
        training_batch(stream, seed=0, step=0, batch_size=2, context=32)
    with pytest.raises(ValueError, match="fewer than one window"):
        evaluation_starts(stream, 12, 4)


def test_evaluation_windows_are_spread_and_disjoint(tmp_path):
    stream = build_stream(docs(), ByteTokenizer(), tmp_path / "s")
    starts = evaluation_starts(stream, 100, 5)
    assert len(starts) == 5 and starts[0] == 0 and starts[-1] + 100 <= len(stream)
    assert (starts.diff() >= 100).all()


def test_prepare_text_from_local_files_then_reuses_the_folder(tmp_path):
    for i, t in enumerate(TEXTS * 2):
        (tmp_path / f"book{i}.txt").write_text(t)
    spec = TextSpec(sources=f"files:{tmp_path}", vocab_size=300, held_out=0.2)
    data = prepare_text(spec, tmp_path / "prepared")
    assert data.tokenizer.vocab_size == 300 and len(data.validation.meta["documents"]) == 2
    again = prepare_text(spec, tmp_path / "prepared")
    assert again.tokenizer.fingerprint == data.tokenizer.fingerprint
    assert np.array_equal(again.train.tokens, data.train.tokens)
    with pytest.raises(ValueError, match="another spec"):
        prepare_text(TextSpec(sources=f"files:{tmp_path}", vocab_size=400), tmp_path / "prepared")
