"""Exercises of the book with automatic checks: each runs random-shape cases and says what is wrong.

    from loglin_edu import exercises as ex
    ex.show("fenwick.level")            # the task and the signature
    ex.check("fenwick.level", my_level)  # ✔ or ✘ with the first case that disagrees, and a hint
    ex.show_solution("fenwick.level")    # the reference solution's code, checked like the reader's

Every exercise is checked against the package (or against its reference solution, which the tests check
against the package), so exercise, checker and solution cannot drift apart.
"""

from __future__ import annotations

import ast
import inspect
from typing import Callable

from . import (
    ch01_softmax, ch02_linear, ch03_gated, ch04_fenwick, ch05_hmatrix, ch06_loglinear, ch07_chunk_scan,
    ch08_kernel_puzzles, ch09_cost, ch10_layers, ch11_recall, ch12_decoding,
    ch13_language_modelling,
)
from .checking import Exercise, Report, run

EXERCISES: dict[str, Exercise] = {
    ex.name: ex
    for module in (
        ch01_softmax, ch02_linear, ch03_gated, ch04_fenwick, ch05_hmatrix, ch06_loglinear, ch07_chunk_scan,
        ch08_kernel_puzzles, ch09_cost, ch10_layers, ch11_recall, ch12_decoding, ch13_language_modelling,
    )
    for ex in module.EXERCISES
}


def get(name: str) -> Exercise:
    """The exercise called ``name`` (``ValueError`` listing the names otherwise)."""
    if name not in EXERCISES:
        raise ValueError(f"no exercise {name!r}; the exercises are: {', '.join(EXERCISES)}")
    return EXERCISES[name]


def check(name: str, fn: Callable, *, seed: int = 0) -> Report:
    """Run exercise ``name``'s random cases on ``fn``; the :class:`Report` prints ✔ or the first disagreement."""
    return run(get(name), fn, seed=seed)


def _markdown(text: str):
    from IPython.display import Markdown

    return Markdown(text)


def show(name: str):
    """The task of exercise ``name`` as Markdown (signature and statement)."""
    ex = get(name)
    return _markdown(f"**Exercise `{ex.name}`** — write `{ex.signature}`.\n\n{ex.task}")


def _referenced_globals(code) -> set[str]:
    """The global names ``code`` and the functions nested in it read."""
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _referenced_globals(const)
    return names


def solution_imports(fn: Callable) -> list[str]:
    """The import lines that make ``fn``'s source run on its own: one per global it reads or names in its annotations
    that its module imported (a module, or a function or class of another module)."""
    annotation_names = {node.id for text in fn.__annotations__.values() if isinstance(text, str)
                        for node in ast.walk(ast.parse(text, mode="eval")) if isinstance(node, ast.Name)}
    lines = []
    for name in sorted(_referenced_globals(fn.__code__) | annotation_names):
        if name not in fn.__globals__:
            continue
        obj = fn.__globals__[name]
        if inspect.ismodule(obj):
            path = obj.__name__
            lines.append(f"import {path}" if path == name else f"import {path} as {name}")
        elif getattr(obj, "__module__", fn.__module__) != fn.__module__ and getattr(obj, "__name__", None):
            alias = "" if obj.__name__ == name else f" as {name}"
            lines.append(f"from {obj.__module__} import {obj.__name__}{alias}")
    return sorted(lines, key=lambda line: (line.startswith("from"), line))


def solution_source(name: str) -> str:
    """What :func:`show_solution` shows: a kernel puzzle's ``source``, or the solution's imports and its code."""
    solution = get(name).solution
    if getattr(solution, "source", None):
        return solution.source
    imports = solution_imports(solution)
    return "\n".join(imports) + "\n\n\n" * bool(imports) + inspect.getsource(solution)


def show_solution(name: str):
    """The reference solution's source code with the imports it needs (a kernel puzzle's: its ``source``),
    followed by its own check."""
    report = check(name, get(name).solution)
    return _markdown(f"```python\n{solution_source(name)}```\n\n{report}")


__all__ = ["EXERCISES", "Exercise", "Report", "check", "get", "show", "show_solution", "solution_imports", "solution_source"]
