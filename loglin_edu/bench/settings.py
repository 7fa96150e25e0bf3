"""The benchmark's settings: the shapes and inputs every implementation runs on, and the work they must do.

The GPU setting (PAPER.md §7): ``B·T = 65,536`` tokens, 48 heads, state ``K = 128``, head dim ``V = 64``,
q and k shared by the heads, bf16, ``T`` from 1K to 64K. The CPU setting is a tiny one for the
interpreter (tests and the book build).

The counted work of the tree schedule (:func:`counted_work`) and the bytes every implementation must
move give the floor: ``max(flops / 790 TFLOP/s, bytes / 4.3 TB/s)``, the two ceilings of an H200
(a bf16 matrix product and a device-to-device copy, measured).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..fenwick import num_levels

MATMUL_FLOPS = 790e12  # bf16 dense products on an H200, measured
COPY_BYTES = 4.3e12  # device-to-device copy on an H200, bytes read + written per second, measured


@dataclass(frozen=True)
class Setting:
    """One benchmark setting: ``B = tokens // T`` sequences of ``T`` tokens for every ``T`` in lengths."""

    tokens: int = 65536
    heads: int = 48
    key: int = 128
    value: int = 64
    dtype: str = "bfloat16"
    lengths: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
    chunk_size: int = 64

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


GPU = Setting()
CPU = Setting(tokens=128, heads=2, key=16, value=16, dtype="float32", lengths=(32, 64, 128), chunk_size=16)


def make_inputs(B: int, T: int, s: Setting, device, seed: int = 0) -> dict:
    """Mamba-2-like inputs: q, k ``[B, T, 1, K]`` (shared) scaled by ``K^-1/2``, v ``[B, T, H, V]``,
    λ ``[B, T, H, L]`` in (0.5, 1.5), log decay in (-0.1, 0)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def rand(*shape, scale=1.0, offset=0.0, normal=True):
        x = torch.randn(*shape, generator=gen) if normal else torch.rand(*shape, generator=gen)
        return (x * scale + offset).to(device=device, dtype=s.torch_dtype)

    return dict(
        q=rand(B, T, 1, s.key, scale=s.key**-0.5),
        k=rand(B, T, 1, s.key, scale=s.key**-0.5),
        v=rand(B, T, s.heads, s.value),
        level_scales=rand(B, T, s.heads, num_levels(T), normal=False, offset=0.5),
        log_decay=rand(B, T, s.heads, scale=-0.1, normal=False),
    )


def prepare(B: int, T: int, s: Setting, device) -> dict:
    """:func:`make_inputs` plus the per-head q, k some baselines need (``q_heads``) and SDPA's ``[B, H, T, D]`` inputs."""
    inputs = make_inputs(B, T, s, device)
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    inputs["q_heads"] = tuple(x.expand(-1, -1, s.heads, -1).contiguous() for x in (q, k))
    sdpa_qk = torch.randn(2, B, s.heads, T, s.value, device=device, dtype=s.torch_dtype)
    inputs["sdpa"] = (sdpa_qk[0], sdpa_qk[1], v.transpose(1, 2).contiguous())
    return inputs


def counted_work(B: int, T: int, s: Setting) -> dict:
    """Matrix-product flops of our schedule (forward, backward) and the fewest bytes any implementation
    moves (inputs read once, outputs written once), for ``B`` sequences of ``T`` tokens."""
    C, H, K, V = s.chunk_size, s.heads, s.key, s.value
    N = -(-T // C)
    reads = sum(bin(c).count("1") for c in range(N)) * C  # token-level reads of a node, per sequence and head
    per_head = B * H
    leaves = 2 * T * K * V
    intra = 2 * T * C * (K + V)
    level_reads = 2 * reads * K * V
    forward = per_head * (leaves + intra + level_reads)
    # backward: node gradients (= level reads), dq (intra 3 products + level reads), dk/dv (intra 4 + 2 leaf products)
    backward = per_head * (level_reads + (2 * T * C * (2 * K + V) + level_reads) + (2 * T * C * (2 * K + 2 * V) + 2 * leaves))
    size = torch.finfo(s.torch_dtype).bits // 8
    L = (T - 1).bit_length() + 1
    inputs = B * T * (2 * K + H * (V + L + 1)) * size
    outputs = B * T * H * V * size
    return dict(
        forward_flops=forward,
        backward_flops=backward,
        forward_bytes=inputs + outputs,
        backward_bytes=2 * (inputs + outputs),  # read inputs and dO, write every gradient
    )


def floor_ms(work: dict, backward: bool) -> float:
    """The arithmetic/memory floor in ms: the larger of flops over the matrix rate and bytes over bandwidth."""
    flops = work["forward_flops"] + (work["backward_flops"] if backward else 0)
    nbytes = work["forward_bytes"] + (work["backward_bytes"] if backward else 0)
    return 1e3 * max(flops / MATMUL_FLOPS, nbytes / COPY_BYTES)
