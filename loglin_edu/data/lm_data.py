"""Everything a language-model run reads, prepared once into a folder: split, tokenizer, token streams.

    folder/spec.json         the :class:`TextSpec` it was made from
    folder/tokenizer.json    the tokenizer (trained on the training split only)
    folder/train.{bin,json}  folder/validation.{bin,json}   the token streams (:mod:`.token_stream`)

:func:`prepare_text` makes what is missing and reuses what is there; a folder made from another spec is
refused. Once prepared, a folder is all a run needs: the corpus packages are not imported again (a
machine without them can train from a copied folder).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from .corpus import DEFAULT_SOURCES, Document, load_corpus, split_documents
from .token_stream import TokenStream, build_stream, corpus_fingerprint, open_stream
from .tokenizer import ByteTokenizer, Tokenizer, load_tokenizer, train_bpe, write_text_atomic

TOKENIZERS = ("bpe", "bytes")


@dataclass(frozen=True)
class TextSpec:
    """sources: corpus names for :func:`~loglin_edu.data.corpus.load_corpus`; tokenizer: ``"bpe"`` or
    ``"bytes"``; vocab_size: of the BPE; held_out: the validation share of each source's characters;
    split_seed: which documents are held out; max_document_chars: keep only the first this many characters of
    each document (a small slice for quick runs; None: all of it)."""

    sources: str = DEFAULT_SOURCES
    tokenizer: str = "bpe"
    vocab_size: int = 4096
    held_out: float = 0.1
    split_seed: int = 0
    max_document_chars: int | None = None

    def __post_init__(self) -> None:
        if self.tokenizer not in TOKENIZERS:
            raise ValueError(f"tokenizer must be one of {TOKENIZERS}, got {self.tokenizer!r}")


@dataclass
class TextData:
    """A prepared folder: its spec, tokenizer and the two token streams."""

    spec: TextSpec
    tokenizer: Tokenizer
    train: TokenStream
    validation: TokenStream
    folder: Path

    def describe(self) -> dict:
        """Documents and tokens of each split, and the tokenizer."""
        return dict(tokenizer=self.tokenizer.kind, vocab_size=self.tokenizer.vocab_size,
                    tokenizer_fingerprint=self.tokenizer.fingerprint,
                    train=dict(documents=len(self.train.meta["documents"]), tokens=len(self.train)),
                    validation=dict(documents=len(self.validation.meta["documents"]), tokens=len(self.validation),
                                    titles=[d["title"] for d in self.validation.meta["documents"]]))


def trim(docs: list[Document], max_chars: int | None) -> list[Document]:
    """Each document cut to its first ``max_chars`` characters (None: unchanged)."""
    if max_chars is None:
        return docs
    return [Document(d.source, d.title, d.text[:max_chars]) for d in docs]


def prepare_text(spec: TextSpec, folder: str | Path, *, documents: list[Document] | None = None) -> TextData:
    """The folder of ``spec`` (module docstring), made where missing. documents: the corpus to use instead of
    loading ``spec.sources`` (then ``spec.sources`` only names it)."""
    folder = Path(folder)
    spec_path, tok_path = folder / "spec.json", folder / "tokenizer.json"
    if spec_path.exists():
        saved = json.loads(spec_path.read_text())
        if saved != asdict(spec):
            raise ValueError(f"{folder} was prepared for another spec ({saved}, not {asdict(spec)}): "
                             f"use another folder, or delete this one to prepare it again")
    else:
        write_text_atomic(spec_path, json.dumps(asdict(spec), indent=1))
    files = [folder / f"{part}.{suffix}" for part in ("train", "validation") for suffix in ("bin", "json")]
    ready = tok_path.exists() and all(f.exists() for f in files)
    if ready and documents is None:
        tokenizer = load_tokenizer(tok_path)
        return TextData(spec, tokenizer, open_stream(folder / "train", tokenizer),
                        open_stream(folder / "validation", tokenizer), folder)
    docs = trim(documents if documents is not None else load_corpus(spec.sources), spec.max_document_chars)
    split = split_documents(docs, spec.held_out, spec.split_seed)
    if tok_path.exists():
        tokenizer = load_tokenizer(tok_path)
    else:
        if spec.tokenizer == "bytes":
            tokenizer = ByteTokenizer()
        else:
            tokenizer = train_bpe([d.text for d in split.train], spec.vocab_size)
        tokenizer.save(tok_path)
    streams = {}
    for name, part in (("train", split.train), ("validation", split.validation)):
        try:
            streams[name] = open_stream(folder / name, tokenizer, corpus_fingerprint(part))
        except FileNotFoundError:
            streams[name] = build_stream(part, tokenizer, folder / name)
    return TextData(spec, tokenizer, streams["train"], streams["validation"], folder)
