"""Chapter 10: the layers — λ from the projection, Mamba-2's decay, and what the log-linear layers add."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import layers
from ..fenwick import num_levels
from .checking import Case, Exercise, call, describe


def level_scales(dl: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``λ[b, t, h, ℓ] = softplus(weight[h, ℓ] · dl[b, t, h·L + ℓ])``. dl: ``[B, T, H · L]``; weight: ``[H, L]``
    -> ``[B, T, H, L]``."""
    return F.softplus(weight * dl.unflatten(-1, weight.shape))


def _scales_after_softplus(dl, weight):
    return weight * F.softplus(dl.unflatten(-1, weight.shape))


def _scales_level_major(dl, weight):
    H, L = weight.shape
    return F.softplus(weight * dl.unflatten(-1, (L, H)).transpose(-1, -2))


def _scales_without_softplus(dl, weight):
    return weight * dl.unflatten(-1, weight.shape)


def _scale_cases(rng):
    for _ in range(6):
        B, H, L = rng.randint(1, 2), rng.randint(2, 4), rng.randint(2, 6)
        T = rng.randint(1, 2 ** (L - 1))  # a layer with L levels takes sequences up to 2^(L-1)
        gen = torch.Generator().manual_seed(rng.randrange(2**31))
        dl = torch.randn(B, T, H * L, generator=gen, dtype=torch.float64)
        weight = 0.5 + torch.rand(H, L, generator=gen, dtype=torch.float64)
        yield Case((dl, weight), describe(dict(B=B, T=T, H=H, L=L)))


def _scales_of_the_layer(dl, weight):
    H, L = weight.shape
    module = layers.LevelScales(H, max_len=2 ** (L - 1)).double()  # num_levels(2^(L-1)) = L
    with torch.no_grad():
        module.weight.copy_(weight)
        return module(dl)


LEVEL_SCALES = Exercise(
    name="layers.level_scales",
    chapter=10,
    signature="level_scales(dl, weight) -> λ",
    task="Turn the `H · L` extra outputs `dl: [B, T, H·L]` of a layer's projection into the level weights "
         "`λ: [B, T, H, L]`: `λ[b, t, h, ℓ] = softplus(weight[h, ℓ] · dl[b, t, h·L + ℓ])` with the per-head, "
         "per-level parameter `weight: [H, L]` (`L_{h,ℓ}` in the text). The outputs are grouped by head.",
    solution=level_scales,
    cases=_scale_cases,
    reference=_scales_of_the_layer,
    mistakes=(
        (_scales_after_softplus, "the parameter scales the input of the softplus: softplus(L · dl), not L · softplus(dl)."),
        (_scales_level_major, "the H·L outputs are grouped by head (h·L + ℓ): unflatten the last dimension to (H, L)."),
        (_scales_without_softplus, "λ must be positive: apply softplus to L · dl."),
    ),
)


def mamba2_log_decay(dt_raw: torch.Tensor, dt_bias: torch.Tensor, A_log: torch.Tensor) -> torch.Tensor:
    """Mamba-2's log decay ``g = -exp(A_log) · softplus(dt_raw + dt_bias) <= 0``. dt_raw: ``[B, T, H]``;
    dt_bias, A_log: ``[H]`` -> ``[B, T, H]``."""
    return -torch.exp(A_log) * F.softplus(dt_raw + dt_bias)


def _decay_positive(dt_raw, dt_bias, A_log):
    return torch.exp(A_log) * F.softplus(dt_raw + dt_bias)


def _decay_log_rate(dt_raw, dt_bias, A_log):
    return -A_log * F.softplus(dt_raw + dt_bias)


def _decay_bias_outside(dt_raw, dt_bias, A_log):
    return -torch.exp(A_log) * (F.softplus(dt_raw) + dt_bias)


