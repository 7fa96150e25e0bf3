"""The chapters run from an installed package, as on Colab: no checkout, no editable install, a working directory
of their own.

The package is built from a copy of the sources and installed non-editable with ``pip install --no-deps --target``
into a temporary folder, which goes first on the kernel's ``PYTHONPATH`` (the other dependencies come from this
environment); then chapters 9 and 11 execute from another temporary folder. They find their results through the
installed package data (``loglin_edu.viz.results``), never through a path into the repository.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = [ROOT / "book" / "09_how_fast_is_it.ipynb", ROOT / "book" / "11_associative_recall.ipynb"]
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", "_build", "build", "node_modules", "*.egg-info", "__pycache__",
                                     ".pytest_cache", ".hypothesis", "dist")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A non-editable install of the package from a copy of this checkout; returns its folder."""
    base = tmp_path_factory.mktemp("colab")
    sources, target = base / "sources", base / "site"
    shutil.copytree(ROOT, sources, ignore=NOT_SOURCES)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(sources)], check=True, timeout=600)
    shutil.rmtree(sources)
    return target


def environment(site: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}


@pytest.mark.slow
def test_the_installed_package_is_the_copy_and_holds_the_results(installed, tmp_path):
    code = ("import loglin_edu, sys; from loglin_edu.viz import results\n"
            "print(loglin_edu.__file__); print(len(results.names())); print(results.load('kernels_h200')['setting'])")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=environment(installed), capture_output=True,
                          text=True, check=True)
    where, count, _ = done.stdout.splitlines()
    assert Path(where).is_relative_to(installed), where
    assert int(count) == len(list((ROOT / "book" / "results").glob("*.json")))


@pytest.mark.slow
@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_chapter_executes_from_an_installed_package(installed, chapter, tmp_path, monkeypatch):
    from nbclient import NotebookClient

    work = tmp_path / "work"
    work.mkdir()
    notebook = nbformat.read(chapter, as_version=4)
    monkeypatch.setenv("PYTHONPATH", environment(installed)["PYTHONPATH"])
    monkeypatch.chdir(work)
    client = NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(work)}})
    client.execute()
    source = "\n".join(c.source for c in notebook.cells if c.cell_type == "code")
    assert "book/results" not in source and "__file__" not in source, "the chapter looks for results in a checkout"
