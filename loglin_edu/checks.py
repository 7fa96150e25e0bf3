"""Input checks shared by every operator: clear errors instead of silent wrong answers.

Every message names the argument, what was expected and what was received.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .fenwick import num_levels


@dataclass(frozen=True)
class Dims:
    """Sizes of one attention call: batch B, length T, heads H, key width K, value width V."""

    B: int
    T: int
    H: int
    K: int
    V: int


def _check_tensor(name: str, x, rank: int, layout: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape {layout}, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.dim() != rank:
        raise ValueError(f"{name} must have shape {layout} ({rank} dims), got shape {tuple(x.shape)}")


def _check_same(name: str, x: torch.Tensor, ref: torch.Tensor, ref_name: str) -> None:
    if x.device != ref.device:
        raise ValueError(f"{name} is on {x.device} but {ref_name} is on {ref.device}: put all inputs on one device")
    if x.dtype != ref.dtype:
        raise TypeError(f"{name} has dtype {x.dtype} but {ref_name} has dtype {ref.dtype}: use one dtype")


def check_qkv(q, k, v) -> Dims:
    """Check ``q, k: [B, T, Hk, K]`` and ``v: [B, T, H, V]`` with ``Hk`` equal to ``H`` or 1 (shared).

    Returns the :class:`Dims` of the call (``H`` taken from ``v``).
    """
    _check_tensor("q", q, 4, "[B, T, H, K]")
    _check_tensor("k", k, 4, "[B, T, H, K]")
    _check_tensor("v", v, 4, "[B, T, H, V]")
    _check_same("k", k, q, "q")
    _check_same("v", v, q, "q")
    B, T, Hq, K = q.shape
    if k.shape != q.shape:
        raise ValueError(f"k must have the shape of q, [B={B}, T={T}, H={Hq}, K={K}], got {tuple(k.shape)}")
    H = v.shape[2]
    if v.shape[:2] != (B, T) or Hq not in (1, H):
        raise ValueError(
            f"v must have shape [B={B}, T={T}, H, V] with H = {Hq} (or q, k shared by heads with H=1), "
            f"got {tuple(v.shape)}"
        )
    if T < 1:
        raise ValueError(f"q, k, v must hold at least one position (T >= 1), got T={T}")
    return Dims(B=B, T=T, H=H, K=K, V=v.shape[3])


def check_gate(name: str, x, dims: Dims, ref: torch.Tensor, *, nonpositive: bool = False) -> None:
    """Check a per-token, per-head gate ``x: [B, T, H]`` (``log_decay`` or ``beta``): shape, device, finite."""
    _check_tensor(name, x, 3, "[B, T, H]")
    _check_same(name, x, ref, "q")
    if tuple(x.shape) != (dims.B, dims.T, dims.H):
        raise ValueError(f"{name} must have shape [B={dims.B}, T={dims.T}, H={dims.H}], got {tuple(x.shape)}")
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} must be finite, got non-finite values")
    if nonpositive and (x > 0).any():
        raise ValueError(f"{name} must be <= 0 (a decay, exp({name}) <= 1), got a maximum of {x.max().item():g}")


def check_level_scales(level_scales, dims: Dims, ref: torch.Tensor) -> None:
    """Check ``level_scales: [B, T, H, L]`` with ``L >= num_levels(T)``."""
    _check_tensor("level_scales", level_scales, 4, "[B, T, H, L]")
    _check_same("level_scales", level_scales, ref, "q")
    if tuple(level_scales.shape[:3]) != (dims.B, dims.T, dims.H):
        raise ValueError(
            f"level_scales must have shape [B={dims.B}, T={dims.T}, H={dims.H}, L], got {tuple(level_scales.shape)}"
        )
    need = num_levels(dims.T)
    if level_scales.shape[3] < need:
        raise ValueError(
            f"level_scales has L={level_scales.shape[3]} levels but T={dims.T} needs at least "
            f"num_levels({dims.T}) = {need}"
        )


def check_form(form, forms: tuple[str, ...]) -> None:
    """Check that ``form`` is one of ``forms``."""
    if form not in forms:
        raise ValueError(f"form must be one of {forms}, got {form!r}")


def check_chunk_size(chunk_size) -> None:
    """Check that ``chunk_size`` is a positive power of two (chunks must align with the Fenwick buckets)."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise TypeError(f"chunk_size must be an int, got {type(chunk_size).__name__}")
    if chunk_size <= 0 or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size must be a positive power of two, got {chunk_size}")
