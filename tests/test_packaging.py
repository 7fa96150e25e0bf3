"""The installed package holds every subpackage (a non-editable install ships only what pyproject lists)."""

import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def listed_packages() -> set[str]:
    tomllib = pytest.importorskip("tomllib")
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])


def test_every_subpackage_is_listed():
    found = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "loglin_edu").rglob("__init__.py")
    } | {"loglin_edu.kernels", "loglin_edu.results"}
    assert found == listed_packages()


def test_import_needs_no_triton():
    code = "import sys, loglin_edu; assert 'triton' not in sys.modules, 'import loglin_edu imported triton'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_wheel_ships_the_browser_explorers_javascript(tmp_path):
    """A non-editable install carries explorers.js (package data), which the book's browser explorers embed."""
    source = tmp_path / "source"
    for name in ("pyproject.toml", "README.md"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, source / name)
    for package in ("loglin_edu", "kernels", "book/results"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path),
         str(source)],
        check=True,
        capture_output=True,
    )
    wheel = next(tmp_path.glob("loglin_edu-*.whl"))
    assert "loglin_edu/viz/explorers.js" in zipfile.ZipFile(wheel).namelist()
