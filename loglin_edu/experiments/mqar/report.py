"""What a recall run reports: the best learning rate per cell, comparisons beyond the seed spread, the
results file with its provenance, and a text table."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch

from ...provenance import provenance
from .settings import LABELS, Tier


def best_by_cell(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For every (model, width, seed): the final accuracy of its best learning rate (Zoology's protocol picks
    the best learning rate of each cell)."""
    rows = []
    for rec in records:
        for seed in sorted({m["seed"] for m in rec["members"]}):
            finals = [line for line in rec["final"] if line["seed"] == seed]
            if not finals:
                continue
            best = max(finals, key=lambda line: line["accuracy"])
            rows.append(dict(model=rec["model_name"], width=rec["width"], seed=seed, lr=best["lr"],
                             accuracy=best["accuracy"], accuracy_by_set=best["accuracy_by_set"],
                             accuracy_by_level=best["accuracy_by_level"]))
    return rows


def cell_accuracies(result: dict[str, Any], model: str, width: int) -> list[float]:
    """Best-learning-rate final accuracy of every seed of one cell (empty if the job did not finish)."""
    return [r["accuracy"] for r in result["best"] if r["model"] == model and r["width"] == width]


def compare(result: dict[str, Any], model: str, baseline: str, width: int) -> dict[str, Any]:
    """Is ``model`` better than ``baseline`` at ``width``, beyond the spread over seeds?

    Difference of the seed means, and its standard error ``sqrt(s_a²/n_a + s_b²/n_b)`` (sample standard
    deviations). ``separated`` when the difference exceeds two standard errors and one point of accuracy.
    """
    a = torch.tensor(cell_accuracies(result, model, width), dtype=torch.float64) * 100
    b = torch.tensor(cell_accuracies(result, baseline, width), dtype=torch.float64) * 100
    if len(a) < 2 or len(b) < 2:
        return dict(model=model, baseline=baseline, width=width, seeds=(len(a), len(b)), separated=None)
    diff = (a.mean() - b.mean()).item()
    se = (a.var() / len(a) + b.var() / len(b)).sqrt().item()
    return dict(model=model, baseline=baseline, width=width, seeds=(len(a), len(b)), mean=a.mean().item(),
                baseline_mean=b.mean().item(), difference=diff, standard_error=se,
                separated=abs(diff) > max(2 * se, 1.0), better=diff > 0)


GATE_ACCURACY = 0.99


def transformer_gate(result: dict[str, Any], threshold: float = GATE_ACCURACY) -> dict[str, Any]:
    """Zoology's sanity check before any comparison: the Transformer's test accuracy (mean over seeds, each seed
    at its selected learning rate) reaches ``threshold`` at every width of the run.

    Returns ``dict(threshold, by_width={width: mean or None}, passed)``; a width whose Transformer did not
    finish counts as failed, and a run without Transformer jobs does not pass.
    """
    by_width = {}
    for w in result["widths"]:
        accs = cell_accuracies(result, "transformer", w)
        by_width[str(w)] = sum(accs) / len(accs) if accs else None
    passed = bool(by_width) and all(a is not None and a >= threshold for a in by_width.values())
    return dict(threshold=threshold, by_width=by_width, passed=passed)


def results_record(name: str, tier: Tier, records: list[dict[str, Any]], *, device: str, seconds: float,
                   commit: str | None, command: str | None) -> dict[str, Any]:
    """The results file of one tier: setup, provenance, every job's record and the best-lr table
    (``best`` only counts jobs that reached their last step; see each job's ``complete``)."""
    result = dict(
        tier=name, **{**provenance(command, device), **({"commit": commit} if commit else {})},
        seconds=round(seconds, 1), data=asdict(tier.data), train=tier.train.to_dict(), seeds=list(tier.seeds),
        lrs=list(tier.lrs), models=list(tier.models), widths=list(tier.widths), backend=tier.backend,
        transformer=dict(conv_size=tier.attention_conv, rope=tier.attention_rope), jobs=records,
        best=best_by_cell([r for r in records if r["complete"]]),
    )
    result["gate"] = transformer_gate(result)
    return result


def summary_table(result: dict[str, Any]) -> list[str]:
    """Mean ± std over seeds of the best-learning-rate accuracy, one line per model, one column per width."""
    lines = [f"{'model':<28}" + "".join(f"{'d=' + str(w):>16}" for w in result["widths"])]
    for model in result["models"]:
        cells = []
        for w in result["widths"]:
            accs = torch.tensor([r["accuracy"] for r in result["best"] if r["model"] == model and r["width"] == w])
            if len(accs) == 0:
                cells.append("-")
            else:
                cells.append(f"{100 * accs.mean():6.1f} ± {100 * accs.std():4.1f}" if len(accs) > 1 else f"{100 * accs.mean():6.1f}")
        lines.append(f"{LABELS[model]:<28}" + "".join(f"{c:>16}" for c in cells))
    return lines
