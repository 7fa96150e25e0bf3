"""Tokenizers for language modelling: a byte-level BPE learned from the training split, and plain bytes.

Both have one interface: ``encode(text) -> list[int]``, ``encode_batch(texts)``, ``decode(ids) -> str``,
``vocab_size``, ``eos_id`` (the token written after every document), ``fingerprint`` (a hash of everything
that decides the ids: a token cache or checkpoint made with one tokenizer is refused by another) and
``save(path)``; :func:`load_tokenizer` reads either back.

- :class:`ByteTokenizer` (no dependency): the 256 byte values of the UTF-8 text; byte 0 (NUL) is the
  end-of-document token, so NUL characters are dropped from the text.
- :class:`BPETokenizer`: Hugging Face ``tokenizers`` byte-level BPE (GPT-2's scheme: the bytes of every
  pre-token are the alphabet, so any text encodes and decodes losslessly). :func:`train_bpe` starts from the
  256 bytes and ``<|endoftext|>`` (id 0) and merges the most frequent adjacent pair until ``vocab_size``
  tokens; it reads the documents in their given order and gives the same vocabulary on every run.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable, Sequence

from ..provenance import temporary_path

EOS = "<|endoftext|>"


class SavedTokenizer:
    """What both tokenizers derive from their ``to_str()`` (everything that decides the ids): the fingerprint
    and the file ``save`` writes."""

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.to_str().encode()).hexdigest()[:16]

    def save(self, path: str | Path) -> None:
        write_text_atomic(Path(path), self.to_str())


class ByteTokenizer(SavedTokenizer):
    """UTF-8 bytes as tokens, ``vocab_size = 256``, ``eos_id = 0`` (module docstring)."""

    kind = "bytes"
    vocab_size = 256
    eos_id = 0

    def encode(self, text: str) -> list[int]:
        return list(text.replace("\0", "").encode("utf-8"))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(int(i) for i in ids if int(i) != self.eos_id).decode("utf-8", errors="replace")

    def to_str(self) -> str:
        return json.dumps({"loglin_edu_tokenizer": "bytes", "vocab_size": 256})

    def __repr__(self) -> str:
        return f"ByteTokenizer(vocab_size=256, fingerprint={self.fingerprint})"


class BPETokenizer(SavedTokenizer):
    """A trained Hugging Face byte-level BPE (module docstring). tokenizer: a ``tokenizers.Tokenizer``."""

    kind = "bpe"

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()
        eos = tokenizer.token_to_id(EOS)
        if eos is None:
            raise ValueError(f"a BPE tokenizer needs the end-of-document token {EOS!r} in its vocabulary")
        self.eos_id = eos

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids])

    def to_str(self) -> str:
        return self.tokenizer.to_str()

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size}, fingerprint={self.fingerprint})"


Tokenizer = ByteTokenizer | BPETokenizer


def train_bpe(texts: Sequence[str], vocab_size: int = 4096, min_frequency: int = 2) -> BPETokenizer:
    """A byte-level BPE with ``vocab_size`` tokens learned from ``texts`` (module docstring).

    texts: the training documents (never the validation ones); min_frequency: a pair seen fewer times is
    never merged (the vocabulary may then stay smaller than ``vocab_size`` on a tiny corpus).
    """
    try:
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError("a BPE tokenizer needs Hugging Face tokenizers: pip install tokenizers "
                                  "(or use ByteTokenizer, which needs nothing)") from err
    if not 257 <= vocab_size <= 65536:
        raise ValueError(f"vocab_size must be in [257, 65536] (256 bytes, the end token, uint16 ids), got {vocab_size}")
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(texts), trainer, length=len(texts))
    return BPETokenizer(tok)


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer saved at ``path`` by ``save`` (bytes or BPE)."""
    text = Path(path).read_text(encoding="utf-8")
    if json.loads(text).get("loglin_edu_tokenizer") == "bytes":
        return ByteTokenizer()
    try:
        from tokenizers import Tokenizer as HFTokenizer
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(f"{path} is a BPE tokenizer: pip install tokenizers") from err
    return BPETokenizer(HFTokenizer.from_str(text))


def write_text_atomic(path: Path, text: str) -> None:
    """Write to a temporary file, then rename: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
