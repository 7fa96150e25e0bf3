"""Chapter 9: what the kernels cost — node reads, the counted forward work, and the memory the tree keeps."""

from __future__ import annotations

import torch

from ..bench.settings import Setting, counted_work
from ..kernels.config import accumulator_dtype, state_dtype
from .checking import Case, Exercise, call


def node_reads(n_chunks: int) -> int:
    """Reads of a tree node by the output kernel for ``N`` chunks: chunk ``c`` reads one node per set bit of
    ``c``, so ``Σ_{c < N} popcount(c)``."""
    return sum(bin(c).count("1") for c in range(n_chunks))


def _reads_all_levels(n_chunks: int) -> int:
    return sum(c.bit_length() for c in range(n_chunks))


def _reads_shifted(n_chunks: int) -> int:
    return sum(bin(c + 1).count("1") for c in range(n_chunks))


def _reads_estimate(n_chunks: int) -> int:
    return n_chunks * max(n_chunks - 1, 1).bit_length() // 2


def _chunk_counts(rng):
    yield Case((list(range(1, 70)),), "N = 1 ... 69")
    yield Case(([rng.randrange(70, 20000) for _ in range(20)],), "20 random N below 20,000")


NODE_READS = Exercise(
    name="cost.node_reads",
    chapter=9,
    signature="node_reads(N) -> int",
    task="Return how many tree nodes the output kernel reads in total for a sequence of `N` chunks: chunk `c` "
         "reads one node at each chunk level `ℓ` whose bit `ℓ - 1` of `c` is set (chapter 8). Chunk 0 reads none.",
    solution=node_reads,
    cases=_chunk_counts,
    driver=lambda fn, counts: {N: call(fn, N) for N in counts},
    mistakes=(
        (_reads_all_levels, "a chunk reads one node per *set* bit of c, not one per level up to bit_length(c): "
                            "count the ones, bin(c).count('1')."),
        (_reads_shifted, "chunks are 0-based: chunk c reads popcount(c) nodes, for c = 0 ... N - 1."),
        (_reads_estimate, "N log2(N) / 2 is the average for a power of two, not the exact count: sum popcount(c) "
                          "over the chunks."),
    ),
)


