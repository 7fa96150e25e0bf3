"""The "every form agrees" ledger: run each form of an operator on the same inputs and compare.

For each form: the largest absolute difference from the reference form, the relative error
``‖o - o_ref‖ / ‖o_ref‖`` and the median wall-clock time of a few runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class LedgerRow:
    """One form's agreement with the reference and its median time in milliseconds."""

    form: str
    max_abs_error: float
    relative_error: float
    milliseconds: float


class Ledger(list):
    """A list of :class:`LedgerRow` that prints as a table (text, and HTML in a notebook)."""

    header = ("form", "max abs error", "relative error", "time (ms)")

    def _cells(self) -> list[tuple[str, ...]]:
        return [
            (r.form, f"{r.max_abs_error:.2e}", f"{r.relative_error:.2e}", f"{r.milliseconds:.2f}") for r in self
        ]

    def __str__(self) -> str:
        rows = [self.header, *self._cells()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(self.header))]
        lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{h}</th>" for h in self.header)
        body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in self._cells())
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _median_ms(fn: Callable[[], torch.Tensor], repeats: int) -> tuple[torch.Tensor, float]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        if out.is_cuda:
            torch.cuda.synchronize(out.device)
        times.append((time.perf_counter() - start) * 1e3)
    return out, sorted(times)[len(times) // 2]


def compare_forms(
    operator: Callable[..., torch.Tensor],
    *args,
    forms: tuple[str, ...] | None = None,
    reference: str = "naive",
    repeats: int = 3,
    **kwargs,
) -> Ledger:
    """Run ``operator(*args, form=f, **kwargs)`` for each form and compare with ``form=reference``.

    ``forms`` defaults to every form the operator's module lists in ``FORMS``. Returns a :class:`Ledger`.
    """
    if forms is None:
        forms = getattr(operator, "forms", None)
        if forms is None:
            raise ValueError(f"forms must be given: {getattr(operator, '__name__', operator)} lists none")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    with torch.no_grad():
        expected = operator(*args, form=reference, **kwargs)
        ledger = Ledger()
        for form in forms:
            out, ms = _median_ms(lambda: operator(*args, form=form, **kwargs), repeats)
            diff = (out - expected).abs()
            ledger.append(
                LedgerRow(
                    form=form,
                    max_abs_error=diff.max().item(),
                    relative_error=(torch.linalg.vector_norm(out - expected) / torch.linalg.vector_norm(expected)).item(),
                    milliseconds=ms,
                )
            )
    return ledger
