"""The optimiser and its schedule: AdamW with decay on matrices only, linear warm-up then cosine decay.

    schedule(step) = (step + 1) / warmup                                 for step < warmup
                   = ½ (1 + cos(π (step - warmup) / (steps - warmup)))   afterwards
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import torch
from torch import nn


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to 0 at ``total`` (module docstring)."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def parameter_groups(model: nn.Module, lr: float, weight_decay: float) -> list[dict]:
    """Two AdamW groups of one model: matrices (weight decay) and vectors (norm gains, biases, A, D, λ
    weights: no decay). ``group["base_lr"]`` is the peak learning rate the schedule scales."""
    params = list(model.parameters())
    return [dict(params=[p for p in params if (p.dim() >= 2) == decay], weight_decay=weight_decay if decay else 0.0,
                 lr=lr, base_lr=lr) for decay in (True, False)]


def make_optimizer(models: Sequence[nn.Module], lrs: Iterable[float], weight_decay: float,
                   betas: tuple[float, float] = (0.9, 0.999), capturable: bool = False) -> torch.optim.AdamW:
    """AdamW over several models, each with its own peak learning rate (:func:`parameter_groups`).

    capturable: step counts stay on the device and learning rates may be device tensors, so that the step can be
    recorded in a CUDA graph (:mod:`~loglin_edu.train.step`). On CUDA the update is PyTorch's fused AdamW (one
    kernel per group, its step counts on the device); elsewhere the ``foreach`` form."""
    models = list(models)
    groups = [g for model, lr in zip(models, lrs) for g in parameter_groups(model, lr, weight_decay)]
    fused = all(p.is_cuda for model in models for p in model.parameters())
    return torch.optim.AdamW(groups, betas=betas, foreach=not fused, fused=fused, capturable=capturable)


def set_learning_rates(optimizer: torch.optim.Optimizer, factor: float) -> None:
    """Every group's learning rate becomes its ``base_lr · factor``."""
    for group in optimizer.param_groups:
        group["lr"] = group["base_lr"] * factor
