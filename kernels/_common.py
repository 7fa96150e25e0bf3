"""Host-side helpers shared by the kernels: block sizes, dot precision, and the decay prefix sums.

Every kernel reads ``[B, T, H, D]`` tensors through their strides (the last dimension contiguous); the
decay is prepared here, once per call, as two small tensors:

    gc[b, h, t]   = Σ_{chunk start <= r <= t} g_r      (fp32, within-chunk cumulative sum, [B, H, N·C])
    gend[b, h, c] = Σ_{r <= last token of chunk c} g_r  (fp64, global, [B, H, N])

Kernels take differences of ``gend`` in fp64 and convert them to fp32 only then, so a long sequence
never subtracts two large fp32 numbers; within a chunk ``gc`` is small and fp32 suffices.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_BLOCK = 128  # widest K or V tile one program holds; wider heads are split by the wrappers


def block(n: int, minimum: int = 16) -> int:
    """Tile width for a dimension of size ``n``: the next power of two, at least ``minimum`` (16 is
    ``tl.dot``'s minimum)."""
    return max(minimum, 1 << (n - 1).bit_length())


def head_block(n: int) -> int:
    """Tile width of a key or value dimension (``K`` or ``V``, the operands of the state products).

    At least 64 on a GPU: with 16- or 32-wide tiles, Triton 3.6 on an H200 computed wrong fp16/bf16
    outputs (NaN, or errors of 30-100 %) in the state-reading kernels while the interpreter was exact
    (kernels/NOTES.md, run 8). The interpreter keeps the narrow tiles, which are correct and cheaper there.
    """
    from . import interpreted

    return block(n, 16 if interpreted() else 64)


PRECISIONS = ("fast", "split", "fp32", "exact")
"""The precision ladder of 16-bit calls (``LaunchConfig.precision``), each rung adding one thing:

- ``"fast"``: states stored in the input's 16-bit type (bf16; fp16 calls always keep fp32 states), their
  fp32 products in tf32;
- ``"split"``: each chunk's leaf ``K̃ᵀ V`` from K̃ split into two 16-bit parts (two products), so the
  forward's states carry no rounding of the decayed keys;
- ``"fp32"``: and states stored in fp32, their products in tf32;
- ``"exact"``: and those products in tf32x3 (three tf32 passes, about fp32 accuracy).

fp32 and fp64 calls ignore it: their products are exact (``"ieee"``) and their states keep their type.
Every rung meets the bf16 bound of 1e-2 on o and every gradient up to T = 65,536; measured on an H200 at
that length (book/results/kernels_precision_ladder_h200.json), forward+backward 19.4 / 19.7 / 22.1 /
34.5 ms and the largest error 2.5e-3 / 2.4e-3 / 4.1e-3 / 2.3e-3. The default is the fastest.
"""


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")


def dot_precision(dtype: torch.dtype, precision: str = "fast") -> str:
    """``tl.dot`` precision: exact (``"ieee"``) for fp32/fp64 inputs; for fp16/bf16 inputs the 16-bit dots
    ignore it and the fp32 dots (those with a state) run in tf32, or in tf32x3 at ``precision="exact"``."""
    if dtype in (torch.float32, torch.float64):
        return "ieee"
    return "tf32x3" if precision == "exact" else "tf32"


def state_dtype(dtype: torch.dtype, precision: str = "fast") -> torch.dtype:
    """Storage type of the ``K × V`` states kernels write to memory. They are always accumulated in
    fp32 registers; bf16 calls store them in bf16 (half the traffic, bf16's range) at precisions
    ``"fast"`` and ``"split"``; fp16 calls keep fp32, since a state can outgrow fp16's range; fp32/fp64
    calls keep their own type."""
    if dtype == torch.bfloat16 and precision in ("fast", "split"):
        return torch.bfloat16
    return accumulator_dtype(dtype)


def split_leaf(dtype: torch.dtype, precision: str = "fast") -> bool:
    """Whether the tree kernel forms the leaf from K̃ split into two 16-bit parts (precision ladder)."""
    return dtype in (torch.float16, torch.bfloat16) and precision != "fast"


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """Registers accumulate in fp32 (fp64 for fp64 inputs, which only the interpreter's checks use)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def chunk_decay(log_decay: torch.Tensor | None, B: int, T: int, H: int, chunk_size: int, device,
                dtype: torch.dtype = torch.float32) -> tuple:
    """``(gc, gend)`` of the module docstring from ``log_decay: [B, T, H]`` (or None: no decay).

    Returns ``gc: [B, H, N·C]`` (``accumulator_dtype(dtype)``; kernels take their accumulator type
    from it) and ``gend: [B, H, N]`` (fp64), padded tokens decaying by nothing.
    """
    n_chunks = -(-T // chunk_size)
    acc = accumulator_dtype(dtype)
    if log_decay is None:
        return (torch.zeros(B, H, n_chunks * chunk_size, device=device, dtype=acc),
                torch.zeros(B, H, n_chunks, device=device, dtype=torch.float64))
    g = torch.zeros(B, H, n_chunks * chunk_size, device=device, dtype=acc)
    g[:, :, :T] = log_decay.transpose(1, 2)
    gc = g.view(B, H, n_chunks, chunk_size).cumsum(-1)
    gend = gc[..., -1].double().cumsum(-1)
    return gc.view(B, H, -1).contiguous(), gend.contiguous()


def reverse_cumsum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``y_t = Σ_{r >= t} x_r`` along ``dim``, in fp64."""
    return x.double().flip(dim).cumsum(dim).flip(dim)


def last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    """Kernels index the last dimension with stride 1; other strides are free (views are fine)."""
    return x if x.stride(-1) == 1 else x.contiguous()


@dataclass(frozen=True)
class LaunchConfig:
    """Knobs of the log-linear kernels (steps 3-4); every value computes the same function.

    head_group: heads one program of the per-chunk kernels handles in a loop (with q, k shared by all
        heads, ``Q Kᵀ`` is then computed once per chunk for the group, and dq, dk are summed in registers);
    block_levels: ``m`` — one program of the tree kernels owns ``2^m`` chunks and the levels inside them;
    num_warps: warps per program of the per-chunk kernels; tree_warps: of the tree kernels;
    exact_node_grads: form and store the backward's node gradients in fp32 (tf32 products on a GPU)
        rather than the state dtype: d log_decay in bf16 needs it (kernels/backward.py).
    precision: the rung of :data:`PRECISIONS` for fp16/bf16 calls (all meet the bf16 bound; see there).
    """

    head_group: int = 1
    block_levels: int = 4
    num_warps: int = 4
    tree_warps: int = 4
    exact_node_grads: bool = True
    precision: str = "fast"

    def __post_init__(self) -> None:
        check_precision(self.precision)

    def group(self, heads: int) -> int:
        """The largest divisor of ``heads`` not above ``head_group``."""
        return max(d for d in range(1, min(self.head_group, heads) + 1) if heads % d == 0)
