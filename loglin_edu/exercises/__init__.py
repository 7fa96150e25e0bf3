"""Exercises of the book with automatic checks: each runs random-shape cases and says what is wrong.

    from loglin_edu import exercises as ex
    ex.show("fenwick.level")            # the task and the signature
    ex.check("fenwick.level", my_level)  # ✔ or ✘ with the first case that disagrees, and a hint
    ex.show_solution("fenwick.level")    # the reference solution's code, checked like the reader's

Every exercise is checked against the package (or against its reference solution, which the tests check
against the package), so exercise, checker and solution cannot drift apart.
"""

from __future__ import annotations

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


def show_solution(name: str):
    """The reference solution's source code (a kernel puzzle's: its ``source``), followed by its own check."""
    ex = get(name)
    report = check(name, ex.solution)
    source = getattr(ex.solution, "source", None) or inspect.getsource(ex.solution)
    return _markdown(f"```python\n{source}```\n\n{report}")


__all__ = ["EXERCISES", "Exercise", "Report", "check", "get", "show", "show_solution"]
