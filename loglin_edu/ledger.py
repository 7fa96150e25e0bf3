"""The "every form agrees" ledger: run each form of an operator on the same inputs and compare.

For each form: the largest absolute difference from the reference form, the relative error
``‖o - o_ref‖ / ‖o_ref‖`` and the median wall-clock time of a few runs (:func:`~loglin_edu.timing.median_ms`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .ops import REFERENCE_FORMS
from .timing import median_ms


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


def compare_forms(
    operator: Callable[..., torch.Tensor],
    *args,
    forms: tuple[str, ...] | None = None,
    reference: str = "naive",
    repeats: int = 3,
    **kwargs,
) -> Ledger:
    """Run ``operator(*args, form=f, **kwargs)`` for each form and compare with ``form=reference``.

    ``forms`` defaults to :data:`~loglin_edu.ops.REFERENCE_FORMS`, the forms every operator has.
    Returns a :class:`Ledger`.
    """
    forms = REFERENCE_FORMS if forms is None else forms
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    with torch.no_grad():
        expected = operator(*args, form=reference, **kwargs)
        ledger = Ledger()
        for form in forms:
            outputs = []
            ms = median_ms(lambda: outputs.append(operator(*args, form=form, **kwargs)), device=expected.device,
                           repeats=repeats, warmup=0)
            out = outputs[-1]
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
