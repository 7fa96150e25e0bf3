"""The benchmark's settings: the shapes and inputs every implementation runs on, and the work they must do.

Log-linear Mamba-2 (PAPER.md §7): ``B·T = 65,536`` tokens, 48 heads, state ``K = 128``, head dim ``V = 64``,
q and k shared by the heads, bf16, ``T`` from 1K to 64K. Log-linear Gated DeltaNet, the authors' setting:
``B·T = 65,536``, 6 heads, ``K = 192``, ``V = 384``, q and k per head (unit length, q scaled by
``K^-1/2`` as the layer does), bf16, ``T`` from 1K to 64K. The CPU settings are tiny ones for the
interpreter (tests and the book build).

The counted work of the tree schedule (:func:`counted_work`) and the bytes every implementation must
move give the floor: ``max(flops / 790 TFLOP/s, bytes / 4.3 TB/s)``, the two ceilings of an H200
(a bf16 matrix product and a device-to-device copy, measured).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..fenwick import num_levels, trailing_zeros

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
    model: str = "loglinear_mamba2"

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


MODELS = ("loglinear_mamba2", "gated_deltanet")
GPU = Setting()
CPU = Setting(tokens=128, heads=2, key=16, value=16, dtype="float32", lengths=(32, 64, 128), chunk_size=16)
GDN_GPU = Setting(heads=6, key=192, value=384, lengths=(1024, 4096, 16384, 65536), model="gated_deltanet")
GDN_CPU = Setting(tokens=32, heads=2, key=16, value=16, dtype="float32", lengths=(16, 32), chunk_size=16,
                  model="gated_deltanet")
GDN_REFERENCE_MS = {
    "authors' log-linear Gated DeltaNet": {1024: 60.7, 4096: 86.7, 16384: 125.0, 65536: 189.3},
    "fla linear Gated DeltaNet": {1024: 17.1, 4096: 18.9, 16384: 25.2, 65536: 54.2},
}
"""Forward+backward median ms in :data:`GDN_GPU`'s setting on one H200 (bf16, 65,536 tokens per step, 6 heads,
K = 192, V = 384) of two implementations this package's benchmark does not time forward and backward: the paper's
authors' Triton kernels for log-linear Gated DeltaNet, and fla's linear Gated DeltaNet (``chunk_gated_delta_rule``,
whose backward refuses to run on Hopper under the Triton the benchmark runs with, so the benchmark times its forward
only). Measured outside ``python -m loglin_edu.bench``, as reference numbers to read ours against."""
SETTINGS = {("loglinear_mamba2", "gpu"): GPU, ("loglinear_mamba2", "cpu"): CPU,
            ("gated_deltanet", "gpu"): GDN_GPU, ("gated_deltanet", "cpu"): GDN_CPU}


def make_inputs(B: int, T: int, s: Setting, device, seed: int = 0) -> dict:
    """Mamba-2-like inputs: q, k ``[B, T, 1, K]`` (shared) scaled by ``K^-1/2``, v ``[B, T, H, V]``,
    λ ``[B, T, H, L]`` in (0.5, 1.5), log decay in (-0.1, 0). Gated DeltaNet: q, k ``[B, T, H, K]`` of unit
    length (q then scaled by ``K^-1/2``) and β ``[B, T, H]`` in (0, 1) as well."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def rand(*shape, scale=1.0, offset=0.0, normal=True):
        x = torch.randn(*shape, generator=gen) if normal else torch.rand(*shape, generator=gen)
        return (x * scale + offset).to(device=device, dtype=s.torch_dtype)

    if s.model == "gated_deltanet":
        unit = lambda: torch.nn.functional.normalize(torch.randn(B, T, s.heads, s.key, generator=gen), dim=-1)  # noqa: E731
        return dict(
            q=(unit() * s.key**-0.5).to(device=device, dtype=s.torch_dtype),
            k=unit().to(device=device, dtype=s.torch_dtype),
            v=rand(B, T, s.heads, s.value),
            level_scales=rand(B, T, s.heads, num_levels(T), normal=False, offset=0.5),
            log_decay=rand(B, T, s.heads, scale=-0.1, normal=False),
            beta=rand(B, T, s.heads, normal=False),
        )

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
    if s.model == "gated_deltanet":  # SDPA at the same heads and key width: q, k, v all K wide
        inputs["sdpa"] = tuple(torch.randn(B, s.heads, T, s.key, device=device, dtype=s.torch_dtype) for _ in range(3))
        return inputs
    inputs["q_heads"] = tuple(x.expand(-1, -1, s.heads, -1).contiguous() for x in (q, k))
    sdpa_qk = torch.randn(2, B, s.heads, T, s.value, device=device, dtype=s.torch_dtype)
    inputs["sdpa"] = (sdpa_qk[0], sdpa_qk[1], v.transpose(1, 2).contiguous())
    return inputs


