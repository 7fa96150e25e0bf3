"""Accuracy of every member of an ensemble on recall test sets: overall, by set and by Fenwick level."""

from __future__ import annotations

import torch

from ..data.recall import RecallSet
from .batches import gather_batch
from .ensemble import Ensemble


@torch.no_grad()
def evaluate(ensemble: Ensemble, test_sets: dict[str, RecallSet], batch_size: int, amp: bool = False) -> list[dict]:
    """Accuracy of every member on every test set (argmax over the vocabulary at each query).

    Returns one dict per member: ``accuracy`` over all queries, ``accuracy_by_set``, ``accuracy_by_level``
    (by the Fenwick level of the answer seen from its query) and ``queries`` counted.
    """
    M = len(ensemble.members)
    device = next(ensemble.parameters()).device
    correct_by_set, count_by_set = {}, {}
    correct_by_level = torch.zeros(M, 64, device=device)
    count_by_level = torch.zeros(64, device=device)
    for name, test in test_sets.items():
        correct = torch.zeros(M, device=device)
        for start in range(0, len(test), batch_size):
            rows = torch.arange(start, min(start + batch_size, len(test)), device=test.inputs.device)
            tokens, positions, answers = gather_batch([test], [rows])
            with autocast(device, amp):
                logits = ensemble(tokens, positions, shared_inputs=True)  # [M, N, V]
            hit = (logits.argmax(-1) == answers).float()
            correct += hit.sum(1)
            levels = test.select(rows).levels().flatten().to(device)
            correct_by_level.index_add_(1, levels, hit)
            count_by_level.index_add_(0, levels, torch.ones_like(levels, dtype=torch.float))
        correct_by_set[name] = correct
        count_by_set[name] = len(test) * test.num_queries
    total = sum(count_by_set.values())
    overall = sum(correct_by_set.values()) / total
    by_set = {name: (c / count_by_set[name]).tolist() for name, c in correct_by_set.items()}
    used = count_by_level.nonzero().flatten().tolist()
    by_level = (correct_by_level[:, used] / count_by_level[used]).tolist()
    return [
        dict(accuracy=overall[m].item(), accuracy_by_set={n: a[m] for n, a in by_set.items()},
             accuracy_by_level={str(lvl): by_level[m][i] for i, lvl in enumerate(used)}, queries=total)
        for m in range(M)
    ]


def autocast(device: torch.device, enabled: bool):
    """bf16 autocast on CUDA when ``enabled``; a no-op context elsewhere."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled and device.type == "cuda")
