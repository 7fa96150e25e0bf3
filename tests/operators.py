"""The operators under test, each with a recipe for its random inputs (float64 by default)."""

from dataclasses import dataclass
from typing import Callable

import torch

import loglin_edu as le


@dataclass(frozen=True)
class Operator:
    name: str
    fn: Callable
    level_scales: bool = False
    decay: bool = False
    delta: bool = False

    def inputs(self, B, T, H, K, V, seed, shared_qk=False, dtype=torch.float64, ones=False):
        """Positional arguments for ``fn``: q, k, v[, level_scales][, log_decay, beta]."""
        gen = torch.Generator().manual_seed(seed)
        Hk = 1 if shared_qk else H
        q = torch.randn(B, T, Hk, K, generator=gen, dtype=dtype)
        k = torch.randn(B, T, Hk, K, generator=gen, dtype=dtype)
        if self.delta:  # the delta rule is stable for unit keys and β in (0, 1)
            k = torch.nn.functional.normalize(k, dim=-1)
        args = [q, k, torch.randn(B, T, H, V, generator=gen, dtype=dtype)]
        if self.level_scales:
            L = le.num_levels(T) + 1  # one level more than needed: extra levels must be ignored
            lam = torch.ones(B, T, H, L, dtype=dtype) if ones else 0.5 + torch.rand(B, T, H, L, generator=gen, dtype=dtype)
            args.append(lam)
        if self.decay or self.delta:
            args.append(-0.5 * torch.rand(B, T, H, generator=gen, dtype=dtype) if self.decay else None)
        if self.delta:
            args.append(torch.rand(B, T, H, generator=gen, dtype=dtype))
        return args

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


OPERATORS = [
    Operator("softmax", le.softmax_attention),
    Operator("linear", le.linear_attention),
    Operator("mamba2", le.mamba2_attention, decay=True),
    Operator("deltanet", le.gated_deltanet_attention, delta=True),
    Operator("gated_deltanet", le.gated_deltanet_attention, decay=True, delta=True),
    Operator("loglinear", le.loglinear_attention, level_scales=True),
    Operator("loglinear_mamba2", le.loglinear_attention, level_scales=True, decay=True),
    Operator("loglinear_deltanet", le.loglinear_attention, level_scales=True, delta=True),
    Operator("loglinear_gated_deltanet", le.loglinear_attention, level_scales=True, decay=True, delta=True),
]
LOGLINEAR = [op for op in OPERATORS if op.level_scales]


def relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """‖x - ref‖ / ‖ref‖, with an absolute floor of 1e-300 for an all-zero reference."""
    return (torch.linalg.vector_norm(x - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-300)).item()


def assert_close(x: torch.Tensor, ref: torch.Tensor, rtol: float = 1e-10, atol: float = 1e-12, what: str = ""):
    """‖x - ref‖ <= rtol ‖ref‖ + atol (atol covers references that are exactly zero)."""
    err = torch.linalg.vector_norm(x - ref).item()
    bound = rtol * torch.linalg.vector_norm(ref).item() + atol
    assert err <= bound, f"{what}: ‖x - ref‖ = {err:.3e} > {bound:.3e} (relative {relative_error(x, ref):.3e})"


def outputs_and_grads(op: Operator, args, **kwargs):
    """Output and gradients of a fixed random projection of it, for every differentiable input."""
    args = [None if a is None else a.detach().clone().requires_grad_(True) for a in args]
    out = op(*args, **kwargs)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    inputs = [a for a in args if a is not None]
    grads = torch.autograd.grad((out * weights).sum(), inputs, allow_unused=True)
    return out.detach(), [torch.zeros_like(a) if g is None else g for a, g in zip(inputs, grads)]
