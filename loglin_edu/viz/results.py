"""The book's results files: measured JSON (with provenance) and plots, found through the installed package.

The files live in the repository's ``book/results/`` and are installed as the package data of
``loglin_edu.results``, so a chapter finds them the same way in a checkout, after ``pip install`` from the
repository, or on Colab — never through a path relative to the working directory:

    from loglin_edu.viz import results
    bench = results.load("kernels_h200")     # the parsed JSON of book/results/kernels_h200.json
    print(results.caption(bench))            # NVIDIA H200 · torch 2.11.0+cu130 · triton 3.6.0 · 2026-11-30
    png = results.read_bytes("kernels_h200.png")
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

PACKAGE = "loglin_edu.results"
CAPTION_LIBRARIES = ("torch", "triton", "fla-core")


def _folder():
    return resources.files(PACKAGE)


def names(suffix: str = ".json") -> list[str]:
    """The results files ending in ``suffix``, sorted (names with the suffix)."""
    return sorted(f.name for f in _folder().iterdir()
                  if f.is_file() and f.name.endswith(suffix) and not f.name.startswith("_"))


def file(name: str):
    """The results file ``name`` (a ``Traversable``: ``.read_text()``, ``.read_bytes()``); ``ValueError``
    naming the available files when there is none."""
    found = _folder() / name
    if not found.is_file():
        raise ValueError(f"no results file {name!r}; the results files are: {', '.join(names('')) or 'none'}")
    return found


def load(name: str) -> dict[str, Any]:
    """The parsed JSON of results file ``name`` (``".json"`` is added when missing)."""
    return json.loads(file(name if name.endswith(".json") else name + ".json").read_text())


def read_bytes(name: str) -> bytes:
    """The bytes of results file ``name`` (a plot, for ``IPython.display.Image(data=...)``)."""
    return file(name).read_bytes()


def caption(record: dict[str, Any], *, commit: bool = False) -> str:
    """One line saying where ``record``'s numbers come from: device, library versions and date (and the code's
    commit, in its 7-character short form, when ``commit``), e.g.
    ``NVIDIA H200 · torch 2.11.0+cu130 · triton 3.6.0 · 2026-11-30``.
    Reads ``versions`` and ``date`` (benchmarks) or ``environment`` (experiments)."""
    versions = record.get("versions") or record.get("environment") or {}  # older experiment files: "environment"
    parts = [versions.get("device") or record.get("device") or "unknown device"]
    parts += [f"{lib} {versions[lib]}" for lib in CAPTION_LIBRARIES if versions.get(lib, "not installed") != "not installed"]
    date = record.get("date") or versions.get("date")
    if date:
        parts.append(date[:10])
    if commit and record.get("commit"):
        parts.append(f"code {record['commit'][:7]}")  # a commit's short form, as git prints it
    return " · ".join(parts)