def _decay_cases(rng):
    for _ in range(6):
        B, T, H = rng.randint(1, 2), rng.randint(1, 20), rng.randint(1, 4)
        gen = torch.Generator().manual_seed(rng.randrange(2**31))
        yield Case((torch.randn(B, T, H, generator=gen, dtype=torch.float64),
                    torch.randn(H, generator=gen, dtype=torch.float64) - 3,
                    torch.rand(H, generator=gen, dtype=torch.float64) * 2.5), describe(dict(B=B, T=T, H=H)))


MAMBA2_LOG_DECAY = Exercise(
    name="layers.mamba2_log_decay",
    chapter=10,
    signature="mamba2_log_decay(dt_raw, dt_bias, A_log) -> g",
    task="Mamba-2's log decay per token and head, from the step-size output `dt_raw: [B, T, H]` of the projection "
         "and the per-head parameters `dt_bias, A_log: [H]`: the step size `Δ = softplus(dt_raw + dt_bias)` and "
         "`g = -exp(A_log) · Δ` (so `g <= 0`).",
    solution=mamba2_log_decay,
    cases=_decay_cases,
    mistakes=(
        (_decay_positive, "g is a log decay: it must be <= 0, g = -exp(A_log) · Δ."),
        (_decay_log_rate, "A_log is the logarithm of the rate: the rate is exp(A_log) > 0."),
        (_decay_bias_outside, "the bias shifts the input of the softplus: Δ = softplus(dt_raw + dt_bias)."),
    ),
)


def extra_parameters(d_model: int, num_heads: int, max_len: int) -> int:
    """Parameters a log-linear layer adds to its linear layer: ``H · L`` more outputs of a bias-free projection
    of the ``d_model``-wide input, and the ``H · L`` parameters ``L_{h,ℓ}``: ``H · L · (d_model + 1)``,
    ``L = num_levels(max_len)``."""
    return num_heads * num_levels(max_len) * (d_model + 1)


def _extra_bit_length(d_model, num_heads, max_len):
    return num_heads * max_len.bit_length() * (d_model + 1)


def _extra_projection_only(d_model, num_heads, max_len):
    return num_heads * num_levels(max_len) * d_model


def _extra_cases(rng):
    for shapes in ([(16, 2, 1024), (32, 4, 2048), (8, 1, 1)], [(16, 2, 1000), (16, 4, 100), (24, 3, 5000)]):
        yield Case((shapes,), "(d_model, H, max_len) = " + ", ".join(map(str, shapes)))


def _extra_of_the_layers(shapes):
    counts = {}
    for d, H, max_len in shapes:
        head_dim = 2 * d // H  # Mamba-2's inner width is 2 · d_model
        linear = layers.Mamba2(d, head_dim=head_dim, d_state=4)
        loglinear = layers.LogLinearMamba2(d, head_dim=head_dim, d_state=4, max_len=max_len)
        counts[(d, H, max_len)] = sum(p.numel() for p in loglinear.parameters()) - sum(p.numel() for p in linear.parameters())
    return counts


EXTRA_PARAMETERS = Exercise(
    name="layers.extra_parameters",
    chapter=10,
    signature="extra_parameters(d_model, num_heads, max_len) -> int",
    task="How many parameters does a log-linear layer add to its linear layer (Mamba-2 → log-linear Mamba-2, "
         "Gated DeltaNet → log-linear Gated DeltaNet), for input width `d_model`, `num_heads` heads and a "
         "maximum length `max_len`? Each head and level gets one more output of a bias-free projection of the "
         "input, and one parameter `L_{h,ℓ}`.",
    solution=extra_parameters,
    cases=_extra_cases,
    driver=lambda fn, shapes: {shape: call(fn, *shape) for shape in shapes},
    reference=_extra_of_the_layers,
    mistakes=(
        (_extra_bit_length, "the number of levels is num_levels(max_len) = bit_length(max_len - 1) + 1, which "
                            "differs from bit_length(max_len) when max_len is not a power of two."),
        (_extra_projection_only, "besides the projection's H·L·d_model weights, each head and level has its own "
                                 "parameter L_{h,ℓ}: H·L more."),
    ),
)

EXERCISES = (LEVEL_SCALES, MAMBA2_LOG_DECAY, EXTRA_PARAMETERS)
