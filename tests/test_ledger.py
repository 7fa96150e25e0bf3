import torch

import loglin_edu as le
from operators import LOGLINEAR


def test_ledger_rows_for_every_form():
    op = LOGLINEAR[1]
    args = op.inputs(B=1, T=50, H=2, K=4, V=4, seed=0)
    ledger = le.compare_forms(le.loglinear_attention, *args, chunk_size=8, repeats=2)
    assert [row.form for row in ledger] == list(le.REFERENCE_FORMS)
    assert ledger[0].max_abs_error == 0.0  # naive against itself
    assert all(row.relative_error < 1e-12 and row.milliseconds > 0 for row in ledger)
    text = str(ledger)
    assert "relative error" in text and "chunkwise" in text
    assert "<table>" in ledger._repr_html_()


def test_ledger_reports_a_wrong_form():
    def operator(x, *, form):
        return x + (1.0 if form == "broken" else 0.0)

    ledger = le.compare_forms(operator, torch.ones(3), forms=("naive", "broken"))
    assert ledger[1].max_abs_error == 1.0 and abs(ledger[1].relative_error - 1.0) < 1e-12