def forward_flops(B: int, T: int, H: int, K: int, V: int, C: int) -> int:
    """Matrix-product flops of the tree schedule's forward for ``B`` sequences of ``T`` tokens, ``H`` heads:

        per (sequence, head):  2·T·K·V  (leaves K̃ᵀV)  +  2·T·C·(K + V)  (Q Kᵀ and its product with V inside
        every chunk)  +  2·C·K·V · Σ_{c < N} popcount(c)  (one [C, K] × [K, V] product per node read),

    ``N = ceil(T / C)`` chunks."""
    n_chunks = -(-T // C)
    reads = sum(bin(c).count("1") for c in range(n_chunks))
    return B * H * (2 * T * K * V + 2 * T * C * (K + V) + 2 * C * reads * K * V)


def _flops_without_leaves(B, T, H, K, V, C):
    return forward_flops(B, T, H, K, V, C) - B * H * 2 * T * K * V


def _flops_dense_intra(B, T, H, K, V, C):
    return forward_flops(B, T, H, K, V, C) - B * H * 2 * T * C * (K + V) + B * H * 2 * T * T * (K + V)


def _flops_floor_chunks(B, T, H, K, V, C):
    reads = sum(bin(c).count("1") for c in range(T // C))
    return B * H * (2 * T * K * V + 2 * T * C * (K + V) + 2 * C * reads * K * V)


def _work_cases(rng):
    for _ in range(10):
        C = rng.choice([16, 32, 64])
        T = rng.choice([C * rng.randint(1, 40), rng.randint(1, 3000), 2 ** rng.randint(6, 16)])
        sizes = dict(B=rng.randint(1, 4), T=T, H=rng.randint(1, 48), K=rng.choice([16, 64, 128]),
                     V=rng.choice([16, 64, 128]), C=C)
        yield Case(tuple(sizes.values()), ", ".join(f"{k}={v}" for k, v in sizes.items()))


def _counted_forward(B, T, H, K, V, C):
    setting = Setting(tokens=B * T, heads=H, key=K, value=V, chunk_size=C, lengths=(T,))
    return counted_work(B, T, setting)["forward_flops"]


FORWARD_FLOPS = Exercise(
    name="cost.forward_flops",
    chapter=9,
    signature="forward_flops(B, T, H, K, V, C) -> int",
    task="Return the matrix-product flops of the forward (a product `[m, k] × [k, n]` costs `2·m·k·n`) for `B` "
         "sequences of `T` tokens, `H` heads, keys of width `K`, values of width `V`, chunks of `C` tokens: the "
         "leaves `K̃ᵀ V` of every chunk, the two `[C, C]`-sized products inside every chunk, and one "
         "`[C, K] × [K, V]` product per node a chunk reads. A last partial chunk counts as a full one for the "
         "reads, its real tokens only for the rest.",
    solution=forward_flops,
    cases=_work_cases,
    reference=_counted_forward,
    mistakes=(
        (_flops_without_leaves, "every chunk also forms its leaf K̃ᵀ V (2·C·K·V flops per chunk): 2·T·K·V in all."),
        (_flops_dense_intra, "inside a chunk the products are [C, C]-sized: 2·T·C·(K + V), not the 2·T·T·(K + V) "
                             "of dense attention."),
        (_flops_floor_chunks, "a last partial chunk is still a chunk: N = ceil(T / C)."),
    ),
)


def tree_memory(B: int, T: int, H: int, K: int, V: int, C: int, dtype: torch.dtype) -> dict[str, int]:
    """Bytes the tree adds for a call in ``dtype`` (default precision): ``nodes`` (one ``K × V`` state per chunk
    and head, stored as ``state_dtype``: bf16 for bf16 calls, fp32 for fp16 and fp32 calls), ``residuals``
    (what storing a node in 16 bits rounded away, same size; none for fp32 nodes) and ``node_grads`` (the
    backward's node gradients, fp32)."""
    chunks = B * H * -(-T // C)
    state = torch.finfo(state_dtype(dtype)).bits // 8
    nodes = chunks * K * V * state
    return dict(nodes=nodes, residuals=nodes if state == 2 else 0,
                node_grads=chunks * K * V * torch.finfo(accumulator_dtype(dtype)).bits // 8)


def _memory_input_bytes(B, T, H, K, V, C, dtype):
    chunks = B * H * -(-T // C)
    size = torch.finfo(dtype).bits // 8
    return dict(nodes=chunks * K * V * size, residuals=chunks * K * V * size if size == 2 else 0,
                node_grads=chunks * K * V * 4)


def _memory_floor_chunks(B, T, H, K, V, C, dtype):
    return tree_memory(B, C * (T // C), H, K, V, C, dtype)


def _memory_no_residuals(B, T, H, K, V, C, dtype):
    return dict(tree_memory(B, T, H, K, V, C, dtype), residuals=0)


def _memory_cases(rng):
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.bfloat16, torch.float16):
        C = rng.choice([16, 64])
        sizes = dict(B=rng.randint(1, 8), T=rng.randint(1, 5000), H=rng.randint(1, 48),
                     K=rng.choice([16, 64, 128]), V=rng.choice([16, 64]), C=C)
        yield Case((*sizes.values(), dtype),
                   ", ".join(f"{k}={v}" for k, v in sizes.items()) + f", dtype={str(dtype).replace('torch.', '')}")


TREE_MEMORY = Exercise(
    name="cost.tree_memory",
    chapter=9,
    signature="tree_memory(B, T, H, K, V, C, dtype) -> dict",
    task="Return the bytes of the tree buffers for a call in `dtype` as `dict(nodes=..., residuals=..., "
         "node_grads=...)`: one `K × V` node per chunk and head, stored in bf16 for bf16 inputs and in fp32 "
         "for fp16 and fp32 inputs (an fp16 state could overflow); for 16-bit nodes the same number of bytes "
         "again for their rounding residuals (0 otherwise); and the backward's node gradients, always fp32.",
    solution=tree_memory,
    cases=_memory_cases,
    mistakes=(
        (_memory_input_bytes, "fp16 calls store their nodes in fp32 (an fp16 state could overflow), so they need "
                              "no residuals: only bf16 nodes are 16-bit."),
        (_memory_floor_chunks, "a last partial chunk has a node too: N = ceil(T / C) chunks."),
        (_memory_no_residuals, "16-bit nodes keep what their rounding lost (the residuals), as many bytes again."),
    ),
)

EXERCISES = (NODE_READS, FORWARD_FLOPS, TREE_MEMORY)
