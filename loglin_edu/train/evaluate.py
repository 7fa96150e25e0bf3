"""Accuracy of every member of an ensemble on recall sets, and the level weights λ its log-linear layers learned.

Two ways to average, both reported (they differ when sets have different numbers of queries per sequence):

    accuracy       = mean over sequences n of (correct queries of n / queries of n)   (Zoology's metric)
    query_accuracy = Σ correct queries / Σ queries                                     (pooled)

Within one set every sequence has the same number of queries, so ``accuracy_by_set`` is both.
"""

from __future__ import annotations

import torch
from torch import nn

from ..data.recall import RecallSet
from ..layers.parts import LevelScales
from .batches import gather_batch
from .ensemble import Ensemble


@torch.no_grad()
def evaluate(ensemble: Ensemble, test_sets: dict[str, RecallSet], batch_size: int, amp: bool = False) -> list[dict]:
    """Accuracy of every member on the sets ``test_sets`` (argmax over the vocabulary at each query).

    Returns one dict per member: ``accuracy`` (mean over sequences of each sequence's fraction of correct
    queries), ``query_accuracy`` (over all queries), ``accuracy_by_set``, ``accuracy_by_level`` (by the Fenwick
    level of the answer seen from its query), ``queries`` and ``sequences`` counted.
    """
    M = len(ensemble.members)
    device = next(ensemble.parameters()).device
    correct_by_set, count_by_set = {}, {}
    sequence_score = torch.zeros(M, device=device)  # Σ_n fraction of sequence n's queries answered
    correct_by_level = torch.zeros(M, 64, device=device)
    count_by_level = torch.zeros(64, device=device)
    for name, test in test_sets.items():
        correct = torch.zeros(M, device=device)
        for start in range(0, len(test), batch_size):
            rows = torch.arange(start, min(start + batch_size, len(test)), device=test.inputs.device)
            tokens, positions, answers = gather_batch([test], [rows])
            with autocast(device, amp):
                logits = ensemble(tokens, positions, shared_inputs=True)  # [M, N, V]
            hit = (logits.argmax(-1) == answers).float()  # [M, b · Q]
            correct += hit.sum(1)
            sequence_score += hit.view(M, len(rows), test.num_queries).mean(2).sum(1)
            levels = test.select(rows).levels().flatten().to(device)
            correct_by_level.index_add_(1, levels, hit)
            count_by_level.index_add_(0, levels, torch.ones_like(levels, dtype=torch.float))
        correct_by_set[name] = correct
        count_by_set[name] = len(test) * test.num_queries
    queries = sum(count_by_set.values())
    sequences = sum(len(test) for test in test_sets.values())
    pooled = sum(correct_by_set.values()) / queries
    per_sequence = sequence_score / sequences
    by_set = {name: (c / count_by_set[name]).tolist() for name, c in correct_by_set.items()}
    used = count_by_level.nonzero().flatten().tolist()
    by_level = (correct_by_level[:, used] / count_by_level[used]).tolist()
    return [
        dict(accuracy=per_sequence[m].item(), query_accuracy=pooled[m].item(),
             accuracy_by_set={n: a[m] for n, a in by_set.items()},
             accuracy_by_level={str(lvl): by_level[m][i] for i, lvl in enumerate(used)}, queries=queries,
             sequences=sequences)
        for m in range(M)
    ]


@torch.no_grad()
def level_scales_at_queries(model: nn.Module, test: RecallSet, count: int = 64) -> list[list[float]] | None:
    """The λ a model's log-linear layers give the levels, averaged where they are read: at the query positions
    of the first ``count`` sequences of ``test``, over heads, and over the queries whose bucket of that level is
    not empty (bucket ``ℓ >= 1`` of query ``t`` holds keys iff bit ``ℓ - 1`` of ``t`` is set; level 0 always).

    Returns one list per log-linear layer, ``[λ̄_0, λ̄_1, ...]`` (None for a level no query reads), or None
    for a model without log-linear layers.
    """
    modules = [m for m in model.modules() if isinstance(m, LevelScales)]
    if not modules:
        return None
    captured: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda _m, _inputs, out: captured.append(out)) for m in modules]
    rows = torch.arange(min(count, len(test)), device=test.inputs.device)
    sample = test.select(rows)
    try:
        model(sample.inputs)
    finally:
        for hook in hooks:
            hook.remove()
    t = sample.query_positions  # [n, Q]
    L = modules[0].num_levels
    level = torch.arange(L, device=t.device)
    read = (level == 0) | (((t[..., None] >> (level - 1).clamp(min=0)) & 1) == 1)  # [n, Q, L]
    out = []
    for lam in captured:  # [n, T, H, L]
        at_queries = lam.gather(1, t[..., None, None].expand(-1, -1, *lam.shape[2:])).mean(2)  # [n, Q, L]
        weight = read.float()
        mean = (at_queries * weight).sum((0, 1)) / weight.sum((0, 1)).clamp(min=1)
        out.append([m if c > 0 else None for m, c in zip(mean.tolist(), weight.sum((0, 1)).tolist())])
    return out


def autocast(device: torch.device, enabled: bool, cache: bool = True):
    """bf16 autocast on CUDA when ``enabled``; a no-op context elsewhere. ``cache=False`` inside a captured
    CUDA graph (autocast's cast cache would outlive the capture)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled and device.type == "cuda",
                          cache_enabled=cache)
