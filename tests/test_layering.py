"""The package's layers depend one way only: no module imports a module of a higher layer.

    0 ground   definitions and forms: fenwick, masks, the forms of every model, the decoding state, and the
               utilities every layer uses (checks, layout, timing, provenance)
    1 ops      the registry of operators and forms; kernels beside it (they import only the ground)
    2 parts    layers and models, data, the forms ledger
    3 training train
    4 programs experiments, benchmarks
    5 book     viz, exercises

A module may import modules of its own layer or lower ones. Imports are read from the source (``ast``), so
an import inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "loglin_edu"
KERNELS = ROOT / "kernels"

LAYERS = {
    "ground": 0, "ops": 1, "kernels": 1, "parts": 2, "training": 3, "programs": 4, "book": 5,
}
TOP_LEVEL = {  # first component below loglin_edu -> layer
    "fenwick": "ground", "masks": "ground", "checks": "ground", "layout": "ground", "recurrence": "ground",
    "chunking": "ground", "softmax": "ground", "linear": "ground", "deltanet": "ground", "loglinear": "ground",
    "chunk_scan": "ground", "state": "ground", "decoding": "ground", "timing": "ground", "provenance": "ground",
    "ops": "ops", "kernels": "kernels",
    "layers": "parts", "data": "parts", "ledger": "parts",
    "train": "training",
    "experiments": "programs", "bench": "programs",
    "viz": "book", "exercises": "book",
}


def module_name(path: Path) -> str:
    if path.is_relative_to(KERNELS):
        parts = ["loglin_edu", "kernels", *path.relative_to(KERNELS).with_suffix("").parts]
    else:
        parts = ["loglin_edu", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(p for p in parts if p != "__init__")


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py")) + sorted(KERNELS.rglob("*.py"))


def imported(path: Path, source: str | None = None) -> set[str]:
    """Absolute names of the loglin_edu modules ``path`` (or ``source`` read as if it were ``path``) imports,
    relative imports resolved."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("loglin_edu")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("loglin_edu"):
                found.add(target)
                found |= {f"{target}.{a.name}" for a in node.names}  # `from . import x` names a module
    return found


def layer_of(name: str) -> str | None:
    parts = name.split(".")
    if len(parts) < 2:
        return None  # the package itself (its __init__ re-exports the ground and ops)
    return TOP_LEVEL.get(parts[1])


def higher_imports(path: Path, source: str | None = None) -> list[str]:
    """The modules of a higher layer than its own that ``path`` (or ``source`` read as ``path``) imports."""
    own = layer_of(module_name(path))
    if own is None:
        return []
    return sorted(
        target for target in imported(path, source)
        if (layer := layer_of(target)) is not None and LAYERS[layer] > LAYERS[own]
    )


@pytest.mark.parametrize("path", sources(), ids=lambda p: module_name(p))
def test_no_module_imports_a_higher_layer(path):
    higher = higher_imports(path)
    assert not higher, f"{module_name(path)} ({layer_of(module_name(path))}) imports a higher layer: {higher}"


def test_kernels_import_only_the_ground():
    for path in sorted(KERNELS.rglob("*.py")):
        above = sorted(t for t in imported(path) if layer_of(t) not in ("ground", "kernels"))
        assert not above, f"{module_name(path)} imports {above}"


def test_every_module_has_a_layer():
    unknown = sorted({module_name(p).split(".")[1] for p in sources() if module_name(p) != "loglin_edu"} - set(TOP_LEVEL))
    assert not unknown, f"modules without a layer in this test: {unknown}"


def test_the_checker_sees_a_violation():
    """The test itself can fail: a ground module importing the layers is caught."""
    fenwick = PACKAGE / "fenwick.py"
    assert higher_imports(fenwick) == []
    assert higher_imports(fenwick, fenwick.read_text() + "\nfrom .layers import model\n") == [
        "loglin_edu.layers", "loglin_edu.layers.model"]
