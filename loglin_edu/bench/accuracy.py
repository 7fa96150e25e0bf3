"""Accuracy of the kernels: relative errors of the output and every gradient against float64."""

from __future__ import annotations

import torch

from ..fenwick import num_levels


ACCURACY_SHAPES = (  # (B, T, H, Hk, K, V): per-head and shared q/k, T off the chunk grid, long sequences
    (2, 1000, 4, 4, 64, 64),
    (3, 333, 3, 1, 40, 24),
    (1, 4096, 8, 1, 128, 64),
    (1, 65536, 2, 1, 128, 64),
)


def relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """``‖x - ref‖ / ‖ref‖`` in fp64."""
    x, ref = x.double(), ref.double()
    return (torch.linalg.vector_norm(x - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-300)).item()


def accuracy_inputs(shape, gen: torch.Generator) -> list[torch.Tensor]:
    """fp32 CPU inputs of one shape ``(B, T, H, Hk, K, V)``: q, k ``[B, T, Hk, K]`` scaled by ``K^-1/2``,
    v ``[B, T, H, V]``, λ ``[B, T, H, L + 1]`` in (0.5, 1.5), log decay ``[B, T, H]`` in (-0.1, 0)."""
    B, T, H, Hk, K, V = shape
    return [
        torch.randn(B, T, Hk, K, generator=gen) * K**-0.5,
        torch.randn(B, T, Hk, K, generator=gen) * K**-0.5,
        torch.randn(B, T, H, V, generator=gen),
        0.5 + torch.rand(B, T, H, num_levels(T) + 1, generator=gen),
        -0.1 * torch.rand(B, T, H, generator=gen),
    ]


def accuracy(shape, dtype: torch.dtype, device, seed: int = 0, config=None) -> dict:
    """Relative errors of o and every gradient of ``loglinear_mamba2`` in ``dtype`` against the package's
    chunkwise form in float64 on the same (rounded) inputs."""
    from ..kernels.step5_loglinear_mamba2 import loglinear_mamba2
    from ..ops import loglinear_attention

    gen = torch.Generator(device="cpu").manual_seed(seed)
    low = [x.to(device=device, dtype=dtype).requires_grad_(True) for x in accuracy_inputs(shape, gen)]
    high = [x.detach().double().requires_grad_(True) for x in low]
    out = loglinear_mamba2(*low, config=config)
    weights = torch.randn(out.shape, generator=gen).to(device=device, dtype=dtype)  # dO, in the inputs' dtype
    grads = torch.autograd.grad((out.float() * weights.float()).sum(), low)
    ref = loglinear_attention(*high, form="chunkwise", chunk_size=64)
    ref_grads = torch.autograd.grad((ref * weights.double()).sum(), high)
    names = ("o", "dq", "dk", "dv", "dlevel_scales", "dlog_decay")
    errors = [relative_error(out, ref)] + [relative_error(g, r) for g, r in zip(grads, ref_grads)]
    return {"shape": dict(zip("B T H Hk K V".split(), shape)), "dtype": str(dtype).replace("torch.", ""),
            "errors": dict(zip(names, errors))}


DELTA_ACCURACY_SHAPES = (  # (B, T, H, Hk, K, V): per-head and shared q/k, the authors' widths, long sequences
    (2, 1000, 4, 4, 64, 64),
    (3, 333, 3, 1, 40, 24),
    (1, 2048, 2, 2, 192, 384),
    (1, 4096, 2, 2, 256, 256),
    (1, 65536, 2, 2, 128, 64),
)


def delta_accuracy_inputs(shape, gen: torch.Generator) -> list[torch.Tensor]:
    """fp32 CPU inputs of log-linear Gated DeltaNet, ``(B, T, H, Hk, K, V)``: q, k ``[B, T, Hk, K]`` of unit length
    (q scaled by ``K^-1/2``, as the layer does), v ``[B, T, H, V]``, λ ``[B, T, H, L + 1]`` in (0.5, 1.5),
    log decay ``[B, T, H]`` in (-0.1, 0), β ``[B, T, H]`` in (0, 1)."""
    B, T, H, Hk, K, V = shape
    unit = lambda: torch.nn.functional.normalize(torch.randn(B, T, Hk, K, generator=gen), dim=-1)  # noqa: E731
    return [
        unit() * K**-0.5,
        unit(),
        torch.randn(B, T, H, V, generator=gen),
        0.5 + torch.rand(B, T, H, num_levels(T) + 1, generator=gen),
        -0.1 * torch.rand(B, T, H, generator=gen),
        torch.rand(B, T, H, generator=gen),
    ]


def delta_accuracy(shape, dtype: torch.dtype, device, seed: int = 0, config=None) -> dict:
    """Relative errors of o and every gradient (q, k, v, λ, log decay, β) of ``loglinear_gated_deltanet`` in
    ``dtype`` against the package's chunkwise form in float64 on the same (rounded) inputs."""
    from ..kernels.step9_loglinear_gated_deltanet import loglinear_gated_deltanet
    from ..ops import loglinear_attention

    gen = torch.Generator(device="cpu").manual_seed(seed)
    low = [x.to(device=device, dtype=dtype).requires_grad_(True) for x in delta_accuracy_inputs(shape, gen)]
    high = [x.detach().double().requires_grad_(True) for x in low]
    out = loglinear_gated_deltanet(*low, config=config)
    weights = torch.randn(out.shape, generator=gen).to(device=device, dtype=dtype)
    grads = torch.autograd.grad((out.float() * weights.float()).sum(), low)
    ref = loglinear_attention(*high, form="chunkwise", chunk_size=64)
    ref_grads = torch.autograd.grad((ref * weights.double()).sum(), high)
    names = ("o", "dq", "dk", "dv", "dlevel_scales", "dlog_decay", "dbeta")
    errors = [relative_error(out, ref)] + [relative_error(g, r) for g, r in zip(grads, ref_grads)]
    return {"shape": dict(zip("B T H Hk K V".split(), shape)), "dtype": str(dtype).replace("torch.", ""),
            "errors": dict(zip(names, errors))}
