"""The chunk-scan algorithm for log-linear attention: O(T log T) time, no ``T × T`` tensor.

Cut the sequence into aligned chunks of ``C = 2^c`` tokens. Two keys of one chunk are at level
``<= c``; a key in chunk ``sc`` and a query in chunk ``tc > sc`` are at level ``c + bit_length(tc ^ sc)``.

1. **Intra-chunk** (levels ``0..c``): per chunk the dense ``C × C`` product
   ``((A ⊙ M^S)_chunk ⊙ Λ) V`` with ``Λ[i, j] = λ[i, level(i, j)]``, the same level pattern in every chunk.
2. **Inter-chunk** (chunk levels ``1..n``, ``n = bit_length(N - 1)``): a binary counter over chunks holds
   one ``K × V`` state per chunk level. Entering chunk ``tc``, chunk levels ``0..j`` (``j`` = trailing
   zeros of ``tc``; level 0 is the previous chunk itself) merge into level ``j + 1``. Every token of the
   chunk then reads each non-empty level ``m``: ``o_t += λ[t, c + m] S^(m)ᵀ query_t``. Leaving the chunk,
   every level is carried through its transition ``Φ_tc``.

Work: ``O(T·C·(K+V))`` inside chunks plus ``O(T·K·V·log(T/C))`` for the levels.
"""

from __future__ import annotations

import torch

from .layout import pad_time
from .chunking import chunk_terms, split_chunks
from .fenwick import levels_within_chunk, num_chunk_levels, trailing_zeros


def intra_chunk_scales(level_scales: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``Λ[n, i, j] = λ[nC + i, level(i, j)]`` (0 for ``j > i``).

    level_scales: ``[B, H, N, C, L]`` (chunked, ``L > log2 C``) -> ``[B, H, N, C, C]``.
    """
    levels = levels_within_chunk(chunk_size, device=level_scales.device)
    index = levels.clamp(min=0).expand(*level_scales.shape[:-1], chunk_size)
    return torch.gather(level_scales, -1, index) * (levels >= 0)


def chunk_scan(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    level_scales: torch.Tensor,
    log_decay: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> torch.Tensor:
    """Log-linear attention by chunk scan (module docstring), heads-first.

    q, k: ``[B, H, T, K]``; v: ``[B, H, T, V]``; level_scales: ``[B, H, T, L]``; log_decay, beta:
    ``[B, H, T]`` or None. Returns ``[B, H, T, V]``.
    """
    T = q.shape[2]
    inner = chunk_size.bit_length() - 1  # log2 C
    n_levels = inner + num_chunk_levels(T, chunk_size) + 1
    lam = pad_time(level_scales, max(n_levels, level_scales.shape[-1]), dim=3)  # padded tokens use high levels
    lam = split_chunks(lam, chunk_size)  # [B, H, N, C, L]
    terms = chunk_terms(q, k, v, log_decay, beta, chunk_size)
    out = (terms.intra * intra_chunk_scales(lam, chunk_size)) @ split_chunks(v, chunk_size)

    levels: dict[int, torch.Tensor] = {}  # chunk level m >= 1 -> its state at the current chunk's start
    from_levels = []
    for c in range(out.shape[2]):
        if c > 0:
            j = trailing_zeros(c)
            carried = [terms.own[:, :, c - 1]] + [levels.pop(m) for m in range(1, j + 1) if m in levels]
            levels[j + 1] = sum(carried[1:], carried[0])
        read = torch.zeros_like(out[:, :, c])
        for m, state in levels.items():
            read = read + lam[:, :, c, :, inner + m, None] * (terms.query[:, :, c] @ state)
        from_levels.append(read)
        levels = {m: terms.propagate(c, state) for m, state in levels.items()}
    out = out + torch.stack(from_levels, dim=2)
    return out.flatten(2, 3)[:, :, :T]