def counted_work(B: int, T: int, s: Setting) -> dict:
    """Matrix-product flops of our schedule (forward, backward) and the fewest bytes any implementation
    moves (inputs read once, outputs written once), for ``B`` sequences of ``T`` tokens."""
    if s.model == "gated_deltanet":
        return counted_work_delta(B, T, s)
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


def carried_levels(N: int) -> int:
    """Transitions of the stacked reverse walk over ``N`` chunks: chunk ``c < N - 1`` carries one level for its
    ``j`` trailing ones (if any; the trailing zeros of ``c + 1``), merged, and one for each set bit above them,
    ``popcount(c) - j + [j > 0]``."""
    return sum(bin(c).count("1") - trailing_zeros(c + 1) + (trailing_zeros(c + 1) > 0) for c in range(N - 1))


def counted_work_delta(B: int, T: int, s: Setting) -> dict:
    """:func:`counted_work` of the log-linear Gated DeltaNet schedule (kernels steps 6-8), per sequence and head:

    - WY factors: ``Q Kᵀ``, ``K Kᵀ``, ``W``, ``query`` (``2·C·K`` each per token), ``U₀`` and the intra product
      (``2·C·V`` each), the solve and ``P`` (about ``(C/16 + 18)·2C²`` per token);
    - level walks: one chunk transition (``4·C·K·V``) per chunk and level, ``n·N`` of them; reads ``2·C·K·V``
      per stored state (``Σ_c popcount(c)``);
    - backward: the stacked reverse walk (``4·C·K·V`` per transition, one per chunk and distinct level it
      carries, :func:`carried_levels`; ``2·C·K·V`` per read), the level gradients (``2·K·K·V`` per carried level
      for ``G = Σ_ℓ D_ℓ S_ℓᵀ``, ``8·C·K·K + 4·C·K·V`` per chunk for the products of the chunk's factors with it,
      ``2·C·K·V`` per read for the reads' own), the WY backward (about three times its forward).
    """
    C, H, K, V = s.chunk_size, s.heads, s.key, s.value
    N = -(-T // C)
    n = (N - 1).bit_length()
    reads = sum(bin(c).count("1") for c in range(N))
    ckv = 2 * C * K * V
    chunks = T * (4 * 2 * C * K + 2 * 2 * C * V + (C // 16 + 18) * 2 * C * C)
    walks = n * N * 2 * ckv
    forward = B * H * (chunks + walks + reads * ckv)
    carried = carried_levels(N)
    level_grads = carried * 2 * K * K * V + N * (2 * 2 * C * K * K + 2 * ckv) + reads * ckv
    backward = B * H * (carried * 2 * ckv + reads * ckv + level_grads + 3 * chunks)
    size = torch.finfo(s.torch_dtype).bits // 8
    L = (T - 1).bit_length() + 1
    inputs = B * T * H * (2 * K + V + L + 2) * size
    outputs = B * T * H * V * size
    return dict(forward_flops=forward, backward_flops=backward, forward_bytes=inputs + outputs,
                backward_bytes=2 * (inputs + outputs))
