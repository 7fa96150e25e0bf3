"""The installed package holds every subpackage (a non-editable install ships only what pyproject lists)."""

import pathlib
import subprocess
import sys

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
