"""Token streams on disk, and the batches a language model trains on.

A split of the corpus becomes one stream: every document's tokens followed by the end-of-document token,

    stream = doc_1, eos, doc_2, eos, ..., doc_n, eos                     (uint16 ids, N tokens)

stored as a raw ``numpy.memmap`` (``NAME.bin``) beside ``NAME.json``: the tokenizer's fingerprint and
vocabulary, the corpus fingerprint, where each document starts. Opening a stream with another tokenizer or
corpus is refused (the ids would mean other text).

Batches: a training example is a window of ``context + 1`` tokens starting anywhere in the stream; inputs
are its first ``context`` tokens, targets the last ``context``. The global batch of step ``s`` is ``B``
windows whose starts are drawn from a generator seeded with ``(seed, s)``; with ``W`` data-parallel ranks
and ``A`` accumulation steps, rank ``r`` at micro-step ``a`` takes rows

    r · B/W + a · B/(W·A)  ...  r · B/W + (a + 1) · B/(W·A) - 1

so every (W, A) sees the same global batch, and each piece is a pure function of (seed, s, r, a): training
resumes at any step without a data-loader state.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ..provenance import temporary_path
from .corpus import Document
from .tokenizer import Tokenizer, write_text_atomic

DTYPE = np.uint16


@dataclass
class TokenStream:
    """``N`` token ids (``tokens``: a read-only ``numpy.memmap`` or array) and what made them (``meta``:
    tokenizer fingerprint and vocabulary size, corpus fingerprint, ``documents`` with their starts)."""

    tokens: np.ndarray
    meta: dict

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def vocab_size(self) -> int:
        return self.meta["vocab_size"]

    def window(self, start: int, length: int) -> torch.Tensor:
        """Tokens ``start .. start + length - 1`` as int64 ``[length]``."""
        return torch.from_numpy(self.tokens[start: start + length].astype(np.int64))

    def windows(self, starts: torch.Tensor, length: int) -> torch.Tensor:
        """``[len(starts), length]`` int64: the windows beginning at ``starts``."""
        index = starts.numpy()[:, None] + np.arange(length)
        return torch.from_numpy(self.tokens[index].astype(np.int64))


def corpus_fingerprint(documents: Sequence[Document]) -> str:
    """A hash of the documents' sources, titles and texts, in order."""
    h = hashlib.sha256()
    for d in documents:
        h.update(f"{d.source}\0{d.title}\0{len(d.text)}\0".encode())
        h.update(d.text.encode("utf-8", errors="replace"))
    return h.hexdigest()[:16]


def build_stream(documents: Sequence[Document], tokenizer: Tokenizer, path: str | Path, *,
                 batch: int = 64) -> TokenStream:
    """Encode ``documents`` (module docstring) into ``path.bin`` and ``path.json``, both written atomically;
    returns the stream opened from disk. path: the name without suffix, e.g. ``data/train``."""
    if tokenizer.vocab_size > np.iinfo(DTYPE).max + 1:
        raise ValueError(f"a tokenizer of {tokenizer.vocab_size} tokens does not fit uint16 ids (at most 65536)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    bin_path = path.with_suffix(".bin")
    tmp = temporary_path(bin_path)
    starts, total = [], 0
    with tmp.open("wb") as f:
        for i in range(0, len(documents), batch):
            part = documents[i: i + batch]
            for doc, ids in zip(part, tokenizer.encode_batch([d.text for d in part])):
                array = np.asarray(ids + [tokenizer.eos_id], dtype=DTYPE)
                f.write(array.tobytes())
                starts.append(dict(source=doc.source, title=doc.title, start=total, tokens=len(array)))
                total += len(array)
    os.replace(tmp, bin_path)
    meta = dict(format="loglin_edu.token_stream/1", dtype="uint16", num_tokens=total, tokenizer=tokenizer.fingerprint,
                tokenizer_kind=tokenizer.kind, vocab_size=tokenizer.vocab_size, corpus=corpus_fingerprint(documents),
                documents=starts)
    write_text_atomic(path.with_suffix(".json"), json.dumps(meta, indent=1))
    return open_stream(path, tokenizer)


def open_stream(path: str | Path, tokenizer: Tokenizer | None = None, corpus: str | None = None) -> TokenStream:
    """The stream saved at ``path`` (``path.bin`` + ``path.json``), memory-mapped read-only.

    tokenizer, corpus: when given, the stream must have been made by this tokenizer (same fingerprint) from
    this corpus (same :func:`corpus_fingerprint`); otherwise a ValueError says what to do.
    """
    path = Path(path)
    meta_path, bin_path = path.with_suffix(".json"), path.with_suffix(".bin")
    if not meta_path.exists() or not bin_path.exists():
        raise FileNotFoundError(f"no token stream at {path} (expected {bin_path.name} and {meta_path.name})")
    meta = json.loads(meta_path.read_text())
    if tokenizer is not None and meta["tokenizer"] != tokenizer.fingerprint:
        raise ValueError(
            f"token stream {bin_path} was made by tokenizer {meta['tokenizer']} ({meta['tokenizer_kind']}, vocabulary "
            f"{meta['vocab_size']}), not by this one ({tokenizer.fingerprint}, {tokenizer.kind}, vocabulary "
            f"{tokenizer.vocab_size}): load the tokenizer saved beside it, or delete {bin_path.name} and "
            f"{meta_path.name} to encode the corpus again"
        )
    if corpus is not None and meta["corpus"] != corpus:
        raise ValueError(f"token stream {bin_path} was made from another corpus ({meta['corpus']}, not {corpus}): "
                         f"delete {bin_path.name} and {meta_path.name} to encode this corpus")
    tokens = np.memmap(bin_path, dtype=DTYPE, mode="r")
    if len(tokens) != meta["num_tokens"]:
        raise ValueError(f"{bin_path} holds {len(tokens)} tokens, its {meta_path.name} says {meta['num_tokens']}: "
                         f"delete both to encode the corpus again")
    return TokenStream(tokens, meta)


def check_fits(stream: TokenStream, length: int, what: str = "stream") -> None:
    """A window of ``length`` tokens must fit in the stream."""
    if len(stream) < length:
        raise ValueError(f"the {what} holds {len(stream)} tokens, fewer than one window of {length} (context + 1): "
                         f"use more text (more or longer documents) or a shorter context")


def batch_starts(seed: int, step: int, batch_size: int, num_starts: int) -> torch.Tensor:
    """``[batch_size]`` window starts of the global batch of ``step``, uniform in ``[0, num_starts)``."""
    gen = torch.Generator().manual_seed((seed * 1_000_003 + step) % (2**63))
    return torch.randint(num_starts, (batch_size,), generator=gen)


def micro_batch_rows(batch_size: int, world_size: int, micro_steps: int, rank: int, micro_step: int) -> range:
    """Rows of the global batch that rank ``rank`` takes at accumulation step ``micro_step`` (module docstring):
    a block of ``B / (W · A)`` rows inside the rank's block of ``B / W``."""
    if batch_size % (world_size * micro_steps):
        raise ValueError(f"batch_size={batch_size} must split evenly over world_size={world_size} ranks × "
                         f"micro_steps={micro_steps} accumulation steps")
    if not (0 <= rank < world_size and 0 <= micro_step < micro_steps):
        raise ValueError(f"need 0 <= rank < {world_size} and 0 <= micro_step < {micro_steps}, got {rank}, {micro_step}")
    share = batch_size // (world_size * micro_steps)
    first = rank * (batch_size // world_size) + micro_step * share
    return range(first, first + share)


def training_batch(stream: TokenStream, *, seed: int, step: int, batch_size: int, context: int, rank: int = 0,
                   world_size: int = 1, micro_step: int = 0, micro_steps: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s micro-batch ``micro_step`` of the global batch of ``step`` (module docstring).

    Returns inputs, targets: int64 ``[batch_size / (world_size · micro_steps), context]``.
    """
    rows = micro_batch_rows(batch_size, world_size, micro_steps, rank, micro_step)
    check_fits(stream, context + 1, "training stream")
    starts = batch_starts(seed, step, batch_size, len(stream) - context)[rows.start: rows.stop]
    tokens = stream.windows(starts, context + 1)
    return tokens[:, :-1], tokens[:, 1:]


def evaluation_starts(stream: TokenStream, length: int, count: int) -> torch.Tensor:
    """``count`` (or fewer, if they do not fit) window starts of ``length`` tokens, evenly spread over the stream
    and not overlapping: the same windows every time."""
    check_fits(stream, length, "evaluation stream")
    fit = min(count, len(stream) // length)
    stride = (len(stream) - length) // max(1, fit - 1) if fit > 1 else 0
    return torch.arange(fit) * stride
